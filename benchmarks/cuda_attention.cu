// benchmarks/cuda_attention.cu - bench_cuda_attention: scaled_dot_product_attention forward +
// backward on the GPU, one JSON row per case, for scripts/gpu-check.sh next to
// compare_pytorch_cuda.py's torch.nn.functional.scaled_dot_product_attention rows of the same names:
//   attention_bf16_t1024, attention_bf16_t4096   [4, 16, T, 64] bf16 under autocast, causal
//                                                (cuDNN's fused attention where the build has the
//                                                cuDNN frontend, else trainkit's kernels)
//   attention_fp32_t1024                         the same in fp32 (trainkit's kernels; PyTorch's
//                                                efficient-attention kernel)
// Each row prints the route that ran ("cudnn" or "own").
//
//   bench_cuda_attention [--steps N] [--warmup N]
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include <trainkit/cuda.cuh>

#include "machine.cuh"  // start_gpu_benchmark, flag, time_steps

namespace {
namespace tk = trainkit;
namespace ag = trainkit::autograd;
using tk::cuda;
using tk::index_t;

tk::tensor<float, cuda> random_input(const tk::shape& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(tk::numel(s)));
  for (auto& e : v) e = n(rng);
  return tk::tensor<float>::from_vector(v, s).to<cuda>();
}

const char* route_name() {
  return tk::backend::attention<cuda>::last_route() == tk::backend::cuda_attention_route::cudnn ? "cudnn" : "own";
}

/// Forward + backward of one causal attention on [4, 16, t, 64] inputs; bf16: under amp::mixed_bf16.
void run(const char* name, index_t t, bool bf16, int warmup, int steps) {
  const tk::shape s{4, 16, t, 64};
  tk::var<float, cuda> q(random_input(s, 1), true), k(random_input(s, 2), true), v(random_input(s, 3), true);
  const auto g = random_input(s, 4);
  ag::attention_options<float, cuda> o;
  o.is_causal = true;
  auto step = [&] {
    q.zero_grad(), k.zero_grad(), v.zero_grad();
    auto out = bf16 ? tk::amp::scaled_dot_product_attention<tk::amp::mixed_bf16>(q, k, v, o)
                    : ag::scaled_dot_product_attention(q, k, v, o);
    out.backward(g);
  };
  const double ms = time_steps(warmup, steps, step);
  // Causal: half the score matrix; forward 2 and backward 5 products of T x T x 64 (flash attention's count).
  const double flops = 4.0 * 16 * double(t) * double(t) * 64 * 2 * 3.5 / 2;
  std::printf("{\"bench\": \"%s\", \"framework\": \"trainkit\", \"ms\": %.4f, \"tflops\": %.1f, \"route\": \"%s\"}\n", name,
              ms, flops / (ms * 1e-3) / 1e12, route_name());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  if (!start_gpu_benchmark()) return 77;
  const int steps = int(flag(argc, argv, "--steps", 20)), warmup = int(flag(argc, argv, "--warmup", 5));
  run("attention_bf16_t1024", 1024, true, warmup, steps);
  run("attention_bf16_t4096", 4096, true, warmup, steps);
  run("attention_fp32_t1024", 1024, false, warmup, std::max(2, steps / 4));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda_attention: %s\n", e.what());
  return 1;
}
