#!/usr/bin/env bash
# scripts/test.sh - the whole test suite, as CI runs it (.ci/run).
#
#   scripts/test.sh             ASan+UBSan suite (build-asan/), then the main suite (build-test/)
#   scripts/test.sh --no-asan   the main suite only (quick local runs)
#   scripts/test.sh --no-fuzz   without the fuzz stage
#   FUZZ_SECONDS=60 scripts/test.sh   run each libFuzzer harness this long (default 30)
#   JOBS=4 scripts/test.sh      parallel build and test jobs (default 2)
#
# build-test/:  -O2 (the test files -O1; no -g: it costs build time CI does not need), -Wall -Wextra -Werror; every ctest test.
# fuzz:         scripts/fuzz.sh runs the libFuzzer harnesses of the IDX, CIFAR-10 and snapshot readers
#               (tests/fuzz/) for FUZZ_SECONDS each; skipped, visibly, without clang++.
# build-asan/:  Debug -O0 -g1 (line tables: file:line in every sanitizer stack, 23 % less compile
#               time than -g; -O0: 548 s of compiler time against 1073 s at -O1, for 53 s more of
#               test time, and nothing optimised away from the checks; unoptimised stack frames
#               also found a recursive graph teardown), -fsanitize=address,undefined, -Werror; neither examples nor benchmarks
#               are built (their smoke tests, label "example", and the package tests, label
#               "package", which build without sanitizers anyway, are run by the main suite only).
# Exit status: nonzero if any build or test failed. The last line printed is the main suite's ctest
# summary ("NN% tests passed, N tests failed out of M").
set -uo pipefail

usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

run_asan=1
run_fuzz=1
for arg in "$@"; do
  case "$arg" in
    --no-asan) run_asan=0 ;;
    --no-fuzz) run_fuzz=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${JOBS:-2}"

# shellcheck source=scripts/deps.sh
source "$repo_root/scripts/deps.sh"
trainkit_install_deps || exit 1
# Conan (PyPI) for the package_conan_create test; best effort: without it that test is skipped,
# visibly, and everything else runs.
if ! command -v conan >/dev/null 2>&1; then
  python3 -m pip install --quiet conan >/dev/null 2>&1 ||
    echo "test.sh: could not pip install conan; package_conan_create will be skipped"
fi
# TensorBoard (PyPI) reads the event files trainkit writes (monitor_tensorboard_python,
# example_fashion_mnist_mlp_tensorboard); best effort: without it those tests are skipped, visibly.
if ! python3 -c 'import tensorboard' >/dev/null 2>&1; then
  { python3 -m pip install --quiet tensorboard || python3 -m pip install --quiet --break-system-packages tensorboard; } \
    >/dev/null 2>&1 || echo "test.sh: could not pip install tensorboard; the TensorBoard reader tests will be skipped"
fi

trainkit_install_cudnn_frontend  # cuDNN's fused attention (CUDA builds; scripts/deps.sh)

# suite <name> <build dir> <ctest args...> -- <cmake configure args...>
# Configures, builds and runs ctest (even after a failed build: whatever did build is tested); the
# ctest output also goes to <build dir>/ctest.log.
suite() {
  local name="$1" dir="$2"
  shift 2
  local -a ctest_args=()
  while (($#)) && [[ "$1" != "--" ]]; do ctest_args+=("$1"); shift; done
  shift  # the --
  rm -f "$dir/ctest.log"  # never report a summary left over from an earlier run
  echo "=== [$name] configure $dir"
  cmake -S "$repo_root" -B "$dir" -G Ninja "$@" || return 1
  echo "=== [$name] build"
  # -k 0: build every target that can be built, so one broken test file does not hide the others;
  # its test then fails in ctest ("Could not find executable") and the summary counts it.
  local build_rc=0
  cmake --build "$dir" -j "$jobs" -- -k 0 || build_rc=$?
  echo "=== [$name] ctest"
  # Kernel routes measured by the tests go to a route file of this build tree, shared by its tests
  # (backend/cpu/measured_route.hpp), not to the user's cache.
  TRAINKIT_ROUTE_CACHE="${TRAINKIT_ROUTE_CACHE:-$dir/cpu-routes}" \
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" "${ctest_args[@]}" 2>&1 | tee "$dir/ctest.log"
  local ctest_rc="${PIPESTATUS[0]}"
  if ((build_rc != 0)); then
    echo "=== [$name] build FAILED (see the compiler errors above)"
    return 1
  fi
  return "$ctest_rc"
}

# The CPU the figures and skips below belong to (tests of kernels it lacks print "SKIPPED: ...").
echo "=== CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'); flags:" \
  "$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512_bf16|amx_bf16|avx_ne_convert)$' | tr '\n' ' ')" \
  "${TRAINKIT_MAX_CPU_ISA:+(limited: TRAINKIT_MAX_CPU_ISA=$TRAINKIT_MAX_CPU_ISA)}"

asan_status=skipped
if ((run_asan)); then
  # LeakSanitizer stays on; a UBSan finding aborts the test (-fno-sanitize-recover) with a stack.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  # (Nor the compile-fail tests, label "compile_fail": they check diagnostics, which sanitizers do not
  # change; the main suite runs them. 76 s of compiler time.)
  if suite asan "$repo_root/build-asan" -LE "example|package|compile_fail" -- \
      -DCMAKE_BUILD_TYPE=Debug \
      "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g1" \
      -DTRAINKIT_SANITIZE=ON \
      -DTRAINKIT_WERROR=ON \
      -DTRAINKIT_BUILD_TESTS=ON \
      -DTRAINKIT_BUILD_EXAMPLES=OFF \
      -DTRAINKIT_BUILD_BENCHMARKS=OFF; then
    asan_status=passed
  else
    asan_status=FAILED
  fi
  unset ASAN_OPTIONS UBSAN_OPTIONS
fi

fuzz_status=skipped
if ((run_fuzz)); then
  echo "=== [fuzz] scripts/fuzz.sh ${FUZZ_SECONDS:-30}"
  "$repo_root/scripts/fuzz.sh" "${FUZZ_SECONDS:-30}"
  case $? in
    0) fuzz_status=passed ;;
    77) fuzz_status="skipped (no clang++)" ;;
    *) fuzz_status=FAILED ;;
  esac
fi

main_status=FAILED
# -O2 without -DNDEBUG: asserts stay on in tests; no -g, which slows every compile and link. The
# .cu files are only compiled and linked here - they run where a GPU is, from gpu-check's Release
# build, which shows GCC's flow warnings (-Wmaybe-uninitialized) on their host code; the CPU build
# sees the same headers at -O2. So their host pass is at -O0 (150 s of compiler time less than -O1
# for the 14 files), and their device code in nvcc's fast-compile mode where it has one (-Ofc=max,
# CUDA 12.8+; still sm_90 machine code + compute_90 PTX, with every error): gpt_char.cu took 142 s
# of compiler time, 81 s with it (cicc 48 -> 23 s, ptxas 28 -> 3 s).
# (The help is read whole: `nvcc --help | grep -q` fails under pipefail when grep stops reading.)
cuda_check_flags="-O0"
nvcc_path="$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)"
if [[ -n "$nvcc_path" ]] && [[ "$("$nvcc_path" --help 2>/dev/null)" == *"--Ofast-compile"* ]]; then
  cuda_check_flags="-O0 -Ofc=max"
fi
echo "=== .cu files in the main suite: $cuda_check_flags"
# The C++ benchmarks are only compiled here too: they link trainkit::precompiled (not for figures).
# The test files at -O1 (TRAINKIT_TESTS_CXX_FLAGS; the float ops they call come from
# trainkit::precompiled at -O2, as the examples' do): 273 s of compiler time against 446 s, for 3 s
# more of unit-test time.
if suite main "$repo_root/build-test" -- \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2" \
    "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=$cuda_check_flags" \
    -DTRAINKIT_TESTS_CXX_FLAGS=-O1 \
    -DTRAINKIT_WERROR=ON \
    -DTRAINKIT_SANITIZE=OFF "-DTRAINKIT_CUDA=$([[ -n "$nvcc_path" ]] && echo ON || echo OFF)" \
    -DTRAINKIT_BUILD_TESTS=ON \
    -DTRAINKIT_BUILD_EXAMPLES=ON \
    -DTRAINKIT_BUILD_BENCHMARKS=ON \
    -DTRAINKIT_BENCHMARKS_PRECOMPILED=ON; then
  main_status=passed
fi

echo
echo "=== asan suite (build-asan): $asan_status"
echo "=== fuzz (build-fuzz): $fuzz_status"
echo "=== main suite (build-test): $main_status"
summary="$(grep -E '^[0-9]+% tests passed' "$repo_root/build-test/ctest.log" 2>/dev/null | tail -n 1)"
if [[ -n "$summary" ]]; then
  echo "$summary"
else
  echo "0% tests passed: the main suite did not build or ctest did not run (see above)"
fi

[[ "$main_status" == passed && "$asan_status" != FAILED && "$fuzz_status" != FAILED ]]
