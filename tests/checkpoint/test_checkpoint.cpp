// tests/checkpoint/test_checkpoint.cpp - gradient checkpointing: gradients bit-identical to the
// stored run (with dropout, with mixed precision, nested), leaf hooks fired once, the recompute
// policies' segments, the --checkpoint parser, and the peak memory a 16-block MLP saves.
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "support/gradcheck.hpp"
#include "trainkit/amp/amp.hpp"
#include "trainkit/autograd/ops/dropout.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/dropout.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/sequential.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using fvar = autograd::var<float>;
using ftensor = tensor<float>;
using ckpt_segment = trainkit::checkpoint::segment;

namespace {

ftensor random_float(const shape& s, unsigned seed) {
  std::mt19937 rng(seed);
  return tk_test::random_tensor<float>(s, rng);
}

bool bit_equal(const ftensor& a, const ftensor& b) {
  return a.defined() && b.defined() && a.sizes() == b.sizes() && a.to_vector() == b.to_vector();
}

/// An MLP of `blocks` x (linear(width, width), relu[, dropout]) as one flat sequential.
std::shared_ptr<nn::sequential<float>> make_mlp(int blocks, index_t width, double p_drop = 0.0,
                                                generator* drop_gen = nullptr) {
  generator init(2024);
  auto net = std::make_shared<nn::sequential<float>>();
  for (int i = 0; i < blocks; ++i) {
    net->push_back(std::make_shared<nn::linear<float>>(width, width, true, init));
    net->push_back(std::make_shared<nn::relu<float>>());
    if (p_drop > 0)
      net->push_back(
          std::make_shared<nn::dropout<float>>(p_drop, drop_gen ? *drop_gen : default_generator()));
  }
  return net;
}

/// Parameter gradients after one backward of mean(policy-run(x)), from a fresh net each time.
template <class Policy, class Layer = trainkit::checkpoint::default_layer_forward>
std::vector<ftensor> grads_of(const Policy& policy, int blocks, double p_drop, const ftensor& x,
                              Layer layer = {}) {
  manual_seed(77);
  generator drop_gen(5);
  auto net = make_mlp(blocks, x.size(1), p_drop, &drop_gen);
  auto y = trainkit::checkpoint::apply_recompute(policy, *net, fvar(x), layer);
  autograd::mean(y * y).backward();
  std::vector<ftensor> g;
  for (auto& p : net->parameters()) g.push_back(p.grad());
  g.push_back(ftensor::from_vector({float(drop_gen.offset()), float(default_generator().offset())}));
  return g;
}

}  // namespace

TEST_CASE("checkpoint gives the same gradients as the stored graph, bit for bit, with dropout",
          "[checkpoint]") {
  const ftensor x = random_float({6, 16}, 1), w1 = random_float({16, 16}, 2), w2 = random_float({8, 16}, 3);
  const ftensor b1 = random_float({16}, 4);
  auto block = [](const fvar& in, const fvar& w, const fvar& b) {
    auto h = autograd::relu(autograd::linear(in, w, b));
    h = autograd::dropout(h, 0.3, true);  // draws from the default generator
    return autograd::tanh(h * 2.0);
  };
  auto run = [&](bool ckpt, fvar& xin, fvar& w, fvar& b, fvar& w_out) {
    manual_seed(9);
    auto h = ckpt ? trainkit::checkpoint::checkpoint(
                        [&](const fvar& in, const fvar& ww) { return block(in, ww, b); }, xin, w)
                  : block(xin, w, b);
    auto extra = autograd::dropout(h, 0.5, true);  // after the checkpoint: the stream must not shift
    auto out = autograd::linear(extra, w_out);
    autograd::sum(out * out).backward();
    return default_generator().get_state();
  };
  fvar xa(x.clone(), true), wa(w1.clone(), true), ba(b1.clone(), true), woa(w2.clone(), true);
  fvar xb(x.clone(), true), wb(w1.clone(), true), bb(b1.clone(), true), wob(w2.clone(), true);
  const auto state_a = run(false, xa, wa, ba, woa);
  const auto state_b = run(true, xb, wb, bb, wob);
  REQUIRE(state_a == state_b);
  REQUIRE(bit_equal(xa.grad(), xb.grad()));    // an input
  REQUIRE(bit_equal(wa.grad(), wb.grad()));    // an input that is a parameter
  REQUIRE(bit_equal(ba.grad(), bb.grad()));    // a parameter captured by the closure
  REQUIRE(bit_equal(woa.grad(), wob.grad()));  // after the checkpoint
}

TEST_CASE("a checkpoint whose inputs need no gradient still trains the parameters inside", "[checkpoint]") {
  fvar x(random_float({4, 8}, 5));  // data
  fvar w(random_float({3, 8}, 6), true);
  auto y = trainkit::checkpoint::checkpoint([&](const fvar& in) { return autograd::linear(in, w); }, x);
  REQUIRE(y.requires_grad());
  REQUIRE(y.grad_fn()->name() == "checkpoint");
  autograd::sum(y).backward();
  fvar w2(w.value().clone(), true);
  autograd::sum(autograd::linear(x, w2)).backward();
  REQUIRE(bit_equal(w.grad(), w2.grad()));
  REQUIRE_FALSE(x.grad().defined());
}

TEST_CASE("under no_grad a checkpoint is the plain function", "[checkpoint]") {
  fvar x(random_float({2, 3}, 7), true);
  autograd::no_grad ng;
  auto y = trainkit::checkpoint::checkpoint([](const fvar& a) { return autograd::exp(a); }, x);
  REQUIRE(y.is_leaf());
  REQUIRE_FALSE(y.requires_grad());
  REQUIRE(bit_equal(y.value(), trainkit::exp(x.value())));
}

TEST_CASE("several inputs, a function of several vars, and nested checkpoints (re-entrant backward)",
          "[checkpoint]") {
  const ftensor a0 = random_float({5, 4}, 8), b0 = random_float({4, 6}, 9), c0 = random_float({5, 6}, 10);
  auto f = [](const fvar& a, const fvar& b, const fvar& c) {
    return autograd::sigmoid(autograd::matmul(a, b) + c) * c;
  };
  fvar a(a0.clone(), true), b(b0.clone(), true), c(c0.clone(), false);
  autograd::sum(autograd::tanh(f(a, b, c))).backward();

  fvar a2(a0.clone(), true), b2(b0.clone(), true), c2(c0.clone(), false);
  auto inner = [&](const fvar& x, const fvar& y, const fvar& z) {
    // A checkpoint inside the checkpointed function: backward runs inside backward inside backward.
    auto m = trainkit::checkpoint::checkpoint(
        [](const fvar& p, const fvar& q) { return autograd::matmul(p, q); }, x, y);
    return autograd::sigmoid(m + z) * z;
  };
  auto out = trainkit::checkpoint::checkpoint(inner, a2, b2, c2);
  autograd::sum(autograd::tanh(out)).backward();
  REQUIRE(bit_equal(a.grad(), a2.grad()));
  REQUIRE(bit_equal(b.grad(), b2.grad()));
  REQUIRE_FALSE(c2.grad().defined());
}

TEST_CASE("a second backward needs retain_graph, and then recomputes again", "[checkpoint]") {
  fvar x(random_float({3, 3}, 11), true);
  auto y = autograd::sum(trainkit::checkpoint::checkpoint([](const fvar& a) { return a * a; }, x));
  y.backward({}, true);
  const ftensor g1 = x.grad().clone();
  y.backward();
  REQUIRE(bit_equal(x.grad(), g1 * 2.0));
  REQUIRE_THROWS_AS(y.backward(), usage_error);
}

TEST_CASE("explicit generators are replayed too", "[checkpoint]") {
  generator g(123);
  const ftensor x0 = random_float({8, 8}, 12);
  auto f = [&](const fvar& a) { return autograd::dropout(a, 0.5, true, g); };
  fvar x(x0.clone(), true);
  g.set_state(123, 0);
  autograd::sum(f(x) * f(x)).backward();

  fvar x2(x0.clone(), true);
  g.set_state(123, 0);
  trainkit::checkpoint::preserve_rng keep{.default_generator = false, .generators = {&g}};
  auto y1 = trainkit::checkpoint::checkpoint(keep, f, x2);
  auto y2 = trainkit::checkpoint::checkpoint(keep, f, x2);
  autograd::sum(y1 * y2).backward();
  REQUIRE(bit_equal(x.grad(), x2.grad()));
  REQUIRE(g.offset() == 2 * 16);  // two draws of 64 values: recomputation left the stream alone
}

TEST_CASE("every leaf's post-accumulate hook fires exactly once per backward", "[checkpoint]") {
  const auto policy = GENERATE(as<trainkit::checkpoint::recompute_choice>{},
                               trainkit::checkpoint::store_all{}, trainkit::checkpoint::sqrt_segments{},
                               trainkit::checkpoint::every_n{1}, trainkit::checkpoint::every_n{3});
  INFO("policy " << trainkit::checkpoint::to_string(policy));
  auto net = make_mlp(6, 8);
  std::map<const void*, int> fired;
  for (auto& p : net->parameters())
    p.register_post_accumulate_hook([&fired, id = p.get()](ftensor&) { ++fired[id]; });
  fvar x(random_float({4, 8}, 13));
  for (int step = 1; step <= 2; ++step) {
    autograd::sum(trainkit::checkpoint::apply_recompute(policy, *net, x)).backward();
    REQUIRE(fired.size() == net->parameters().size());
    for (auto& [id, n] : fired) REQUIRE(n == step);
  }
}

TEST_CASE("apply_recompute: every policy gives the store_all gradients bit for bit", "[checkpoint]") {
  const ftensor x = random_float({8, 32}, 14);
  for (double p : {0.0, 0.2}) {
    INFO("dropout p = " << p);
    const auto ref = grads_of(trainkit::checkpoint::store_all{}, 5, p, x);
    REQUIRE(bit_equal(grads_of(trainkit::checkpoint::sqrt_segments{}, 5, p, x).back(), ref.back()));
    for (auto policy : {trainkit::checkpoint::recompute_choice{trainkit::checkpoint::sqrt_segments{}},
                        trainkit::checkpoint::recompute_choice{trainkit::checkpoint::every_n{1}},
                        trainkit::checkpoint::recompute_choice{trainkit::checkpoint::every_n{4}}}) {
      INFO("policy " << trainkit::checkpoint::to_string(policy));
      const auto g = grads_of(policy, 5, p, x);
      REQUIRE(g.size() == ref.size());
      for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(bit_equal(g[i], ref[i]));
    }
    for (std::size_t s : {1u, 2u, 3u, 100u}) {
      INFO("checkpoint_sequential with " << s << " segments");
      manual_seed(77);
      generator drop_gen(5);
      auto net = make_mlp(5, 32, p, &drop_gen);
      auto y = trainkit::checkpoint::checkpoint_sequential(*net, s, fvar(x));
      autograd::mean(y * y).backward();
      const auto params = net->parameters();
      for (std::size_t i = 0; i < params.size(); ++i) REQUIRE(bit_equal(params[i].grad(), ref[i]));
    }
  }
}

TEMPLATE_TEST_CASE("checkpointing under a mixed policy is bit-identical to mixed without it",
                   "[checkpoint][amp]", amp::mixed_bf16, amp::mixed_fp16) {
  const ftensor x = random_float({8, 32}, 15);
  const auto ref = grads_of(trainkit::checkpoint::store_all{}, 4, 0.1, x, amp::module_forward<TestType>{});
  const auto g = grads_of(trainkit::checkpoint::sqrt_segments{}, 4, 0.1, x, amp::module_forward<TestType>{});
  for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(bit_equal(g[i], ref[i]));
  const auto fp32 = grads_of(trainkit::checkpoint::store_all{}, 4, 0.1, x);
  REQUIRE_FALSE(bit_equal(ref[0], fp32[0]));  // the policy really ran in the compute type
}

TEST_CASE("recompute policies choose the segment boundaries", "[checkpoint]") {
  using namespace trainkit::checkpoint;
  STATIC_REQUIRE(recompute_policy<store_all>);
  STATIC_REQUIRE(recompute_policy<every_n>);
  STATIC_REQUIRE(recompute_policy<sqrt_segments>);
  STATIC_REQUIRE(recompute_policy<fixed_segments>);
  STATIC_REQUIRE_FALSE(recompute_policy<int>);
  REQUIRE(store_all{}.segments(5) == std::vector<ckpt_segment>{{0, 5, false}});
  REQUIRE(store_all{}.segments(0).empty());
  REQUIRE(every_n{3}.segments(7) == std::vector<ckpt_segment>{{0, 3, true}, {3, 6, true}, {6, 7, false}});
  REQUIRE(every_n{3}.segments(6) == std::vector<ckpt_segment>{{0, 3, true}, {3, 6, false}});
  REQUIRE(sqrt_segments{}.segments(16) ==
          std::vector<ckpt_segment>{{0, 4, true}, {4, 8, true}, {8, 12, true}, {12, 16, false}});
  const auto s32 = sqrt_segments{}.segments(32);  // ceil(sqrt(32)) = 6 segments: 6, 6, 5, 5, 5, 5
  REQUIRE(s32.size() == 6);
  REQUIRE(s32.front() == ckpt_segment{0, 6, true});
  REQUIRE(s32.back() == ckpt_segment{27, 32, false});
  REQUIRE(sqrt_segments{}.segments(1) == std::vector<ckpt_segment>{{0, 1, false}});
  REQUIRE(fixed_segments{10}.segments(3).size() == 3);
  REQUIRE_THROWS_AS(every_n{0}.segments(4), value_error);
  REQUIRE_THROWS_AS(fixed_segments{0}.segments(4), value_error);
}

TEST_CASE("parse_recompute reads --checkpoint none|sqrt|every:N", "[checkpoint]") {
  using namespace trainkit::checkpoint;
  REQUIRE(std::holds_alternative<store_all>(parse_recompute("none")));
  REQUIRE(std::holds_alternative<sqrt_segments>(parse_recompute("sqrt")));
  const auto e = parse_recompute("every:4");
  REQUIRE(std::get<every_n>(e).k == 4);
  for (const char* s : {"none", "sqrt", "every:1", "every:12"}) REQUIRE(to_string(parse_recompute(s)) == s);
  for (const char* bad : {"every:", "every:0", "every:x", "every:3x", "all", ""}) {
    INFO(bad);
    REQUIRE_THROWS_AS(parse_recompute(bad), value_error);
  }
  REQUIRE_THROWS_WITH(parse_recompute("full"), Catch::Contains("full") && Catch::Contains("every:N"));
}

TEST_CASE("sqrt_segments keeps at most 0.4x the peak activation bytes of store_all on a 16-block MLP",
          "[checkpoint][memory]") {
  // 16 x (Linear(256, 256) + ReLU), batch 256: 32 layers, so sqrt_segments makes 6 segments.
  auto net = make_mlp(16, 256);
  const fvar x(random_float({256, 256}, 16));
  auto peak_of = [&](const auto& policy) {
    // A first step allocates every gradient; zeroing them in place keeps them out of the measure,
    // which is then the activations, the saved tensors and backward's temporaries.
    autograd::mean(trainkit::checkpoint::apply_recompute(policy, *net, x)).backward();
    net->zero_grad(false);
    allocator<cpu>::reset_peak();
    const std::size_t base = allocator<cpu>::stats().allocated;
    autograd::mean(trainkit::checkpoint::apply_recompute(policy, *net, x)).backward();
    const std::size_t peak = allocator<cpu>::stats().peak - base;
    REQUIRE(allocator<cpu>::stats().allocated == base);  // nothing leaked into the graph's aftermath
    return peak;
  };
  const std::size_t all = peak_of(trainkit::checkpoint::store_all{});
  const std::size_t sqrt = peak_of(trainkit::checkpoint::sqrt_segments{});
  const std::size_t every4 = peak_of(trainkit::checkpoint::every_n{4});
  const double act = 256.0 * 256 * sizeof(float);
  WARN("peak activation bytes: store_all " << all << " (" << all / act << " activations), sqrt_segments "
                                           << sqrt << " (" << sqrt / act << "), every_n{4} " << every4 << " ("
                                           << every4 / act << "); sqrt / store_all = " << double(sqrt) / all);
  REQUIRE(double(sqrt) <= 0.4 * double(all));
  REQUIRE(every4 < all);
}
