// tests/autograd/test_attention.cpp - scaled_dot_product_attention (fused, tiles and an online
// softmax) against the unfused composition matmul -> softmax -> matmul in double precision,
// outputs and gradients, across tile edges (64 rows / keys), causal, additive and boolean masks,
// rows hidden from every key; finite differences on small shapes; float against double; bad
// shapes and options named; packed_self_attention (a packed projection's q, k, v blocks).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/gradcheck.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using namespace trainkit::autograd;
using tk_test::dtensor;
using tk_test::dvar;

namespace {

/// The unfused composition with the library's own differentiable ops: softmax(q k^T s + mask) v.
dvar unfused_attention(const dvar& q, const dvar& k, const dvar& v, const dtensor& mask, double scale) {
  dvar s = mul(matmul(q, transpose(k, -1, -2)), scale);
  if (mask.defined()) s = add(s, dvar(mask.expand(s.sizes()).contiguous(), false));
  return matmul(softmax(s, -1), v);
}

/// [tq, tk] additive mask of 0 / -inf: causal (key j hidden from query i when j > i).
dtensor causal_mask(index_t tq, index_t tk) {
  auto m = dtensor::empty({tq, tk});
  for (index_t i = 0; i < tq; ++i)
    for (index_t j = 0; j < tk; ++j) m.data()[i * tk + j] = j > i ? -INFINITY : 0.0;
  return m;
}

struct attention_case {
  index_t b, h, tq, tk, d, dv;
};

/// Fused against unfused: the output and all three gradients for one upstream gradient.
void check_against_unfused(const attention_case& c, const attention_options<double, cpu>& o, const dtensor& ref_mask,
                           std::mt19937& rng, double tol = 1e-12) {
  const dtensor q = tk_test::random_tensor({c.b, c.h, c.tq, c.d}, rng, -2, 2);
  const dtensor k = tk_test::random_tensor({c.b, c.h, c.tk, c.d}, rng, -2, 2);
  const dtensor v = tk_test::random_tensor({c.b, c.h, c.tk, c.dv}, rng, -1, 1);
  const dtensor g = tk_test::random_tensor({c.b, c.h, c.tq, c.dv}, rng, -1, 1);
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(c.d));
  dvar fq(q.clone(), true), fk(k.clone(), true), fv(v.clone(), true);
  dvar uq(q.clone(), true), uk(k.clone(), true), uv(v.clone(), true);
  const dvar fused = scaled_dot_product_attention(fq, fk, fv, o);
  const dvar unfused = unfused_attention(uq, uk, uv, ref_mask, scale);
  TK_REQUIRE_CLOSE(fused.value(), unfused.value(), tol);
  fused.backward(g);
  unfused.backward(g);
  TK_REQUIRE_CLOSE(fq.grad(), uq.grad(), tol);
  TK_REQUIRE_CLOSE(fk.grad(), uk.grad(), tol);
  TK_REQUIRE_CLOSE(fv.grad(), uv.grad(), tol);
}

using trainkit::test::error_message;

}  // namespace

TEST_CASE("attention: fused equals matmul-softmax-matmul across tile edges", "[attention]") {
  std::mt19937 rng(2901);
  for (attention_case c : {attention_case{1, 1, 1, 1, 4, 4}, attention_case{2, 3, 70, 90, 16, 8},
                           attention_case{1, 2, 64, 64, 8, 8}, attention_case{1, 1, 129, 65, 5, 7},
                           attention_case{2, 1, 30, 200, 32, 16}}) {
    INFO("B " << c.b << " H " << c.h << " Tq " << c.tq << " Tk " << c.tk << " d " << c.d << " dv " << c.dv);
    check_against_unfused(c, {}, {}, rng);
    attention_options<double, cpu> scaled;
    scaled.scale = 0.37;
    check_against_unfused(c, scaled, {}, rng);
  }
}

TEST_CASE("attention: each input gradient comes in its input's layout: the heads of a projection merge back "
          "without a copy",
          "[attention]") {
  std::mt19937 rng(2911);
  const index_t b = 2, t = 70, heads = 3, hd = 8;
  // Three projections [B, T, H hd], each split into heads [B, H, T, hd] (reshape, permute), as
  // nn::multi_head_attention does; the same heads as leaves, dense and as such views.
  std::vector<dvar> proj, heads_of, views, dense;
  for (int i = 0; i < 3; ++i) {
    const dtensor x = tk_test::random_tensor({b, t, heads * hd}, rng, -2, 2);
    proj.emplace_back(x.clone(), true);
    heads_of.push_back(permute(reshape(proj.back(), {b, t, heads, hd}), {0, 2, 1, 3}));
    views.emplace_back(x.clone().reshape({b, t, heads, hd}).permute({0, 2, 1, 3}), true);
    dense.emplace_back(views.back().value().contiguous(), true);
  }
  // What reaches each leaf (hooks see the incoming gradient before it is kept, densely).
  std::vector<dtensor> seen(6);
  for (std::size_t i = 0; i < 3; ++i) {
    views[i].register_hook([&seen, i](const dtensor& g) { return seen[i] = g, dtensor(); });
    dense[i].register_hook([&seen, i](const dtensor& g) { return seen[3 + i] = g, dtensor(); });
  }
  attention_options<double, cpu> o;
  o.is_causal = true;
  const dtensor g = tk_test::random_tensor({b, heads, t, hd}, rng, -1, 1);
  scaled_dot_product_attention(heads_of[0], heads_of[1], heads_of[2], o).backward(g);
  scaled_dot_product_attention(views[0], views[1], views[2], o).backward(g);
  scaled_dot_product_attention(dense[0], dense[1], dense[2], o).backward(g);
  const dvar uq(dense[0].value().clone(), true), uk(dense[1].value().clone(), true), uv(dense[2].value().clone(), true);
  unfused_attention(uq, uk, uv, causal_mask(t, t), 1.0 / std::sqrt(double(hd))).backward(g);
  const dvar* unfused[3] = {&uq, &uk, &uv};
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("input " << i);
    const dtensor& want = unfused[i]->grad();
    TK_REQUIRE_CLOSE(seen[i], want, 1e-12);
    TK_REQUIRE_CLOSE(seen[3 + i], want, 1e-12);
    TK_REQUIRE_CLOSE(proj[i].grad(), want.permute({0, 2, 1, 3}).reshape({b, t, heads * hd}), 1e-12);
    // A dense input, a dense gradient; heads inside tokens ([B, T, H, hd] memory), a gradient so
    // laid out, whose merge back into [B, T, H hd] is a view.
    CHECK(seen[3 + i].is_contiguous());
    CHECK(seen[i].strides() == views[i].value().strides());
  }
}

TEST_CASE("packed_self_attention: the attention of a packed projection's three blocks, one gradient for all three",
          "[attention]") {
  std::mt19937 rng(2913);
  const index_t b = 2, t = 70, heads = 3, hd = 8, e = heads * hd;
  const dtensor x = tk_test::random_tensor({b, t, 3 * e}, rng, -2, 2);
  const dtensor g = tk_test::random_tensor({b, heads, t, hd}, rng, -1, 1);
  auto mask = dtensor::zeros({t, t});
  for (index_t i = 0; i < t * t; i += 7) mask.data()[i] = -1.5;
  for (int variant = 0; variant < 4; ++variant) {
    INFO("variant " << variant << " (0 plain, 1 causal, 2 additive mask and scale, 3 dropout)");
    generator packed_gen(91), split_gen(91);
    attention_options<double, cpu> o;
    o.is_causal = variant == 1;
    if (variant == 2) o.attn_mask = mask, o.scale = 0.41;
    if (variant == 3) o.dropout_p = 0.2;
    o.gen = &packed_gen;
    dvar packed(x.clone(), true), split(x.clone(), true);
    const dvar out = packed_self_attention(packed, heads, o);
    // The same as slicing the three blocks and splitting each into heads.
    auto heads_of = [&](index_t i) {
      return permute(reshape(slice(split, 2, i * e, (i + 1) * e), {b, t, heads, hd}), {0, 2, 1, 3});
    };
    attention_options<double, cpu> so = o;
    so.gen = &split_gen;
    const dvar want = scaled_dot_product_attention(heads_of(0), heads_of(1), heads_of(2), so);
    CHECK(out.sizes() == shape{b, heads, t, hd});
    CHECK(packed_gen.offset() == split_gen.offset());
    TK_REQUIRE_CLOSE(out.value(), want.value(), 1e-12);
    out.backward(g);
    want.backward(g);
    TK_REQUIRE_CLOSE(packed.grad(), split.grad(), 1e-12);
  }
  // Against the unfused composition too, and finite differences on a small one.
  dvar packed(x.clone(), true);
  attention_options<double, cpu> causal;
  causal.is_causal = true;
  packed_self_attention(packed, heads, causal).backward(g);
  const dtensor blocks = x.view({b, t, 3, heads, hd});
  const dvar uq(blocks.select(2, 0).permute({0, 2, 1, 3}).contiguous(), true),
      uk(blocks.select(2, 1).permute({0, 2, 1, 3}).contiguous(), true),
      uv(blocks.select(2, 2).permute({0, 2, 1, 3}).contiguous(), true);
  unfused_attention(uq, uk, uv, causal_mask(t, t), 1.0 / std::sqrt(double(hd))).backward(g);
  const dtensor d = packed.grad().view({b, t, 3, heads, hd});
  TK_REQUIRE_CLOSE(d.select(2, 0).permute({0, 2, 1, 3}).contiguous(), uq.grad(), 1e-12);
  TK_REQUIRE_CLOSE(d.select(2, 1).permute({0, 2, 1, 3}).contiguous(), uk.grad(), 1e-12);
  TK_REQUIRE_CLOSE(d.select(2, 2).permute({0, 2, 1, 3}).contiguous(), uv.grad(), 1e-12);
  const auto r = tk_test::gradcheck(
      [&](const std::vector<dvar>& in) { return packed_self_attention(in[0], 2, causal); },
      {tk_test::random_tensor({2, 3, 12}, rng, -1, 1)});
  INFO(r.message);
  CHECK(r.ok);
  // Bad sizes are named.
  using Catch::Matchers::Contains;
  CHECK_THAT(error_message([&] { packed_self_attention(dvar(dtensor::zeros({2, 5, 10})), 2); }),
             Contains("packed_self_attention") && Contains("[2, 5, 10]") && Contains("heads = 2"));
  CHECK_THAT(error_message([&] { packed_self_attention(dvar(dtensor::zeros({5, 12})), 2); }), Contains("[5, 12]"));
}

TEST_CASE("attention: is_causal hides later keys, top-left aligned as torch", "[attention]") {
  std::mt19937 rng(2902);
  attention_options<double, cpu> o;
  o.is_causal = true;
  for (attention_case c : {attention_case{2, 2, 100, 100, 8, 8}, attention_case{1, 3, 130, 70, 16, 4},
                           attention_case{1, 1, 40, 150, 8, 8}, attention_case{1, 1, 65, 65, 4, 4}}) {
    INFO("B " << c.b << " H " << c.h << " Tq " << c.tq << " Tk " << c.tk);
    check_against_unfused(c, o, causal_mask(c.tq, c.tk), rng);
  }
}

TEST_CASE("attention: additive masks broadcast from [Tq, Tk], [B, 1, Tq, Tk] and [H, 1, Tk]", "[attention]") {
  std::mt19937 rng(2903);
  const attention_case c{2, 3, 70, 80, 8, 8};
  for (shape ms : {shape{c.tq, c.tk}, shape{c.b, 1, c.tq, c.tk}, shape{c.h, 1, c.tk}, shape{c.b, c.h, c.tq, c.tk}}) {
    INFO("mask " << to_string(ms));
    attention_options<double, cpu> o;
    o.attn_mask = tk_test::random_tensor(ms, rng, -3, 3);
    // some -inf entries too (never a whole row: the unfused softmax would give NaN there)
    for (index_t i = 0; i < o.attn_mask.numel(); i += 7)
      if (i % ms.back() != 0) o.attn_mask.data()[i] = -INFINITY;
    check_against_unfused(c, o, o.attn_mask, rng);
  }
}

TEST_CASE("attention: a boolean mask is the additive 0 / -inf one; a row hidden from every key gives 0", "[attention]") {
  std::mt19937 rng(2904);
  const attention_case c{1, 2, 70, 75, 8, 6};
  tensor<bool> keep = tensor<bool>::empty({c.tq, c.tk});
  dtensor additive = dtensor::empty({c.tq, c.tk});
  std::bernoulli_distribution coin(0.7);
  for (index_t i = 0; i < keep.numel(); ++i) {
    const bool row_hidden = i / c.tk == 3 || i / c.tk == 66;  // two rows with no key at all
    const bool k_ = !row_hidden && (i % c.tk == 0 || coin(rng));
    keep.data()[i] = k_;
    additive.data()[i] = k_ ? 0.0 : -INFINITY;
  }
  const dtensor q = tk_test::random_tensor({c.b, c.h, c.tq, c.d}, rng);
  const dtensor k = tk_test::random_tensor({c.b, c.h, c.tk, c.d}, rng);
  const dtensor v = tk_test::random_tensor({c.b, c.h, c.tk, c.dv}, rng);
  attention_options<double, cpu> ob, oa;
  ob.attn_bool_mask = keep;
  oa.attn_mask = additive;
  dvar bq(q.clone(), true), bk(k.clone(), true), bv(v.clone(), true);
  const dvar byb = scaled_dot_product_attention(bq, bk, bv, ob);
  const dvar bya = scaled_dot_product_attention(dvar(q), dvar(k), dvar(v), oa);
  TK_REQUIRE_CLOSE(byb.value(), bya.value(), 0.0);
  // the hidden rows are 0; every other row matches the unfused composition
  const dvar ref = unfused_attention(dvar(q), dvar(k), dvar(v), additive, 1.0 / std::sqrt(double(c.d)));
  for (index_t h = 0; h < c.h; ++h)
    for (index_t i = 0; i < c.tq; ++i)
      for (index_t e = 0; e < c.dv; ++e) {
        const double got = byb.value().at({0, h, i, e});
        if (i == 3 || i == 66) {
          REQUIRE(got == 0.0);
        } else {
          REQUIRE(got == Approx(ref.value().at({0, h, i, e})).margin(1e-12));
        }
      }
  byb.backward(tk_test::random_tensor(byb.sizes(), rng));
  for (index_t h = 0; h < c.h; ++h)
    for (index_t e = 0; e < c.d; ++e) {
      REQUIRE(bq.grad().at({0, h, 3, e}) == 0.0);  // no gradient through a hidden row
      REQUIRE(std::isfinite(bq.grad().at({0, h, 10, e})));
    }
}

TEST_CASE("attention: gradients match finite differences", "[attention][grad]") {
  std::mt19937 rng(2905);
  const dtensor q = tk_test::random_tensor({1, 2, 5, 3}, rng), k = tk_test::random_tensor({1, 2, 6, 3}, rng),
                v = tk_test::random_tensor({1, 2, 6, 4}, rng);
  TK_REQUIRE_GRADCHECK([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }, {q, k, v});
  TK_REQUIRE_GRADCHECK(
      [](const auto& x) {
        attention_options<double, cpu> o;
        o.is_causal = true;
        o.scale = 0.8;
        return scaled_dot_product_attention(x[0], x[1], x[2], o);
      },
      {q, k, v});
  // inputs that are views (transposed heads and tokens, as a multi-head layer makes them)
  const dtensor qt = tk_test::random_tensor({1, 5, 2, 3}, rng).transpose(1, 2);
  TK_REQUIRE_GRADCHECK([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }, {qt, k, v});
}

TEST_CASE("attention: float agrees with double", "[attention]") {
  std::mt19937 rng(2906);
  const dtensor q = tk_test::random_tensor({2, 2, 100, 32}, rng), k = tk_test::random_tensor({2, 2, 120, 32}, rng),
                v = tk_test::random_tensor({2, 2, 120, 32}, rng);
  attention_options<float, cpu> of;
  of.is_causal = true;
  attention_options<double, cpu> od;
  od.is_causal = true;
  auto to_f = [](const dtensor& t) {
    auto f = tensor<float>::empty(t.sizes());
    for (index_t i = 0; i < t.numel(); ++i) f.data()[i] = float(t.data()[i]);
    return f;
  };
  const auto yf = scaled_dot_product_attention(var<float>(to_f(q)), var<float>(to_f(k)), var<float>(to_f(v)), of);
  const auto yd = scaled_dot_product_attention(dvar(q), dvar(k), dvar(v), od);
  double worst = 0;
  for (index_t i = 0; i < yd.value().numel(); ++i)
    worst = std::max(worst, std::abs(double(yf.value().data()[i]) - yd.value().data()[i]));
  CHECK(worst < 1e-5);
}

TEST_CASE("attention: dropout is dropout(softmax) with the mask autograd::dropout draws, regenerated in backward",
          "[attention][dropout]") {
  std::mt19937 rng(2906);
  for (attention_case c : {attention_case{2, 3, 70, 90, 16, 8}, attention_case{1, 2, 130, 129, 8, 5},
                           attention_case{1, 1, 3, 5, 4, 4}}) {
    for (bool causal : {false, true}) {
      INFO("B " << c.b << " H " << c.h << " Tq " << c.tq << " Tk " << c.tk << " causal " << causal);
      const dtensor q = tk_test::random_tensor({c.b, c.h, c.tq, c.d}, rng, -2, 2);
      const dtensor k = tk_test::random_tensor({c.b, c.h, c.tk, c.d}, rng, -2, 2);
      const dtensor v = tk_test::random_tensor({c.b, c.h, c.tk, c.dv}, rng, -1, 1);
      const dtensor g = tk_test::random_tensor({c.b, c.h, c.tq, c.dv}, rng, -1, 1);
      generator fused_gen(77), unfused_gen(77);
      fused_gen.reserve(13), unfused_gen.reserve(13);  // an offset that is not 0
      attention_options<double, cpu> o;
      o.dropout_p = 0.3;
      o.gen = &fused_gen;
      o.is_causal = causal;
      dvar fq(q.clone(), true), fk(k.clone(), true), fv(v.clone(), true);
      dvar uq(q.clone(), true), uk(k.clone(), true), uv(v.clone(), true);
      const dvar fused = scaled_dot_product_attention(fq, fk, fv, o);
      dvar s = mul(matmul(uq, transpose(uk, -1, -2)), 1.0 / std::sqrt(double(c.d)));
      if (causal) s = add(s, dvar(causal_mask(c.tq, c.tk).expand(s.sizes()).contiguous(), false));
      const dvar unfused = matmul(dropout(softmax(s, -1), 0.3, true, unfused_gen), uv);
      CHECK(fused_gen.offset() == unfused_gen.offset());  // the same draw, the generator advanced alike
      TK_REQUIRE_CLOSE(fused.value(), unfused.value(), 1e-12);
      fused.backward(g);
      unfused.backward(g);
      TK_REQUIRE_CLOSE(fq.grad(), uq.grad(), 1e-12);
      TK_REQUIRE_CLOSE(fk.grad(), uk.grad(), 1e-12);
      TK_REQUIRE_CLOSE(fv.grad(), uv.grad(), 1e-12);
    }
  }
  // About p of the probabilities are dropped: with v = identity rows, each output row is the kept,
  // rescaled probabilities; their mean is 1 / Tk either way.
  const index_t t = 256;
  auto eye = dtensor::zeros({1, 1, t, t});
  for (index_t i = 0; i < t; ++i) eye.data()[i * t + i] = 1;
  generator gen(5);
  attention_options<double, cpu> o;
  o.dropout_p = 0.25;
  o.gen = &gen;
  const dvar out = scaled_dot_product_attention(dvar(dtensor::zeros({1, 1, t, 4})), dvar(dtensor::zeros({1, 1, t, 4})),
                                                dvar(eye), o);
  index_t zeros = 0;
  for (double x : out.value().to_vector()) zeros += x == 0;
  CHECK(std::abs(double(zeros) / double(t * t) - 0.25) < 0.01);
  // dropout_p = 1 gives zeros, and a generator that is not advanced at p = 0.
  o.dropout_p = 1;
  CHECK(scaled_dot_product_attention(dvar(dtensor::zeros({1, 1, 4, 4})), dvar(dtensor::zeros({1, 1, 4, 4})),
                                     dvar(dtensor::ones({1, 1, 4, 4})), o)
            .value()
            .to_vector() == std::vector<double>(16, 0.0));
  o.dropout_p = 0;
  const auto before = gen.offset();
  scaled_dot_product_attention(dvar(dtensor::zeros({1, 1, 4, 4})), dvar(dtensor::zeros({1, 1, 4, 4})),
                               dvar(dtensor::ones({1, 1, 4, 4})), o);
  CHECK(gen.offset() == before);
}

TEST_CASE("attention: wrong shapes and options are named", "[attention]") {
  const dvar q(dtensor::zeros({2, 3, 4, 8})), k(dtensor::zeros({2, 3, 5, 8})), v(dtensor::zeros({2, 3, 5, 6}));
  const auto message = [](auto&& f) { return error_message(f); };
  using Catch::Matchers::Contains;
  CHECK_THAT(message([&] { scaled_dot_product_attention(dvar(dtensor::zeros({3, 4, 8})), k, v); }),
             Contains("scaled_dot_product_attention") && Contains("[3, 4, 8]"));
  CHECK_THAT(message([&] { scaled_dot_product_attention(q, dvar(dtensor::zeros({2, 3, 5, 7})), v); }),
             Contains("same feature size"));
  CHECK_THAT(message([&] { scaled_dot_product_attention(q, k, dvar(dtensor::zeros({2, 3, 6, 6}))); }),
             Contains("same number of tokens"));
  CHECK_THAT(message([&] { scaled_dot_product_attention(q, k, dvar(dtensor::zeros({2, 2, 5, 6}))); }),
             Contains("batch and heads"));
  attention_options<double, cpu> bad_mask;
  bad_mask.attn_mask = dtensor::zeros({4, 6});
  CHECK_THAT(message([&] { scaled_dot_product_attention(q, k, v, bad_mask); }),
             Contains("attn_mask [4, 6]") && Contains("[2, 3, 4, 5]"));
  attention_options<double, cpu> both;
  both.attn_mask = dtensor::zeros({4, 5});
  both.is_causal = true;
  CHECK_THAT(message([&] { scaled_dot_product_attention(q, k, v, both); }), Contains("is_causal"));
  attention_options<double, cpu> drop;
  drop.dropout_p = 1.5;
  CHECK_THAT(message([&] { scaled_dot_product_attention(q, k, v, drop); }),
             Contains("dropout_p") && Contains("1.5"));
}

TEST_CASE("attention: forward + backward memory grows linearly with T, not with T^2", "[attention][memory]") {
  // One layer's forward and backward at T = 512 ... 4096 (fp32, 1 x 1 heads, d 16): the allocator's
  // peak above q, k, v and the upstream gradient. Unfused, the scores alone would be 4 T^2 bytes
  // (64 MiB at T = 4096) and the peak would grow 64x from 512 to 4096; fused it grows 8x.
  std::mt19937 rng(2907);
  std::vector<double> peaks;
  for (index_t t : {512, 1024, 2048, 4096}) {
    const auto q = tk_test::random_tensor<float>({1, 1, t, 16}, rng), k = tk_test::random_tensor<float>({1, 1, t, 16}, rng),
               v = tk_test::random_tensor<float>({1, 1, t, 16}, rng), g = tk_test::random_tensor<float>({1, 1, t, 16}, rng);
    var<float> vq(q, true), vk(k, true), vv(v, true);
    allocator<cpu>::reset_peak();
    const std::size_t base = allocator<cpu>::stats().allocated;
    {
      attention_options<float, cpu> o;
      o.is_causal = true;
      const auto out = scaled_dot_product_attention(vq, vk, vv, o);
      out.backward(g);
    }
    const double peak = double(allocator<cpu>::stats().peak - base);
    peaks.push_back(peak);
    WARN("T = " << t << ": peak " << peak << " bytes above the inputs (one [T, 16] fp32 tensor: " << 64 * t << ")");
  }
  for (std::size_t i = 1; i < peaks.size(); ++i) {
    INFO("T doubled: peak " << peaks[i - 1] << " -> " << peaks[i] << " bytes");
    CHECK(peaks[i] <= 2.2 * peaks[i - 1]);
  }
  CHECK(peaks.back() < 16.0 * 64 * 4096);  // a few [T, 16] tensors, never a T x T one
}
