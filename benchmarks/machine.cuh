// benchmarks/machine.cuh - the first line of every CUDA benchmark's output names the machine it
// ran on: the CPU (model, the features trainkit's host kernels choose by, an ISA limit in force;
// as cpu_context.hpp puts it in the C++ benchmarks' context) and the GPU (name, compute capability,
// memory), so that figures from different machines can be told apart.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#include "trainkit/backend/cpu/cpu_features.hpp"

inline void print_machine() {
  cudaDeviceProp p{};
  int device = 0;
  const bool known = cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&p, device) == cudaSuccess;
  std::printf("machine: %s; GPU: %s (sm_%d%d, %.1f GiB)\n", trainkit::backend::cpu_features::describe().c_str(),
              known ? p.name : "unknown", p.major, p.minor, double(p.totalGlobalMem) / double(1ull << 30));
}
