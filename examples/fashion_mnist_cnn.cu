// fashion_mnist_cnn.cu - the two-block CNN of fashion_mnist_cnn.cpp, trained on a CUDA GPU.
//
//   build/examples/fashion_mnist_cnn_cuda --data /usr/share/datasets/fashion-mnist --epochs 3
//       [--precision fp32|fp16|bf16] [--checkpoint none|sqrt|every:N] [--tf32]
//
// The same model, data, optimizer and schedule as the CPU example - only the device type differs:
// layers are nn::conv2d<float, cuda> etc., each batch is copied to the GPU, and everything else
// (cuDNN convolutions, cuBLASLt GEMMs, our kernels for the rest) follows from the tensor type.
// --precision bf16 runs convolutions and linear layers in bfloat16 with fp32 master weights
// (cuDNN and cuBLASLt take the 16-bit operands directly); fp16 adds dynamic loss scaling.
// Prints loss, test accuracy and samples/s per epoch. Exit code 77 without a CUDA device.
#include <cstdio>
#include <exception>

#include <trainkit/cuda.hpp>  // tensors, autograd, nn, optim, data + the CUDA backend

#include "common/example.hpp"      // flags, stopwatch
#include "common/fashion_cnn.hpp"  // the model

namespace tk = trainkit;
using tk::cuda;
using tk::index_t;

namespace {

/// Test-set accuracy on the GPU: eval mode, no graph, predictions compared on the host.
template <class Model, class Forward>
double accuracy(Model& model, const tk::tensor<float>& x, const tk::tensor<std::int64_t>& y, Forward forward,
                index_t batch = 1000) {
  tk::no_grad guard;
  model.eval();
  index_t correct = 0;
  for (index_t i = 0; i < x.size(0); i += batch) {
    const auto end = std::min(x.size(0), i + batch);
    auto logits = forward(model, tk::var<float, cuda>(x.slice(0, i, end).to<cuda>()));
    const auto pred = tk::argmax(logits.value(), 1).to_vector();
    const auto truth = y.slice(0, i, end).to_vector();
    for (std::size_t k = 0; k < pred.size(); ++k) correct += pred[k] == truth[k];
  }
  model.train();
  return x.size(0) ? double(correct) / double(x.size(0)) : 0.0;
}

}  // namespace

int main(int argc, char** argv) try {
  example::flags f(argc, argv,
                   {{"data", "/usr/share/datasets/fashion-mnist"}, {"epochs", "3"}, {"batch", "128"},
                    {"lr", "0.05"}, {"train-limit", "0"}, {"test-limit", "0"}, {"seed", "1"},
                    {"precision", "fp32"}, {"checkpoint", "none"}, {"tf32", "0"}});
  if (!tk::gpu::available()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  const auto precision = tk::amp::parse_precision(f.str("precision"));
  const auto recompute = tk::checkpoint::parse_recompute(f.str("checkpoint"));
  tk::gpu::settings().allow_tf32 = f.num("tf32") != 0;
  tk::manual_seed(static_cast<std::uint64_t>(f.num("seed")));

  // Data on the host (pixels standardised with the training set's mean and std); batches are
  // copied to the device as they are used.
  tk::data::mnist_options opts{.mean = tk::data::fashion_mnist_mean, .stddev = tk::data::fashion_mnist_std};
  if (f.num("train-limit") > 0) opts.limit = f.num("train-limit");
  auto train = tk::data::load_mnist(f.str("data"), tk::data::split::train, opts);
  opts.limit = f.num("test-limit") > 0 ? std::optional<index_t>(f.num("test-limit")) : std::nullopt;
  auto test = tk::data::load_mnist(f.str("data"), tk::data::split::test, opts);
  std::printf("train %lld  test %lld images of %lldx%lld\n", (long long)train.size(), (long long)test.size(),
              (long long)train.images.size(2), (long long)train.images.size(3));

  // Model: [N,1,28,28] -> conv block (32) -> [N,32,14,14] -> conv block (64) -> [N,64,7,7] -> MLP head,
  // its parameters drawn on the host from the seeded generator (the CPU example's values) and
  // copied to the GPU.
  auto model = example::fashion_cnn<cuda>();
  std::printf("parameters: %lld  device: %d multiprocessors\n", (long long)model->num_parameters(),
              tk::gpu::current_device_info().multiprocessors);

  const index_t batch = f.num("batch"), epochs = f.num("epochs");
  tk::data::batch_iterator batches(train.images, train.labels, batch, /*shuffle=*/true,
                                   static_cast<std::uint64_t>(f.num("seed")));
  const index_t steps = epochs * static_cast<index_t>(batches.size());
  tk::optim::sgd opt(model->parameters(), {.lr = f.real("lr"), .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  tk::optim::warmup_cosine_lr schedule({.base_lr = f.real("lr"), .warmup_steps = std::min<index_t>(100, steps / 10),
                                        .total_steps = steps, .min_lr = 0.0});
  schedule.apply(opt);

  std::printf("precision %s  checkpoint %s  tf32 %s\n", std::string(tk::amp::to_string(precision)).c_str(),
              tk::checkpoint::to_string(recompute).c_str(), tk::gpu::settings().allow_tf32 ? "on" : "off");
  tk::amp::visit_precision(precision, [&]<class P>(P) {
    tk::amp::default_scaler_t<P> scaler;  // dynamic loss scaling for fp16, none for fp32/bf16
    for (index_t epoch = 0; epoch < epochs; ++epoch) {
      batches.set_epoch(static_cast<std::uint64_t>(epoch));
      example::stopwatch clock;
      // The epoch's loss is summed on the device: no host sync per step.
      auto loss_sum = tk::tensor<float, cuda>::zeros({});
      index_t seen = 0;
      for (auto& b : batches) {
        const auto x = b.x.to<cuda>();
        const auto y = b.y.to<cuda>();
        auto logits = tk::checkpoint::apply_recompute(recompute, *model, tk::var<float, cuda>(x),
                                                      tk::amp::module_forward<P>{});
        auto loss = tk::autograd::cross_entropy(logits, y);
        opt.zero_grad();
        scaler.scale(loss).backward();
        scaler.step(opt);
        scaler.update();
        schedule.step(opt);
        tk::add_(loss_sum, loss.value(), double(b.x.size(0)));
        seen += b.x.size(0);
      }
      const double mean_loss = double(loss_sum.item()) / double(seen);  // waits for the epoch's work
      const double secs = clock.seconds();
      const double acc = accuracy(*model, test.images, test.labels, tk::amp::module_forward<P>{});
      const auto mem = tk::allocator<cuda>::stats();
      std::printf("epoch %lld  loss %.4f  test accuracy %.2f%%  %.0f samples/s  peak %.1f MiB\n",
                  (long long)epoch + 1, mean_loss, 100 * acc, double(seen) / secs, double(mem.peak) / double(1 << 20));
      std::fflush(stdout);
    }
  });
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist_cnn_cuda: %s\n", e.what());
  return 1;
}
