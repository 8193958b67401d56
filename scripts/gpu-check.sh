#!/usr/bin/env bash
# scripts/gpu-check.sh - the CUDA backend on a bare GPU machine, in one call of at most 6 minutes.
#
#   scripts/gpu-check.sh --pack   here (a build machine with nvcc; no GPU needed): builds the CUDA
#                                 targets (Release, build-gpupack-build/) and writes build-gpupack/,
#                                 at most 40 MB (GPU_PACK_MAX_BYTES), to carry to the GPU machine
#   scripts/gpu-check.sh          there, with build-gpupack/ carried along: only runs what was built
#
# On the GPU machine: a copy of this checkout with build-gpupack/ beside scripts/, then
# `scripts/gpu-check.sh` (give it 7 minutes).
#
# build-gpupack/ holds
#   payload.tar.xz      bin/: the stripped CUDA binaries (every test_cuda_*, bench_cuda_train_step,
#                       bench_cuda_bandwidth, the examples/*.cu programs); lib/: the shared libraries
#                       they need that are not the CUDA toolkit's, the driver's or glibc's (OpenBLAS,
#                       libgfortran, libquadmath, libgomp, zlib, libstdc++, Open MPI...); mpi/: Open
#                       MPI's mpirun/orted, plugins and help files, where a binary links MPI
#   fashion-mnist/      the Fashion-MNIST *-ubyte.gz files (the training set cut to fit the size
#                       limit when it must be; manifest.txt says how many images)
#   text/               the GPT example's corpus (fortunes-min's fortunes, literature, riddles)
#   compare_pytorch_cuda.py and gpt_char_pytorch.py (its GPT rows' model), manifest.txt (the expected binaries - "built" or "not built" - and the
#                       expected benchmark rows), sources.sha256 (what the binaries were built from)
#
# The GPU form probes first, in seconds, and names what is missing (a GPU, the CUDA runtime,
# python3 + torch, compute-sanitizer, a library some binary needs: `ldd` with LD_LIBRARY_PATH =
# the pack's lib/, the toolkit's lib64/ and the Python wheels' nvidia/*/lib - cudnn, nccl, cu13...).
# A binary whose libraries do not resolve is rebuilt there only if cmake, ninja, nvcc and the CPU
# dependencies are there; otherwise that is reported. Then, each phase under `timeout` inside a
# budget of 360 s (GPU_CHECK_BUDGET_S):
#   1. the CUDA op tests against the CPU backend (every test_cuda_* but the NCCL/DDP ones)
#   2. DDP with NCCL: test_cuda_nccl_compile at world size 1, and two ranks sharing the GPU as
#      threads (test_cuda_ddp / test_cuda_step_sync, thread_group on device buffers, where built) and
#      as MPI processes (mpirun -np 2, where the pack carries Open MPI)
#   3. bench_cuda_bandwidth, bench_cuda_train_step (the strict-fp32 - TF32 off - vs bf16 step of
#      the 4 x 4096 MLP, and the CNN), bench_cuda_attention (causal attention forward + backward,
#      bf16 at T = 1024 and 4096, fp32 at 1024) and bench_cuda_kernel_count (kernels per Linear forward +
#      backward under bf16, CUPTI), then benchmarks/compare_pytorch_cuda.py: the same work in
#      PyTorch eager (kernels counted by torch.profiler), and the comparison table
#   4. compute-sanitizer --tool memcheck on the elementwise and reduction tests
#   5. the CUDA example(s), one epoch (the GPT: 300 steps) in fp32 and in bf16
# and writes at most 8 files under $OUT (default build-gpu/out):
#   summary.md (device, probe, every binary's exit status, benchmark table, result), probe.log,
#   tests.log, ddp.log, sanitizer.log, bench.log, bench_trainkit.jsonl, bench_pytorch.jsonl
# Exit status: 77 when there is no GPU (or nothing to run it on), 0 when every binary exited 0, every
# expected benchmark row is there and every benchmark met its target, 1 otherwise.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pack="$repo/build-gpupack"
cd "$repo" || exit 1

# Libraries never packed: glibc's, the driver's and the CUDA toolkit's (cuDNN and NCCL included:
# the GPU machine has them in the toolkit or as Python wheels).
system_lib_re='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|libmvec|libBrokenLocale)[.-]'
cuda_lib_re='^lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc[a-z.-]*|nvJitLink|cufft[a-z]*|curand|cusparse[a-zA-Z]*|cusolver[a-zA-Z]*|nvToolsExt|nvtx3interop|cupti|nvidia-[a-z-]*|nvperf[a-z_]*)\.so'

# ===================================================================================================
# --pack: build here, strip, collect the libraries, the data and the manifest.
if [[ "${1:-}" == "--pack" ]]; then
  max_bytes="${GPU_PACK_MAX_BYTES:-40000000}"
  build="$repo/build-gpupack-build"
  stage="$build/stage"
  cores="$(nproc 2>/dev/null || echo 1)"
  jobs="${GPU_PACK_JOBS:-$((cores <= 2 ? 1 : cores))}"
  die() { echo "gpu-check --pack: $*" >&2; exit 1; }
  for t in cmake ninja strip ldd xz tar python3; do command -v "$t" >/dev/null || die "$t not found"; done
  nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
  [[ -x "$nvcc" ]] || die "nvcc not found (set CUDACXX)"

  # The binaries: every tests/cuda test, the CUDA benchmarks and examples, and the NCCL/DDP ones.
  expected=()
  for f in tests/cuda/test_*.cu; do s="$(basename "$f" .cu)"; expected+=("test_cuda_${s#test_}"); done
  expected+=(test_cuda_nccl_compile test_cuda_ddp test_cuda_step_sync)
  for f in benchmarks/*.cu; do expected+=("bench_$(basename "$f" .cu)"); done
  for f in examples/*.cu; do expected+=("$(basename "$f" .cu)_cuda"); done
  mapfile -t expected < <(printf '%s\n' "${expected[@]}" | awk '!seen[$0]++')

  # cuDNN's fused attention (trainkit::cudnn_frontend) needs the cuDNN frontend's headers (PyPI).
  # shellcheck source=scripts/deps.sh
  source "$repo/scripts/deps.sh"
  trainkit_install_cudnn_frontend

  echo "== configure + build ($build, -j$jobs)"
  t0=$(date +%s)
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DTRAINKIT_CUDA=ON -DTRAINKIT_WERROR=OFF -DTRAINKIT_BUILD_TESTS=ON -DTRAINKIT_BUILD_EXAMPLES=ON \
    -DTRAINKIT_BUILD_BENCHMARKS=ON >"$build.configure.log" 2>&1 || { tail -n 30 "$build.configure.log"; die "configure failed"; }
  grep -E "^-- trainkit:" "$build.configure.log"
  # Only the expected targets that the build knows (an absent test_cuda_ddp is "not built").
  known="$(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's/^\([A-Za-z0-9_]*\): phony$/\1/p')"
  targets=()
  for b in "${expected[@]}"; do grep -qx "$b" <<<"$known" && targets+=("$b"); done
  ((${#targets[@]})) || die "no CUDA target in $build (TRAINKIT_CUDA off?)"
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" || die "build failed"
  echo "   built in $(($(date +%s) - t0)) s"

  rm -rf "$stage" "$pack"
  mkdir -p "$stage/bin" "$stage/lib" "$pack/fashion-mnist"
  manifest="$pack/manifest.txt"
  {
    echo "# trainkit gpu-check pack, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$repo" diff --quiet 2>/dev/null || echo ' + local changes')"
    echo "# binary <name> built|not-built [mpi]; row <framework> <bench>; mpi yes|no; data <train images>"
    echo "nvcc $("$nvcc" --version | grep -o 'release [0-9.]*' | cut -d' ' -f2)"
  } >"$manifest"
  uses_mpi=0
  for b in "${expected[@]}"; do
    exe="$(find "$build" -path "$stage" -prune -o -type f -name "$b" -perm -u+x -print 2>/dev/null | head -n 1)"
    if [[ -z "$exe" ]]; then
      echo "binary $b not-built" >>"$manifest"
      echo "   $b: not built"
      continue
    fi
    strip --strip-unneeded -o "$stage/bin/$b" "$exe"
    mpi=""
    ldd "$exe" | grep -q 'libmpi\.so' && { mpi=" mpi"; uses_mpi=1; }
    echo "binary $b built$mpi" >>"$manifest"
  done

  # pack_deps <file>...: copy every library they load that is not glibc/driver/CUDA into lib/.
  pack_deps() {
    local f line name path
    for f in "$@"; do
      while read -r line; do
        name="$(awk '{print $1}' <<<"$line")"
        path="$(awk '$2 == "=>" {print $3}' <<<"$line")"
        [[ "$line" == *"not found"* ]] && die "$f: $line"
        [[ -z "$path" || ! -e "$path" ]] && continue
        [[ "$name" =~ $system_lib_re || "$name" =~ $cuda_lib_re ]] && continue
        [[ -e "$stage/lib/$name" ]] || cp -L "$path" "$stage/lib/$name"
      done < <(ldd "$f" 2>/dev/null)
    done
  }
  pack_deps "$stage"/bin/*

  # Open MPI, where a binary links it: mpirun/orted, the plugins whose libraries are packed or glibc's
  # (no UCX, OFI, PSM, verbs), the help files - relocated with OPAL_PREFIX=<unpacked>/mpi.
  echo "mpi $([[ $uses_mpi == 1 ]] && echo yes || echo no)" >>"$manifest"
  if ((uses_mpi)) && command -v ompi_info >/dev/null && command -v orted >/dev/null; then
    path_of() { ompi_info --path "$1" --parsable 2>/dev/null | sed -n "s/^path:$1:\(.*\)$/\1/p"; }
    prefix="$(path_of prefix)"; pkglibdir="$(path_of pkglibdir)"; pkgdatadir="$(path_of pkgdatadir)"
    bindir="$(path_of bindir)"
    mkdir -p "$stage/mpi/bin" "$stage/mpi/${pkglibdir#"$prefix"/}" "$stage/mpi/${pkgdatadir#"$prefix"/}"
    for t in orterun orted; do cp -L "$bindir/$t" "$stage/mpi/bin/$t"; strip --strip-unneeded "$stage/mpi/bin/$t"; done
    ln -s orterun "$stage/mpi/bin/mpirun"
    pack_deps "$stage/mpi/bin/orterun" "$stage/mpi/bin/orted"
    cp -r "$pkgdatadir/." "$stage/mpi/${pkgdatadir#"$prefix"/}/"
    # Plugins: the ones whose libraries are all glibc's, packed already, or Open MPI's own small ones.
    for p in "$pkglibdir"/mca_*.so; do
      ok=1
      while read -r name _ path _; do
        [[ "$name" =~ $system_lib_re || -e "$stage/lib/$name" ]] && continue
        [[ "$name" =~ ^lib(mca_common_(ompio|sm|monitoring|dstore)|oshmem|numa|pmix|munge|uuid)\.so && -e "$path" ]] && continue
        ok=0; break
      done < <(ldd "$p" 2>/dev/null | awk '$2 == "=>"')
      ((ok)) && cp "$p" "$stage/mpi/${pkglibdir#"$prefix"/}/"
    done
    pack_deps "$stage/mpi/${pkglibdir#"$prefix"/}"/*.so
    # An external PMIx (Debian's pmix2): its few plugins and help files, relocated with
    # PMIX_INSTALL_PREFIX=<unpacked>/mpi/pmix.
    pmix="$(ldd "$stage/mpi/${pkglibdir#"$prefix"/}"/mca_pmix_*.so 2>/dev/null | awk '$1 == "libpmix.so.2" {print $3; exit}')"
    if [[ -n "$pmix" ]]; then
      pmix_root="$(dirname "$(dirname "$(readlink -f "$pmix")")")"
      mkdir -p "$stage/mpi/pmix/lib" "$stage/mpi/pmix/share"
      [[ -d "$pmix_root/lib/pmix" ]] && cp -r "$pmix_root/lib/pmix" "$stage/mpi/pmix/lib/" && pack_deps "$stage/mpi/pmix/lib/pmix"/*.so
      [[ -d "$pmix_root/share/pmix" ]] && cp -r "$pmix_root/share/pmix" "$stage/mpi/pmix/share/"
    fi
    echo "   Open MPI: $(ls "$stage/mpi/${pkglibdir#"$prefix"/}" | wc -l) plugins of $(ls "$pkglibdir"/mca_*.so | wc -l)"
  elif ((uses_mpi)); then
    echo "   a binary links MPI but ompi_info/orted were not found: no mpirun in the pack (MPI runs are skipped there)"
  fi
  strip --strip-unneeded "$stage"/lib/*.so* 2>/dev/null || true

  echo "== payload.tar.xz"
  XZ_OPT="-6 -T$jobs" tar -C "$stage" -cJf "$pack/payload.tar.xz" .
  # Benchmarks, the PyTorch comparison, the expected rows: every bench name the CUDA benchmarks print
  # (their sources' run("...") and "mlp_/cnn_..." literals), by trainkit and - where the comparison
  # script times the same - by PyTorch.
  cp benchmarks/compare_pytorch_cuda.py benchmarks/gpt_char_pytorch.py "$pack/"
  rows="$( (grep -ho 'run("[^"]*"' benchmarks/cuda_bandwidth.cu | sed 's/run("//; s/"$//'
    grep -ho '"\(mlp\|cnn\|gpt\)_[a-z0-9_]*"' benchmarks/cuda_train_step.cu | tr -d '"'
    grep -ho '"linear_[a-z0-9]*_kernels"' benchmarks/cuda_kernel_count.cu | tr -d '"'
    grep -ho '"attention_[a-z0-9_]*"' benchmarks/cuda_attention.cu | tr -d '"') | awk '!seen[$0]++')"
  while read -r r; do
    [[ -z "$r" ]] && continue
    echo "row trainkit $r" >>"$manifest"
    grep -qF "\"$r\"" benchmarks/compare_pytorch_cuda.py && echo "row pytorch $r" >>"$manifest"
  done <<<"$rows"
  (cd "$repo" && sha256sum include/trainkit/cuda.cuh tests/cuda/*.cu benchmarks/*.cu examples/*.cu) >"$pack/sources.sha256"

  # Fashion-MNIST: all of it where it fits, else the test set and as much of the training set as fits.
  data="${TRAINKIT_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
  if [[ -f "$data/train-images-idx3-ubyte.gz" ]]; then
    used=$(du -cb "$pack" | tail -n 1 | cut -f1)
    full=$(du -cb "$data"/*-ubyte.gz | tail -n 1 | cut -f1)
    if ((used + full + 200000 <= max_bytes)); then
      cp "$data"/*-ubyte.gz "$pack/fashion-mnist/"
      echo "data 60000" >>"$manifest"
    else
      cp "$data"/t10k-*-ubyte.gz "$pack/fashion-mnist/"
      left=$((max_bytes - used - $(du -cb "$data"/t10k-*.gz | tail -n 1 | cut -f1) - 300000))
      python3 - "$data" "$pack/fashion-mnist" "$left" >>"$manifest" <<'EOF'
import gzip, struct, sys
src, dst, room = sys.argv[1], sys.argv[2], int(sys.argv[3])
n = max(1000, min(60000, int(room / 445) // 1000 * 1000))  # ~440 bytes per gzipped 28x28 image
for kind, rec in (("images", 784), ("labels", 1)):
    raw = gzip.open(f"{src}/train-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz").read()
    head = 16 if kind == "images" else 8
    out = raw[:4] + struct.pack(">I", n) + raw[8:head] + raw[head:head + n * rec]
    with gzip.open(f"{dst}/train-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz", "wb", 9) as f:
        f.write(out)
print(f"data {n}")
EOF
    fi
    echo "   Fashion-MNIST: $(grep '^data' "$manifest" | cut -d' ' -f2) training images"
  else
    echo "data 0" >>"$manifest"
    echo "   no Fashion-MNIST under $data: the example is skipped there"
  fi

  # The GPT example's corpus (Debian's fortunes-min, about 100 KB): the GPU machine has no such package.
  mkdir -p "$pack/text"
  for t in fortunes literature riddles; do
    [[ -f "/usr/share/games/fortunes/$t" ]] && cp "/usr/share/games/fortunes/$t" "$pack/text/"
  done
  [[ -n "$(ls "$pack/text")" ]] || echo "   no fortunes-min under /usr/share/games/fortunes: the GPT example is skipped there"

  size=$(du -cb "$pack" | tail -n 1 | cut -f1)
  echo "== build-gpupack: $size bytes ($(du -sh "$pack" | cut -f1); limit $max_bytes)"
  (cd "$pack" && ls -l payload.tar.xz fashion-mnist/*) | awk '{print "   " $5 "\t" $9}'
  echo "   binaries: $(grep -c '^binary .* built' "$manifest") built, $(grep -c 'not-built' "$manifest") not built; libraries: $(ls "$stage/lib" | tr '\n' ' ')"
  ((size <= max_bytes)) || die "the pack is $size bytes, over $max_bytes"
  echo "carry it: run(command=\"scripts/gpu-check.sh\", carry=[\"build-gpupack\"], timeout_s=420)"
  exit 0
fi

# ===================================================================================================
# The GPU machine.
out="${OUT:-$repo/build-gpu/out}"
mkdir -p "$out"
summary="$out/summary.md"
probe_log="$out/probe.log"
t_start=$(date +%s)
budget="${GPU_CHECK_BUDGET_S:-360}"
# limit <seconds>: that, or less when the budget has less left (keeping 5 s for the summary).
limit() {
  local left=$((budget - 5 - ($(date +%s) - t_start)))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}
note() { echo "$*" | tee -a "$summary"; }
: >"$summary"
: >"$probe_log"
note "# trainkit CUDA check ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
note ""
note "## Probe"
missing=()
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && gpus="$(timeout 15 nvidia-smi -L 2>>"$probe_log")" && [[ -n "$gpus" ]]; then
  have_gpu=1
  note "- device: $(head -n 1 <<<"$gpus")"
  note "- driver: $(timeout 10 nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1), supports CUDA $(timeout 10 nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | cut -d' ' -f3)"
else
  missing+=("GPU (nvidia-smi finds none)")
fi
# The CUDA runtime the binaries will load, and the toolkit's library directories.
cuda_dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && cuda_dirs+=("$(readlink -f "$d")")
done
cudart="$( (for d in "${cuda_dirs[@]}"; do ls "$d"/libcudart.so.* 2>/dev/null; done
  ldconfig -p 2>/dev/null | awk '/libcudart\.so\./{print $NF}') | head -n 1)"
if [[ -n "$cudart" ]]; then
  note "- CUDA runtime: $(basename "$(readlink -f "$cudart")") ($cudart)"
else
  missing+=("CUDA runtime (libcudart.so.* in /usr/local/cuda or ldconfig)")
fi
nvcc="$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)"
[[ -n "$nvcc" ]] && note "- nvcc: $nvcc $("$nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*')"
# Python, torch, and the wheels' library directories (nvidia/cudnn, nvidia/nccl, nvidia/cu13, ...).
wheel_dirs=()
if command -v python3 >/dev/null; then
  torch_line="$(timeout 60 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>>"$probe_log")"
  if [[ -n "$torch_line" ]]; then note "- python3 + torch $torch_line"; else missing+=("torch for python3 (the PyTorch comparison is skipped)"); fi
  mapfile -t wheel_dirs < <(timeout 20 python3 -c '
import glob, site, sys
dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
seen = set()
for d in dirs:
    for lib in sorted(glob.glob(d + "/nvidia/*/lib")):
        if lib not in seen:
            seen.add(lib); print(lib)' 2>>"$probe_log")
  ((${#wheel_dirs[@]})) && note "- Python wheels' libraries: ${wheel_dirs[*]}"
else
  missing+=("python3 (the PyTorch comparison is skipped)")
fi
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
[[ -n "$sanitizer" ]] || missing+=("compute-sanitizer (the memcheck phase is skipped)")

# The pack.
root="${TMPDIR:-/tmp}/trainkit-gpupack"
built=()
declare -A manifest_mpi=()
if [[ -f "$pack/manifest.txt" && -f "$pack/payload.tar.xz" ]]; then
  rm -rf "$root" && mkdir -p "$root"
  if command -v xz >/dev/null; then
    tar -C "$root" -xJf "$pack/payload.tar.xz" 2>>"$probe_log"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$pack/payload.tar.xz" "$root" 2>>"$probe_log"
  fi || missing+=("an unpacked payload (tar/xz failed, see probe.log)")
  while read -r kind name state extra; do
    [[ "$kind" == binary && "$state" == built ]] || continue
    built+=("$name")
    [[ "${extra:-}" == mpi ]] && manifest_mpi[$name]=1
  done <"$pack/manifest.txt"
  note "- pack: $(head -n 1 "$pack/manifest.txt" | sed 's/^# //'); $(grep -c '^binary .* built' "$pack/manifest.txt") binaries built, not built: $(awk '$1 == "binary" && $3 == "not-built" {printf "%s ", $2}' "$pack/manifest.txt")"
  if [[ -f "$pack/sources.sha256" ]] && ! sha256sum --quiet -c "$pack/sources.sha256" >>"$probe_log" 2>&1; then
    note "- note: the sources changed since the pack was built (see probe.log); these binaries are the packed ones"
  fi
else
  missing+=("build-gpupack/ (run scripts/gpu-check.sh --pack on the build machine and carry build-gpupack)")
fi
ldpath="$root/lib"
for d in "${cuda_dirs[@]}" "${wheel_dirs[@]}"; do ldpath+=":$d"; done
ldpath+="${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Every packed binary's libraries must resolve.
unresolved=()
for b in "${built[@]}"; do
  miss="$(LD_LIBRARY_PATH="$ldpath" ldd "$root/bin/$b" 2>&1 | grep 'not found' | sed 's/^[[:space:]]*//' | sort -u | tr '\n' ';')"
  if [[ -n "$miss" ]]; then
    unresolved+=("$b")
    missing+=("for $b: $miss")
  fi
done
mpirun=""
if [[ -x "$root/mpi/bin/mpirun" ]]; then
  mpirun="$root/mpi/bin/mpirun"
  miss="$(LD_LIBRARY_PATH="$ldpath" ldd "$root/mpi/bin/orterun" 2>&1 | grep 'not found' | tr -s ' \t' ' ' | tr '\n' ';')"
  [[ -n "$miss" ]] && { missing+=("for mpirun: $miss"); mpirun=""; }
fi
# Rebuild the unresolved ones here, if this machine can.
if ((${#unresolved[@]})) && ((have_gpu)); then
  can=1
  for t in cmake ninja; do command -v "$t" >/dev/null || can=0; done
  [[ -n "$nvcc" ]] || can=0
  ls /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/*/*/cblas.h >/dev/null 2>&1 || can=0
  ls /usr/include/zlib.h >/dev/null 2>&1 || can=0
  ls /usr/lib/cmake/Catch2 /usr/local/lib/cmake/Catch2 /usr/lib/*/cmake/Catch2 >/dev/null 2>&1 || can=0
  if ((can)); then
    note "- rebuilding ${unresolved[*]} (their libraries do not resolve); output in probe.log"
    {
      timeout "$(limit 60)" cmake -S "$repo" -B "$repo/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINKIT_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc" -DTRAINKIT_BUILD_EXAMPLES=ON -DTRAINKIT_BUILD_BENCHMARKS=ON &&
        timeout "$(limit 200)" cmake --build "$repo/build-gpu" -j "$(nproc)" --target "${unresolved[@]}"
    } >>"$probe_log" 2>&1
    for b in "${unresolved[@]}"; do
      exe="$(find "$repo/build-gpu" -type f -name "$b" -perm -u+x 2>/dev/null | head -n 1)"
      if [[ -n "$exe" ]] && ! LD_LIBRARY_PATH="$ldpath" ldd "$exe" | grep -q 'not found'; then
        cp "$exe" "$root/bin/$b" && note "  - $b: rebuilt"
      else
        note "  - $b: rebuild failed (see probe.log)"
      fi
    done
  else
    note "- cannot rebuild ${unresolved[*]} here (needs cmake, ninja, nvcc, cblas.h, zlib.h and Catch2): they fail below"
  fi
fi
if ((${#missing[@]})); then
  note "- missing:"
  for m in "${missing[@]}"; do note "  - $m"; done
else
  note "- nothing missing"
fi
note "- probe: $(($(date +%s) - t_start)) s"
note ""
if ((!have_gpu)); then
  note "No GPU on this machine: nothing to run here; the GPU run is owed."
  exit 77
fi
if ((${#built[@]} == 0)); then
  note "Nothing to run: no pack."
  exit 1
fi

# ---------------------------------------------------------------------------------------------------
# runbin <label> <seconds> <log> <command...>: one binary under timeout; its exit status is recorded.
results=()  # "label|status|seconds"
failed=0
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
runbin() {
  local label="$1" secs="$2" log="$3"
  shift 3
  local t0 rc
  t0=$(date +%s)
  echo "=== $label: $*" >>"$log"
  timeout -k 5 "$(limit "$secs")" env LD_LIBRARY_PATH="$ldpath" "$@" >>"$log" 2>&1
  rc=$?
  echo "=== $label: exit status $rc ($(($(date +%s) - t0)) s)" >>"$log"
  results+=("$label|$rc|$(($(date +%s) - t0))")
  ((rc == 0)) || failed=1
  return $rc
}
has() { [[ -x "$root/bin/$1" ]] && printf '%s\n' "${built[@]}" | grep -qx "$1"; }
is_nccl() { [[ "$1" == *nccl* || "$1" == *ddp* || "$1" == *step_sync* ]]; }
catch_counts() { grep -E "^(All tests passed|test cases:)" "$1" | tail -n 1; }

# 1. The CUDA op tests against the CPU backend.
log="$out/tests.log"
: >"$log"
for b in "${built[@]}"; do
  [[ "$b" == test_cuda_* ]] && ! is_nccl "$b" && runbin "$b" 120 "$log" "$root/bin/$b" --reporter compact
done

# 2. DDP with NCCL: world size 1; two ranks on the one GPU as threads and as MPI processes.
log="$out/ddp.log"
: >"$log"
mpi_run=()
if [[ -n "$mpirun" ]]; then
  export OPAL_PREFIX="$root/mpi" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_btl_vader_single_copy_mechanism=none \
    OMPI_MCA_btl=self,vader PATH="$root/mpi/bin:$PATH"
  if [[ -d "$root/mpi/pmix" ]]; then
    export PMIX_INSTALL_PREFIX="$root/mpi/pmix" PMIX_MCA_mca_base_component_path="$root/mpi/pmix/lib/pmix" \
      PMIX_MCA_mca_base_component_show_load_errors=0
  fi
  mpi_run=("$mpirun" --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x OMP_NUM_THREADS)
fi
if has test_cuda_nccl_compile; then
  if ((${#mpi_run[@]})); then
    runbin "nccl world size 1 (mpirun -np 1 test_cuda_nccl_compile)" 60 "$log" "${mpi_run[@]}" -np 1 "$root/bin/test_cuda_nccl_compile"
    runbin "nccl 2 MPI ranks on one GPU (mpirun -np 2 test_cuda_nccl_compile)" 60 "$log" "${mpi_run[@]}" -np 2 "$root/bin/test_cuda_nccl_compile"
  else
    runbin "nccl world size 1 (test_cuda_nccl_compile, MPI singleton)" 60 "$log" "$root/bin/test_cuda_nccl_compile"
    note "- no mpirun in the pack: the 2-rank MPI run of test_cuda_nccl_compile is skipped"
  fi
fi
for b in "${built[@]}"; do
  [[ "$b" == test_cuda_* && "$b" != test_cuda_nccl_compile ]] && is_nccl "$b" || continue
  runbin "$b (thread_group ranks on device buffers)" 90 "$log" "$root/bin/$b" --reporter compact
  if [[ -n "${manifest_mpi[$b]:-}" && ${#mpi_run[@]} -gt 0 ]]; then
    runbin "$b (mpirun -np 2)" 90 "$log" "${mpi_run[@]}" -np 2 "$root/bin/$b" --reporter compact
  fi
done
# The CUDA DDP example: NCCL at world size 1, and two MPI processes sharing the GPU through pinned
# staging (NCCL refuses two ranks on one device), int8 compressed.
if has fashion_mnist_ddp_cuda && [[ -f "$pack/fashion-mnist/t10k-images-idx3-ubyte.gz" ]]; then
  ddp_args=(--data "$pack/fashion-mnist" --epochs 1 --train-limit 2000 --test-limit 500)
  if ((${#mpi_run[@]})); then
    runbin "fashion_mnist_ddp_cuda --comm nccl (mpirun -np 1)" 90 "$log" "${mpi_run[@]}" -np 1 \
      "$root/bin/fashion_mnist_ddp_cuda" "${ddp_args[@]}"
    runbin "fashion_mnist_ddp_cuda --comm mpi --compression int8 (mpirun -np 2, one GPU)" 90 "$log" \
      "${mpi_run[@]}" -np 2 "$root/bin/fashion_mnist_ddp_cuda" "${ddp_args[@]}" --comm mpi --compression int8
  else
    runbin "fashion_mnist_ddp_cuda --comm nccl (MPI singleton)" 90 "$log" "$root/bin/fashion_mnist_ddp_cuda" "${ddp_args[@]}"
  fi
fi

# 3. Benchmarks: trainkit, then the same work in PyTorch, and the comparison.
blog="$out/bench.log"
tk_rows="$out/bench_trainkit.jsonl"
pt_rows="$out/bench_pytorch.jsonl"
: >"$blog"
: >"$tk_rows"
: >"$pt_rows"
for b in bench_cuda_bandwidth bench_cuda_train_step bench_cuda_kernel_count bench_cuda_attention; do
  if has "$b"; then
    t0=$(date +%s)
    timeout -k 5 "$(limit 90)" env LD_LIBRARY_PATH="$ldpath" "$root/bin/$b" >>"$tk_rows" 2>>"$blog"
    rc=$?
    results+=("$b|$rc|$(($(date +%s) - t0))")
    ((rc == 0)) || failed=1
  fi
done
compare_rc=1
if [[ -n "${torch_line:-}" ]]; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout -k 5 "$(limit 120)" python3 "$pack/compare_pytorch_cuda.py" >"$pt_rows" 2>>"$blog"
  rc=$?
  results+=("compare_pytorch_cuda.py|$rc|$(($(date +%s) - t0))")
  ((rc == 0)) || failed=1
fi
python3 "$pack/compare_pytorch_cuda.py" --compare "$tk_rows" "$pt_rows" >"$out/compare.md" 2>>"$blog"
compare_rc=$?

# 4. compute-sanitizer memcheck on the elementwise and reduction tests.
log="$out/sanitizer.log"
: >"$log"
if [[ -n "$sanitizer" ]] && has test_cuda_tensor_ops; then
  runbin "memcheck: test_cuda_tensor_ops [elementwise],[reduce]" 120 "$log" \
    "$sanitizer" --tool memcheck --error-exitcode 86 --print-limit 20 \
    "$root/bin/test_cuda_tensor_ops" "[elementwise],[reduce]" --reporter compact
fi

# 5. The CUDA example(s): one epoch (the GPT: 300 steps) in fp32 and in bf16.
log="$out/tests.log"
data="$pack/fashion-mnist"
for b in "${built[@]}"; do
  # The DDP example takes no --precision: its runs (NCCL, MPI + int8) are in section 4 above.
  [[ "$b" == *_cuda && "$b" != test_* && "$b" != bench_* && "$b" != *_ddp_* ]] || continue
  if [[ "$b" == gpt_char_cuda ]]; then  # 300 steps of the default model on the packed corpus
    texts="$(ls "$pack"/text/* 2>/dev/null | paste -sd, -)"
    if [[ -n "$texts" ]]; then
      for prec in fp32 bf16; do
        runbin "$b --precision $prec (300 steps)" 60 "$log" "$root/bin/$b" --text "$texts" --steps 300 \
          --eval-every 100 --sample-chars 100 --precision "$prec"
      done
    else
      note "- $b: no corpus in the pack; skipped"
    fi
  elif [[ -f "$data/train-images-idx3-ubyte.gz" ]]; then
    for prec in fp32 bf16; do
      runbin "$b --precision $prec (1 epoch)" 60 "$log" "$root/bin/$b" --data "$data" --epochs 1 --precision "$prec"
    done
  else
    note "- $b: no Fashion-MNIST in the pack; skipped"
  fi
done

# ---------------------------------------------------------------------------------------------------
note "## Binaries (exit status; 124 = timed out)"
note ""
note "| run | exit status | s | |"
note "|---|---|---|---|"
for r in "${results[@]}"; do
  IFS='|' read -r label rc secs <<<"$r"
  note "| $label | $rc | $secs | $([[ $rc == 0 ]] && echo ok || echo FAILED) |"
done
note ""
note "Catch2 totals:"
note '```'
for f in "$out/tests.log" "$out/ddp.log" "$out/sanitizer.log"; do
  grep -E "^(=== [^:]*: exit status|All tests passed|test cases:)|ERROR SUMMARY" "$f" 2>/dev/null | sed 's/^=== //' >>"$summary"
done
note '```'
if grep -q -E "FAILED|failed" "$out/tests.log" "$out/ddp.log" "$out/sanitizer.log" 2>/dev/null; then
  note ""
  note "First failures:"
  note '```'
  grep -h -B2 -A6 -E "FAILED|Invalid __global__|ERROR SUMMARY: [1-9]" "$out/tests.log" "$out/ddp.log" "$out/sanitizer.log" | head -n 60 >>"$summary"
  note '```'
fi
note ""

note "## Benchmarks (trainkit vs PyTorch eager, same machine, same run)"
note ""
cat "$out/compare.md" >>"$summary" 2>/dev/null
rm -f "$out/compare.md"
note ""
# The strict-fp32 (TF32 off) vs bf16 step of the 4 x 4096 MLP, from the rows that are there.
mlp="$(python3 - "$tk_rows" "$pt_rows" <<'EOF'
import json, sys
rows = {}
for path in sys.argv[1:]:
    for line in open(path):
        if line.startswith("{"):
            o = json.loads(line)
            rows[(o.get("framework", "trainkit"), o["bench"])] = o
names = sorted({b for _, b in rows if b.startswith("mlp_")})
for n in names:
    tk, pt = rows.get(("trainkit", n)), rows.get(("pytorch", n))
    print(f"| {n} | {tk['ms']:.3f} ms |" if tk else f"| {n} | - |", f"{pt['ms']:.3f} ms |" if pt else "- |")
EOF
)"
if [[ -n "$mlp" ]]; then
  note "MLP 4 x 4096, batch 1024, one SGD step (mlp_fp32: strict fp32, TF32 off):"
  note ""
  note "| bench | trainkit | pytorch |"
  note "|---|---|---|"
  note "$mlp"
  grep -q "mlp_fp32" <<<"$mlp" || note "(no mlp_fp32 row: bench_cuda_train_step does not time the strict-fp32 MLP)"
  note ""
fi
# Every expected row must be there.
missing_rows=()
while read -r kind fw name; do
  [[ "$kind" == row ]] || continue
  f="$tk_rows"; [[ "$fw" == pytorch ]] && f="$pt_rows"
  grep -qF "\"bench\": \"$name\"" "$f" || missing_rows+=("$fw/$name")
done <"$pack/manifest.txt"
if ((${#missing_rows[@]})); then
  note "Missing benchmark rows: ${missing_rows[*]}"
  failed=1
fi
((compare_rc == 0)) || note "Benchmark targets: not all met (see the table)"

t_end=$(date +%s)
status=FAILED
((failed == 0 && compare_rc == 0)) && status=passed
note ""
note "## Result: $status (binaries $([[ $failed == 0 ]] && echo ok || echo 'not all ok'), benchmark rows ${#missing_rows[@]} missing, targets $([[ $compare_rc == 0 ]] && echo met || echo 'not met'); $((t_end - t_start)) s in all)"
[[ "$status" == passed ]]
