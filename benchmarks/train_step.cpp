// A whole training step (forward, cross-entropy, backward, SGD with momentum) of the MLP
// 784-512-512-10 and of the two-block CNN, batch 128 - the same work compare_pytorch.py
// times in PyTorch:
//   bm_mlp_step, bm_cnn_step        the hand-written loop in fp32
//   bm_step/<model>/<precision>     train::train_step under fp32, mixed_bf16 or mixed_fp16 (dynamic
//                                   loss scaling for fp16), for the MLP, the CNN and the residual
//                                   network of examples/common/resnet.hpp (width 16, 1x28x28 input);
//                                   counter peak_MiB: what one step allocates above the model,
//                                   gradients and optimizer state (activations and transients)
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output


#include "trainkit/trainkit.hpp"

#include "../examples/common/resnet.hpp"  // example::resnet
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

auto make_mlp() {
  return nn::make_sequential(std::make_shared<nn::linear<>>(784, 512), std::make_shared<nn::relu<>>(),
                                   std::make_shared<nn::linear<>>(512, 512), std::make_shared<nn::relu<>>(),
                                   std::make_shared<nn::linear<>>(512, 10));
}
void bm_mlp_step(benchmark::State& st) {
  auto model = make_mlp();
  run_steps(st, *model, random_input({128, 784}), random_labels(128));
}

auto make_cnn() {
  return nn::make_sequential(
      std::make_shared<nn::conv2d<>>(1, 32, std::array<index_t, 2>{3, 3}, nn::conv2d_options{.padding = {1, 1}}),
      std::make_shared<nn::batch_norm2d<>>(32), std::make_shared<nn::relu<>>(),
      std::make_shared<nn::max_pool2d<>>(nn::pool2d_options{.kernel = {2, 2}}),
      std::make_shared<nn::conv2d<>>(32, 64, std::array<index_t, 2>{3, 3}, nn::conv2d_options{.padding = {1, 1}}),
      std::make_shared<nn::batch_norm2d<>>(64), std::make_shared<nn::relu<>>(),
      std::make_shared<nn::max_pool2d<>>(nn::pool2d_options{.kernel = {2, 2}}), std::make_shared<nn::flatten<>>(),
      std::make_shared<nn::linear<>>(64 * 7 * 7, 128), std::make_shared<nn::relu<>>(),
      std::make_shared<nn::linear<>>(128, 10));
}
void bm_cnn_step(benchmark::State& st) {
  auto model = make_cnn();
  run_steps(st, *model, random_input({128, 1, 28, 28}), random_labels(128));
}

/// train_step under Precision (its default scaler) on a model, batch 128.
template <class Precision, class Model>
void run_train_step(benchmark::State& st, Model& model, const tk::tensor<float>& x, const tk::tensor<std::int64_t>& y) {
  tk::optim::sgd opt(model.parameters(), {.lr = 0.01, .momentum = 0.9});
  tk::train::train_step<Model, decltype(opt), Precision> step(model, opt);
  const auto loss = [&](const tk::var<float>& logits) { return tk::autograd::cross_entropy(logits, y); };
  step(x, loss);  // the optimizer's state exists from here: the peak below is the step's own
  const auto base = tk::allocator<tk::cpu>::stats().allocated;
  tk::allocator<tk::cpu>::reset_peak();
  for (auto _ : st) benchmark::DoNotOptimize(step(x, loss).loss);
  st.counters["samples/s"] = benchmark::Counter(double(x.size(0)), benchmark::Counter::kIsIterationInvariantRate);
  // Bytes a step allocates on top of the model, its gradients and the optimizer state: the
  // activations saved for backward and the transients of backward.
  st.counters["peak_MiB"] = double(tk::allocator<tk::cpu>::stats().peak - base) / double(1 << 20);
}
template <class Precision>
void bm_step_mlp(benchmark::State& st) {
  auto model = make_mlp();
  run_train_step<Precision>(st, *model, random_input({128, 784}), random_labels(128));
}
template <class Precision>
void bm_step_cnn(benchmark::State& st) {
  auto model = make_cnn();
  run_train_step<Precision>(st, *model, random_input({128, 1, 28, 28}), random_labels(128));
}
template <class Precision>
void bm_step_resnet(benchmark::State& st) {
  example::resnet model(1, 16, 10);
  run_train_step<Precision>(st, model, random_input({128, 1, 28, 28}), random_labels(128));
}
}  // namespace

BENCHMARK(bm_mlp_step)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_cnn_step)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_mlp<tk::amp::fp32>)->Name("bm_step/mlp/fp32")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_mlp<tk::amp::mixed_bf16>)->Name("bm_step/mlp/bf16")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_mlp<tk::amp::mixed_fp16>)->Name("bm_step/mlp/fp16")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_cnn<tk::amp::fp32>)->Name("bm_step/cnn/fp32")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_cnn<tk::amp::mixed_bf16>)->Name("bm_step/cnn/bf16")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_cnn<tk::amp::mixed_fp16>)->Name("bm_step/cnn/fp16")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_resnet<tk::amp::fp32>)->Name("bm_step/resnet/fp32")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_resnet<tk::amp::mixed_bf16>)->Name("bm_step/resnet/bf16")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_step_resnet<tk::amp::mixed_fp16>)->Name("bm_step/resnet/fp16")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
