// tests/nn/test_attention_layer.cpp - nn::multi_head_attention: torch's parameters and
// initialisation, the layer against its composition from autograd ops (linear, heads,
// scaled_dot_product_attention, out_proj) in double, layouts (batch_first, unbatched), finite
// differences, attention dropout (training only, replayed bit for bit by recomputation), errors.
// Parity with torch.nn.MultiheadAttention: tests/reference/test_parity_attention.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/gradcheck.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
namespace ag = trainkit::autograd;
using tk_test::dtensor;
using tk_test::dvar;
using dmha = nn::multi_head_attention<double>;

namespace mha_test {

/// The layer written out from autograd ops on [N, L, E] inputs.
dvar composed(dmha& m, const dvar& q, const dvar& k, const dvar& v, const ag::attention_options<double, cpu>& o) {
  const index_t e = m.embed_dim(), h = m.num_heads(), hd = m.head_dim();
  const dvar w = m.in_proj_weight(), b = m.in_proj_bias();
  auto heads = [&](const dvar& x, index_t i) {
    const dvar y = ag::linear(x, ag::slice(w, 0, i * e, (i + 1) * e), ag::slice(b, 0, i * e, (i + 1) * e));
    return ag::permute(ag::reshape(y, {x.size(0), x.size(1), h, hd}), {0, 2, 1, 3});
  };
  const dvar a = ag::scaled_dot_product_attention(heads(q, 0), heads(k, 1), heads(v, 2), o);
  return m.out_proj()(ag::reshape(ag::permute(a, {0, 2, 1, 3}), {q.size(0), q.size(1), e}));
}

using trainkit::test::error_message;

TEST_CASE("multi_head_attention: torch's parameters, names and initialisation", "[nn][attention]") {
  generator gen(3);
  nn::multi_head_attention<float> m(64, 8, 0.0, true, false, gen);
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  CHECK(m.in_proj_weight().sizes() == shape{192, 64});
  CHECK(m.head_dim() == 8);
  const double bound = std::sqrt(6.0 / (64 + 192));  // xavier_uniform_ over fan_in 64, fan_out 192
  double lo = 0, hi = 0;
  for (float x : m.in_proj_weight().value().to_vector()) lo = std::min<double>(lo, x), hi = std::max<double>(hi, x);
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  CHECK(hi > 0.9 * bound);
  for (float x : m.in_proj_bias().value().to_vector()) CHECK(x == 0);
  for (float x : m.out_proj().bias().value().to_vector()) CHECK(x == 0);
  nn::multi_head_attention<float> no_bias(64, 8, 0.0, false);
  CHECK(no_bias.parameters().size() == 2);
}

TEST_CASE("multi_head_attention: the layer is its composition; batch_first, [L, N, E] and unbatched agree",
          "[nn][attention]") {
  std::mt19937 rng(2911);
  generator gen(4);
  dmha first(12, 3, 0.0, true, /*batch_first=*/true, gen);
  for (auto& p : first.parameters()) {  // biases that are not 0
    auto v = p.value();
    copy_(v, tk_test::random_tensor(p.sizes(), rng, -0.5, 0.5));
  }
  dmha seq_first(12, 3, 0.0, true, /*batch_first=*/false, gen);
  for (std::size_t i = 0; i < first.parameters().size(); ++i) {
    auto v = seq_first.parameters()[i].value();
    copy_(v, first.parameters()[i].value());
  }
  const dtensor q = tk_test::random_tensor({2, 5, 12}, rng), kv = tk_test::random_tensor({2, 7, 12}, rng);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    ag::attention_options<double, cpu> o;
    o.is_causal = causal;
    nn::attention_masks<double, cpu> masks;
    masks.is_causal = causal;
    // Self-attention (one packed projection) and cross-attention (three).
    TK_REQUIRE_CLOSE(first(dvar(q), dvar(q), dvar(q), masks).value(),
                     composed(first, dvar(q), dvar(q), dvar(q), o).value(), 1e-12);
    const dvar cross = first(dvar(q), dvar(kv), dvar(kv), masks);
    TK_REQUIRE_CLOSE(cross.value(), composed(first, dvar(q), dvar(kv), dvar(kv), o).value(), 1e-12);
    // [L, N, E]: the transposed inputs give the transposed output.
    const dvar t = seq_first(dvar(q.transpose(0, 1).contiguous()), dvar(kv.transpose(0, 1).contiguous()),
                             dvar(kv.transpose(0, 1).contiguous()), masks);
    TK_REQUIRE_CLOSE(t.value(), cross.value().transpose(0, 1).contiguous(), 1e-12);
    // Unbatched [L, E] is batch 1.
    const dvar u = first(dvar(q.slice(0, 1, 2).reshape({5, 12})), dvar(kv.slice(0, 1, 2).reshape({7, 12})),
                         dvar(kv.slice(0, 1, 2).reshape({7, 12})), masks);
    TK_REQUIRE_CLOSE(u.value(), cross.value().slice(0, 1, 2).reshape({5, 12}), 1e-12);
  }
  // forward(x) is self-attention without masks.
  TK_REQUIRE_CLOSE(first(dvar(q)).value(), first(dvar(q), dvar(q), dvar(q)).value(), 0);
}

TEST_CASE("multi_head_attention: self-attention of one var (one packed projection) equals three projections",
          "[nn][attention]") {
  std::mt19937 rng(2914);
  generator gen(6);
  dmha m(12, 3, 0.0, true, /*batch_first=*/true, gen);
  for (auto& p : m.parameters()) {
    auto v = p.value();
    copy_(v, tk_test::random_tensor(p.sizes(), rng, -0.5, 0.5));
  }
  const dtensor x = tk_test::random_tensor({2, 70, 12}, rng), g = tk_test::random_tensor({2, 70, 12}, rng);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    nn::attention_masks<double, cpu> masks;
    masks.is_causal = causal;
    if (!causal) {  // with a key padding mask instead
      masks.key_padding_mask = tensor<bool>::zeros({2, 70});
      masks.key_padding_mask.data()[75] = true;
    }
    const dvar one(x.clone(), true);
    CHECK(dmha::packs(one, one, one));
    m.zero_grad();
    m(one, one, one, masks).backward(g);
    std::vector<dtensor> packed_grads;
    for (auto& p : m.parameters()) packed_grads.push_back(p.grad().clone());
    // Three vars of the same values: three projections.
    const dvar q(x.clone(), true), k(x.clone(), true), v(x.clone(), true);
    CHECK_FALSE(dmha::packs(q, k, v));
    m.zero_grad();
    m(q, k, v, masks).backward(g);
    TK_REQUIRE_CLOSE(one.grad(), (q.grad() + k.grad() + v.grad()).contiguous(), 1e-12);
    for (std::size_t i = 0; i < packed_grads.size(); ++i) {
      INFO("parameter " << i);
      TK_REQUIRE_CLOSE(packed_grads[i], m.parameters()[i].grad(), 1e-12);
    }
  }
}

TEST_CASE("multi_head_attention: gradients of inputs and parameters match finite differences", "[nn][attention][grad]") {
  std::mt19937 rng(2912);
  generator gen(5);
  dmha m(6, 2, 0.0, true, true, gen);
  auto pad = tensor<bool>::zeros({2, 4});
  pad.data()[3] = true;  // batch 0 ignores its last key
  const dtensor q = tk_test::random_tensor({2, 3, 6}, rng), kv = tk_test::random_tensor({2, 4, 6}, rng);
  const auto r = tk_test::gradcheck(
      [&](const std::vector<dvar>& x) {
        nn::attention_masks<double, cpu> masks;
        masks.key_padding_mask = pad;
        return m(x[0], x[1], x[1], masks);
      },
      {q.clone(), kv.clone()});
  INFO(r.message);
  CHECK(r.ok);
  // The parameters (the module's own leaves): central differences of L = sum(out * R), causal.
  const dtensor proj = tk_test::random_tensor({2, 3, 6}, rng, 0.5, 1.5);
  auto loss = [&] {
    nn::attention_masks<double, cpu> masks;
    masks.is_causal = true;
    return ag::sum(m(dvar(q), dvar(kv), dvar(kv), masks) * dvar(proj));
  };
  m.zero_grad();
  loss().backward();
  for (auto& [name, p] : m.named_parameters()) {
    INFO("parameter " << name);
    const auto g = p.grad().to_vector();
    double* w = p.value().data();
    for (index_t i = 0; i < p.numel(); ++i) {
      const double w0 = w[i], h = 1e-6;
      w[i] = w0 + h;
      const double up = loss().item();
      w[i] = w0 - h;
      const double down = loss().item();
      w[i] = w0;
      CHECK(std::abs((up - down) / (2 * h) - g[std::size_t(i)]) <= 1e-6 + 1e-5 * std::abs(g[std::size_t(i)]));
    }
  }
}

TEST_CASE("multi_head_attention: dropout acts in training only and recomputation replays it bit for bit",
          "[nn][attention][dropout]") {
  std::mt19937 rng(2913);
  generator init_gen(6), drop_gen(7);
  auto net = std::make_shared<nn::sequential<float>>();
  net->push_back(std::make_shared<nn::linear<float>>(16, 16, true, init_gen));
  net->push_back(std::make_shared<nn::multi_head_attention<float>>(16, 4, 0.3, true, true, drop_gen));
  net->push_back(std::make_shared<nn::linear<float>>(16, 16, true, init_gen));
  net->push_back(std::make_shared<nn::multi_head_attention<float>>(16, 2, 0.3, true, true, drop_gen));
  const auto x = tk_test::random_tensor<float>({2, 9, 16}, rng);
  auto grads = [&](auto policy) {
    drop_gen.set_state(7, 0);
    net->zero_grad();
    const ag::var<float> y = trainkit::checkpoint::apply_recompute(policy, *net, ag::var<float>(x));
    ag::mean(y * y).backward();
    std::vector<tensor<float>> g;
    for (auto& p : net->parameters()) g.push_back(p.grad().clone());
    g.push_back(y.value().clone());
    return g;
  };
  const auto stored = grads(trainkit::checkpoint::store_all{});
  for (auto policy : {trainkit::checkpoint::recompute_choice{trainkit::checkpoint::every_n{1}},
                      trainkit::checkpoint::recompute_choice{trainkit::checkpoint::sqrt_segments{}}}) {
    INFO("policy " << trainkit::checkpoint::to_string(policy));
    const auto g = grads(policy);
    REQUIRE(g.size() == stored.size());
    for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(g[i].to_vector() == stored[i].to_vector());
  }
  // Training draws masks (two calls differ); eval draws none and equals the same layer at p = 0.
  auto& attn = static_cast<nn::multi_head_attention<float>&>(*(*net)[1]);
  const ag::var<float> xv(x);
  const auto a = attn(xv).value().to_vector(), b = attn(xv).value().to_vector();
  CHECK(a != b);
  net->eval();
  const auto offset = drop_gen.offset();
  const auto e1 = attn(xv).value().to_vector();
  CHECK(drop_gen.offset() == offset);
  CHECK(e1 == attn(xv).value().to_vector());
}

TEST_CASE("multi_head_attention: bad sizes, masks and options are named", "[nn][attention]") {
  using Catch::Matchers::Contains;
  CHECK_THAT(error_message([] { nn::multi_head_attention<float>(10, 3); }), Contains("multiple of num_heads"));
  CHECK_THAT(error_message([] { nn::multi_head_attention<float>(8, 2, 1.5); }), Contains("dropout"));
  nn::multi_head_attention<float> m(8, 2, 0.0, true, true);
  const ag::var<float> x(tensor<float>::zeros({2, 5, 8})), kv(tensor<float>::zeros({2, 6, 8}));
  CHECK_THAT(error_message([&] { m(ag::var<float>(tensor<float>::zeros({2, 5, 7}))); }),
             Contains("embed_dim = 8") && Contains("[2, 5, 7]"));
  CHECK_THAT(error_message([&] { m(x, ag::var<float>(tensor<float>::zeros({3, 6, 8})), kv); }),
             Contains("batch size") && Contains("[3, 6, 8]"));
  nn::attention_masks<float, cpu> bad;
  bad.key_padding_mask = tensor<bool>::zeros({2, 5});
  CHECK_THAT(error_message([&] { m(x, kv, kv, bad); }), Contains("key_padding_mask [2, 5]") && Contains("[2, 6]"));
  nn::attention_masks<float, cpu> bad_attn;
  bad_attn.attn_mask = tensor<bool>::zeros({5, 5});
  CHECK_THAT(error_message([&] { m(x, kv, kv, bad_attn); }),
             Contains("attn_mask [5, 5]") && Contains("[5, 6]") && Contains("[4, 5, 6]"));
  nn::attention_masks<float, cpu> both;
  both.attn_mask = tensor<bool>::zeros({5, 6});
  both.attn_mask_float = tensor<float>::zeros({5, 6});
  CHECK_THAT(error_message([&] { m(x, kv, kv, both); }), Contains("not both"));
  // A per-head mask [N * H, L, S] is accepted; its head rows differ.
  nn::attention_masks<float, cpu> per_head;
  per_head.attn_mask = tensor<bool>::zeros({4, 5, 6});
  CHECK(m(x, kv, kv, per_head).sizes() == shape{2, 5, 8});
}

}  // namespace mha_test
