// tests/train/test_train_step.cpp - train_step against the hand-written loop: bit-identical with the
// no-op policies (dropout included), with clipping and a schedule; the recompute axis equal to
// store_all; fp16 with dynamic scaling skipping the steps a hand loop skips; data_parallel on
// thread ranks keeping the ranks bit-identical; metrics per step; the batch-size finder.
#include <catch2/catch.hpp>

#include "support/values.hpp"
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "monitor/parsers.hpp"
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/core/seed.hpp"
#include "trainkit/parallel/data_parallel.hpp"
#include "trainkit/dist/thread_group.hpp"
#include "trainkit/monitor/monitor.hpp"
#include "trainkit/train/train.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using Catch::Matchers::Contains;
using net_t = nn::sequential<float>;

namespace {

std::shared_ptr<net_t> make_mlp(std::uint64_t seed, index_t in = 12, index_t hidden = 32, index_t out = 4) {
  set_seed(seed);
  return nn::make_sequential(
      std::make_shared<nn::linear<float>>(in, hidden), std::make_shared<nn::relu<float>>(),
      std::make_shared<nn::dropout<float>>(0.25), std::make_shared<nn::linear<float>>(hidden, hidden),
      std::make_shared<nn::relu<float>>(), std::make_shared<nn::linear<float>>(hidden, out));
}

struct batches {
  std::vector<tensor<float>> x;
  std::vector<tensor<std::int64_t>> y;
};
batches make_batches(int n, index_t b = 16, index_t in = 12, index_t classes = 4, float amplitude = 1.0f) {
  generator g(777);
  batches r;
  for (int i = 0; i < n; ++i) {
    auto x = tensor<float>::empty({b, in});
    fill_normal(g, x.data(), static_cast<std::size_t>(b * in), 0.0f, amplitude);
    auto y = tensor<std::int64_t>::empty({b});
    for (index_t k = 0; k < b; ++k) y.data()[k] = static_cast<std::int64_t>((k * 7 + i) % classes);
    r.x.push_back(x);
    r.y.push_back(y);
  }
  return r;
}

using trainkit::test::params_of;

}  // namespace

TEST_CASE("train_step with no-op policies is the hand-written loop, bit for bit", "[train]") {
  const auto data = make_batches(6);
  auto hand = make_mlp(1);
  auto composed = make_mlp(1);
  REQUIRE(params_of(*hand) == params_of(*composed));
  optim::sgd<float> opt_a(hand->parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::sgd<float> opt_b(composed->parameters(), {.lr = 0.05, .momentum = 0.9});

  set_seed(42);  // dropout masks
  std::vector<double> hand_losses;
  for (int i = 0; i < 6; ++i) {
    auto loss = autograd::cross_entropy((*hand)(var<float>(data.x[i])), data.y[i]);
    opt_a.zero_grad();
    loss.backward();
    opt_a.step();
    hand_losses.push_back(loss.item());
  }
  set_seed(42);
  train::train_step step(*composed, opt_b);
  static_assert(std::is_same_v<decltype(step)::precision_type, amp::fp32>);
  static_assert(std::is_same_v<decltype(step)::scaler_type, amp::no_scaling>);
  static_assert(std::is_same_v<decltype(step)::recompute_type, checkpoint::store_all>);
  static_assert(std::is_same_v<decltype(step)::parallel_type, train::no_parallel>);
  for (int i = 0; i < 6; ++i) {
    const auto r =
        step(data.x[i], [&](const var<float>& out) { return autograd::cross_entropy(out, data.y[i]); });
    REQUIRE(r.loss == hand_losses[static_cast<std::size_t>(i)]);
    REQUIRE(r.stepped);
    REQUIRE(!r.found_inf);
    REQUIRE(std::isnan(r.grad_norm));
    REQUIRE(r.learning_rate == 0.05);
    REQUIRE(r.loss_scale == 1.0);
    REQUIRE(r.seconds > 0);
  }
  REQUIRE(params_of(*hand) == params_of(*composed));
}

TEST_CASE("train_step: clipping and an attached schedule, as by hand", "[train]") {
  const auto data = make_batches(5);
  auto hand = make_mlp(2);
  auto composed = make_mlp(2);
  optim::adamw<float> opt_a(hand->parameters(), {.lr = 0.01});
  optim::adamw<float> opt_b(composed->parameters(), {.lr = 0.01});
  optim::warmup_cosine_lr sched_a({.base_lr = 0.01, .warmup_steps = 2, .total_steps = 5});
  optim::warmup_cosine_lr sched_b({.base_lr = 0.01, .warmup_steps = 2, .total_steps = 5});
  sched_a.apply(opt_a);
  sched_b.apply(opt_b);
  set_seed(3);
  std::vector<double> norms;
  for (int i = 0; i < 5; ++i) {
    auto loss = autograd::cross_entropy((*hand)(var<float>(data.x[i])), data.y[i]);
    opt_a.zero_grad();
    loss.backward();
    norms.push_back(optim::clip_grad_norm_(opt_a.params(), 0.1));
    opt_a.step();
    sched_a.step(opt_a);
  }
  set_seed(3);
  train::train_step step(*composed, opt_b, {.max_grad_norm = 0.1});
  step.attach_schedule(sched_b);
  for (int i = 0; i < 5; ++i) {
    const auto r =
        step(data.x[i], [&](const var<float>& out) { return autograd::cross_entropy(out, data.y[i]); });
    REQUIRE(r.grad_norm == norms[static_cast<std::size_t>(i)]);
    REQUIRE(r.learning_rate == sched_b.lr_at(i));
  }
  REQUIRE(sched_b.current_step() == 5);
  REQUIRE(params_of(*hand) == params_of(*composed));
  REQUIRE_THROWS_AS(train::train_step(*composed, opt_b, {.max_grad_norm = -1.0}), value_error);
}

TEST_CASE("train_step: recomputation gives the store_all result", "[train][checkpoint]") {
  const auto data = make_batches(4);
  auto stored = make_mlp(4);
  auto recomputed = make_mlp(4);
  optim::sgd<float> opt_a(stored->parameters(), {.lr = 0.1});
  optim::sgd<float> opt_b(recomputed->parameters(), {.lr = 0.1});
  train::train_step a(*stored, opt_a);
  train::train_step<net_t, optim::sgd<float>, amp::fp32, amp::no_scaling, checkpoint::every_n> b(
      *recomputed, opt_b, {}, {}, checkpoint::every_n{2});
  set_seed(9);
  for (int i = 0; i < 4; ++i)
    a(data.x[i], [&](const var<float>& o) { return autograd::cross_entropy(o, data.y[i]); });
  set_seed(9);
  for (int i = 0; i < 4; ++i)
    b(data.x[i], [&](const var<float>& o) { return autograd::cross_entropy(o, data.y[i]); });
  // The dropout masks are replayed in the recomputation, so the runs agree exactly.
  REQUIRE(params_of(*stored) == params_of(*recomputed));

  // The policy chosen at run time (--checkpoint): one step type, each choice the same result.
  for (const char* flag : {"none", "sqrt", "every:1"}) {
    INFO("--checkpoint " << flag);
    auto chosen = make_mlp(4);
    optim::sgd<float> opt_c(chosen->parameters(), {.lr = 0.1});
    train::train_step<net_t, optim::sgd<float>, amp::fp32, amp::no_scaling, checkpoint::recompute_choice> c(
        *chosen, opt_c, {}, {}, checkpoint::parse_recompute(flag));
    set_seed(9);
    for (int i = 0; i < 4; ++i)
      c(data.x[i], [&](const var<float>& o) { return autograd::cross_entropy(o, data.y[i]); });
    REQUIRE(params_of(*chosen) == params_of(*stored));
  }
}

TEST_CASE("train_step: fp16 with dynamic scaling skips the steps a hand loop skips", "[train][amp]") {
  // Inputs large enough that a scale of 2^24 overflows fp16 gradients: the first steps back off.
  const auto data = make_batches(8, 16, 12, 4, 4.0f);
  auto hand = make_mlp(5);
  auto composed = make_mlp(5);
  optim::sgd<float> opt_a(hand->parameters(), {.lr = 0.02});
  optim::sgd<float> opt_b(composed->parameters(), {.lr = 0.02});
  const amp::dynamic_scaling_options so{.init_scale = 16777216.0, .growth_interval = 3};
  amp::dynamic_scaling scaler_a(so);
  set_seed(6);
  std::vector<bool> hand_stepped;
  for (int i = 0; i < 8; ++i) {
    auto out = amp::forward<amp::mixed_fp16>(*hand, var<float>(data.x[i]));
    auto loss = autograd::cross_entropy(out, data.y[i]);
    opt_a.zero_grad();
    scaler_a.scale(loss).backward();
    scaler_a.unscale(opt_a);
    hand_stepped.push_back(scaler_a.step(opt_a));
    scaler_a.update();
  }
  set_seed(6);
  auto step = train::make_train_step<amp::mixed_fp16>(*composed, opt_b, {}, amp::dynamic_scaling(so));
  static_assert(std::is_same_v<decltype(step)::scaler_type, amp::dynamic_scaling>);
  int skipped = 0;
  for (int i = 0; i < 8; ++i) {
    const auto r =
        step(data.x[i], [&](const var<float>& o) { return autograd::cross_entropy(o, data.y[i]); });
    REQUIRE(r.stepped == hand_stepped[static_cast<std::size_t>(i)]);
    REQUIRE(r.found_inf == !r.stepped);
    skipped += !r.stepped;
  }
  CHECK(skipped > 0);
  REQUIRE(step.scaler().get_state() == scaler_a.get_state());
  REQUIRE(step.scaler().skipped_steps() == skipped);
  REQUIRE(params_of(*hand) == params_of(*composed));
}

TEST_CASE("train_step reports each step to training_metrics", "[train][monitor]") {
  const auto data = make_batches(3);
  auto net = make_mlp(7);
  optim::sgd<float> opt(net->parameters(), {.lr = 0.1});
  monitor::registry reg;
  monitor::training_metrics metrics(reg, {.gpu = false});
  train::train_step step(*net, opt, {.metrics = &metrics});
  double last = 0;
  for (int i = 0; i < 3; ++i)
    last = step(data.x[i], [&](const var<float>& o) { return autograd::cross_entropy(o, data.y[i]); }).loss;
  const auto e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
  REQUIRE(*e.value("trainkit_steps_total") == 3);
  REQUIRE(*e.value("trainkit_samples_total") == 48);
  REQUIRE(*e.value("trainkit_loss") == last);
  REQUIRE(*e.value("trainkit_learning_rate") == 0.1);
  REQUIRE(*e.value("trainkit_step_duration_seconds_count") == 3);
  REQUIRE(*e.value("trainkit_skipped_steps_total") == 0);
}

TEST_CASE("train_step over data_parallel keeps the ranks identical", "[train][dist]") {
  constexpr int world = 2;
  const auto data = make_batches(4, 16);
  std::vector<std::vector<std::vector<float>>> final_params(world);
  std::vector<double> bytes(world);
  std::mutex mu;
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    // Each rank starts from a different initialisation: data_parallel broadcasts rank 0's.
    generator init(100 + static_cast<std::uint64_t>(comm.rank()));  // only used while the layers are built
    auto net = nn::make_sequential(std::make_shared<nn::linear<float>>(12, 16, true, init),
                                   std::make_shared<nn::relu<float>>(),
                                   std::make_shared<nn::linear<float>>(16, 4, true, init));
    optim::sgd<float> opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
    parallel::data_parallel<dist::thread_group, compression::int8> ddp(comm, *net);
    monitor::registry reg;
    monitor::training_metrics metrics(reg, {.gpu = false});
    train::train_step<net_t, optim::sgd<float>, amp::fp32, amp::dynamic_scaling, checkpoint::store_all,
                      parallel::data_parallel<dist::thread_group, compression::int8>>
        step(*net, opt, ddp, {.max_grad_norm = 5.0, .metrics = &metrics});
    for (int i = 0; i < 4; ++i) {
      // Rank r trains on its half of the batch.
      auto x =
          data.x[static_cast<std::size_t>(i)].slice(0, comm.rank() * 8, comm.rank() * 8 + 8).contiguous();
      auto y =
          data.y[static_cast<std::size_t>(i)].slice(0, comm.rank() * 8, comm.rank() * 8 + 8).contiguous();
      step(x, [&](const var<float>& o) { return autograd::cross_entropy(o, y); });
    }
    std::lock_guard lk(mu);
    final_params[static_cast<std::size_t>(comm.rank())] = params_of(*net);
    const auto e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
    bytes[static_cast<std::size_t>(comm.rank())] = *e.value("trainkit_bytes_sent_total");
  });
  REQUIRE(final_params[0] == final_params[1]);
  REQUIRE(bytes[0] > 0);
}

TEST_CASE("find_max_batch_size: the largest batch within the budget", "[train][memory]") {
  // A step whose peak grows linearly with the batch: one [b, 1000] float buffer (4000 b bytes).
  const std::size_t base = allocator<cpu>::stats().allocated;
  auto trial = [](index_t b) {
    auto t = tensor<float>::zeros({b, 1000});
    (void)t;
  };
  const std::size_t budget = base + 400000;  // 80 %: base*0.8 + 320000 bytes
  const auto r = train::find_max_batch_size<cpu>(trial, {.budget_bytes = budget});
  const auto limit = static_cast<std::size_t>(0.8 * static_cast<double>(budget));
  REQUIRE(r.limit_bytes == limit);
  REQUIRE(r.peak_bytes <= limit);
  REQUIRE(r.batch >= 1);
  // One more sample would not fit.
  REQUIRE(base + static_cast<std::size_t>(r.batch + 1) * 4000 > limit);
  REQUIRE(r.trials <= 2 * 17);
  // The cap is respected, and a budget too small is a clear error.
  REQUIRE(
      train::find_max_batch_size<cpu>(trial, {.budget_bytes = std::size_t(1) << 40, .max_batch = 24}).batch ==
      24);
  REQUIRE_THROWS_WITH(
      train::find_max_batch_size<cpu>(trial, {.budget_bytes = 1000}),
      Contains("even a batch of 1 does not fit") && Contains("limit is 0.8 x 1000 = 800 bytes"));
  REQUIRE_THROWS_AS(train::find_max_batch_size<cpu>(trial, {}), usage_error);
  // A real training step: the batch found trains, and twice it would not fit.
  auto net = make_mlp(8, 64, 256, 10);
  optim::sgd<float> opt(net->parameters(), {.lr = 0.01});
  train::train_step step(*net, opt);
  auto run = [&](index_t b) {
    auto x = tensor<float>::zeros({b, 64});
    auto y = tensor<std::int64_t>::zeros({b});
    step(x, [&](const var<float>& o) { return autograd::cross_entropy(o, y); });
  };
  const std::size_t now = allocator<cpu>::stats().allocated;
  const auto found = train::find_max_batch_size<cpu>(run, {.budget_bytes = now + (std::size_t(4) << 20)});
  INFO("batch " << found.batch << " peak " << found.peak_bytes << " limit " << found.limit_bytes);
  REQUIRE(found.batch > 1);
  REQUIRE(found.peak_bytes <= found.limit_bytes);
}
