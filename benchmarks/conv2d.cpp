// conv2d forward and forward+backward on the CNN example's layer shapes: the bm_conv2d_* rows on
// the route in force (TRAINKIT_CPU_CONV: oneDNN where built with it, else im2col + GEMM), the
// bm_conv2d_route_* rows on each route in fp32 and bfloat16 (the Fashion-MNIST CNN's two convolutions).
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output

#include <utility>  // std::move

#include "trainkit/trainkit.hpp"

#include "inputs.hpp"  // random_input

namespace {
namespace tk = trainkit;
namespace ag = trainkit::autograd;
using tk::index_t;

tk::tensor<float> random_tensor(tk::shape s) { return bench::random_input(std::move(s), 3); }

// Args: batch, in channels, out channels, spatial size (3x3 kernel, padding 1).
void layers(benchmark::internal::Benchmark* b) { b->Args({128, 1, 32, 28})->Args({128, 32, 64, 14})->Args({32, 64, 64, 32}); }

void counters(benchmark::State& st, double passes) {
  const double n = double(st.range(0)), c = double(st.range(1)), o = double(st.range(2)), s = double(st.range(3));
  st.counters["GFLOP/s"] = benchmark::Counter(passes * 2 * n * o * c * 9 * s * s, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}

void bm_conv2d_forward(benchmark::State& st) {
  const index_t n = st.range(0), c = st.range(1), o = st.range(2), s = st.range(3);
  tk::var<float> x(random_tensor({n, c, s, s})), w(random_tensor({o, c, 3, 3})), b(random_tensor({o}));
  tk::no_grad g;
  for (auto _ : st) benchmark::DoNotOptimize(ag::conv2d(x, w, b, {.padding = {1, 1}}).value().data());
  counters(st, 1);
}

void bm_conv2d_forward_backward(benchmark::State& st) {
  const index_t n = st.range(0), c = st.range(1), o = st.range(2), s = st.range(3);
  tk::var<float> x(random_tensor({n, c, s, s}), true), w(random_tensor({o, c, 3, 3}), true), b(random_tensor({o}), true);
  auto r = tk::var<float>(random_tensor({n, o, s, s}));
  for (auto _ : st) {
    auto y = ag::sum(ag::conv2d(x, w, b, {.padding = {1, 1}}) * r);
    y.backward();
    x.zero_grad();
    w.zero_grad();
    b.zero_grad();
  }
  counters(st, 3);
}

// Args: batch, in channels, out channels, spatial size: the Fashion-MNIST CNN's convolutions.
void cnn_layers(benchmark::internal::Benchmark* b) { b->Args({128, 1, 32, 28})->Args({128, 32, 64, 14}); }

constexpr auto im2col = tk::backend::cpu_conv_route::im2col;
constexpr auto onednn = tk::backend::cpu_conv_route::onednn;

template <class T>
tk::tensor<T> random_tensor_as(tk::shape s) {
  return tk::cast<T>(random_tensor(std::move(s)));
}

template <class T, tk::backend::cpu_conv_route R>
void bm_conv2d_route_forward(benchmark::State& st) {
  const index_t n = st.range(0), c = st.range(1), o = st.range(2), s = st.range(3);
  tk::backend::set_cpu_conv_route(R);
  tk::var<T> x(random_tensor_as<T>({n, c, s, s})), w(random_tensor_as<T>({o, c, 3, 3})), b(random_tensor_as<T>({o}));
  tk::no_grad g;
  for (auto _ : st) benchmark::DoNotOptimize(ag::conv2d(x, w, b, {.padding = {1, 1}}).value().data());
  counters(st, 1);
}

/// Forward, then the input, weight and bias gradients of <y, r>.
template <class T, tk::backend::cpu_conv_route R>
void bm_conv2d_route_forward_backward(benchmark::State& st) {
  const index_t n = st.range(0), c = st.range(1), o = st.range(2), s = st.range(3);
  tk::backend::set_cpu_conv_route(R);
  tk::var<T> x(random_tensor_as<T>({n, c, s, s}), true), w(random_tensor_as<T>({o, c, 3, 3}), true),
      b(random_tensor_as<T>({o}), true);
  const auto r = random_tensor_as<T>({n, o, s, s});
  for (auto _ : st) {
    ag::conv2d(x, w, b, {.padding = {1, 1}}).backward(r);
    x.zero_grad();
    w.zero_grad();
    b.zero_grad();
  }
  counters(st, 3);
}
}  // namespace

BENCHMARK(bm_conv2d_forward)->Apply(layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_conv2d_forward_backward)->Apply(layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(bm_conv2d_route_forward, float, im2col)->Apply(cnn_layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(bm_conv2d_route_forward, float, onednn)->Apply(cnn_layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(bm_conv2d_route_forward, tk::bfloat16, im2col)->Apply(cnn_layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(bm_conv2d_route_forward, tk::bfloat16, onednn)->Apply(cnn_layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(bm_conv2d_route_forward_backward, float, im2col)->Apply(cnn_layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(bm_conv2d_route_forward_backward, float, onednn)->Apply(cnn_layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(bm_conv2d_route_forward_backward, tk::bfloat16, im2col)->Apply(cnn_layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(bm_conv2d_route_forward_backward, tk::bfloat16, onednn)->Apply(cnn_layers)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
