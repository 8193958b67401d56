// cuda_train_step.cu - whole training steps on the GPU (forward, cross entropy, backward, SGD with
// momentum), the same work benchmarks/compare_pytorch_cuda.py times in PyTorch eager:
//   mlp_bf16_amp    4 x Linear(4096, 4096) with ReLU between, batch 1024, 4096 classes; fp32 master
//                   weights, GEMMs in bfloat16 (amp::mixed_bf16 - torch.autocast(bfloat16))
//   mlp_bf16        the same model held in bfloat16 (model.to(torch.bfloat16))
//   mlp_fp32        the same model in strict fp32 (TF32 off): the baseline bf16 must beat 2x
//   cnn_fp32        the Fashion-MNIST CNN of examples/fashion_mnist_cnn.cu, batch 128, strict fp32
//   cnn_tf32        the same with TF32 convolutions and GEMMs (PyTorch's default for convolutions)
//   cnn_fp32_ddp1   cnn_fp32 through data_parallel over NCCL at world size 1 (hooks, bucket views,
//                   events, the side stream): what DDP costs over the plain step (target <= 1.03x)
//   gpt_bf16_amp    the GPT of examples/gpt_char in nanoGPT's character-level size (6 layers, width
//                   384, 6 heads, context 256, batch 64, 96 symbols): one train::train_step as the
//                   example runs it (AdamW with decay groups, clipping at 1.0, the loss left on the
//                   GPU) under bf16 autocast - the GPU row of issue 29's "GPT step <= 1.0x eager"
//   gpt_fp32        the same in strict fp32 (TF32 off)
//
//   build/benchmarks/bench_cuda_train_step [--steps 50] [--warmup 10] [--only name]
//
// Steps are issued back to back (the loss is not read per step); the time is the mean per step
// between CUDA events. Optimizers: SGD with momentum 0.9, AdamW for the GPT. One JSON line per benchmark. Exit code 77 without a CUDA device.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include <trainkit/cuda.cuh>

#include "machine.cuh"  // start_gpu_benchmark, flag, time_steps

#define FASHION_MNIST_CNN_MODEL_ONLY
#include "../examples/fashion_mnist_cnn.cpp"  // example::fashion_cnn<Device>(), the model of the CNN examples
#define GPT_CHAR_MODEL_ONLY
#include "../examples/gpt_char.cpp"  // example::gpt<Device>, the model of the GPT examples

namespace tk = trainkit;
namespace nn = trainkit::nn;
using tk::cuda;
using tk::index_t;

namespace {

template <class T>
tk::tensor<T, cuda> random_input(tk::shape s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<T> v(static_cast<std::size_t>(tk::numel(s)));
  for (auto& x : v) x = static_cast<T>(nd(rng));
  return tk::tensor<T>::from_vector(v, s).template to<cuda>();
}
tk::tensor<std::int64_t, cuda> random_labels(index_t n, index_t classes) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) v[std::size_t(i)] = (i * 7919) % classes;
  return tk::tensor<std::int64_t>::from_vector(v).to<cuda>();
}

void report(const char* name, index_t batch, double ms) {
  const auto mem = tk::allocator<cuda>::stats();
  std::printf("{\"bench\": \"%s\", \"framework\": \"trainkit\", \"batch\": %lld, \"ms\": %.4f, \"samples_per_s\": %.1f, "
              "\"peak_mib\": %.1f}\n",
              name, (long long)batch, ms, double(batch) / (ms * 1e-3), double(mem.peak) / double(1 << 20));
  std::fflush(stdout);
}

template <class T>
auto make_mlp() {
  tk::manual_seed(1);
  return nn::make_sequential(
      std::make_shared<nn::linear<T, cuda>>(4096, 4096), std::make_shared<nn::relu<T, cuda>>(),
      std::make_shared<nn::linear<T, cuda>>(4096, 4096), std::make_shared<nn::relu<T, cuda>>(),
      std::make_shared<nn::linear<T, cuda>>(4096, 4096), std::make_shared<nn::relu<T, cuda>>(),
      std::make_shared<nn::linear<T, cuda>>(4096, 4096));
}

auto make_cnn() {
  tk::manual_seed(1);
  return example::fashion_cnn<cuda>();
}

/// Mean ms of the GPT's train_step under Precision (see gpt_bf16_amp above).
template <class Precision>
double time_gpt(int warmup, int steps, index_t batch) {
  const example::gpt_config c{.vocab = 96, .context = 256, .layers = 6, .embd = 384, .heads = 6};
  tk::generator g(1);
  example::gpt<cuda> model(c, g);
  const auto x = random_labels(batch * c.context, c.vocab).reshape({batch, c.context});
  const auto y = random_labels(batch * c.context + 1, c.vocab).slice(0, 1, batch * c.context + 1).contiguous();
  tk::optim::adamw<float, cuda> opt(tk::optim::decay_groups(model.named_parameters(), 0.1),
                                    {.lr = 3e-4, .beta2 = 0.99, .weight_decay = 0.1});
  tk::train::train_step<example::gpt<cuda>, decltype(opt), Precision, tk::amp::no_scaling> step(
      model, opt, {.max_grad_norm = 1.0, .read_loss = false});
  tk::allocator<cuda>::reset_peak();
  return time_steps(warmup, steps, [&] {
    step(x, [&](const tk::var<float, cuda>& logits) {
      return tk::autograd::cross_entropy(tk::autograd::reshape(logits, {-1, c.vocab}), y);
    });
  });
}

}  // namespace

int main(int argc, char** argv) try {
  if (!start_gpu_benchmark()) return 77;
  const int steps = int(flag(argc, argv, "--steps", 50)), warmup = int(flag(argc, argv, "--warmup", 10));
  const char* only = str_flag(argc, argv, "--only");
  auto wanted = [&](const char* name) { return only == nullptr || std::strcmp(only, name) == 0; };
  const index_t mlp_batch = 1024, cnn_batch = 128, gpt_batch = 64;

  if (wanted("mlp_bf16_amp")) {
    auto model = make_mlp<float>();
    const auto x = random_input<float>({mlp_batch, 4096}, 7);
    const auto y = random_labels(mlp_batch, 4096);
    tk::optim::sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
    tk::allocator<cuda>::reset_peak();
    const double ms = time_steps(warmup, steps, [&] {
      auto logits = tk::amp::forward<tk::amp::mixed_bf16>(*model, tk::var<float, cuda>(x));
      auto loss = tk::autograd::cross_entropy(logits, y);
      opt.zero_grad();
      loss.backward();
      opt.step();
    });
    report("mlp_bf16_amp", mlp_batch, ms);
  }
  if (wanted("mlp_bf16")) {
    auto model = make_mlp<tk::bfloat16>();
    const auto x = random_input<tk::bfloat16>({mlp_batch, 4096}, 7);
    const auto y = random_labels(mlp_batch, 4096);
    tk::optim::sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
    tk::allocator<cuda>::reset_peak();
    const double ms = time_steps(warmup, steps, [&] {
      auto loss = tk::autograd::cross_entropy((*model)(tk::var<tk::bfloat16, cuda>(x)), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
    });
    report("mlp_bf16", mlp_batch, ms);
  }
  if (wanted("mlp_fp32")) {
    tk::gpu::settings().allow_tf32 = false;
    auto model = make_mlp<float>();
    const auto x = random_input<float>({mlp_batch, 4096}, 7);
    const auto y = random_labels(mlp_batch, 4096);
    tk::optim::sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
    tk::allocator<cuda>::reset_peak();
    const double ms = time_steps(warmup, steps, [&] {
      auto loss = tk::autograd::cross_entropy((*model)(tk::var<float, cuda>(x)), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
    });
    report("mlp_fp32", mlp_batch, ms);
  }
  for (bool tf32 : {false, true}) {
    const char* name = tf32 ? "cnn_tf32" : "cnn_fp32";
    if (!wanted(name)) continue;
    tk::gpu::settings().allow_tf32 = tf32;
    auto model = make_cnn();
    const auto x = random_input<float>({cnn_batch, 1, 28, 28}, 7);
    const auto y = random_labels(cnn_batch, 10);
    tk::optim::sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
    tk::allocator<cuda>::reset_peak();
    const double ms = time_steps(warmup, steps, [&] {
      auto loss = tk::autograd::cross_entropy((*model)(tk::var<float, cuda>(x)), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
    });
    report(name, cnn_batch, ms);
  }
#if TRAINKIT_HAS_NCCL
  if (wanted("cnn_fp32_ddp1")) {
    tk::gpu::settings().allow_tf32 = false;
    tk::dist::thread_group::run(1, [&](tk::dist::thread_group& boot) {
      tk::dist::nccl comm(boot, tk::gpu::current_device());
      auto model = make_cnn();
      tk::parallel::data_parallel<tk::dist::nccl, tk::compression::none, float, cuda> ddp(comm, *model);
      const auto x = random_input<float>({cnn_batch, 1, 28, 28}, 7);
      const auto y = random_labels(cnn_batch, 10);
      tk::optim::sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
      tk::allocator<cuda>::reset_peak();
      const double ms = time_steps(warmup, steps, [&] {
        auto loss = tk::autograd::cross_entropy((*model)(tk::var<float, cuda>(x)), y);
        opt.zero_grad();
        loss.backward();
        ddp.finish();
        opt.step();
      });
      report("cnn_fp32_ddp1", cnn_batch, ms);
    });
  }
#endif
  tk::gpu::settings().allow_tf32 = false;
  if (wanted("gpt_bf16_amp")) report("gpt_bf16_amp", gpt_batch, time_gpt<tk::amp::mixed_bf16>(warmup, steps, gpt_batch));
  if (wanted("gpt_fp32")) report("gpt_fp32", gpt_batch, time_gpt<tk::amp::fp32>(warmup, steps, gpt_batch));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda_train_step: %s\n", e.what());
  return 1;
}
