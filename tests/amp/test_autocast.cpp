// amp::autocast: any module - a user's own, not a Sequential - gets the precision policy through
// autograd's linear/matmul/conv2d; train_step refuses a mixed policy that reached no such op.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/values.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using fvar = autograd::var<float>;
using ftensor = tensor<float>;

namespace {

using test::bit_equal;
using test::random_float;

// A user's residual network: conv stem, a residual block of two convs, pooling, a linear head,
// and a matmul of its own - no Sequential at the top, no amp in its code.
class residual_net : public nn::module<float> {
 public:
  explicit residual_net(generator& gen)
      : stem_(register_module("stem", std::make_shared<nn::conv2d<>>(1, 4, 3, nn::conv2d_options{.padding = {1, 1}}, gen))),
        c1_(register_module("c1", std::make_shared<nn::conv2d<>>(4, 4, 3, nn::conv2d_options{.padding = {1, 1}}, gen))),
        c2_(register_module("c2", std::make_shared<nn::conv2d<>>(4, 4, 3, nn::conv2d_options{.padding = {1, 1}}, gen))),
        head_(register_module("head", std::make_shared<nn::linear<>>(4 * 6 * 6, 5, true, gen))),
        mix_(register_parameter("mix", random_mix(gen))) {}
  std::string_view type_name() const override { return "residual_net"; }
  fvar forward(const fvar& x) override {
    auto h = autograd::relu(stem_->forward(x));
    h = h + c2_->forward(autograd::relu(c1_->forward(h)));  // the residual connection
    auto y = head_->forward(autograd::flatten(h, 1, -1));
    return autograd::matmul(y, mix_);
  }
  // The same computation spelled out with the amp ops (the reference).
  template <class P>
  fvar by_hand(const fvar& x) {
    auto conv = [](const std::shared_ptr<nn::conv2d<>>& c, const fvar& v) {
      return amp::conv2d<P>(v, c->weight(), c->bias(), c->op_options());
    };
    auto h = autograd::relu(conv(stem_, x));
    h = h + conv(c2_, autograd::relu(conv(c1_, h)));
    auto y = amp::linear<P>(autograd::flatten(h, 1, -1), head_->weight(), head_->bias());
    return amp::matmul<P>(y, mix_);
  }

 private:
  static ftensor random_mix(generator& gen) {
    auto t = ftensor::empty({5, 5});
    fill_normal(gen, t.data(), 25, 0.0f, 0.5f);
    return t;
  }
  std::shared_ptr<nn::conv2d<>> stem_, c1_, c2_;
  std::shared_ptr<nn::linear<>> head_;
  fvar mix_;
};

// A module whose forward has no GEMM at all (a learned scale).
class scale_only : public nn::module<float> {
 public:
  scale_only() : s_(register_parameter("s", ftensor::ones({1}))) {}
  std::string_view type_name() const override { return "scale_only"; }
  fvar forward(const fvar& x) override { return x * s_; }

 private:
  fvar s_;
};

}  // namespace

TEMPLATE_TEST_CASE("a user module runs its GEMMs and convolutions in the compute type", "[amp][autocast]",
                   amp::mixed_bf16, amp::mixed_fp16) {
  using P = TestType;
  generator gen(5);
  residual_net net(gen);
  std::mt19937 rng(6);
  const fvar x(random_float({3, 1, 6, 6}, rng));
  const auto before = autograd::autocast_op_count();
  const auto y = amp::forward<P>(net, x);
  CHECK(autograd::autocast_op_count() - before == 5);  // 3 convolutions, 1 linear, 1 matmul
  const auto ref = net.template by_hand<P>(x);
  REQUIRE(bit_equal(y.value(), ref.value()));  // exactly the hand-written 16-bit computation
  const auto fp32 = net.forward(x);            // no scope: fp32
  const auto a = y.value().to_vector(), b = fp32.value().to_vector();
  int differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  CHECK(differ == static_cast<int>(a.size()));  // every output changed (before: 0 of them)
  // Gradients flow through the mixed ops to every parameter.
  autograd::sum(y).backward();
  for (const auto& p : net.parameters()) REQUIRE(p.grad().defined());
}

TEST_CASE("autocast scopes nest, an fp32 scope turns mixed off, and plain calls are reached", "[amp][autocast]") {
  std::mt19937 rng(7);
  const fvar a(random_float({4, 6}, rng)), b(random_float({6, 3}, rng));
  const auto plain = autograd::matmul(a, b);
  {
    amp::autocast<amp::mixed_bf16> scope;
    const auto mixed = autograd::matmul(a, b);
    REQUIRE(bit_equal(mixed.value(), amp::matmul<amp::mixed_bf16>(a, b).value()));
    REQUIRE_FALSE(bit_equal(mixed.value(), plain.value()));
    {
      amp::autocast<amp::fp32> off;
      REQUIRE(bit_equal(autograd::matmul(a, b).value(), plain.value()));
    }
    REQUIRE(bit_equal(autograd::matmul(a, b).value(), mixed.value()));  // restored
  }
  REQUIRE(bit_equal(autograd::matmul(a, b).value(), plain.value()));  // the scope is gone
}

TEST_CASE("train_step under bf16 trains a user module and refuses one that reaches no GEMM", "[amp][autocast]") {
  generator gen(8);
  auto net = std::make_shared<residual_net>(gen);
  optim::sgd opt(net->parameters(), {.lr = 0.05});
  train::train_step<residual_net, optim::sgd<float>, amp::mixed_bf16> step(*net, opt);
  std::mt19937 rng(9);
  const ftensor x = random_float({8, 1, 6, 6}, rng), target = random_float({8, 5}, rng);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    const auto r = step(x, [&](const fvar& out) { return autograd::mse_loss(out, fvar(target)); });
    (i == 0 ? first : last) = r.loss;
  }
  CHECK(last < first);

  auto flat = std::make_shared<scale_only>();
  optim::sgd opt2(flat->parameters(), {.lr = 0.05});
  train::train_step<scale_only, optim::sgd<float>, amp::mixed_bf16> bad(*flat, opt2);
  REQUIRE_THROWS_AS(bad(target, [&](const fvar& out) { return autograd::mse_loss(out, fvar(target)); }), usage_error);
  REQUIRE_THROWS_WITH(bad(target, [&](const fvar& out) { return autograd::mse_loss(out, fvar(target)); }),
                      Catch::Contains("scale_only") && Catch::Contains("bf16"));
}

namespace {

// A residual block as its own module (dropout inside: the recompute must replay its mask).
class residual_block : public nn::module<float> {
 public:
  residual_block(index_t c, generator& gen)
      : c1_(register_module("c1", std::make_shared<nn::conv2d<>>(c, c, 3, nn::conv2d_options{.padding = {1, 1}}, gen))),
        c2_(register_module("c2", std::make_shared<nn::conv2d<>>(c, c, 3, nn::conv2d_options{.padding = {1, 1}}, gen))),
        drop_(register_module("drop", std::make_shared<nn::dropout<>>(0.25))) {}
  std::string_view type_name() const override { return "residual_block"; }
  fvar forward(const fvar& x) override { return x + drop_->forward(c2_->forward(autograd::relu(c1_->forward(x)))); }

 private:
  std::shared_ptr<nn::conv2d<>> c1_, c2_;
  std::shared_ptr<nn::dropout<>> drop_;
};

// A user network that names its segments: forward is stem (with batch norm), block, block, head.
class segmented_net : public nn::module<float> {
 public:
  explicit segmented_net(generator& gen)
      : stem_(register_module("stem", nn::make_sequential(std::make_shared<nn::conv2d<>>(
                                                               1, 4, 3, nn::conv2d_options{.padding = {1, 1}}, gen),
                                                           std::make_shared<nn::batch_norm2d<>>(4),
                                                           std::make_shared<nn::relu<>>()))),
        b1_(register_module("b1", std::make_shared<residual_block>(4, gen))),
        b2_(register_module("b2", std::make_shared<residual_block>(4, gen))),
        head_(register_module("head", nn::make_sequential(std::make_shared<nn::flatten<>>(),
                                                           std::make_shared<nn::linear<>>(4 * 6 * 6, 5, true, gen)))) {}
  std::string_view type_name() const override { return "segmented_net"; }
  std::vector<nn::module<float>*> segments() { return {stem_.get(), b1_.get(), b2_.get(), head_.get()}; }
  fvar forward(const fvar& x) override {
    fvar h = x;
    for (auto* s : segments()) h = s->forward(h);
    return h;
  }

 private:
  std::shared_ptr<nn::sequential<>> stem_;
  std::shared_ptr<residual_block> b1_, b2_;
  std::shared_ptr<nn::sequential<>> head_;
};

template <class P, class R>
std::vector<std::vector<float>> grads_after_steps(int steps) {
  generator gen(11);
  auto net = std::make_shared<segmented_net>(gen);
  optim::sgd opt(net->parameters(), {.lr = 0.05});
  train::train_step<segmented_net, optim::sgd<float>, P, amp::no_scaling, R> step(*net, opt);
  std::mt19937 rng(12);
  const ftensor x = random_float({4, 1, 6, 6}, rng), target = random_float({4, 5}, rng);
  manual_seed(13);
  for (int i = 0; i < steps; ++i) step(x, [&](const fvar& out) { return autograd::mse_loss(out, fvar(target)); });
  std::vector<std::vector<float>> g;
  for (const auto& p : net->parameters()) g.push_back(p.grad().to_vector());
  // The batch norm's running statistics: updated once per step, not again by the recomputation.
  for (const auto& [name, t] : net->named_buffers())
    if (name.find("running") != std::string::npos) g.push_back(t.to_vector());
  return g;
}

}  // namespace

TEMPLATE_TEST_CASE("a user module that names its segments recomputes them bit for bit", "[amp][checkpoint]",
                   amp::fp32, amp::mixed_bf16) {
  using P = TestType;
  static_assert(checkpoint::segmented_module<segmented_net>);
  const auto stored = grads_after_steps<P, checkpoint::store_all>(3);
  CHECK(grads_after_steps<P, checkpoint::sqrt_segments>(3) == stored);
  CHECK(grads_after_steps<P, checkpoint::every_n>(3) == stored);
}

// ---- 16-bit values between ops (value_precision, autograd/saved.hpp) ------------------------------

namespace {
bool all_bf16_values(const ftensor& t) {
  for (const float v : t.contiguous().to_vector())
    if (static_cast<float>(trainkit::bfloat16(v)) != v) return false;
  return true;
}
ftensor rounded_bf16(const ftensor& t) { return map(functors::round_to<trainkit::bfloat16>{}, t); }
}  // namespace

TEST_CASE("under bf16 the ops after a convolution keep 16-bit values 16-bit, as torch.autocast does",
          "[amp][autocast][precision]") {
  using autograd::value_precision;
  generator gen(31);
  std::mt19937 rng(32);
  nn::conv2d<float> conv(2, 3, 3, nn::conv2d_options{.padding = {1, 1}}, gen);
  nn::batch_norm2d<float> bn(3);
  const fvar x(random_float({4, 2, 6, 6}, rng));
  amp::autocast<amp::mixed_bf16> scope;
  const fvar h = conv.forward(x);
  REQUIRE(h.precision() == value_precision::bfloat16);
  const fvar b = bn.forward(h);  // a bf16 input: a bf16 output (PyTorch's batch norm on a bf16 tensor)
  CHECK(b.precision() == value_precision::bfloat16);
  CHECK(all_bf16_values(b.value()));
  const fvar r = autograd::relu(b);
  CHECK(r.precision() == value_precision::bfloat16);
  const fvar p = autograd::max_pool2d(r);
  CHECK(p.precision() == value_precision::bfloat16);
  const fvar s = p + p;  // bf16 + bf16: the rounded sum, still bf16
  CHECK(s.precision() == value_precision::bfloat16);
  CHECK(all_bf16_values(s.value()));
  CHECK((s + fvar(random_float(s.sizes(), rng))).precision() == value_precision::full);  // bf16 + fp32: fp32
  CHECK(autograd::mean(s, {2, 3}).precision() == value_precision::full);  // not on the list: fp32
  CHECK(autograd::relu(x).precision() == value_precision::full);        // plain values stay plain
}

TEST_CASE("relu and batch norm save 16-bit values in 16 bits: same gradients, half the bytes",
          "[amp][autocast][precision]") {
  using autograd::value_precision;
  std::mt19937 rng(33);
  const ftensor xv = rounded_bf16(random_float({8, 4, 16, 16}, rng));  // bf16 values
  const ftensor w = random_float({8, 4, 16, 16}, rng);
  // The same computation on the same values, tagged bf16 (16-bit saves) and not (full saves).
  auto run = [&](bool tagged, std::size_t& held) {
    fvar x(xv, true);
    nn::batch_norm2d<float> bn(4);
    const auto tag = [&](fvar v) {  // the input as a precision scope's op would hand it over
      if (tagged) v.set_precision(value_precision::bfloat16);
      return v;
    };
    const std::size_t before = allocator<cpu>::stats().allocated;
    // x * 1.0: a temporary, as an activation is, so what the graph saves is all that holds it.
    const fvar y = autograd::relu(bn.forward(autograd::relu(tag(x * 1.0))));
    held = allocator<cpu>::stats().allocated - before - std::size_t(y.numel()) * sizeof(float);
    autograd::sum(y * fvar(w)).backward();
    return std::pair{y.value(), x.grad()};
  };
  std::size_t held16 = 0, held32 = 0;
  const auto [y16, g16] = run(true, held16);
  const auto [y32, g32] = run(false, held32);
  CHECK(bit_equal(y16, autograd::relu(fvar(rounded_bf16(y32))).value()));  // only the BN output's rounding differs
  // The backward of relu and batch norm read the same values either way: the input gradient
  // differs through the rounded batch-norm output (relu's mask after it) and batch norm's gradient,
  // which for a bf16 input is bf16 values (PyTorch returns a bf16 gradient for a bf16 input).
  CHECK(bit_equal(g16, rounded_bf16(g16)));
  const auto a = g16.to_vector(), b = g32.to_vector();
  std::size_t close = 0;
  for (std::size_t i = 0; i < a.size(); ++i) close += std::fabs(a[i] - b[i]) <= 0x1p-8f * std::fabs(b[i]);
  CHECK(double(close) >= 0.5 * double(a.size()));
  WARN("bytes held for backward by relu -> batch norm -> relu: bf16-tagged " << held16 << ", plain " << held32);
  CHECK(double(held16) <= 0.55 * double(held32));  // three activations in 2 bytes instead of 4
}
