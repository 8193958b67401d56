#!/usr/bin/env bash
# scripts/gpu-check.sh - the CUDA backend on a GPU machine, in one call of at most 8 minutes.
#
#   scripts/gpu-check.sh --pack   (here, on the CI/dev machine; no GPU needed) writes build-gpupack/:
#                                 deps.tar.xz (OpenBLAS + cblas.h, Catch2, zlib headers - what the GPU
#                                 image lacks) and fashion-mnist/*.gz, about 36 MB
#   scripts/gpu-check.sh          (on the GPU machine, with build-gpupack/ carried along)
#
# The second form configures build-gpu/ with TRAINKIT_CUDA=ON (Release), builds the CUDA targets
# only (trainkit_cuda_all), runs the CUDA tests (ctest -L cuda), the CUDA example for one epoch in
# fp32 and in bf16, the GPU benchmarks and benchmarks/compare_pytorch_cuda.py, and writes under
# $OUT (default build-gpu/out):
#   summary.md           device, build time, test results, example epochs, benchmark table (pass/fail)
#   build.log ctest.log examples.log bench_trainkit.jsonl bench_pytorch.jsonl bench.log
# Each phase has its own time limit inside a budget of 470 s (GPU_CHECK_BUDGET_S), so a hang in one
# still leaves the others' logs and the summary.
# Exit status: 0 when every test passed and every benchmark met its target, 1 otherwise, 77 when
# there is no GPU.
#
# With the device tool: run(command="scripts/gpu-check.sh", carry=["build-gpupack"], timeout_s=600).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pack="$repo/build-gpupack"
cd "$repo" || exit 1

# ---------------------------------------------------------------------------------------------------
if [[ "${1:-}" == "--pack" ]]; then
  set -e
  rm -rf "$pack"
  mkdir -p "$pack/deps/lib" "$pack/deps/include" "$pack/deps/catch2/include" "$pack/deps/catch2/lib/cmake" \
    "$pack/deps/zlib/include" "$pack/deps/zlib/lib" "$pack/fashion-mnist"
  arch_lib=/usr/lib/x86_64-linux-gnu
  blas_dir="$arch_lib/openblas-openmp"
  [[ -e "$blas_dir/libopenblas.so.0" ]] || blas_dir="$arch_lib/openblas-pthread"
  cp -L "$blas_dir/libopenblas.so.0" "$pack/deps/lib/"
  ln -s libopenblas.so.0 "$pack/deps/lib/libopenblas.so"
  for l in libgfortran.so.5 libquadmath.so.0; do cp -L "$arch_lib/$l" "$pack/deps/lib/"; done
  inc="/usr/include/x86_64-linux-gnu/$(basename "$blas_dir")"
  cp "$inc/cblas.h" "$inc/openblas_config.h" "$inc/f77blas.h" "$pack/deps/include/"
  cp -r /usr/include/catch2 "$pack/deps/catch2/include/"
  cp -r /usr/lib/cmake/Catch2 "$pack/deps/catch2/lib/cmake/"
  [[ -e /usr/lib/libCatch2WithMain.a ]] && cp /usr/lib/libCatch2WithMain.a "$pack/deps/catch2/lib/"
  cp /usr/include/zlib.h /usr/include/zconf.h "$pack/deps/zlib/include/"
  cp -L "$arch_lib/libz.so.1" "$pack/deps/zlib/lib/"
  ln -s libz.so.1 "$pack/deps/zlib/lib/libz.so"
  tar -C "$pack" -cJf "$pack/deps.tar.xz" deps
  rm -rf "$pack/deps"
  cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$pack/fashion-mnist/"
  du -sh "$pack"
  echo "carry build-gpupack: run(command=\"scripts/gpu-check.sh\", carry=[\"build-gpupack\"], timeout_s=600)"
  exit 0
fi

# ---------------------------------------------------------------------------------------------------
out="${OUT:-$repo/build-gpu/out}"
mkdir -p "$out"
build="$repo/build-gpu"
summary="$out/summary.md"
t_start=$(date +%s)
budget="${GPU_CHECK_BUDGET_S:-470}"  # the whole check; each phase gets at most what is left of it
# limit <seconds>: that, or less when the budget has less left (at least 5 s).
limit() {
  local left=$((budget - ($(date +%s) - t_start)))
  ((left < 5)) && left=5
  echo $(($1 < left ? $1 : left))
}
jobs="$(nproc 2>/dev/null || echo 4)"
note() { echo "$*" | tee -a "$summary"; }
: >"$summary"
note "# trainkit CUDA check ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
note ""

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  note "No GPU on this machine (nvidia-smi finds none): nothing to check here; the GPU run is owed."
  exit 77
fi
note "- device: $(nvidia-smi -L | head -n 1)"
note "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
note "- nvcc: $(command -v nvcc || echo /usr/local/cuda/bin/nvcc) $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | grep -o 'release [0-9.]*')"
note "- host compiler: $(g++ --version | head -n 1); cmake: $(cmake --version | head -n 1)"

# Dependencies: the pack when carried, else whatever the machine has.
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DTRAINKIT_CUDA=ON -DTRAINKIT_WERROR=OFF -DTRAINKIT_BUILD_TESTS=ON
  -DTRAINKIT_BUILD_EXAMPLES=ON -DTRAINKIT_BUILD_BENCHMARKS=ON)
[[ -x /usr/local/cuda/bin/nvcc ]] && cmake_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
data_dir=/usr/share/datasets/fashion-mnist
if [[ -f "$pack/deps.tar.xz" ]]; then
  deps=/tmp/trainkit-gpudeps
  rm -rf "$deps" && mkdir -p "$deps" && tar -C "$deps" -xJf "$pack/deps.tar.xz"
  d="$deps/deps"
  export LD_LIBRARY_PATH="$d/lib:$d/zlib/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  cmake_args+=("-DBLAS_LIBRARIES=$d/lib/libopenblas.so" "-DTRAINKIT_CBLAS_INCLUDE_DIR=$d/include"
    "-DCatch2_DIR=$d/catch2/lib/cmake/Catch2" "-DZLIB_ROOT=$d/zlib"
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$d/lib -Wl,-rpath,$d/lib")
  note "- CPU dependencies: from build-gpupack/deps.tar.xz"
fi
[[ -d "$pack/fashion-mnist" ]] && data_dir="$pack/fashion-mnist"
cmake_args+=("-DTRAINKIT_FASHION_MNIST_DIR=$data_dir")
# cuDNN and NCCL: the toolkit's, or PyTorch's wheels (nvidia-cudnn-cu13, nvidia-nccl-cu13).
py_pkg() { python3 -c "import importlib; m = importlib.import_module('nvidia.$1'); print(list(m.__path__)[0])" 2>/dev/null; }
for lib in cudnn nccl; do
  if ! ls /usr/local/cuda/include/$lib.h >/dev/null 2>&1; then
    root="$(py_pkg $lib)"
    if [[ -n "$root" ]]; then
      upper="$(echo $lib | tr a-z A-Z)"
      cmake_args+=("-D${upper}_ROOT=$root")
      export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      note "- $lib: $root (Python wheel)"
    fi
  fi
done
note ""

# ---------------------------------------------------------------------------------------------------
note "## Build"
t0=$(date +%s)
{
  timeout "$(limit 60)" cmake -S "$repo" -B "$build" -G Ninja "${cmake_args[@]}" &&
    timeout "$(limit 300)" cmake --build "$build" --target trainkit_cuda_all -j "$jobs"
} >"$out/build.log" 2>&1
build_rc=$?
t1=$(date +%s)
note "- configure + build of the CUDA targets: $((t1 - t0)) s with $jobs jobs, exit status $build_rc"
if ((build_rc != 0)); then
  note ""
  note '```'
  grep -E "error|Error|FAILED" "$out/build.log" | head -n 40 | tee -a "$summary"
  note '```'
fi
note ""

# ---------------------------------------------------------------------------------------------------
note "## Tests (ctest -L cuda)"
test_rc=1
if [[ -d "$build" ]]; then
  timeout "$(limit 150)" ctest --test-dir "$build" -L cuda -E example --output-on-failure -j 2 >"$out/ctest.log" 2>&1
  test_rc=$?
  note '```'
  grep -E "Test +#[0-9]+:|tests passed" "$out/ctest.log" >>"$summary"
  note '```'
  # The failing assertions, if any.
  if ((test_rc != 0)); then
    note ""
    note "Failures (first 60 lines):"
    note '```'
    grep -B2 -A8 -E "FAILED|REQUIRE|with expansion|Catch::|what\(\)" "$out/ctest.log" | head -n 60 >>"$summary"
    note '```'
  fi
fi
note ""

# ---------------------------------------------------------------------------------------------------
note "## Example: fashion_mnist_cnn_cuda, one epoch"
example_rc=1
ex="$build/examples/fashion_mnist_cnn_cuda"
if [[ -x "$ex" ]]; then
  : >"$out/examples.log"
  example_rc=0
  for prec in fp32 bf16; do
    echo "=== --precision $prec" >>"$out/examples.log"
    timeout "$(limit 75)" "$ex" --data "$data_dir" --epochs 1 --precision "$prec" >>"$out/examples.log" 2>&1 || example_rc=1
  done
  note '```'
  grep -E "===|epoch|precision|error|fashion_mnist" "$out/examples.log" | tee -a "$summary" >/dev/null
  note '```'
fi
note ""

# ---------------------------------------------------------------------------------------------------
note "## Benchmarks (trainkit vs PyTorch eager, same machine, same run)"
bench_rc=1
: >"$out/bench_trainkit.jsonl"
: >"$out/bench.log"
if [[ -x "$build/benchmarks/bench_cuda_bandwidth" ]]; then
  timeout "$(limit 40)" "$build/benchmarks/bench_cuda_bandwidth" >>"$out/bench_trainkit.jsonl" 2>>"$out/bench.log"
  timeout "$(limit 60)" "$build/benchmarks/bench_cuda_train_step" >>"$out/bench_trainkit.jsonl" 2>>"$out/bench.log"
  PYTHONUNBUFFERED=1 timeout "$(limit 100)" python3 "$repo/benchmarks/compare_pytorch_cuda.py" >"$out/bench_pytorch.jsonl" \
    2>>"$out/bench.log"
  python3 "$repo/benchmarks/compare_pytorch_cuda.py" --compare "$out/bench_trainkit.jsonl" "$out/bench_pytorch.jsonl" \
    >"$out/compare.md" 2>>"$out/bench.log"
  bench_rc=$?
  cat "$out/compare.md" >>"$summary"
  rm -f "$out/compare.md"
fi
note ""

# ---------------------------------------------------------------------------------------------------
t_end=$(date +%s)
status="FAILED"
((build_rc == 0 && test_rc == 0 && example_rc == 0 && bench_rc == 0)) && status="passed"
note "## Result: $status (build $build_rc, tests $test_rc, example $example_rc, benchmarks $bench_rc; $((t_end - t_start)) s in all)"
[[ "$status" == passed ]]
