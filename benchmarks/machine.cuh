// benchmarks/machine.cuh - what the CUDA benchmarks share. The first line of every one's output
// names the machine it ran on: the CPU (model, the features trainkit's host kernels choose by, an
// ISA limit in force; as cpu_context.hpp puts it in the C++ benchmarks' context) and the GPU (name,
// compute capability, memory), so that figures from different machines can be told apart. Also
// their command-line flags and the CUDA-event timing of a repeated step.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <trainkit/cuda.cuh>

#include "trainkit/backend/cpu/cpu_features.hpp"

inline void print_machine() {
  cudaDeviceProp p{};
  int device = 0;
  const bool known = cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&p, device) == cudaSuccess;
  std::printf("machine: %s; GPU: %s (sm_%d%d, %.1f GiB)\n", trainkit::backend::cpu_features::describe().c_str(),
              known ? p.name : "unknown", p.major, p.minor, double(p.totalGlobalMem) / double(1ull << 30));
}

/// The start of a CUDA benchmark's main: false (after printing SKIPPED; exit with 77) where there is
/// no GPU, else the machine line printed.
inline bool start_gpu_benchmark() {
  if (!trainkit::gpu::available()) {
    std::printf("SKIPPED: no CUDA device\n");
    return false;
  }
  print_machine();
  return true;
}

/// The value after `name` on the command line, else def.
inline const char* str_flag(int argc, char** argv, const char* name, const char* def = nullptr) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}
inline double flag(int argc, char** argv, const char* name, double def) {
  const char* v = str_flag(argc, argv, name);
  return v != nullptr ? std::atof(v) : def;
}

/// Mean ms per call of step over `steps` calls timed with CUDA events, after `warmup` untimed ones.
template <class F>
double time_steps(int warmup, int steps, F&& step) {
  for (int i = 0; i < warmup; ++i) step();
  trainkit::gpu::synchronize();
  trainkit::gpu::event start(true), stop(true);
  start.record();
  for (int i = 0; i < steps; ++i) step();
  stop.record();
  stop.synchronize();
  return double(trainkit::gpu::event::elapsed_ms(start, stop)) / steps;
}
