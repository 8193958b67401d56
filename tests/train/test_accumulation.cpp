// tests/train/test_accumulation.cpp - gradient accumulation in train_step: K micro-batches per
// optimizer step equal one step on the K-times batch (sgd with clipping and a schedule, adamw),
// also on data_parallel thread ranks with and without recomputation, with no communication before
// the K-th micro-batch; an inf in one micro-batch skips the whole step and backs the scale off once,
// as the hand-written `scaler.scale(loss / K)` loop does; one metrics record per optimizer step;
// accumulation_steps < 1 refused.
#include <catch2/catch.hpp>

#include "support/values.hpp"
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "monitor/parsers.hpp"
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/dist/thread_group.hpp"
#include "trainkit/monitor/monitor.hpp"
#include "trainkit/parallel/data_parallel.hpp"
#include "trainkit/train/train.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using Catch::Matchers::Contains;
using net_t = nn::sequential<float>;
using param_values = std::vector<std::vector<float>>;

namespace {

constexpr int K = 4;  // micro-batches per optimizer step
constexpr index_t in_f = 12, classes = 4;

/// Linear-ReLU-Linear-ReLU-Linear, no dropout: the equivalence is exact up to round-off. Five
/// layers, so that every_n and sqrt_segments cut it into several checkpointed segments.
std::shared_ptr<net_t> make_plain_mlp(std::uint64_t seed) {
  generator g(seed);
  return nn::make_sequential(
      std::make_shared<nn::linear<float>>(in_f, 16, true, g), std::make_shared<nn::relu<float>>(),
      std::make_shared<nn::linear<float>>(16, 16, true, g), std::make_shared<nn::relu<float>>(),
      std::make_shared<nn::linear<float>>(16, classes, true, g));
}

struct batch {
  tensor<float> x;
  tensor<std::int64_t> y;
  /// Rows [lo, hi): a micro-batch (or a rank's shard) of this batch.
  batch rows(index_t lo, index_t hi) const {
    return {x.slice(0, lo, hi).contiguous(), y.slice(0, lo, hi).contiguous()};
  }
};
/// The batch of optimizer step `step`: `rows` samples, the same wherever it is made.
batch make_batch(int step, index_t rows) {
  generator g(900 + static_cast<std::uint64_t>(step));
  auto x = tensor<float>::empty({rows, in_f});
  fill_normal(g, x.data(), static_cast<std::size_t>(rows * in_f), 0.0f, 1.0f);
  auto y = tensor<std::int64_t>::empty({rows});
  for (index_t i = 0; i < rows; ++i) y.data()[i] = static_cast<std::int64_t>((i * 5 + step) % classes);
  return {x, y};
}

auto loss_of(const batch& b) {
  return [&b](const var<float>& out) { return autograd::cross_entropy(out, b.y); };
}

using trainkit::test::params_of;

/// "" when a and b agree to fp32 round-off (|a - b| <= 1e-6 + 1e-5 |b|), else the first difference.
std::string compare(const param_values& a, const param_values& b) {
  if (a.size() != b.size()) return "different numbers of parameters";
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return "parameter " + std::to_string(i) + ": different sizes";
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      const double x = a[i][j], y = b[i][j];
      if (std::fabs(x - y) > 1e-6 + 1e-5 * std::fabs(y)) {
        std::ostringstream os;
        os << "parameter " << i << " element " << j << ": " << x << " vs " << y;
        return os.str();
      }
    }
  }
  return "";
}

/// `steps` optimizer steps two ways from the same initialisation: one call per step on the 4B
/// batch (accumulation_steps = 1), and K calls per step on its four B-row slices (K). Checks what
/// each call reports on the way; returns the two parameter sets.
template <class Optimizer, class MakeOpt>
std::pair<param_values, param_values> whole_vs_accumulated(MakeOpt make_opt, int steps, index_t b,
                                                           double max_grad_norm = 0.0,
                                                           bool with_schedule = false) {
  auto whole_net = make_plain_mlp(11);
  auto acc_net = make_plain_mlp(11);
  REQUIRE(params_of(*whole_net) == params_of(*acc_net));
  Optimizer opt_a = make_opt(whole_net->parameters());
  Optimizer opt_b = make_opt(acc_net->parameters());
  train::train_step whole(*whole_net, opt_a, {.max_grad_norm = max_grad_norm});
  train::train_step acc(*acc_net, opt_b, {.max_grad_norm = max_grad_norm, .accumulation_steps = K});
  optim::step_lr sched_a({.base_lr = opt_a.lr(), .step_size = 1, .gamma = 0.5});
  optim::step_lr sched_b({.base_lr = opt_b.lr(), .step_size = 1, .gamma = 0.5});
  if (with_schedule) {
    whole.attach_schedule(sched_a);
    acc.attach_schedule(sched_b);
  }
  for (int s = 0; s < steps; ++s) {
    const batch full = make_batch(s, K * b);
    const auto rw = whole(full.x, loss_of(full));
    REQUIRE(rw.stepped);
    REQUIRE(!rw.accumulating);
    REQUIRE(rw.micro_step == 0);

    double loss_sum = 0.0;
    for (int k = 0; k < K; ++k) {
      REQUIRE(acc.at_step_boundary() == (k == 0));
      REQUIRE(acc.micro_step() == k);
      const auto before = params_of(*acc_net);
      const batch micro = full.rows(k * b, (k + 1) * b);
      const auto r = acc(micro.x, loss_of(micro));
      INFO("step " << s << " micro-batch " << k);
      REQUIRE(r.micro_step == k);
      REQUIRE(r.accumulating == (k + 1 < K));
      REQUIRE(r.stepped == (k + 1 == K));
      REQUIRE(!r.found_inf);
      REQUIRE(r.learning_rate == rw.learning_rate);
      if (r.accumulating) {
        REQUIRE(params_of(*acc_net) == before);  // no optimizer step yet
        REQUIRE(std::isnan(r.grad_norm));
      } else if (max_grad_norm > 0) {
        // Clipped once, on the accumulated gradient: the norm of the whole batch's gradient.
        REQUIRE(r.grad_norm == Approx(rw.grad_norm).epsilon(1e-5));
      }
      loss_sum += r.loss;
    }
    // Each call reports its micro-batch's own mean loss (not divided by K): their mean is the
    // mean over the whole batch.
    REQUIRE(loss_sum / K == Approx(rw.loss).epsilon(1e-6));
    REQUIRE(acc.at_step_boundary());
  }
  if (with_schedule) REQUIRE(sched_b.current_step() == steps);  // once per optimizer step
  return {params_of(*whole_net), params_of(*acc_net)};
}

}  // namespace

TEST_CASE("accumulation over K micro-batches is one step on the K-times batch", "[train][accumulation]") {
  SECTION("sgd with momentum") {
    const auto [whole, acc] = whole_vs_accumulated<optim::sgd<float>>(
        [](auto p) { return optim::sgd<float>(p, {.lr = 0.1, .momentum = 0.9}); }, 3, 8);
    REQUIRE(compare(acc, whole) == "");
  }
  SECTION("sgd with clipping and a schedule: both once per optimizer step") {
    const auto [whole, acc] = whole_vs_accumulated<optim::sgd<float>>(
        [](auto p) { return optim::sgd<float>(p, {.lr = 0.2, .momentum = 0.9}); }, 3, 8, 0.05, true);
    REQUIRE(compare(acc, whole) == "");
  }
  SECTION("adamw") {
    const auto [whole, acc] = whole_vs_accumulated<optim::adamw<float>>(
        [](auto p) { return optim::adamw<float>(p, {.lr = 0.01, .weight_decay = 0.1}); }, 3, 8);
    REQUIRE(compare(acc, whole) == "");
  }
  SECTION("the steps did move the parameters") {
    // Guards the sections above against a comparison of two untrained models.
    const auto [whole, acc] = whole_vs_accumulated<optim::sgd<float>>(
        [](auto p) { return optim::sgd<float>(p, {.lr = 0.1}); }, 2, 8);
    REQUIRE(compare(acc, params_of(*make_plain_mlp(11))) != "");
    REQUIRE(compare(acc, whole) == "");
  }
}

namespace {

/// What a rank saw: its parameters, and the data_parallel figures after each call.
struct rank_record {
  param_values params;
  std::vector<parallel::data_parallel_stats> after_call;
  std::vector<bool> accumulating;
};

/// 2 thread ranks, K micro-batches of b rows each per optimizer step and rank (micro-batch k of rank
/// r: rows [(k * world + r) b, +b) of the step's batch), under data_parallel and Recompute.
template <class Recompute>
std::vector<rank_record> ddp_accumulated(int world, int steps, index_t b) {
  std::vector<rank_record> records(static_cast<std::size_t>(world));
  std::mutex mu;
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    const int r = comm.rank();
    // Rank 1 starts elsewhere: data_parallel broadcasts rank 0's parameters.
    auto net = make_plain_mlp(r == 0 ? 11 : 77);
    optim::sgd<float> opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
    // Small buckets: several reductions per step, so a bucket reduced too early would show.
    parallel::data_parallel<dist::thread_group> ddp(comm, *net,
                                                    {.bucket_cap_bytes = 512, .first_bucket_cap_bytes = 256});
    train::train_step<net_t, optim::sgd<float>, amp::fp32, amp::no_scaling, Recompute,
                      parallel::data_parallel<dist::thread_group>>
        step(*net, opt, ddp, {.accumulation_steps = K});
    rank_record rec;
    for (int s = 0; s < steps; ++s) {
      const batch full = make_batch(s, world * K * b);
      for (int k = 0; k < K; ++k) {
        const index_t lo = (k * world + r) * b;
        const batch micro = full.rows(lo, lo + b);
        rec.accumulating.push_back(step(micro.x, loss_of(micro)).accumulating);
        rec.after_call.push_back(ddp.stats());
      }
    }
    rec.params = params_of(*net);
    std::lock_guard lk(mu);
    records[static_cast<std::size_t>(r)] = std::move(rec);
  });
  return records;
}

/// One process, no accumulation, `steps` steps on the whole batch of world * K * b rows.
param_values one_process(int world, int steps, index_t b) {
  auto net = make_plain_mlp(11);
  optim::sgd<float> opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  train::train_step step(*net, opt);
  for (int s = 0; s < steps; ++s) {
    const batch full = make_batch(s, world * K * b);
    step(full.x, loss_of(full));
  }
  return params_of(*net);
}

}  // namespace

TEMPLATE_TEST_CASE(
    "accumulation under data_parallel: each rank with K micro-batches is one process on "
    "the whole batch, with no communication before the K-th",
    "[train][accumulation][dist]", checkpoint::store_all, checkpoint::every_n, checkpoint::sqrt_segments) {
  constexpr int world = 2, steps = 3;
  constexpr index_t b = 4;
  // Recomputation under no_sync and then synced: a parameter's readiness hook firing twice in
  // the synced backward, or at all in an accumulating one, would throw "marked ready twice".
  const auto records = ddp_accumulated<TestType>(world, steps, b);
  REQUIRE(records[0].params == records[1].params);  // the ranks stay bit-identical
  REQUIRE(compare(records[0].params, one_process(world, steps, b)) == "");

  for (const auto& rec : records) {
    REQUIRE(rec.after_call.size() == static_cast<std::size_t>(steps * K));
    const std::uint64_t buckets_per_step = rec.after_call[K - 1].buckets_reduced;
    REQUIRE(buckets_per_step > 1);
    constexpr std::size_t k_calls = K;
    for (std::size_t c = 0; c < rec.after_call.size(); ++c) {
      const std::size_t step_no = c / k_calls;
      const bool last = c % k_calls == k_calls - 1;
      INFO("call " << c);
      REQUIRE(rec.accumulating[c] == !last);
      // Through the first K - 1 calls of a step the figures stay at the previous step's.
      const std::uint64_t done = step_no + (last ? 1 : 0);
      REQUIRE(rec.after_call[c].steps == done);
      REQUIRE(rec.after_call[c].buckets_reduced == done * buckets_per_step);
      if (!last && c % k_calls > 0) REQUIRE(rec.after_call[c].bytes_sent == rec.after_call[c - 1].bytes_sent);
    }
  }
}

TEST_CASE("accumulation with dynamic scaling: an inf in one micro-batch skips the whole step once",
          "[train][accumulation][amp]") {
  constexpr index_t b = 6;
  constexpr int steps = 3, bad_step = 1, bad_micro = 2;
  // Micro-batch 2 of step 1 holds an inf input: the first layer's weight gradient turns non-finite
  // (the ReLU zeroes the NaN activations, so the loss itself stays finite, as with an fp16
  // gradient overflow).
  std::vector<std::vector<batch>> micro(steps);
  for (int s = 0; s < steps; ++s) {
    const batch full = make_batch(s, K * b);
    for (int k = 0; k < K; ++k) micro[s].push_back(full.rows(k * b, (k + 1) * b));
  }
  micro[bad_step][bad_micro].x.data()[3] = std::numeric_limits<float>::infinity();
  const amp::dynamic_scaling_options so{.init_scale = 65536.0, .growth_interval = 1000};

  // By hand, as docs/mixed_precision.md writes it: scale(loss / K) per micro-batch, then one
  // unscale, step and update.
  auto hand = make_plain_mlp(21);
  optim::sgd<float> opt_a(hand->parameters(), {.lr = 0.05, .momentum = 0.9});
  amp::dynamic_scaling scaler_a(so);
  std::vector<param_values> hand_after;
  for (int s = 0; s < steps; ++s) {
    opt_a.zero_grad();
    for (const auto& m : micro[s]) {
      auto loss = autograd::cross_entropy((*hand)(var<float>(m.x)), m.y);
      scaler_a.scale(loss / K).backward();
    }
    scaler_a.unscale(opt_a);
    scaler_a.step(opt_a);
    scaler_a.update();
    hand_after.push_back(params_of(*hand));
  }
  REQUIRE(scaler_a.skipped_steps() == 1);

  auto net = make_plain_mlp(21);
  optim::sgd<float> opt_b(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  train::train_step<net_t, optim::sgd<float>, amp::fp32, amp::dynamic_scaling> step(
      *net, opt_b, {.accumulation_steps = K}, amp::dynamic_scaling(so));
  param_values before_bad;
  for (int s = 0; s < steps; ++s) {
    if (s == bad_step) before_bad = params_of(*net);
    for (int k = 0; k < K; ++k) {
      INFO("step " << s << " micro-batch " << k);
      const auto r = step(micro[s][k].x, loss_of(micro[s][k]));
      // The scale holds through a step's micro-batches and is backed off once, after the bad step.
      REQUIRE(r.loss_scale == (s <= bad_step ? 65536.0 : 32768.0));
      REQUIRE(r.found_inf == (s == bad_step && k == K - 1));
      REQUIRE(r.stepped == (k == K - 1 && s != bad_step));
    }
    REQUIRE(params_of(*net) == hand_after[static_cast<std::size_t>(s)]);  // bit for bit
  }
  REQUIRE(hand_after[bad_step] == before_bad);  // the skipped step changed nothing
  REQUIRE(step.scaler().get_scale() == 32768.0);
  REQUIRE(step.scaler().skipped_steps() == 1);
  REQUIRE(step.scaler().get_state() == scaler_a.get_state());
}

TEST_CASE("accumulation reports one metrics record per optimizer step", "[train][accumulation][monitor]") {
  constexpr index_t b = 5;
  auto net = make_plain_mlp(31);
  optim::sgd<float> opt(net->parameters(), {.lr = 0.1});
  monitor::registry reg;
  monitor::training_metrics metrics(reg, {.gpu = false});
  train::train_step step(*net, opt, {.metrics = &metrics, .accumulation_steps = K});
  double mean_of_last = 0.0;
  for (int s = 0; s < 2; ++s) {
    const batch full = make_batch(s, K * b);
    double sum = 0.0;
    for (int k = 0; k < K; ++k) {
      const batch m = full.rows(k * b, (k + 1) * b);
      sum += step(m.x, loss_of(m)).loss;
      const auto e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
      // Nothing is reported before the step's last micro-batch.
      REQUIRE(*e.value("trainkit_steps_total") == s + (k == K - 1 ? 1 : 0));
    }
    mean_of_last = sum / K;
  }
  const auto e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
  REQUIRE(*e.value("trainkit_steps_total") == 2);
  REQUIRE(*e.value("trainkit_samples_total") == 2 * K * b);
  REQUIRE(*e.value("trainkit_loss") == mean_of_last);
  REQUIRE(*e.value("trainkit_step_duration_seconds_count") == 2);
  REQUIRE(*e.value("trainkit_skipped_steps_total") == 0);
}

TEST_CASE("accumulation_steps < 1 is a value_error naming the option", "[train][accumulation]") {
  auto net = make_plain_mlp(41);
  optim::sgd<float> opt(net->parameters(), {.lr = 0.1});
  for (int bad : {0, -3}) {
    REQUIRE_THROWS_AS(train::train_step(*net, opt, {.accumulation_steps = bad}), value_error);
    REQUIRE_THROWS_WITH(train::train_step(*net, opt, {.accumulation_steps = bad}),
                        Contains("accumulation_steps must be >= 1, got " + std::to_string(bad)));
  }
  // 1 is the plain step: every call steps.
  train::train_step step(*net, opt, {.accumulation_steps = 1});
  const batch m = make_batch(0, 4);
  const auto r = step(m.x, loss_of(m));
  REQUIRE(r.stepped);
  REQUIRE(!r.accumulating);
  REQUIRE(step.at_step_boundary());
}
