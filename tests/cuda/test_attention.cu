// tests/cuda/test_attention.cu - scaled_dot_product_attention on the GPU against the host's fused
// attention (itself checked against the unfused composition in double and finite differences,
// tests/autograd/test_attention.cpp), forward and the three gradients: trainkit's own kernels in
// float and double (causal, additive and boolean masks, a row hidden from every key, the Philox
// dropout mask, strided heads, head sizes on both sides of each lane-chunk step), bf16 and fp16
// under autocast through both routes (cuDNN's fused attention where the build has the cuDNN
// frontend, and trainkit's kernels), multi_head_attention with masks, memory linear in T, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/support.cuh"

namespace tk = trainkit;
namespace ag = trainkit::autograd;
namespace nn = trainkit::nn;
using tk::cpu;
using tk::cuda;
using tk::index_t;
using tk::shape;
using cuda_test::check_op;
using cuda_test::random;

namespace {

template <class V>
struct device_of_t;
template <class T, class D>
struct device_of_t<tk::var<T, D>> {
  using type = D;
};
/// The device of a var type (cv-ref removed).
template <class V>
using device_of = typename device_of_t<std::decay_t<V>>::type;

/// scaled_dot_product_attention of v[0..2] with options o; dropout draws from a generator made
/// afresh with seed 5 at each call, so the host and the GPU use the same mask.
template <class T>
auto sdpa(ag::attention_options<T, cpu> host_o) {
  return [host_o](const auto& v) {
    using D = device_of<decltype(v[0])>;
    tk::generator gen(5);
    ag::attention_options<T, D> o;
    o.is_causal = host_o.is_causal;
    o.dropout_p = host_o.dropout_p;
    o.scale = host_o.scale;
    o.gen = &gen;
    if constexpr (std::is_same_v<D, cpu>) {
      o.attn_mask = host_o.attn_mask;
      o.attn_bool_mask = host_o.attn_bool_mask;
    } else {
      if (host_o.attn_mask.defined()) o.attn_mask = host_o.attn_mask.template to<cuda>();
      if (host_o.attn_bool_mask.defined()) o.attn_bool_mask = host_o.attn_bool_mask.template to<cuda>();
    }
    return ag::scaled_dot_product_attention(v[0], v[1], v[2], o);
  };
}

struct shape_case {
  index_t b, h, tq, tk, d, dv;
};

}  // namespace

TEST_CASE("attention on cuda: own kernels match the host in float and double", "[cuda][attention]") {
  std::mt19937 rng(29);
  cuda_test::settings_guard guard;
  for (const shape_case c : {shape_case{2, 3, 17, 17, 16, 16}, shape_case{1, 2, 33, 70, 64, 64},
                             shape_case{2, 1, 65, 40, 80, 48}, shape_case{1, 2, 9, 13, 130, 7},
                             shape_case{1, 1, 1, 1, 32, 32}}) {
    INFO("q [" << c.b << ", " << c.h << ", " << c.tq << ", " << c.d << "], k [.., " << c.tk << ", ..], dv " << c.dv);
    const auto q = random<float>({c.b, c.h, c.tq, c.d}, rng), k = random<float>({c.b, c.h, c.tk, c.d}, rng),
               v = random<float>({c.b, c.h, c.tk, c.dv}, rng);
    for (bool causal : {false, true}) {
      INFO("causal " << causal);
      ag::attention_options<float, cpu> o;
      o.is_causal = causal;
      check_op<float>(sdpa<float>(o), {q, k, v}, 2e-5, 2e-5);
      tk::backend::attention<cuda>::last_route() = tk::backend::cuda_attention_route::none;
      check_op<double>(sdpa<double>({.is_causal = causal}), {tk::cast<double>(q), tk::cast<double>(k), tk::cast<double>(v)},
                       1e-12, 1e-12);
      CHECK(tk::backend::attention<cuda>::last_route() == tk::backend::cuda_attention_route::own);
    }
  }
}

TEST_CASE("attention on cuda: masks, hidden rows, scale and dropout match the host", "[cuda][attention]") {
  std::mt19937 rng(31);
  const index_t b = 2, h = 3, tq = 20, tk = 37, d = 24;
  const auto q = random<float>({b, h, tq, d}, rng), k = random<float>({b, h, tk, d}, rng),
             v = random<float>({b, h, tk, d}, rng);
  SECTION("additive masks broadcast from [Tq, Tk] and [B, 1, 1, Tk], with -inf") {
    for (const shape& ms : {shape{tq, tk}, shape{b, 1, 1, tk}}) {
      auto m = random<float>(ms, rng, -2, 2);
      m.data()[1] = -std::numeric_limits<float>::infinity();
      ag::attention_options<float, cpu> o;
      o.attn_mask = m;
      o.scale = 0.3;
      check_op<float>(sdpa<float>(o), {q, k, v}, 2e-5, 2e-5);
    }
  }
  SECTION("a boolean mask with a row hidden from every key (0 output, no gradient)") {
    std::vector<char> keep(std::size_t(tq * tk));
    for (auto& e : keep) e = rng() % 3 != 0;
    for (index_t j = 0; j < tk; ++j) keep[std::size_t(4 * tk + j)] = 0;  // row 4 sees nothing
    auto m = tk::tensor<bool>::empty({tq, tk});
    for (index_t i = 0; i < tq * tk; ++i) m.data()[i] = keep[std::size_t(i)] != 0;
    ag::attention_options<float, cpu> o;
    o.attn_bool_mask = m;
    check_op<float>(sdpa<float>(o), {q, k, v}, 2e-5, 2e-5);
    tk::var<float, cuda> vq(q.to<cuda>()), vk(k.to<cuda>()), vv(v.to<cuda>());
    ag::attention_options<float, cuda> og;
    og.attn_bool_mask = m.to<cuda>();
    const auto out = ag::scaled_dot_product_attention(vq, vk, vv, og).value().to<cpu>();
    for (index_t c = 0; c < d; ++c) CHECK(out.at({0, 0, 4, c}) == 0.0f);
  }
  SECTION("dropout: the host's Philox mask, forward and backward, causal and not") {
    for (bool causal : {false, true}) {
      ag::attention_options<float, cpu> o;
      o.dropout_p = 0.3;
      o.is_causal = causal;
      check_op<float>(sdpa<float>(o), {q, k, v}, 2e-5, 2e-5);
    }
  }
}

TEST_CASE("attention on cuda: heads read where they lie ([B, T, H, d] permuted)", "[cuda][attention]") {
  std::mt19937 rng(37);
  const auto q = random<float>({2, 19, 4, 32}, rng), k = random<float>({2, 23, 4, 32}, rng),
             v = random<float>({2, 23, 4, 40}, rng);
  check_op<float>(
      [](const auto& x) {
        return ag::scaled_dot_product_attention(ag::permute(x[0], {0, 2, 1, 3}), ag::permute(x[1], {0, 2, 1, 3}),
                                                ag::permute(x[2], {0, 2, 1, 3}));
      },
      {q, k, v}, 2e-5, 2e-5);
}

namespace {
/// max |a - b| <= rel * max |b| (the mixed-precision criterion of tests/amp/test_attention.cpp: a
/// 16-bit result's error scales with the largest value, not with each element).
void require_rel_close(const tk::tensor<float>& a, const tk::tensor<float>& b, double rel) {
  const auto va = a.contiguous().to_vector(), vb = b.contiguous().to_vector();
  REQUIRE(va.size() == vb.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    diff = std::max(diff, std::abs(double(va[i]) - double(vb[i])));
    scale = std::max(scale, std::abs(double(vb[i])));
  }
  INFO("max |diff| " << diff << ", max |reference| " << scale << ", rel " << rel);
  REQUIRE(diff <= rel * scale);
}

/// Output and the three gradients of attention under policy P on the GPU, on the host.
template <class P>
std::vector<tk::tensor<float>> gpu_mixed(const std::vector<tk::tensor<float>>& in, const tk::tensor<float>& g,
                                         bool causal) {
  tk::var<float, cuda> q(in[0].to<cuda>(), true), k(in[1].to<cuda>(), true), v(in[2].to<cuda>(), true);
  auto out = tk::amp::scaled_dot_product_attention<P>(q, k, v, ag::attention_options<float, cuda>{.is_causal = causal});
  out.backward(g.to<cuda>());
  return {out.value().template to<cpu>(), q.grad().to<cpu>(), k.grad().to<cpu>(), v.grad().to<cpu>()};
}
}  // namespace

TEST_CASE("attention on cuda: bf16 and fp16 under autocast, cuDNN and own routes", "[cuda][attention][amp]") {
  // Against the host's fp32 attention of the same inputs: within the compute type's error (bf16
  // keeps 8 significant bits, fp16 11; inputs, probabilities, outputs and gradients are rounded).
  std::mt19937 rng(41);
  cuda_test::settings_guard guard;
  for (const shape_case c : {shape_case{2, 4, 64, 64, 64, 64}, shape_case{1, 2, 100, 130, 32, 32},
                             shape_case{2, 2, 48, 48, 128, 128}}) {
    INFO("q [" << c.b << ", " << c.h << ", " << c.tq << ", " << c.d << "], tk " << c.tk);
    const std::vector<tk::tensor<float>> in{random<float>({c.b, c.h, c.tq, c.d}, rng),
                                            random<float>({c.b, c.h, c.tk, c.d}, rng),
                                            random<float>({c.b, c.h, c.tk, c.dv}, rng)};
    const auto g = random<float>({c.b, c.h, c.tq, c.dv}, rng);
    for (bool causal : {false, true}) {
      tk::var<float> q(in[0].clone(), true), k(in[1].clone(), true), v(in[2].clone(), true);
      auto ref = ag::scaled_dot_product_attention(q, k, v, ag::attention_options<float, cpu>{.is_causal = causal});
      ref.backward(g);
      const std::vector<tk::tensor<float>> want{ref.value(), q.grad(), k.grad(), v.grad()};
      for (bool cudnn : {true, false}) {
        INFO("causal " << causal << ", cuDNN allowed " << cudnn);
        tk::gpu::settings().cudnn_attention = cudnn;
        tk::backend::attention<cuda>::last_route() = tk::backend::cuda_attention_route::none;
        const auto bf16 = gpu_mixed<tk::amp::mixed_bf16>(in, g, causal);
        const auto route = tk::backend::attention<cuda>::last_route();
#if TRAINKIT_HAS_CUDNN_FRONTEND
        if (cudnn && route != tk::backend::cuda_attention_route::cudnn)
          WARN("cuDNN did not take this bf16 problem on this GPU: trainkit's kernels ran");
#endif
        if (!cudnn) CHECK(route == tk::backend::cuda_attention_route::own);
        const auto fp16 = gpu_mixed<tk::amp::mixed_fp16>(in, g, causal);
        for (std::size_t i = 0; i < 4; ++i) {
          INFO((i == 0 ? std::string("output") : "gradient of input " + std::to_string(i - 1)));
          require_rel_close(bf16[i], want[i], i == 0 ? 3e-2 : 6e-2);
          require_rel_close(fp16[i], want[i], i == 0 ? 5e-3 : 1e-2);
        }
      }
    }
  }
}

#if TRAINKIT_HAS_CUDNN_FRONTEND
TEST_CASE("attention on cuda: cuDNN's fused attention takes the GPT shapes in bf16", "[cuda][attention][amp]") {
  // [B, H, T, 64] heads, causal, permuted from [B, T, H, 64] as multi_head_attention makes them:
  // cuDNN must take forward and backward on an sm_90 GPU.
  std::mt19937 rng(43);
  cuda_test::settings_guard guard;
  tk::gpu::settings().cudnn_attention = true;
  const auto q = random<float>({4, 256, 8, 64}, rng).to<cuda>(), k = random<float>({4, 256, 8, 64}, rng).to<cuda>(),
             v = random<float>({4, 256, 8, 64}, rng).to<cuda>();
  tk::var<float, cuda> vq(q, true), vk(k, true), vv(v, true);
  tk::backend::attention<cuda>::last_route() = tk::backend::cuda_attention_route::none;
  auto out = tk::amp::scaled_dot_product_attention<tk::amp::mixed_bf16>(
      ag::permute(vq, {0, 2, 1, 3}), ag::permute(vk, {0, 2, 1, 3}), ag::permute(vv, {0, 2, 1, 3}),
      ag::attention_options<float, cuda>{.is_causal = true});
  CHECK(tk::backend::attention<cuda>::last_route() == tk::backend::cuda_attention_route::cudnn);
  tk::backend::attention<cuda>::last_route() = tk::backend::cuda_attention_route::none;
  out.backward(tk::tensor<float, cuda>::ones(out.sizes()));
  CHECK(tk::backend::attention<cuda>::last_route() == tk::backend::cuda_attention_route::cudnn);
  REQUIRE(vq.grad().defined());
}
#endif

TEST_CASE("multi_head_attention on cuda matches the host, with masks", "[cuda][attention][nn]") {
  std::mt19937 rng(47);
  const index_t n = 2, l = 9, e = 32, heads = 4;
  nn::multi_head_attention<float, cpu> host(e, heads, 0.0, true, /*batch_first=*/true);
  nn::multi_head_attention<float, cuda> gpu(e, heads, 0.0, true, /*batch_first=*/true);
  {
    auto hp = host.parameters();
    auto gp = gpu.parameters();
    REQUIRE(hp.size() == gp.size());
    for (std::size_t i = 0; i < hp.size(); ++i) {
      auto dst = gp[i].value();
      tk::copy_(dst, hp[i].value().to<cuda>());
    }
  }
  const auto x = random<float>({n, l, e}, rng);
  auto pad = tk::tensor<bool>::zeros({n, l});
  pad.data()[l - 1] = true;  // batch 0 ignores its last token
  tk::var<float, cpu> xc(x.clone(), true);
  tk::var<float, cuda> xg(x.to<cuda>(), true);
  nn::attention_masks<float, cpu> mc;
  mc.key_padding_mask = pad;
  mc.is_causal = true;
  nn::attention_masks<float, cuda> mg;
  mg.key_padding_mask = pad.to<cuda>();
  mg.is_causal = true;
  auto yc = host.forward(xc, xc, xc, mc);
  auto yg = gpu.forward(xg, xg, xg, mg);
  CUDA_TEST_REQUIRE_CLOSE(yg.value(), yc.value(), 2e-5, 2e-5);
  const auto g = random<float>(yc.sizes(), rng);
  yc.backward(g);
  yg.backward(g.to<cuda>());
  CUDA_TEST_REQUIRE_CLOSE(xg.grad(), xc.grad(), 2e-5, 2e-5);
}

TEST_CASE("attention on cuda: memory grows linearly with T; bad heads are refused", "[cuda][attention][memory]") {
  std::mt19937 rng(53);
  std::vector<double> peaks;
  for (index_t t : {512, 1024, 2048, 4096}) {
    const auto q = random<float>({1, 1, t, 16}, rng).to<cuda>(), k = random<float>({1, 1, t, 16}, rng).to<cuda>(),
               v = random<float>({1, 1, t, 16}, rng).to<cuda>(), g = random<float>({1, 1, t, 16}, rng).to<cuda>();
    tk::var<float, cuda> vq(q, true), vk(k, true), vv(v, true);
    tk::allocator<cuda>::reset_peak();
    const std::size_t base = tk::allocator<cuda>::stats().allocated;
    {
      const auto out = ag::scaled_dot_product_attention(vq, vk, vv, ag::attention_options<float, cuda>{.is_causal = true});
      out.backward(g);
    }
    peaks.push_back(double(tk::allocator<cuda>::stats().peak - base));
    WARN("T = " << t << ": GPU peak " << peaks.back() << " bytes above the inputs");
  }
  for (std::size_t i = 1; i < peaks.size(); ++i) CHECK(peaks[i] <= 2.2 * peaks[i - 1]);
  CHECK(peaks.back() < 16.0 * 64 * 4096);

  const auto big = random<float>({1, 1, 4, 300}, rng).to<cuda>();
  tk::var<float, cuda> vb(big, true);
  try {
    (void)ag::scaled_dot_product_attention(vb, vb, vb);
    FAIL("a head size of 300 was accepted");
  } catch (const tk::usage_error& err) {
    const std::string what = err.what();
    CHECK(what.find("scaled_dot_product_attention") != std::string::npos);
    CHECK(what.find("300") != std::string::npos);
  }
}
