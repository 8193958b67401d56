// data_parallel on thread_group: N ranks on their shards match one process on the concatenated
// batch (with and without no_sync accumulation, any bucket layout, world sizes 1-4), broadcast at
// construction, mismatched models reported on every rank, unused parameters, failures reaching
// finish(), compressed training keeping the ranks in step. Catch2's assertions are not
// thread-safe: rank threads only record what they saw, the test thread checks it.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "trainkit/dist/bucket.hpp"
#include "trainkit/parallel/data_parallel.hpp"
#include "trainkit/dist/thread_group.hpp"

#include "parallel/dp_checks.hpp"
#include "parallel/dp_generic.hpp"

namespace {

using namespace trainkit_test::dp;

// The equivalence run on `world` thread ranks: each rank's parameters (checked on this thread).
std::vector<param_values> distributed(int world, int steps, int micro, index_t b, parallel::data_parallel_options opts) {
  std::vector<shard_result> got(static_cast<std::size_t>(world));
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    got[static_cast<std::size_t>(comm.rank())] = train_shard(comm, steps, micro, b, opts);
  });
  std::vector<param_values> out;
  for (const auto& g : got) {
    CHECK(g.stats.steps == static_cast<std::uint64_t>(steps));
    CHECK(g.stats.buckets_reduced == steps * g.buckets);
    if (world > 1) CHECK(g.stats.bytes_sent > 0);
    out.push_back(g.params);
  }
  return out;
}

void require_close(const param_values& a, const param_values& b) { REQUIRE(compare(a, b) == ""); }

}  // namespace

TEST_CASE("bucket plan: reverse order, a small first bucket, big ones after", "[dist][ddp]") {
  // 4-byte elements: first cap 40 bytes (10 elements), then 100 bytes (25).
  const auto p = dist::plan_buckets({4, 30, 6, 6, 5, 8}, 4, {.cap_bytes = 100, .first_cap_bytes = 40});
  REQUIRE(p.buckets.size() == 3);
  CHECK(p.buckets[0].params == std::vector<std::size_t>{5, 4});  // 13 >= 10
  CHECK(p.buckets[1].params == std::vector<std::size_t>{3, 2, 1});  // 42 >= 25
  CHECK(p.buckets[2].params == std::vector<std::size_t>{0});
  CHECK(p.buckets[1].offsets == std::vector<index_t>{0, 6, 12});
  CHECK(p.buckets[1].numel == 42);
  CHECK(p.bucket_of[2] == 1);
  CHECK(p.slot_of[2] == 1);
  const auto q = dist::plan_buckets({4, 4}, 4, {}, {false, true});
  REQUIRE(q.buckets.size() == 1);
  CHECK(q.bucket_of[1] == 1);  // skipped: no bucket
}

TEST_CASE("data_parallel: N ranks on shards = one process on the whole batch", "[dist][ddp]") {
  const index_t b = 5;
  const int steps = 4;
  for (int world : {1, 2, 3, 4}) {
    for (int micro : {1, 3}) {
      const auto ref = reference(world, steps, micro, b);
      for (int layout = 0; layout < 3; ++layout) {
        INFO("world " << world << ", micro-steps " << micro << ", layout " << layout);
        parallel::data_parallel_options opts;
        if (layout == 1) opts = {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40};  // many buckets
        if (layout == 2) opts = {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40, .overlap = false};
        const auto got = distributed(world, steps, micro, b, opts);
        for (int r = 0; r < world; ++r) {
          require_close(got[static_cast<std::size_t>(r)], ref);
          REQUIRE(got[static_cast<std::size_t>(r)] == got[0]);  // the ranks agree bit for bit
        }
      }
    }
  }
}

TEST_CASE("data_parallel: parameters and buffers come from rank 0", "[dist][ddp]") {
  struct toy : nn::module<> {
    toy(float v) {
      register_parameter("w", tensor::full({3, 2}, v));
      register_parameter("frozen", tensor::full({2}, v), false);
      register_buffer("stat", tensor::full({4}, v));
    }
  };
  std::vector<std::vector<float>> seen(3);
  std::vector<std::size_t> buckets(3);
  dist::thread_group::run(3, [&](dist::thread_group& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    toy m(static_cast<float>(r + 1));
    parallel::data_parallel<dist::thread_group> ddp(comm, m);
    auto& v = seen[r];
    for (float x : m.parameter("w").value().to_vector()) v.push_back(x);
    for (float x : m.parameter("frozen").value().to_vector()) v.push_back(x);
    for (float x : m.buffer("stat").to_vector()) v.push_back(x);
    // BatchNorm-style statistics drift per rank; sync_buffers() brings rank 0's again.
    fill_(m.buffer("stat"), static_cast<float>(r + 5));
    ddp.sync_buffers();
    for (float x : m.buffer("stat").to_vector()) v.push_back(x - 4.0f);
    buckets[r] = ddp.buckets().buckets.size();
  });
  for (std::size_t r = 0; r < 3; ++r) {
    REQUIRE(seen[r] == std::vector<float>(6 + 2 + 4 + 4, 1.0f));
    CHECK(buckets[r] == 1);  // the frozen parameter has none
  }
}

TEST_CASE("data_parallel: different models on the ranks are a clear error on every rank", "[dist][ddp]") {
  for (int variant : {0, 1}) {
    std::vector<std::string> messages(3);
    dist::thread_group::run(3, [&](dist::thread_group& comm) {
      const int r = comm.rank();
      std::shared_ptr<nn::sequential<>> m;
      if (variant == 0) {
        m = make_mlp(1, r == 2 ? 9 : 8);  // rank 2: another hidden size
      } else {
        m = make_mlp(1);
        if (r == 1) m->push_back(std::make_shared<nn::linear<>>(out_features, 2));  // rank 1: one layer more
      }
      try {
        parallel::data_parallel<dist::thread_group> ddp(comm, *m);
      } catch (const dist::dist_error& e) {
        messages[static_cast<std::size_t>(r)] = e.what();
      }
    });
    INFO(messages[0]);
    for (const auto& msg : messages) REQUIRE(msg == messages[0]);  // the same report on every rank
    if (variant == 0) {
      CHECK_THAT(messages[0], Catch::Contains("'0.weight' [8, 6]") && Catch::Contains("'0.weight' [9, 6]") &&
                                  Catch::Contains("rank 2"));
    } else {
      CHECK_THAT(messages[0], Catch::Contains("'5.weight'") && Catch::Contains("nothing") &&
                                  Catch::Contains("rank 1: 8"));
    }
  }
  // Different compression policies would run different collectives: caught too.
  std::vector<std::string> messages(2);
  dist::thread_group::run(2, [&](dist::thread_group& comm) {
    auto m = make_mlp(1);
    try {
      if (comm.rank() == 0) {
        parallel::data_parallel<dist::thread_group, compression::int8> ddp(comm, *m);
      } else {
        parallel::data_parallel<dist::thread_group> ddp(comm, *m);
      }
    } catch (const dist::dist_error& e) {
      messages[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  CHECK_THAT(messages[0], Catch::Contains("compression"));
  CHECK_THAT(messages[1], Catch::Contains("compression"));
}

TEST_CASE("data_parallel: a parameter unused on some rank counts as a zero gradient there", "[dist][ddp]") {
  std::vector<std::vector<float>> grads(2);
  std::vector<char> defined(2);  // not vector<bool>: the ranks write their own elements concurrently
  dist::thread_group::run(2, [&](dist::thread_group& comm) {
    const int r = comm.rank();
    var a(tensor::zeros({3}), true), bb(tensor::zeros({3}), true), unused(tensor::zeros({2}), true);
    parallel::data_parallel<dist::thread_group> ddp(comm, {{"a", a}, {"b", bb}, {"unused", unused}}, {});
    const float s = static_cast<float>(r + 1);
    var x(tensor::full({3}, s));
    auto loss = trainkit::autograd::sum(a * x);
    if (r == 0) loss = loss + trainkit::autograd::sum(bb * x);  // only rank 0 uses b
    loss.backward();
    ddp.finish();
    auto& g = grads[static_cast<std::size_t>(r)];
    for (float x : a.grad().to_vector()) g.push_back(x);
    for (float x : bb.grad().to_vector()) g.push_back(x);
    defined[static_cast<std::size_t>(r)] = unused.grad().defined();
    if (unused.grad().defined())
      for (float x : unused.grad().to_vector()) g.push_back(x);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    REQUIRE(defined[r]);
    // a: (1 + 2) / 2; b: (1 + 0) / 2 (rank 1 contributes zero); unused: zero.
    CHECK(grads[r] == std::vector<float>{1.5f, 1.5f, 1.5f, 0.5f, 0.5f, 0.5f, 0.0f, 0.0f});
  }
}

TEST_CASE("data_parallel: misuse and failures are reported", "[dist][ddp]") {
  SECTION("two synced backward passes without finish()") {
    std::string message;
    dist::thread_group::run(1, [&](dist::thread_group& comm) {
      auto m = make_mlp(1);
      parallel::data_parallel<dist::thread_group> ddp(comm, *m);
      auto [x, y] = batch(0, 4);
      trainkit::autograd::mse_loss(m->forward(var(x)), var(y)).backward();
      try {
        trainkit::autograd::mse_loss(m->forward(var(x)), var(y)).backward();
      } catch (const trainkit::usage_error& e) {
        message = e.what();
      }
    });
    CHECK_THAT(message, Catch::Contains("marked ready twice") && Catch::Contains("finish()"));
  }
  SECTION("a rank that never reduces: finish() throws on the other, within the timeout") {
    std::string message;
    bool still_failed = false;
    const auto t0 = std::chrono::steady_clock::now();
    dist::thread_group::run(
        2,
        [&](dist::thread_group& comm) {
          auto m = make_mlp(1);
          parallel::data_parallel<dist::thread_group> ddp(comm, *m);
          if (comm.rank() == 1) return;  // gone before the first step
          auto [x, y] = batch(0, 4);
          trainkit::autograd::mse_loss(m->forward(var(x)), var(y)).backward();
          try {
            ddp.finish();
          } catch (const dist::dist_error& e) {
            message = e.what();
          }
          try {
            ddp.finish();
          } catch (const dist::dist_error&) {
            still_failed = true;
          }
        },
        {.timeout = std::chrono::milliseconds(300)});
    CHECK_THAT(message, Catch::Contains("300"));
    CHECK(still_failed);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  }
}

TEST_CASE("data_parallel: found_inf is OR-ed over the ranks", "[dist][ddp]") {
  std::vector<int> seen(3);
  dist::thread_group::run(3, [&](dist::thread_group& comm) {
    var a(tensor::zeros({3}), true);
    parallel::data_parallel<dist::thread_group> ddp(comm, {{"a", a}}, {});
    seen[static_cast<std::size_t>(comm.rank())] = (ddp.found_inf(comm.rank() == 1) ? 1 : 0) + (ddp.found_inf(false) ? 2 : 0);
  });
  CHECK(seen == std::vector<int>{1, 1, 1});
}

TEST_CASE("data_parallel: compressed training keeps the ranks identical and close to fp32", "[dist][ddp]") {
  const int world = 2, steps = 30;
  const index_t b = 16;
  auto run = [&]<class C>(C) {
    std::vector<std::vector<std::vector<float>>> out(world);
    std::vector<std::uint64_t> bytes(world);
    std::vector<std::size_t> state(world);
    dist::thread_group::run(world, [&](dist::thread_group& comm) {
      const int r = comm.rank();
      auto m = make_mlp(7, 32);
      parallel::data_parallel<dist::thread_group, C> ddp(comm, *m);
      trainkit::optim::sgd<> opt(m->parameters(), {.lr = lr});
      for (int s = 0; s < steps; ++s) {
        auto [x, y] = batch(s % 3, world * b);
        opt.zero_grad();
        var xs(x.slice(0, r * b, (r + 1) * b).contiguous()), ys(y.slice(0, r * b, (r + 1) * b).contiguous());
        trainkit::autograd::mse_loss(m->forward(xs), ys).backward();
        ddp.finish();
        opt.step();
      }
      out[static_cast<std::size_t>(r)] = values(*m);
      bytes[static_cast<std::size_t>(r)] = ddp.stats().bytes_sent;
      state[static_cast<std::size_t>(r)] = ddp.compression().state().size();
    });
    REQUIRE(out[1] == out[0]);  // every rank applied the same (dequantized) gradients
    CHECK((state[0] > 0) == C::lossy);  // every rank applied the same (dequantized) gradients
    return std::pair{out[0], bytes[0]};
  };
  const auto [fp32, fp32_bytes] = run(compression::none{});
  const auto [i8, i8_bytes] = run(compression::int8{});
  const auto [s1, s1_bytes] = run(compression::sign_1bit{});
  const auto [h16, h16_bytes] = run(compression::bf16{});
  CHECK(i8_bytes < fp32_bytes / 2);
  CHECK(s1_bytes < i8_bytes);
  CHECK(h16_bytes < fp32_bytes);
  // int8 with error feedback follows the fp32 trajectory closely.
  double worst = 0;
  for (std::size_t i = 0; i < fp32.size(); ++i)
    for (std::size_t j = 0; j < fp32[i].size(); ++j) worst = std::max(worst, double(std::fabs(fp32[i][j] - i8[i][j])));
  CHECK(worst < 0.02);
}

TEST_CASE("data_parallel: double parameters (lossless)", "[dist][ddp]") {
  using dvar = trainkit::autograd::var<double>;
  using dtensor = trainkit::tensor<double>;
  std::vector<std::vector<double>> grads(3);
  dist::thread_group::run(3, [&](dist::thread_group& comm) {
    dvar w(dtensor::zeros({4}), true);
    parallel::data_parallel<dist::thread_group, compression::none, double> ddp(comm, {{"w", w}}, {});
    trainkit::autograd::sum(w * dvar(dtensor::full({4}, comm.rank() + 1.0))).backward();
    ddp.finish();
    grads[static_cast<std::size_t>(comm.rank())] = w.grad().to_vector();
  });
  for (const auto& g : grads) CHECK(g == std::vector<double>(4, 2.0));  // (1 + 2 + 3) / 3
}

TEST_CASE("data_parallel: gradients are views into the buckets (device-generic check, cpu)", "[dist][ddp]") {
  const int steps = 4;
  const index_t b = 3;
  for (int world : {1, 2, 3}) {
    INFO("world " << world);
    const auto ref = generic_reference(world, steps, b);
    std::vector<generic_result> got(static_cast<std::size_t>(world));
    dist::thread_group::run(world, [&](dist::thread_group& comm) {
      got[static_cast<std::size_t>(comm.rank())] =
          generic_shard<trainkit::cpu>(comm, steps, b, {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40});
    });
    for (const auto& g : got) {
      CHECK(g.problem == "");
      require_close(g.params, ref);
      CHECK(g.params == got[0].params);
    }
  }
}
