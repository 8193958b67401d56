// Elementwise ops and reductions on the host: dense, broadcast and strided operands, in GB/s.
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output

#include "trainkit/trainkit.hpp"

namespace {
using trainkit::index_t;
using trainkit::tensor;

void sizes(benchmark::internal::Benchmark* b) { b->Arg(1 << 12)->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24); }

void bytes(benchmark::State& st, double per_element) {
  st.counters["GB/s"] = benchmark::Counter(per_element * double(st.range(0)), benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}

void bm_add_dense(benchmark::State& st) {
  auto a = tensor<float>::ones({st.range(0)}), b = tensor<float>::ones({st.range(0)});
  for (auto _ : st) benchmark::DoNotOptimize((a + b).data());
  bytes(st, 12);
}
void bm_add_inplace(benchmark::State& st) {
  auto a = tensor<float>::ones({st.range(0)}), b = tensor<float>::ones({st.range(0)});
  for (auto _ : st) {
    trainkit::add_(a, b, 0.5);
    benchmark::DoNotOptimize(a.data());
  }
  bytes(st, 12);
}
void bm_bias_broadcast(benchmark::State& st) {
  const index_t n = st.range(0) / 512;
  auto a = tensor<float>::ones({n, 512}), b = tensor<float>::ones({512});
  for (auto _ : st) benchmark::DoNotOptimize((a + b).data());
  bytes(st, 8);
}
void bm_gelu(benchmark::State& st) {
  auto a = tensor<float>::ones({st.range(0)});
  for (auto _ : st) benchmark::DoNotOptimize(trainkit::gelu(a).data());
  bytes(st, 8);
}
void bm_transpose_copy(benchmark::State& st) {
  const index_t n = st.range(0) / 512;
  auto a = tensor<float>::ones({n, 512});
  for (auto _ : st) benchmark::DoNotOptimize(a.t().contiguous().data());
  bytes(st, 8);
}
void bm_sum_rows(benchmark::State& st) {
  const index_t n = st.range(0) / 512;
  auto a = tensor<float>::ones({n, 512});
  for (auto _ : st) benchmark::DoNotOptimize(trainkit::sum(a, {1}).data());
  bytes(st, 4);
}
void bm_sum_cols(benchmark::State& st) {
  const index_t n = st.range(0) / 512;
  auto a = tensor<float>::ones({n, 512});
  for (auto _ : st) benchmark::DoNotOptimize(trainkit::sum(a, {0}).data());
  bytes(st, 4);
}
void bm_sum_all(benchmark::State& st) {
  auto a = tensor<float>::ones({st.range(0)});
  for (auto _ : st) benchmark::DoNotOptimize(trainkit::sum(a).data());
  bytes(st, 4);
}
}  // namespace

BENCHMARK(bm_add_dense)->Apply(sizes);
BENCHMARK(bm_add_inplace)->Apply(sizes);
BENCHMARK(bm_bias_broadcast)->Apply(sizes);
BENCHMARK(bm_gelu)->Apply(sizes);
BENCHMARK(bm_transpose_copy)->Apply(sizes);
BENCHMARK(bm_sum_rows)->Apply(sizes);
BENCHMARK(bm_sum_cols)->Apply(sizes);
BENCHMARK(bm_sum_all)->Apply(sizes);
BENCHMARK_MAIN();
