#!/usr/bin/env bash
# scripts/setup.sh - from a clean clone on Debian 12: install what is missing, build trainkit
# (Release, Ninja, in build/) and train the Fashion-MNIST CNN for one epoch.
#
#   scripts/setup.sh            (from any directory)
#   JOBS=8 scripts/setup.sh     (parallel build jobs; default 2)
#
# The tests are built and run by scripts/test.sh, in build-test/; build/ holds only the library's
# examples and benchmarks.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${JOBS:-2}"
data_dir=/usr/share/datasets/fashion-mnist

# shellcheck source=scripts/deps.sh
source "$repo_root/scripts/deps.sh"
trainkit_install_deps

cmake -S "$repo_root" -B "$repo_root/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DTRAINKIT_BUILD_TESTS=OFF \
  -DTRAINKIT_BUILD_EXAMPLES=ON \
  -DTRAINKIT_BUILD_BENCHMARKS=ON
cmake --build "$repo_root/build" -j "$jobs"

"$repo_root/build/examples/fashion_mnist_cnn" --data "$data_dir" --epochs 1
