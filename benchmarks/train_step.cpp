// A whole training step (forward, cross-entropy, backward, SGD with momentum) of the MLP
// 784-512-512-10 and of the two-block CNN, batch 128 - the same work compare_pytorch.py
// times in PyTorch.
#include <benchmark/benchmark.h>


#include "trainkit/trainkit.hpp"

#include "inputs.hpp"  // random_input, random_labels

namespace {
namespace tk = trainkit;
namespace nn = trainkit::nn;
using tk::index_t;

using bench::random_input;
using bench::random_labels;

template <class Model>
void run_steps(benchmark::State& st, Model& model, const tk::tensor<float>& x, const tk::tensor<std::int64_t>& y) {
  tk::optim::sgd opt(model.parameters(), {.lr = 0.01, .momentum = 0.9});
  for (auto _ : st) {
    auto loss = tk::autograd::cross_entropy(model(tk::var<float>(x)), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.value().data());
  }
  st.counters["samples/s"] = benchmark::Counter(double(x.size(0)), benchmark::Counter::kIsIterationInvariantRate);
}

void bm_mlp_step(benchmark::State& st) {
  auto model = nn::make_sequential(std::make_shared<nn::linear<>>(784, 512), std::make_shared<nn::relu<>>(),
                                   std::make_shared<nn::linear<>>(512, 512), std::make_shared<nn::relu<>>(),
                                   std::make_shared<nn::linear<>>(512, 10));
  run_steps(st, *model, random_input({128, 784}), random_labels(128));
}

void bm_cnn_step(benchmark::State& st) {
  auto model = nn::make_sequential(
      std::make_shared<nn::conv2d<>>(1, 32, std::array<index_t, 2>{3, 3}, nn::conv2d_options{.padding = {1, 1}}),
      std::make_shared<nn::batch_norm2d<>>(32), std::make_shared<nn::relu<>>(),
      std::make_shared<nn::max_pool2d<>>(nn::pool2d_options{.kernel = {2, 2}}),
      std::make_shared<nn::conv2d<>>(32, 64, std::array<index_t, 2>{3, 3}, nn::conv2d_options{.padding = {1, 1}}),
      std::make_shared<nn::batch_norm2d<>>(64), std::make_shared<nn::relu<>>(),
      std::make_shared<nn::max_pool2d<>>(nn::pool2d_options{.kernel = {2, 2}}), std::make_shared<nn::flatten<>>(),
      std::make_shared<nn::linear<>>(64 * 7 * 7, 128), std::make_shared<nn::relu<>>(),
      std::make_shared<nn::linear<>>(128, 10));
  run_steps(st, *model, random_input({128, 1, 28, 28}), random_labels(128));
}
}  // namespace

BENCHMARK(bm_mlp_step)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_cnn_step)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
