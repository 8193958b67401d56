// benchmarks/cpu_context.hpp - every benchmark's output names the CPU it ran on: its model, the
// features trainkit's kernels choose by (avx2 fma f16c avx512 avx512_bf16 ...) and an ISA limit
// in force (TRAINKIT_MAX_CPU_ISA), in Google Benchmark's context ("machine: CPU: ..." above the table, and
// "context" of --benchmark_format=json), and the core OpenBLAS's kernels were chosen for, so that figures
// from different machines can be told apart.
#pragma once

#include <benchmark/benchmark.h>
#include <cblas.h>  // openblas_get_corename, openblas_get_config

#include <string>

#include "trainkit/backend/cpu/cpu_features.hpp"

namespace {
const bool trainkit_bench_cpu_context = [] {
  benchmark::AddCustomContext("machine", trainkit::backend::cpu_features::describe());
  // OpenBLAS picks its kernels by itself (OPENBLAS_CORETYPE=Haswell gives an AVX-512 machine an AVX2
  // machine's sgemm): the core it runs on belongs beside the figures too.
  benchmark::AddCustomContext("openblas", std::string(openblas_get_corename()) + " (" + openblas_get_config() + ")");
  return true;
}();
}  // namespace
