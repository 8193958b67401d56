// GEMM through trainkit::matmul against calling cblas_sgemm directly on the same shapes.
// The ratio of the two is what matters (issue goal: trainkit >= 0.9x of raw sgemm).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <random>

#include "trainkit/trainkit.hpp"

namespace {
using trainkit::index_t;
using trainkit::tensor;

tensor<float> random_tensor(trainkit::shape s) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(static_cast<std::size_t>(trainkit::numel(s)));
  for (auto& x : v) x = u(rng);
  return tensor<float>::from_vector(v, s);
}

// Shapes of the MLP/CNN training steps: {M, N, K}.
void shapes(benchmark::internal::Benchmark* b) {
  b->Args({128, 512, 784})->Args({128, 512, 512})->Args({128, 10, 512})->Args({784, 512, 128})
      ->Args({512, 512, 512})->Args({1024, 1024, 1024});
}

void bm_trainkit_matmul(benchmark::State& st) {
  const index_t m = st.range(0), n = st.range(1), k = st.range(2);
  auto a = random_tensor({m, k}), b = random_tensor({k, n});
  for (auto _ : st) benchmark::DoNotOptimize(trainkit::matmul(a, b).data());
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}
void bm_trainkit_matmul_transposed_b(benchmark::State& st) {
  const index_t m = st.range(0), n = st.range(1), k = st.range(2);
  auto a = random_tensor({m, k}), w = random_tensor({n, k});  // linear layer layout
  for (auto _ : st) benchmark::DoNotOptimize(trainkit::matmul(a, w.t()).data());
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}
void bm_cblas_sgemm(benchmark::State& st) {
  const index_t m = st.range(0), n = st.range(1), k = st.range(2);
  auto a = random_tensor({m, k}), b = random_tensor({k, n});
  for (auto _ : st) {
    // Allocate the output each time, as matmul does, so only the call overhead differs.
    auto c = tensor<float>::empty({m, n});
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.f, a.data(), int(k),
                b.data(), int(n), 0.f, c.data(), int(n));
    benchmark::DoNotOptimize(c.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}
}  // namespace

BENCHMARK(bm_cblas_sgemm)->Apply(shapes);
BENCHMARK(bm_trainkit_matmul)->Apply(shapes);
BENCHMARK(bm_trainkit_matmul_transposed_b)->Apply(shapes);
BENCHMARK_MAIN();
