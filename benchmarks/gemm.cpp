// GEMM through trainkit::matmul against calling cblas_sgemm directly on the same shapes.
// The ratio of the two is what matters (issue goal: trainkit >= 0.9x of raw sgemm).
//
// And blas<cpu>::gemm with the route forced (backend/cpu/onednn_route.hpp), fp32 and bfloat16, on the
// shapes of the MLP/CNN steps: OpenBLAS (16-bit widened to fp32 sgemm) against oneDNN. These rows
// chose onednn_prefers_f32(); the figures are in benchmarks/README.md.
//
//   build/benchmarks/bench_gemm --benchmark_filter=blas_gemm --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output
#include <cblas.h>

#include <random>
#include <vector>

#include "trainkit/trainkit.hpp"

namespace {
using trainkit::index_t;
using trainkit::tensor;
using trainkit::backend::cpu_gemm_route;

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

// {M, N, K, trans_a, trans_b}: the GEMMs blas<cpu>::gemm gets from the training steps, plus squares.
void blas_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "ta", "tb"});
  // MLP 784-512-512-10, batch 128: forward x W^T, backward dX = dY W, dW = dY^T X.
  b->Args({128, 512, 784, 0, 1})->Args({128, 512, 512, 0, 1})->Args({128, 10, 512, 0, 1});
  b->Args({128, 784, 512, 0, 0})->Args({128, 512, 10, 0, 0})->Args({512, 784, 128, 1, 0})->Args({10, 512, 128, 1, 0});
  // bench_amp_checkpoint: 16 x Linear(256, 256), batch 256.
  b->Args({256, 256, 256, 0, 1});
  // CNN, one image per call: conv2 forward W [64, 288] @ col [288, 196], its dW and dcol.
  b->Args({64, 196, 288, 0, 0})->Args({64, 288, 196, 0, 1})->Args({288, 196, 64, 1, 0});
  // CNN head: Linear(3136, 128), Linear(128, 10); dX of the first.
  b->Args({128, 128, 3136, 0, 1})->Args({128, 3136, 128, 0, 0});
  // Squares.
  b->Args({512, 512, 512, 0, 0})->Args({1024, 1024, 1024, 0, 0});
}

template <class T>
void bm_blas_gemm(benchmark::State& st, cpu_gemm_route route) {
  const index_t m = st.range(0), n = st.range(1), k = st.range(2);
  const bool ta = st.range(3) != 0, tb = st.range(4) != 0;
  const auto a32 = random_tensor({m, k}), b32 = random_tensor({k, n});
  const std::vector<T> a(a32.data(), a32.data() + m * k), b(b32.data(), b32.data() + k * n);
  std::vector<T> c(std::size_t(m * n));
  const cpu_gemm_route saved = trainkit::backend::get_cpu_gemm_route();
  trainkit::backend::set_cpu_gemm_route(route);
  for (auto _ : st) {
    trainkit::backend::blas<trainkit::cpu>::gemm<T>(ta, tb, m, n, k, 1.0, a.data(), ta ? m : k, b.data(), tb ? k : n,
                                                    0.0, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  trainkit::backend::set_cpu_gemm_route(saved);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}
template <class T>
void bm_blas_gemm_openblas(benchmark::State& st) {
  bm_blas_gemm<T>(st, cpu_gemm_route::openblas);
}
template <class T>
void bm_blas_gemm_onednn(benchmark::State& st) {
  bm_blas_gemm<T>(st, cpu_gemm_route::onednn);
}
}  // namespace

BENCHMARK(bm_cblas_sgemm)->Apply(shapes);
BENCHMARK(bm_trainkit_matmul)->Apply(shapes);
BENCHMARK(bm_trainkit_matmul_transposed_b)->Apply(shapes);

BENCHMARK_TEMPLATE(bm_blas_gemm_openblas, float)->Apply(blas_shapes);
BENCHMARK_TEMPLATE(bm_blas_gemm_openblas, trainkit::bfloat16)->Apply(blas_shapes);
#if TRAINKIT_HAS_ONEDNN
BENCHMARK_TEMPLATE(bm_blas_gemm_onednn, float)->Apply(blas_shapes);
BENCHMARK_TEMPLATE(bm_blas_gemm_onednn, trainkit::bfloat16)->Apply(blas_shapes);
#endif
BENCHMARK_MAIN();
