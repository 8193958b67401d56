// scaled_dot_product_attention forward + backward on the CPU, [batch 4, heads 8, T, d 64], causal
// and not, fp32 and under a bf16 autocast scope - the work compare_pytorch.py --attention times
// with torch.nn.functional.scaled_dot_product_attention on fp32 and bf16 tensors:
//   bm_sdpa/<T>/<causal>/<bf16>     forward, then backward of sum(out * g)
//   counter GFLOP/s: 14 T^2 d operations per (batch, head), half of them causal (forward 4 T^2 d,
//   backward 10 T^2 d with the recomputed scores)
//   bm_mha/<bf16>     nn::multi_head_attention (batch_first, causal) forward + backward on the GPT
//                     example's [32, 64, 128] input with 4 heads: the projections, the split into
//                     heads and the merge back around the fused attention
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output

#include "trainkit/trainkit.hpp"

#include "inputs.hpp"  // random_input

namespace {
namespace tk = trainkit;
using tk::index_t;

void bm_sdpa(benchmark::State& st) {
  const index_t t = st.range(0), b = 4, h = 8, d = 64;
  tk::autograd::attention_options<float, tk::cpu> o;
  o.is_causal = st.range(1) != 0;
  const auto q = bench::random_input({b, h, t, d}, 7), k = bench::random_input({b, h, t, d}, 8),
             v = bench::random_input({b, h, t, d}, 9), g = bench::random_input({b, h, t, d}, 10);
  const bool bf16 = st.range(2) != 0;
  for (auto _ : st) {
    tk::var<float> vq(q, true), vk(k, true), vv(v, true);
    tk::var<float> out;
    if (bf16) {
      tk::amp::autocast<tk::amp::mixed_bf16> scope;
      out = tk::autograd::scaled_dot_product_attention(vq, vk, vv, o);
    } else {
      out = tk::autograd::scaled_dot_product_attention(vq, vk, vv, o);
    }
    out.backward(g);
    benchmark::DoNotOptimize(vq.grad().data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(
      (o.is_causal ? 0.5 : 1.0) * 14.0 * double(b * h * t * t * d), benchmark::Counter::kIsIterationInvariantRate,
      benchmark::Counter::kIs1000);
}
BENCHMARK(bm_sdpa)->ArgsProduct({{256, 1024}, {0, 1}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

void bm_mha(benchmark::State& st) {
  const index_t n = 32, t = 64, e = 128, heads = 4;
  tk::generator gen(5);
  tk::nn::multi_head_attention<float, tk::cpu> mha(e, heads, 0.0, true, /*batch_first=*/true, gen);
  const auto x = bench::random_input({n, t, e}, 11), g = bench::random_input({n, t, e}, 12);
  typename tk::nn::multi_head_attention<float, tk::cpu>::masks_type m;
  m.is_causal = true;
  const bool bf16 = st.range(0) != 0;
  for (auto _ : st) {
    tk::var<float> vx(x, true);
    tk::var<float> out;
    if (bf16) {
      tk::amp::autocast<tk::amp::mixed_bf16> scope;
      out = mha(vx, vx, vx, m);
    } else {
      out = mha(vx, vx, vx, m);
    }
    out.backward(g);
    benchmark::DoNotOptimize(vx.grad().data());
    mha.zero_grad();
  }
}
BENCHMARK(bm_mha)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

/// One causal forward + backward of [1, 8, T, 64] per T: the allocator's peak above the inputs
/// (counter peak_MiB; the per-thread tiles, 2 x 16 KiB and T floats, come from std::vector).
void bm_sdpa_memory(benchmark::State& st) {
  const index_t t = st.range(0), b = 1, h = 8, d = 64;
  tk::autograd::attention_options<float, tk::cpu> o;
  o.is_causal = true;
  const auto q = bench::random_input({b, h, t, d}, 7), k = bench::random_input({b, h, t, d}, 8),
             v = bench::random_input({b, h, t, d}, 9), g = bench::random_input({b, h, t, d}, 10);
  double peak = 0;
  for (auto _ : st) {
    tk::var<float> vq(q, true), vk(k, true), vv(v, true);
    tk::allocator<tk::cpu>::reset_peak();
    const std::size_t base = tk::allocator<tk::cpu>::stats().allocated;
    auto out = tk::autograd::scaled_dot_product_attention(vq, vk, vv, o);
    out.backward(g);
    peak = double(tk::allocator<tk::cpu>::stats().peak - base);
  }
  st.counters["peak_MiB"] = peak / double(1 << 20);
  st.counters["input_MiB"] = double(b * h * t * d * 4) / double(1 << 20);
}
BENCHMARK(bm_sdpa_memory)->Arg(512)->Arg(1024)->Arg(2048)->Arg(4096)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
