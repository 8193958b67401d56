// tests/cuda/catch_main.cpp - main() of the CUDA tests: without a usable CUDA device the test
// executable reports itself skipped (exit code 77, CTest's SKIP_RETURN_CODE) instead of failing, so
// that CI machines without a GPU build and list these tests but do not run them. Plain C++ (the CUDA
// runtime's host API), Catch2's session from tests/catch_session.cpp.
#include <cuda_runtime.h>

#include <cstdio>

#include "support/catch_session.hpp"

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    std::printf("CUDA device 0: %s, compute capability %d.%d, %d multiprocessors, %.1f GiB\n", p.name, p.major,
                p.minor, p.multiProcessorCount, double(p.totalGlobalMem) / double(1ull << 30));
  return trainkit_test::run_catch_session(argc, argv);
}
