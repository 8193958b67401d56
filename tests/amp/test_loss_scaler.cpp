// tests/amp/test_loss_scaler.cpp - the loss scalers against GradScaler's semantics: skipped steps
// and backoff on inf/NaN, growth after the interval, unscale before clipping, at most one unscale
// per step, state round trips, gradient accumulation and the cross-rank found-inf hook.
#include <catch2/catch.hpp>

#include "support/values.hpp"
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/gradcheck.hpp"
#include "trainkit/amp/amp.hpp"
#include "trainkit/optim/clip_grad.hpp"
#include "trainkit/optim/sgd.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using fvar = autograd::var<float>;
using ftensor = tensor<float>;

namespace {

/// A two-parameter model: loss = sum((x W^T + b)^2) / rows.
struct tiny_model {
  fvar w, b;
  explicit tiny_model(unsigned seed) {
    std::mt19937 rng(seed);
    w = fvar(tk_test::random_tensor<float>({3, 4}, rng), true);
    b = fvar(tk_test::random_tensor<float>({3}, rng), true);
  }
  tiny_model(const tiny_model& o) : w(o.w.value().clone(), true), b(o.b.value().clone(), true) {}
  std::vector<fvar> params() const { return {w, b}; }
  fvar loss(const ftensor& x) const {
    auto y = autograd::linear(fvar(x), w, b);
    return autograd::mean(y * y);
  }
};

ftensor batch(unsigned seed, index_t rows = 5) {
  std::mt19937 rng(seed);
  return tk_test::random_tensor<float>({rows, 4}, rng);
}

using trainkit::test::values_equal;

void poison(fvar& p, float value) {
  auto g = p.grad();
  g.data()[1] = value;
}

}  // namespace

TEST_CASE("the scalers model the concept", "[amp][scaler]") {
  STATIC_REQUIRE(amp::loss_scaler<amp::no_scaling>);
  STATIC_REQUIRE(amp::loss_scaler<amp::static_scaling>);
  STATIC_REQUIRE(amp::loss_scaler<amp::dynamic_scaling>);
  STATIC_REQUIRE_FALSE(amp::loss_scaler<int>);
  amp::dynamic_scaling s;
  REQUIRE(s.get_scale() == 65536.0);
  REQUIRE(s.options().growth_factor == 2.0);
  REQUIRE(s.options().backoff_factor == 0.5);
  REQUIRE(s.options().growth_interval == 2000);
  REQUIRE(s.growth_tracker() == 0);
}

TEST_CASE("scale multiplies the loss, so every gradient is scaled exactly", "[amp][scaler]") {
  tiny_model a(1), b(a);
  const auto x = batch(2);
  amp::dynamic_scaling s;
  auto scaled = s.scale(b.loss(x));
  REQUIRE(scaled.item() == a.loss(x).item() * 65536.0f);
  scaled.backward();
  a.loss(x).backward();
  REQUIRE(values_equal(b.w.grad(), a.w.grad() * 65536.0));
  s.unscale(b.params());
  REQUIRE(values_equal(b.w.grad(), a.w.grad()));
  REQUIRE(values_equal(b.b.grad(), a.b.grad()));
}

TEST_CASE("an inf or NaN in one gradient skips the step and halves the scale", "[amp][scaler]") {
  const float bad = GENERATE(std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN());
  tiny_model m(3);
  const ftensor w0 = m.w.value().clone(), b0 = m.b.value().clone();
  optim::sgd<float> opt(m.params(), {.lr = 0.1});
  amp::dynamic_scaling s;
  s.scale(m.loss(batch(4))).backward();
  poison(m.b, bad);
  REQUIRE_FALSE(s.step(opt));
  REQUIRE(s.found_inf());
  REQUIRE(values_equal(m.w.value(), w0));  // no parameter moved
  REQUIRE(values_equal(m.b.value(), b0));
  s.update();
  REQUIRE(s.get_scale() == 32768.0);
  REQUIRE(s.growth_tracker() == 0);
  REQUIRE(s.skipped_steps() == 1);
  REQUIRE(s.found_inf());  // of the last finished step

  // The next clean step goes through at the new scale.
  opt.zero_grad();
  s.scale(m.loss(batch(4))).backward();
  REQUIRE(s.step(opt));
  REQUIRE_FALSE(values_equal(m.w.value(), w0));
  s.update();
  REQUIRE(s.get_scale() == 32768.0);
  REQUIRE(s.growth_tracker() == 1);
  REQUIRE_FALSE(s.found_inf());
}

TEST_CASE("the scale grows after growth_interval clean steps; an inf resets the count", "[amp][scaler]") {
  tiny_model m(5);
  optim::sgd<float> opt(m.params(), {.lr = 1e-3});
  amp::dynamic_scaling s(
      {.init_scale = 1024, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 3});
  auto one_step = [&](bool inject) {
    opt.zero_grad();
    s.scale(m.loss(batch(6))).backward();
    if (inject) poison(m.w, std::numeric_limits<float>::infinity());
    const bool stepped = s.step(opt);
    s.update();
    return stepped;
  };
  REQUIRE(one_step(false));
  REQUIRE(one_step(false));
  REQUIRE(s.get_scale() == 1024.0);
  REQUIRE(s.growth_tracker() == 2);
  REQUIRE(one_step(false));  // the third clean step: growth
  REQUIRE(s.get_scale() == 4096.0);
  REQUIRE(s.growth_tracker() == 0);
  REQUIRE(one_step(false));
  REQUIRE(one_step(false));
  REQUIRE_FALSE(one_step(true));  // backoff and reset, two steps short of growth
  REQUIRE(s.get_scale() == 1024.0);
  REQUIRE(s.growth_tracker() == 0);
  REQUIRE(one_step(false));
  REQUIRE(one_step(false));
  REQUIRE(s.get_scale() == 1024.0);
  REQUIRE(one_step(false));
  REQUIRE(s.get_scale() == 4096.0);
  REQUIRE(s.skipped_steps() == 1);
}

TEST_CASE("growth stops where the scale would overflow", "[amp][scaler]") {
  tiny_model m(6);
  optim::sgd<float> opt(m.params(), {.lr = 0.0});
  amp::dynamic_scaling s({.init_scale = std::numeric_limits<double>::max() / 1.5, .growth_interval = 1});
  const double before = s.get_scale();
  m.loss(batch(1)).backward();  // unscaled: the gradients stay finite
  s.step(opt);
  s.update();
  REQUIRE(s.get_scale() == before);
  REQUIRE(s.growth_tracker() == 0);
}

TEST_CASE("unscale then clip equals clipping the unscaled gradients", "[amp][scaler]") {
  tiny_model a(7), b(a);
  const auto x = batch(8, 9);
  a.loss(x).backward();
  const double na = optim::clip_grad_norm_(a.params(), 0.05);

  amp::dynamic_scaling s;
  optim::sgd<float> opt(b.params(), {.lr = 0.1});
  s.scale(b.loss(x)).backward();
  REQUIRE_FALSE(s.unscale(opt));
  const double nb = optim::clip_grad_norm_(opt.params(), 0.05);
  REQUIRE(na == nb);
  REQUIRE(na > 0.05);  // clipping did something
  REQUIRE(values_equal(a.w.grad(), b.w.grad()));
  REQUIRE(values_equal(a.b.grad(), b.b.grad()));
  // step() after an explicit unscale() does not unscale again.
  optim::sgd<float> opt_a(a.params(), {.lr = 0.1});
  opt_a.step();
  REQUIRE(s.step(opt));
  s.update();
  REQUIRE(values_equal(a.w.value(), b.w.value()));
  REQUIRE(values_equal(a.b.value(), b.b.value()));
}

TEST_CASE("misuse within a step is a usage_error, as in GradScaler", "[amp][scaler]") {
  tiny_model m(9);
  optim::sgd<float> opt(m.params(), {.lr = 0.1});
  amp::dynamic_scaling s;
  REQUIRE_THROWS_AS(s.update(), usage_error);  // nothing recorded yet
  s.scale(m.loss(batch(1))).backward();
  s.unscale(opt);
  REQUIRE_THROWS_AS(s.unscale(opt), usage_error);
  REQUIRE_THROWS_WITH(s.unscale(opt), Catch::Contains("already been called"));
  s.step(opt);
  REQUIRE_THROWS_WITH(s.unscale(opt), Catch::Contains("after step()"));
  REQUIRE_THROWS_WITH(s.step(opt), Catch::Contains("already been called"));
  s.update();
  // A new step starts clean.
  opt.zero_grad();
  s.scale(m.loss(batch(1))).backward();
  REQUIRE_NOTHROW(s.unscale(opt));
  REQUIRE_NOTHROW(s.step(opt));
  // An optimizer and its parameter list are one entry: no double unscale through either door.
  s.update();
  opt.zero_grad();
  s.scale(m.loss(batch(1))).backward();
  s.unscale(opt.params());
  REQUIRE_THROWS_AS(s.unscale(opt), usage_error);
  const ftensor g = m.w.grad().clone();
  REQUIRE(s.step(opt));  // does not unscale a second time
  REQUIRE(values_equal(m.w.grad(), g));
  s.update();
  REQUIRE_THROWS_AS(amp::dynamic_scaling({.growth_factor = 1.0}), value_error);
  REQUIRE_THROWS_AS(amp::dynamic_scaling({.backoff_factor = 1.0}), value_error);
  REQUIRE_THROWS_AS(amp::dynamic_scaling({.init_scale = 0}), value_error);
  REQUIRE_THROWS_AS(amp::dynamic_scaling({.growth_interval = 0}), value_error);
  REQUIRE_THROWS_AS(amp::static_scaling{-1.0}, value_error);
}

TEST_CASE("the reciprocal of the scale is computed in double and applied in fp32", "[amp][scaler]") {
  tiny_model a(10), b(a);
  const auto x = batch(11);
  amp::static_scaling s{3.0};
  s.scale(b.loss(x)).backward();
  const ftensor scaled = b.w.grad().clone();
  s.unscale(b.params());
  const float inv = static_cast<float>(1.0 / 3.0);
  const auto got = b.w.grad().to_vector(), in = scaled.to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == in[i] * inv);
}

TEST_CASE("state round trips: a restored scaler continues identically", "[amp][scaler]") {
  tiny_model m(12);
  optim::sgd<float> opt(m.params(), {.lr = 1e-3});
  const amp::dynamic_scaling_options o{.init_scale = 256, .growth_interval = 2};
  amp::dynamic_scaling s(o);
  auto drive = [&](amp::dynamic_scaling& sc, int steps, int inf_at) {
    std::vector<double> scales;
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      sc.scale(m.loss(batch(13))).backward();
      if (i == inf_at) poison(m.w, std::numeric_limits<float>::quiet_NaN());
      sc.step(opt);
      sc.update();
      scales.push_back(sc.get_scale());
    }
    return scales;
  };
  drive(s, 3, 1);
  const amp::dynamic_scaling::state st = s.get_state();
  REQUIRE(st.scale == s.get_scale());
  REQUIRE(st.growth_tracker == s.growth_tracker());
  REQUIRE(st.growth_tracker == 1);  // resumed mid-interval: the tracker matters

  amp::dynamic_scaling restored(s.options());
  restored.set_state(st);
  REQUIRE(restored.get_state() == st);
  const auto a = drive(s, 5, 3), b = drive(restored, 5, 3);
  REQUIRE(a == b);
  REQUIRE_THROWS_AS(restored.set_state({.scale = 1.0, .growth_tracker = 2}), value_error);  // >= interval
  REQUIRE_THROWS_AS(restored.set_state({.scale = -1.0, .growth_tracker = 0}), value_error);

  amp::static_scaling ss{8.0};
  amp::static_scaling ss2{1.0};
  ss2.set_state(ss.get_state());
  REQUIRE(ss2.get_scale() == 8.0);
}

TEST_CASE("gradient accumulation: two scaled micro-batches, one unscale and step", "[amp][scaler]") {
  tiny_model a(14), b(a);
  const auto x1 = batch(15), x2 = batch(16);
  a.loss(x1).backward();
  a.loss(x2).backward();

  amp::dynamic_scaling s;
  optim::sgd<float> opt(b.params(), {.lr = 0.5});
  s.scale(b.loss(x1)).backward();
  s.scale(b.loss(x2)).backward();
  REQUIRE(s.step(opt));
  s.update();
  optim::sgd<float> opt_a(a.params(), {.lr = 0.5});
  opt_a.step();
  REQUIRE(values_equal(a.w.value(), b.w.value()));
  REQUIRE(values_equal(a.b.value(), b.b.value()));
  REQUIRE(s.growth_tracker() == 1);  // one step, not two
}

TEST_CASE("the found-inf reducer makes every rank skip the same step", "[amp][scaler]") {
  tiny_model m(17);
  const ftensor w0 = m.w.value().clone();
  optim::sgd<float> opt(m.params(), {.lr = 0.1});
  amp::dynamic_scaling s;
  bool other_rank_found = true;
  int calls = 0;
  std::vector<bool> seen;
  s.set_found_inf_reducer([&](bool local) {
    ++calls;
    seen.push_back(local);
    return local || other_rank_found;  // an allreduce(OR) over two ranks
  });
  s.scale(m.loss(batch(18))).backward();  // finite here
  REQUIRE_FALSE(s.step(opt));             // but the other rank overflowed
  REQUIRE(values_equal(m.w.value(), w0));
  s.update();
  REQUIRE(s.get_scale() == 32768.0);
  REQUIRE(calls == 1);
  REQUIRE(seen == std::vector<bool>{false});
  other_rank_found = false;
  opt.zero_grad();
  s.scale(m.loss(batch(18))).backward();
  REQUIRE(s.unscale(opt) == false);
  REQUIRE(s.step(opt));
  s.update();
  REQUIRE(calls == 2);  // once per unscale, whether explicit or from step()
}

TEST_CASE("static scaling skips on inf and keeps its scale; no_scaling always steps", "[amp][scaler]") {
  tiny_model m(19);
  optim::sgd<float> opt(m.params(), {.lr = 0.1});
  amp::static_scaling s{128.0};
  s.scale(m.loss(batch(20))).backward();
  poison(m.w, std::numeric_limits<float>::infinity());
  REQUIRE_FALSE(s.step(opt));
  s.update();
  REQUIRE(s.get_scale() == 128.0);
  REQUIRE(s.skipped_steps() == 1);

  amp::no_scaling n;
  opt.zero_grad();
  auto loss = m.loss(batch(20));
  REQUIRE(n.scale(loss).same(loss));
  n.scale(loss).backward();
  const ftensor g = m.w.grad().clone();
  REQUIRE_FALSE(n.unscale(opt));
  REQUIRE(values_equal(m.w.grad(), g));
  REQUIRE(n.step(opt));
  n.update();
  REQUIRE(n.get_scale() == 1.0);
}

TEST_CASE("with fp16 GEMMs, loss scaling keeps small gradients from flushing to zero", "[amp][scaler]") {
  fvar x(ftensor::full({4, 8}, 1e-3f)), w(ftensor::full({2, 8}, 1e-3f), true);
  auto loss = [&] { return autograd::sum(amp::linear<amp::mixed_fp16>(x, w)) * 1e-4; };
  loss().backward();  // dW = 1e-4 * sum over rows of x = 4e-7 per element, after an fp16 GEMM
  const float unscaled = w.grad().to_vector()[0];
  w.zero_grad();
  amp::dynamic_scaling s;
  s.scale(loss()).backward();
  s.unscale(std::vector<fvar>{w});
  const float scaled = w.grad().to_vector()[0];
  // Without scaling the incoming gradient 1e-4 is representable but g^T x = 4e-7 lands among
  // fp16's subnormals and loses most of its bits; scaled, it is exact to fp16's 11 bits.
  REQUIRE(std::abs(scaled - 4e-7f) < 4e-7f * 1e-3f);
  REQUIRE(std::abs(unscaled - 4e-7f) > 4e-7f * 1e-2f);
}
