// tests/cuda/catch_main.cu - Catch2's main for the CUDA tests: without a usable CUDA device the
// test executable reports itself skipped (exit code 77, CTest's SKIP_RETURN_CODE) instead of failing,
// so that CI machines without a GPU build and list these tests but do not run them.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdio>

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
  return Catch::Session().run(argc, argv);
}
