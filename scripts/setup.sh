#!/usr/bin/env bash
# scripts/setup.sh - from a clean clone on Debian 12: install what the first example needs, build
# it (Release, Ninja, in build/) and train the Fashion-MNIST CNN for one epoch. It builds only
# that example (a few minutes on 2 cores, package installs included); the last line it prints says
# how to build the rest.
#
#   scripts/setup.sh            (from any directory)
#   scripts/setup.sh --all      also the other examples' and the benchmarks' packages (MPI, Google
#                               Benchmark, cpp-httplib), and every target: all examples, the
#                               benchmarks, and the CUDA ones where nvcc is installed
#   JOBS=8 scripts/setup.sh     (parallel build jobs; default: the number of cores)
#
# The tests are built and run by scripts/test.sh, in build-test/ (it installs what only the tests
# need: Catch2, clang, Slurm, munge, Prometheus, ...); build/ holds the examples and benchmarks.
set -euo pipefail

all=0
for arg in "$@"; do
  case "$arg" in
    --all) all=1 ;;
    -h | --help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
data_dir=/usr/share/datasets/fashion-mnist

# shellcheck source=scripts/deps.sh
source "$repo_root/scripts/deps.sh"
if ((all)); then
  trainkit_install_deps "${TRAINKIT_SETUP_PACKAGES[@]}" "${TRAINKIT_EXAMPLE_PACKAGES[@]}"
  trainkit_install_cudnn_frontend
else
  trainkit_install_deps "${TRAINKIT_SETUP_PACKAGES[@]}"
fi

cmake -S "$repo_root" -B "$repo_root/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DTRAINKIT_BUILD_TESTS=OFF \
  -DTRAINKIT_BUILD_EXAMPLES=ON \
  -DTRAINKIT_BUILD_BENCHMARKS=ON
if ((all)); then
  cmake --build "$repo_root/build" -j "$jobs"
else
  cmake --build "$repo_root/build" -j "$jobs" --target fashion_mnist_cnn
fi

"$repo_root/build/examples/fashion_mnist_cnn" --data "$data_dir" --epochs 1
if ((!all)); then
  echo "setup.sh: built build/examples/fashion_mnist_cnn only; the other examples and the benchmarks" \
    "(and the CUDA ones, with nvcc): scripts/setup.sh --all"
fi
