// tests/amp/test_attention.cpp - scaled_dot_product_attention under a mixed policy (torch.autocast
// lists it as a lower-precision op): the GEMM operands and the probabilities in bf16 / fp16 with
// fp32 sums, against the double-precision composition on the rounded inputs; the native bf16 route
// (oneDNN's bf16 kernels) against the widened one; dropout from the same stream; autocast reaching
// it inside nn::multi_head_attention; inputs read where they lie (strided heads); the packed
// self-attention against the attention of its three blocks.
#include <catch2/catch.hpp>

#include <cmath>
#include <type_traits>
#include <random>
#include <vector>

#include "support/gradcheck.hpp"
#include "trainkit/amp/amp.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using trainkit::autograd::attention_options;
using trainkit::autograd::scaled_dot_product_attention;
using fvar = autograd::var<float>;
using ftensor = tensor<float>;
using tk_test::dtensor;
using tk_test::dvar;

namespace {

/// softmax(q k^T s + mask) v with the library's differentiable double ops.
dvar unfused(const dvar& q, const dvar& k, const dvar& v, double scale, bool causal) {
  namespace ag = trainkit::autograd;
  dvar s = ag::mul(ag::matmul(q, ag::transpose(k, -1, -2)), scale);
  if (causal) {
    const index_t tq = q.size(2), tk = k.size(2);
    auto m = dtensor::empty({tq, tk});
    for (index_t i = 0; i < tq; ++i)
      for (index_t j = 0; j < tk; ++j) m.data()[i * tk + j] = j > i ? -INFINITY : 0.0;
    s = ag::add(s, dvar(m.expand(s.sizes()).contiguous(), false));
  }
  return ag::matmul(ag::softmax(s, -1), v);
}

/// max |a - b| <= rel * max |b|.
template <class A, class B>
void require_rel_close(const A& a, const B& b, double rel) {
  const dtensor da = cast<double>(a), db = cast<double>(b);
  double scale = 0;
  for (index_t i = 0; i < db.numel(); ++i) scale = std::max(scale, std::abs(db.data()[i]));
  const double diff = tk_test::max_abs_diff(da, db);
  INFO("max |diff| " << diff << ", max |reference| " << scale << ", rel " << rel);
  REQUIRE(diff <= rel * scale);
}

template <class C>
bool all_representable(const ftensor& t) {
  const ftensor d = t.contiguous();
  for (index_t i = 0; i < d.numel(); ++i)
    if (float(C(d.data()[i])) != d.data()[i]) return false;
  return true;
}

struct restore_route {
  backend::cpu_gemm_route saved = backend::get_cpu_gemm_route();
  ~restore_route() { backend::set_cpu_gemm_route(saved); }
};

/// q [b, h, tq, d] and k in [-2, 2), v [b, h, tk, d] and the upstream gradient in [-1, 1).
struct attention_inputs {
  ftensor q, k, v, g;
  attention_inputs(index_t b, index_t h, index_t tq, index_t tk, index_t d, std::mt19937& rng)
      : q(tk_test::random_tensor<float>({b, h, tq, d}, rng, -2, 2)),
        k(tk_test::random_tensor<float>({b, h, tk, d}, rng, -2, 2)),
        v(tk_test::random_tensor<float>({b, h, tk, d}, rng, -1, 1)),
        g(tk_test::random_tensor<float>({b, h, tq, d}, rng, -1, 1)) {}
};

struct mixed_result {
  ftensor out, dq, dk, dv;
  bool held_bf16 = false;
};

template <class P>
mixed_result run_mixed(const ftensor& q, const ftensor& k, const ftensor& v, const ftensor& g,
                       const attention_options<float, cpu>& o) {
  fvar vq(q.clone(), true), vk(k.clone(), true), vv(v.clone(), true);
  fvar out;
  {
    amp::autocast<P> scope;
    out = scaled_dot_product_attention(vq, vk, vv, o);
  }
  const bool held = out.holds_bf16();
  mixed_result r{out.value().clone(), {}, {}, {}, held};
  out.backward(g);
  r.dq = vq.grad().clone(), r.dk = vk.grad().clone(), r.dv = vv.grad().clone();
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("mixed attention: 16-bit operands and probabilities, fp32 sums, within the compute type's error",
                   "[amp][attention]", amp::mixed_bf16, amp::mixed_fp16) {
  using C = typename TestType::compute_type;
  // bf16 keeps 8 significant bits, fp16 11: the probabilities, the output and each gradient are
  // rounded once or twice on the way.
  const double rel = std::is_same_v<C, trainkit::bfloat16> ? 2e-2 : 3e-3;
  restore_route restore;
  // The oneDNN route where this CPU has bf16 arithmetic (automatic: measured per shape).
  if (backend::blas<cpu>::bf16_native()) backend::set_cpu_gemm_route(backend::cpu_gemm_route::onednn);
  std::mt19937 rng(2931);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    const index_t d = 16;
    const attention_inputs in(2, 3, 70, causal ? 70 : 130, d, rng);
    const ftensor &q = in.q, &k = in.k, &v = in.v, &g = in.g;
    attention_options<float, cpu> o;
    o.is_causal = causal;
    const mixed_result m = run_mixed<TestType>(q, k, v, g, o);

    // The reference: the exact attention of the rounded inputs and upstream gradient.
    auto rounded = [](const ftensor& t) { return cast<double>(cast<C>(t)); };
    dvar rq(rounded(q), true), rk(rounded(k), true), rv(rounded(v), true);
    const dvar ref = unfused(rq, rk, rv, 1.0 / std::sqrt(double(d)), causal);
    ref.backward(rounded(g));
    require_rel_close(m.out, ref.value(), rel);
    require_rel_close(m.dq, rq.grad(), 2 * rel);
    require_rel_close(m.dk, rk.grad(), 2 * rel);
    require_rel_close(m.dv, rv.grad(), 2 * rel);
    // What left the op is compute-type values (held in bf16 on the native route).
    CHECK(all_representable<C>(m.out));
    CHECK(all_representable<C>(m.dq));
    CHECK(all_representable<C>(m.dk));
    CHECK(all_representable<C>(m.dv));
    if constexpr (std::is_same_v<C, trainkit::bfloat16>) CHECK(m.held_bf16 == backend::blas<cpu>::bf16_native());
    // And it is not the fp32 op: the rounding shows.
    fvar fq(q.clone(), false), fk(k.clone(), false), fv(v.clone(), false);
    CHECK(tk_test::max_abs_diff(scaled_dot_product_attention(fq, fk, fv, o).value(), m.out) > 0);
  }
}

TEST_CASE("mixed bf16 attention: oneDNN's bf16 kernels and the widened fp32 route give the same numbers",
          "[amp][attention]") {
  restore_route restore;
  if (backend::blas<cpu>::bf16_native()) backend::set_cpu_gemm_route(backend::cpu_gemm_route::onednn);
  std::mt19937 rng(2932);
  const attention_inputs in(1, 2, 100, 100, 32, rng);
  const ftensor &q = in.q, &k = in.k, &v = in.v, &g = in.g;
  attention_options<float, cpu> o;
  o.is_causal = true;
  const mixed_result native = run_mixed<amp::mixed_bf16>(q, k, v, g, o);
  backend::set_cpu_gemm_route(backend::cpu_gemm_route::openblas);  // no oneDNN: widened
  REQUIRE_FALSE(backend::blas<cpu>::bf16_native());
  const mixed_result widened = run_mixed<amp::mixed_bf16>(q, k, v, g, o);
  CHECK_FALSE(widened.held_bf16);
  // The same bf16 products summed in fp32 in another order: the results differ by at most one
  // rounding of a bf16 value (2^-8 relative) where a sum lands near a rounding boundary.
  require_rel_close(native.out, widened.out, 1.0 / 128);
  require_rel_close(native.dq, widened.dq, 1.0 / 64);
  require_rel_close(native.dk, widened.dk, 1.0 / 64);
  require_rel_close(native.dv, widened.dv, 1.0 / 64);
}

TEST_CASE("mixed attention with dropout keeps the probabilities the fp32 op keeps, from the same stream",
          "[amp][attention]") {
  std::mt19937 rng(2933);
  const index_t b = 2, h = 2, t = 80, d = 8;
  const ftensor q = tk_test::random_tensor<float>({b, h, t, d}, rng, -1, 1);
  const ftensor k = tk_test::random_tensor<float>({b, h, t, d}, rng, -1, 1);
  const ftensor v = tk_test::random_tensor<float>({b, h, t, d}, rng, -1, 1);
  const ftensor g = tk_test::random_tensor<float>({b, h, t, d}, rng, -1, 1);
  generator gm(77), gf(77);
  attention_options<float, cpu> o;
  o.dropout_p = 0.3;
  o.gen = &gm;
  const mixed_result m = run_mixed<amp::mixed_bf16>(q, k, v, g, o);
  o.gen = &gf;
  fvar fq(q.clone(), true), fk(k.clone(), true), fv(v.clone(), true);
  const fvar f = scaled_dot_product_attention(fq, fk, fv, o);
  f.backward(g);
  CHECK(gm.offset() == gf.offset());
  // Another mask would differ by whole kept probabilities (0.3 of them): far above bf16 rounding.
  require_rel_close(m.out, f.value(), 3e-2);
  require_rel_close(m.dv, fv.grad(), 5e-2);
  require_rel_close(m.dq, fq.grad(), 5e-2);
}

TEST_CASE("attention reads heads where they lie: strided q, k, v and gradient equal dense copies",
          "[amp][attention]") {
  std::mt19937 rng(2934);
  const index_t n = 2, l = 67, heads = 3, hd = 8;
  // A packed projection [N, L, 3, H, hd] and its heads [N, H, L, hd] as permuted slices.
  const dtensor packed = tk_test::random_tensor({n, l, 3, heads, hd}, rng, -2, 2);
  const dtensor g = tk_test::random_tensor({n, heads, l, hd}, rng, -1, 1);
  std::vector<dvar> strided, dense;
  for (index_t i = 0; i < 3; ++i) {
    const dtensor head = packed.permute({2, 0, 3, 1, 4}).slice(0, i, i + 1).squeeze(0);
    REQUIRE_FALSE(head.is_contiguous());
    strided.emplace_back(head, true);
    dense.emplace_back(head.contiguous(), true);
  }
  attention_options<double, cpu> o;
  o.is_causal = true;
  const dvar a = scaled_dot_product_attention(strided[0], strided[1], strided[2], o);
  const dvar c = scaled_dot_product_attention(dense[0], dense[1], dense[2], o);
  TK_REQUIRE_CLOSE(a.value(), c.value(), 1e-13);
  a.backward(g.transpose(2, 3).contiguous().transpose(2, 3));  // a strided upstream gradient too
  c.backward(g);
  for (int i = 0; i < 3; ++i) TK_REQUIRE_CLOSE(strided[std::size_t(i)].grad(), dense[std::size_t(i)].grad(), 1e-13);
}

TEST_CASE("under autocast, multi_head_attention's attention runs in bf16 and trains like fp32",
          "[amp][attention]") {
  generator gen(2936);
  nn::multi_head_attention<float> mha(32, 4, 0.0, true, true, gen);
  std::mt19937 rng(2937);
  const ftensor x = tk_test::random_tensor<float>({2, 50, 32}, rng, -1, 1);
  const ftensor g = tk_test::random_tensor<float>({2, 50, 32}, rng, -1, 1);
  nn::attention_masks<float, cpu> causal;
  causal.is_causal = true;
  auto run = [&](bool mixed, std::uint64_t* ops) {
    mha.zero_grad();
    fvar in(x.clone(), true);
    fvar out;
    const std::uint64_t before = amp::autocast<amp::mixed_bf16>::op_count();
    if (mixed) {
      amp::autocast<amp::mixed_bf16> scope;
      out = mha(in, in, in, causal);
    } else {
      out = mha(in, in, in, causal);
    }
    if (ops != nullptr) *ops = amp::autocast<amp::mixed_bf16>::op_count() - before;
    out.backward(g);
    return std::vector<ftensor>{out.value().clone(), in.grad().clone(), mha.in_proj_weight().grad().clone()};
  };
  std::uint64_t ops = 0;
  const auto m = run(true, &ops);
  const auto f = run(false, nullptr);
  CHECK(ops == 3);  // self-attention: one packed projection, the attention, the output projection
  require_rel_close(m[0], f[0], 3e-2);
  require_rel_close(m[1], f[1], 5e-2);
  require_rel_close(m[2], f[2], 5e-2);
}

TEST_CASE("mixed packed_self_attention gives the bits of the attention of its three blocks, on every route",
          "[amp][attention]") {
  namespace ag = trainkit::autograd;
  restore_route restore;
  std::mt19937 rng(2939);
  const index_t b = 2, t = 67, heads = 2, hd = 16, e = heads * hd;
  const ftensor x = tk_test::random_tensor<float>({b, t, 3 * e}, rng, -2, 2);
  const ftensor g = tk_test::random_tensor<float>({b, heads, t, hd}, rng, -1, 1);
  std::vector<backend::cpu_gemm_route> routes{backend::cpu_gemm_route::openblas};  // widened
  if (backend::onednn_supports<trainkit::bfloat16>()) routes.push_back(backend::cpu_gemm_route::onednn);
  for (const auto route : routes) {
    backend::set_cpu_gemm_route(route);
    INFO("bf16 arithmetic (oneDNN's bf16 kernels): " << backend::blas<cpu>::bf16_native());
    attention_options<float, cpu> o;
    o.is_causal = true;
    fvar packed(x.clone(), true), split(x.clone(), true);
    fvar a, c;
    {
      amp::autocast<amp::mixed_bf16> scope;
      a = ag::packed_self_attention(packed, heads, o);
      auto heads_of = [&](index_t i) {
        return ag::permute(ag::reshape(ag::slice(split, 2, i * e, (i + 1) * e), {b, t, heads, hd}), {0, 2, 1, 3});
      };
      c = scaled_dot_product_attention(heads_of(0), heads_of(1), heads_of(2), o);
    }
    CHECK(a.holds_bf16() == backend::blas<cpu>::bf16_native());
    CHECK(tk_test::max_abs_diff(a.value(), c.value()) == 0);
    a.backward(g);
    c.backward(g);
    CHECK(all_representable<trainkit::bfloat16>(packed.grad()));
    CHECK(tk_test::max_abs_diff(packed.grad(), split.grad()) == 0);
  }
}

TEST_CASE("under the automatic route a bf16 attention's tile route is measured once per shape and kept",
          "[amp][attention]") {
  if (!backend::blas<cpu>::bf16_native() || backend::get_cpu_gemm_route() != backend::cpu_gemm_route::automatic) {
    WARN("skipped: no oneDNN bf16 arithmetic on this CPU, or a forced GEMM route (nothing to measure)");
    return;
  }
  backend::detail::route_table::get().use_file("off");
  struct back_to_file {
    ~back_to_file() { backend::detail::route_table::get().use_file(""); }
  } back;
  std::mt19937 rng(2938);
  const ftensor q = tk_test::random_tensor<float>({2, 2, 70, 16}, rng, -1, 1);
  const ftensor g = tk_test::random_tensor<float>({2, 2, 70, 16}, rng, -1, 1);
  auto count = [] {
    int n = 0;
    for (const auto& c : backend::measured_routes()) n += c.key.rfind("sdpa bf16 b2 h2 tq70", 0) == 0;
    return n;
  };
  const mixed_result a = run_mixed<amp::mixed_bf16>(q, q, q, g, {});
  REQUIRE(count() == 1);
  const mixed_result b = run_mixed<amp::mixed_bf16>(q, q, q, g, {});
  CHECK(count() == 1);  // the second call took the kept choice
  // The same route both times: the same bits.
  CHECK(tk_test::max_abs_diff(a.out, b.out) == 0);
  CHECK(tk_test::max_abs_diff(a.dq, b.dq) == 0);
}
