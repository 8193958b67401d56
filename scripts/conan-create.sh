#!/usr/bin/env bash
# scripts/conan-create.sh [WORK_DIR] [-- extra `conan create` arguments] - package trainkit with
# Conan 2 and run test_package/, in an isolated Conan home, offline.
#
#   scripts/conan-create.sh                     # WORK_DIR: a temporary directory, removed afterwards
#   scripts/conan-create.sh build/conan         # CONAN_HOME=build/conan/conan-home (recreated)
#   scripts/conan-create.sh build/conan -- -o "trainkit/*:with_cuda=True"
#
# What it runs, with CONAN_HOME=WORK_DIR/conan-home (the user's own ~/.conan2 is never touched):
#   conan profile detect
#   conan remote disable "*"        # every requirement is a system package: nothing to download
#   conan create <repo>             # the default package (with_mpi=False, with_cuda=False)
#   conan create <repo> -o "trainkit/*:with_mpi=True"    # when MPI's pkg-config file is there
#   conan create <repo> -o "trainkit/*:with_cuda=True"   # when nvcc, cuDNN and NCCL are there
# Each `conan create` packages the headers, then builds and runs test_package/ (a small model
# trained for a few steps; with with_mpi also a singleton-MPI allreduce; with with_cuda a host
# program linked with the CUDA libraries and a .cu file compiled with trainkit::cuda's flags).
#
# Exit status: 0 when every `conan create` succeeded; 77 ("SKIPPED: ...") when conan is not
# installed; anything else is a failure. TRAINKIT_CONAN_JOBS sets tools.build:jobs (default: nproc).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v conan >/dev/null 2>&1; then
  echo "SKIPPED: conan not installed (pip install conan)"
  exit 77
fi

work=""
if (($# > 0)) && [[ "$1" != "--" ]]; then
  work="$1"
  shift
fi
if (($# > 0)) && [[ "$1" == "--" ]]; then
  shift
fi
extra=("$@")

cleanup=""
if [[ -z "$work" ]]; then
  work="$(mktemp -d "${TMPDIR:-/tmp}/trainkit-conan.XXXXXX")"
  cleanup="$work"
fi
mkdir -p "$work"
work="$(cd "$work" && pwd)"
if [[ -n "$cleanup" ]]; then
  trap 'rm -rf "$cleanup"' EXIT
fi

export CONAN_HOME="$work/conan-home"
rm -rf "$CONAN_HOME"
mkdir -p "$CONAN_HOME"
jobs="${TRAINKIT_CONAN_JOBS:-$(nproc 2>/dev/null || echo 1)}"

fail() {
  echo "conan-create: FAILED: $*" >&2
  exit 1
}
run() {
  echo "+ $*"
  "$@" || fail "$* (exit $?)"
}

echo "conan-create: $(conan --version), CONAN_HOME=$CONAN_HOME"
run conan profile detect
run conan remote disable "*"

# test_package/ builds under WORK_DIR, not in the source tree (no build/, no CMakeUserPresets.json).
common=(-c "tools.build:jobs=$jobs"
        -c "tools.cmake.cmake_layout:test_folder=$work/test_package-build"
        -c "tools.cmake.cmaketoolchain:user_presets="
        "${extra[@]}")
run conan create "$root" "${common[@]}"

if command -v pkg-config >/dev/null 2>&1 && { pkg-config --exists mpi-c || pkg-config --exists ompi-c; }; then
  run conan create "$root" -o "trainkit/*:with_mpi=True" "${common[@]}"
else
  echo "conan-create: MPI's pkg-config file (mpi-c/ompi-c) not found: with_mpi=True not tried"
fi

# with_cuda: where the CUDA toolkit (nvcc) with cuDNN and NCCL is installed; TRAINKIT_CONAN_CUDA=0
# skips it, =1 requires it. test_package then also compiles a .cu file (no GPU needed to run it).
cuda_root="${CUDA_PATH:-${CUDA_HOME:-/usr/local/cuda}}"
cuda_mode="${TRAINKIT_CONAN_CUDA:-auto}"
if [[ "$cuda_mode" == 1 ]] || { [[ "$cuda_mode" == auto ]] && [[ -x "$cuda_root/bin/nvcc" ]] &&
  [[ -f "$cuda_root/include/cudnn.h" || -f /usr/include/cudnn.h ]] &&
  [[ -f "$cuda_root/include/nccl.h" || -f /usr/include/nccl.h ]]; }; then
  PATH="$cuda_root/bin:$PATH" run conan create "$root" -o "trainkit/*:with_cuda=True" "${common[@]}"
else
  echo "conan-create: no CUDA toolkit with cuDNN and NCCL under $cuda_root: with_cuda=True not tried"
fi

run conan list "trainkit/*"
echo "conan-create: OK"
