// tests/optim/test_train_mlp.cpp - end to end: a small MLP (nn::sequential of linear + relu) on a
// synthetic, separable but not linearly separable problem (XOR of the signs of two coordinates,
// with a margin) trains past 95% accuracy with sgd (momentum) and with adamw, under a schedule and
// gradient clipping.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "trainkit/trainkit.hpp"  // nn, optim, autograd::cross_entropy

using namespace trainkit;

namespace {

struct dataset {
  tensor<float> x;         // [n, 2]
  tensor<std::int64_t> y;  // [n]
};

/// Points uniform in [-1, 1]^2 away from the axes (|x0|, |x1| >= 0.1); class = sign(x0) xor sign(x1).
dataset make_data(std::size_t n, std::uint64_t seed) {
  generator g(seed);
  std::vector<float> xs;
  std::vector<std::int64_t> ys;
  std::vector<float> u(2);
  while (ys.size() < n) {
    fill_uniform(g, u.data(), 2, -1.0f, 1.0f);
    if (std::abs(u[0]) < 0.1f || std::abs(u[1]) < 0.1f) continue;
    xs.push_back(u[0]);
    xs.push_back(u[1]);
    ys.push_back((u[0] > 0) != (u[1] > 0) ? 1 : 0);
  }
  return {tensor<float>::from_vector(xs, {static_cast<index_t>(n), 2}),
          tensor<std::int64_t>::from_vector(ys)};
}

std::shared_ptr<nn::sequential<float>> make_mlp(std::uint64_t seed) {
  generator g(seed);
  return nn::make_sequential(
      std::make_shared<nn::linear<float>>(2, 32, true, g), std::make_shared<nn::relu<float>>(),
      std::make_shared<nn::linear<float>>(32, 32, true, g), std::make_shared<nn::relu<float>>(),
      std::make_shared<nn::linear<float>>(32, 2, true, g));
}

double accuracy(nn::module<float>& net, const dataset& d) {
  no_grad guard;
  net.eval();
  const auto pred = argmax(net.forward(var<float>(d.x)).value(), 1).to_vector();
  net.train();
  const auto y = d.y.to_vector();
  std::size_t ok = 0;
  for (std::size_t i = 0; i < y.size(); ++i) ok += pred[i] == y[i];
  return double(ok) / double(y.size());
}

/// Mini-batch training: batches of 64 rows in order, `epochs` passes.
template <class Opt, class Sched>
double train_epochs(nn::module<float>& net, Opt& opt, Sched& sched, const dataset& d, int epochs) {
  const index_t n = d.x.size(0), batch = 64;
  double last_loss = 0;
  sched.apply(opt);
  for (int e = 0; e < epochs; ++e) {
    for (index_t b = 0; b < n; b += batch) {
      const index_t end = std::min(n, b + batch);
      var<float> xb(d.x.slice(0, b, end).contiguous());
      const auto yb = d.y.slice(0, b, end).contiguous();
      opt.zero_grad();
      auto loss = autograd::cross_entropy(net.forward(xb), yb);
      loss.backward();
      optim::clip_grad_norm_(net.parameters(), 5.0);
      opt.step();
      sched.step(opt);
      last_loss = loss.item();
    }
  }
  return last_loss;
}

}  // namespace

TEST_CASE("an MLP learns XOR-of-signs past 95% with sgd and with adamw", "[optim][train]") {
  const dataset train_set = make_data(512, 1), test_set = make_data(512, 2);
  const int epochs = 40;
  const std::int64_t total = epochs * 8;

  SECTION("sgd with Nesterov momentum, cyclic learning rate") {
    auto net = make_mlp(3);
    optim::sgd<float> opt(net->parameters(), {.lr = 0.1, .momentum = 0.9, .nesterov = true});
    optim::cyclic_lr sched({.base_lr = 0.01, .max_lr = 0.2, .step_size_up = total / 4});
    const double before = accuracy(*net, test_set);
    const double loss = train_epochs(*net, opt, sched, train_set, epochs);
    const double acc = accuracy(*net, test_set);
    INFO("accuracy " << before << " -> " << acc << ", last loss " << loss);
    CHECK(acc > 0.95);
  }
  SECTION("adamw, warmup + cosine") {
    auto net = make_mlp(4);
    optim::adamw<float> opt(net->parameters(), {.lr = 0.01, .weight_decay = 0.01});
    optim::warmup_cosine_lr sched(
        {.base_lr = 0.01, .warmup_steps = 16, .total_steps = total, .min_lr = 1e-4});
    const double before = accuracy(*net, test_set);
    const double loss = train_epochs(*net, opt, sched, train_set, epochs);
    const double acc = accuracy(*net, test_set);
    INFO("accuracy " << before << " -> " << acc << ", last loss " << loss);
    CHECK(acc > 0.95);
  }
}
