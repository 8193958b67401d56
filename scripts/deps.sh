# shellcheck shell=bash
# scripts/deps.sh - sourced by setup.sh and test.sh: install the Debian packages trainkit needs
# (setup.sh: the first example's; test.sh: everything).
# (No shebang: it is a library of functions, not a program.)

# What scripts/setup.sh needs on Debian 12: the compiler and the build tools, the libraries the
# CPU library uses, and the data set the first example trains on.
TRAINKIT_SETUP_PACKAGES=(
  build-essential   # g++ 12, make, libc headers
  cmake             # >= 3.25
  ninja-build
  libopenblas-dev   # CBLAS: GEMM and friends
  libopenblas-openmp-dev  # the OpenMP build of OpenBLAS: shares the thread pool with our kernels
  libdnnl-dev       # oneDNN: bf16 GEMM (AVX512-BF16/AMX) and faster small fp32 GEMMs on the CPU
  zlib1g-dev        # gzip'd IDX files
  dataset-fashion-mnist  # /usr/share/datasets/fashion-mnist/*.gz for tests and examples
)
# What the other examples and the benchmarks add (scripts/setup.sh --all), and what the test suite
# adds on top (scripts/test.sh installs all three lists).
TRAINKIT_EXAMPLE_PACKAGES=(
  libopenmpi-dev    # MPI communicator (dist/mpi.hpp): the data-parallel example, tests/mpi
  openmpi-bin       # mpirun
  libbenchmark-dev  # benchmarks/
  libcpp-httplib-dev  # trainkit::monitor_http: the Prometheus /metrics endpoint
  fortunes-min      # /usr/share/games/fortunes/*: the GPT example's default text (98 000 characters)
)
TRAINKIT_TEST_PACKAGES=(
  pkg-config        # the pkg-config package test
  doxygen           # the API reference: scripts/docs.sh, ctest docs_doxygen (fails on any warning)
  catch2            # Catch2 v2, <catch2/catch.hpp>
  prometheus        # a real Prometheus server scrapes a training run (tests/monitor, examples/)
  curl              # the example test asks the Prometheus HTTP API
  slurm-wlm         # slurmctld, slurmd, sbatch, salloc, srun: the Slurm test (requeue, faults) runs a one-node cluster
  munge             # munged: Slurm's authentication, started by that test with its own key
  clang             # clang++ for the libFuzzer harnesses: scripts/fuzz.sh, tests/fuzz/
  libclang-rt-dev   # libclang-rt-14-dev: libFuzzer and the sanitizer runtimes (only a Recommends of clang)
  time              # GNU time: benchmarks/compile_time.sh reads the compiler's CPU time and peak memory
)
TRAINKIT_DEBIAN_PACKAGES=("${TRAINKIT_SETUP_PACKAGES[@]}" "${TRAINKIT_EXAMPLE_PACKAGES[@]}" "${TRAINKIT_TEST_PACKAGES[@]}")

# trainkit_package_installed <pkg>: true when dpkg reports it fully installed.
trainkit_package_installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

# trainkit_install_deps [package ...]: apt-get install whatever of the packages (default: all of
# TRAINKIT_DEBIAN_PACKAGES) is missing; nothing (not even apt-get update) when all are there. Uses
# sudo when not root.
trainkit_install_deps() {
  local missing=() pkg
  local -a wanted=("$@")
  ((${#wanted[@]})) || wanted=("${TRAINKIT_DEBIAN_PACKAGES[@]}")
  for pkg in "${wanted[@]}"; do
    trainkit_package_installed "$pkg" || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    echo "deps: all Debian packages present"
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: missing ${missing[*]}, and apt-get is not available; install them by hand" >&2
    return 1
  fi

  local -a sudo=()
  if ((EUID != 0)); then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "deps: missing ${missing[*]}; run as root or install sudo" >&2
      return 1
    fi
  fi

  echo "deps: installing ${missing[*]}"
  # Wait for another apt/dpkg (unattended-upgrades, a parallel setup) rather than fail at once.
  local -a apt_opts=(-o DPkg::Lock::Timeout=600)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends \
    "${missing[@]}"
}

# trainkit_install_cudnn_frontend: where nvcc is installed, the cuDNN frontend's C++ headers from
# PyPI (nvidia-cudnn-frontend; --no-deps: its Python half's dependencies are not needed), which
# trainkit::cudnn_frontend (cuDNN's fused attention on the GPU) builds with. Best effort: without it
# the CUDA attention runs on trainkit's own kernels and the build says so.
trainkit_install_cudnn_frontend() {
  { command -v nvcc || ls /usr/local/cuda/bin/nvcc; } >/dev/null 2>&1 || return 0
  python3 -c 'import sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "include", "cudnn_frontend.h")) else 1)' \
    >/dev/null 2>&1 && return 0
  { python3 -m pip install --quiet --no-deps nvidia-cudnn-frontend ||
    python3 -m pip install --quiet --no-deps --break-system-packages nvidia-cudnn-frontend; } >/dev/null 2>&1 ||
    echo "could not pip install nvidia-cudnn-frontend: CUDA attention will be built on trainkit's kernels only"
}
