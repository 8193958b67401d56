// Tests of trainkit/dist/thread_group.hpp: every collective x element type x world size 1-4 x lengths
// 0, 1, 7, 1000, 1001; avg/max/min; issue order; a rank that throws; a rank that stalls.
//
// Catch2's assertions are not thread-safe: rank threads only compute and record, and every CHECK runs
// on the test's own thread after thread_group::run has joined them.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dist/collective_checks.hpp"
#include "trainkit/dist/dist.hpp"

namespace {

using trainkit::bfloat16;
using trainkit::half;
using namespace trainkit::dist;
namespace checks = trainkit_test::dist;

static_assert(communicator<thread_group>);
static_assert(!std::is_copy_constructible_v<thread_group>);

constexpr int world_sizes[] = {1, 2, 3, 4};

// Runs body(g) -> std::vector<T> on p threads; returns each rank's vector.
template <class T, class Body>
std::vector<std::vector<T>> on_ranks(int p, Body body, thread_group_options opt = {}) {
  std::vector<std::vector<T>> results(static_cast<std::size_t>(p));
  thread_group::run(
      p, [&](thread_group& g) { results[static_cast<std::size_t>(g.rank())] = body(g); }, opt);
  return results;
}

// Runs check(g) -> "" or an error on p threads; returns the ranks' answers joined ("" when all passed).
template <class Check>
std::string on_ranks_check(int p, Check check) {
  std::vector<std::string> errors(static_cast<std::size_t>(p));
  thread_group::run(p, [&](thread_group& g) { errors[static_cast<std::size_t>(g.rank())] = check(g); });
  std::string all;
  for (const auto& e : errors)
    if (!e.empty()) all += e + "\n";
  return all;
}

#define TK_DIST_TYPES float, double, half, bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::int64_t

}  // namespace

TEMPLATE_TEST_CASE("thread_group allreduce: every op, world size and length", "[dist][thread_group]",
                   TK_DIST_TYPES) {
  for (const int p : world_sizes)
    for (const std::size_t n : checks::lengths)
      for (const reduce_op op : checks::all_ops) {
        INFO("world size " << p);
        CHECK(on_ranks_check(
                  p, [&](thread_group& g) { return checks::check_allreduce<TestType>(g, n, op); }) == "");
      }
}

TEMPLATE_TEST_CASE("thread_group broadcast from every root", "[dist][thread_group]", TK_DIST_TYPES) {
  for (const int p : world_sizes)
    for (const std::size_t n : checks::lengths)
      for (int root = 0; root < p; ++root) {
        INFO("world size " << p << ", root " << root);
        CHECK(on_ranks_check(
                  p, [&](thread_group& g) { return checks::check_broadcast<TestType>(g, n, root); }) == "");
      }
}

TEMPLATE_TEST_CASE("thread_group allgather", "[dist][thread_group]", TK_DIST_TYPES) {
  for (const int p : world_sizes)
    for (const std::size_t n : checks::lengths) {
      INFO("world size " << p);
      CHECK(on_ranks_check(p, [&](thread_group& g) { return checks::check_allgather<TestType>(g, n); }) ==
            "");
    }
}

TEMPLATE_TEST_CASE("thread_group reduce_scatter", "[dist][thread_group]", TK_DIST_TYPES) {
  for (const int p : world_sizes)
    for (const std::size_t n : checks::lengths)
      for (const reduce_op op : checks::all_ops) {
        INFO("world size " << p);
        CHECK(on_ranks_check(p, [&](thread_group& g) {
                return checks::check_reduce_scatter<TestType>(g, n, op);
              }) == "");
      }
}

TEMPLATE_TEST_CASE("thread_group alltoall", "[dist][thread_group]", TK_DIST_TYPES) {
  for (const int p : world_sizes)
    for (const std::size_t n : checks::lengths) {
      INFO("world size " << p);
      CHECK(on_ranks_check(p, [&](thread_group& g) { return checks::check_alltoall<TestType>(g, n); }) == "");
    }
}

TEST_CASE("thread_group: back-to-back collectives on separate buffers, waited in any order",
          "[dist][thread_group]") {
  for (const int p : world_sizes)
    for (const bool reverse : {false, true}) {
      INFO("world size " << p << (reverse ? ", waited last first" : ", waited in order"));
      CHECK(on_ranks_check(p, [&](thread_group& g) { return checks::check_back_to_back(g, reverse); }) == "");
    }
}

TEST_CASE("thread_group in-place allgather and reduce_scatter", "[dist][thread_group]") {
  const int p = 3;
  const std::size_t n = 5;
  const auto results = on_ranks<float>(p, [&](thread_group& g) {
    std::vector<float> buf(p * n, -1.0f);
    for (std::size_t i = 0; i < n; ++i)
      buf[static_cast<std::size_t>(g.rank()) * n + i] = float(g.rank() * 10) + float(i);
    g.allgather(buf.data() + static_cast<std::size_t>(g.rank()) * n, n, buf.data()).wait();
    std::vector<float> rs = buf;  // every rank: the same p*n values
    g.reduce_scatter(rs.data(), rs.data() + static_cast<std::size_t>(g.rank()) * n, n, reduce_op::sum).wait();
    buf.insert(buf.end(), rs.begin() + static_cast<std::ptrdiff_t>(g.rank()) * n,
               rs.begin() + static_cast<std::ptrdiff_t>(g.rank() + 1) * n);
    return buf;
  });
  for (int r = 0; r < p; ++r) {
    const auto& v = results[static_cast<std::size_t>(r)];
    for (int j = 0; j < p; ++j)
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(v[static_cast<std::size_t>(j) * n + i] == float(j * 10) + float(i));
    for (std::size_t i = 0; i < n; ++i) REQUIRE(v[p * n + i] == 3.0f * (float(r * 10) + float(i)));
  }
}

TEST_CASE("thread_group barrier and world size 1", "[dist][thread_group]") {
  auto comms = thread_group::create(1);
  REQUIRE(comms.size() == 1);
  auto& g = comms[0];
  CHECK(g.rank() == 0);
  CHECK(g.size() == 1);
  g.barrier().wait();
  std::vector<double> v{1.5, -2.0};
  g.allreduce(v.data(), v.size(), reduce_op::avg).wait();
  CHECK(v == std::vector<double>{1.5, -2.0});

  std::atomic<int> after{0};
  thread_group::run(4, [&](thread_group& h) {
    if (h.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    h.barrier().wait();
    after.fetch_add(1);
  });
  CHECK(after.load() == 4);
}

TEST_CASE("thread_group: zero-length collectives complete at once and take no turn", "[dist][thread_group]") {
  auto comms = thread_group::create(2);
  // Only rank 0 calls: a rendezvous would hang; zero elements must not need one.
  float* none = nullptr;
  work w = comms[0].allreduce(none, 0, reduce_op::sum);
  CHECK(w.done());
  w.wait();
  CHECK(comms[0].broadcast(none, 0, 1).done());
  CHECK(comms[0].allgather(static_cast<const float*>(none), 0, none).done());
  CHECK(comms[0].reduce_scatter(static_cast<const float*>(none), none, 0, reduce_op::max).done());
  CHECK(comms[0].alltoall(static_cast<const float*>(none), none, 0).done());
  CHECK(work{}.done());
}

TEST_CASE("thread_group: sums of 16-bit floats run in float, rounded once", "[dist][thread_group]") {
  // 2048 + 1 + 1 in half: pairwise in half gives 2048 (2049 rounds to even); in float then rounded: 2050.
  const auto results = on_ranks<half>(3, [&](thread_group& g) {
    std::vector<half> v{half(g.rank() == 0 ? 2048.0f : 1.0f)};
    g.allreduce(v.data(), 1, reduce_op::sum).wait();
    return v;
  });
  for (const auto& v : results) CHECK(static_cast<float>(v[0]) == 2050.0f);
}

TEST_CASE("thread_group: reductions are deterministic, rank-ordered, identical on every rank",
          "[dist][thread_group]") {
  const int p = 4;
  const std::size_t n = 3001;
  std::vector<std::vector<float>> inputs(p, std::vector<float>(n));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : inputs)
    for (auto& x : v) x = u(rng) * 1e3f;
  for (int trial = 0; trial < 3; ++trial) {
    const auto results = on_ranks<float>(p, [&](thread_group& g) {
      auto v = inputs[static_cast<std::size_t>(g.rank())];
      g.allreduce(v.data(), n, reduce_op::sum).wait();
      return v;
    });
    for (std::size_t i = 0; i < n; ++i) {
      float want = inputs[0][i];
      for (int r = 1; r < p; ++r) want += inputs[static_cast<std::size_t>(r)][i];
      for (int r = 0; r < p; ++r) REQUIRE(results[static_cast<std::size_t>(r)][i] == want);  // bitwise
    }
  }
}

TEST_CASE("thread_group: collectives complete in issue order (issued back to back, then waited)",
          "[dist][thread_group]") {
  const int p = 3;
  const std::size_t n = 257;
  const int k = 40;
  for (const bool reverse_wait : {false, true}) {
    INFO("waited " << (reverse_wait ? "last first" : "in order"));
    const auto results = on_ranks<std::int64_t>(p, [&](thread_group& g) {
      // One buffer shared by a chain of dependent collectives: each must see the previous one's result.
      std::vector<std::int64_t> chain(n, g.rank() + 1);
      std::vector<std::vector<std::int64_t>> separate(k, std::vector<std::int64_t>(n));
      std::vector<work> works;
      for (int c = 0; c < k; ++c) {
        for (std::size_t i = 0; i < n; ++i) separate[static_cast<std::size_t>(c)][i] = c * 100 + g.rank();
        works.push_back(g.allreduce(separate[static_cast<std::size_t>(c)].data(), n, reduce_op::max));
        if (c % 3 == 0) works.push_back(g.allreduce(chain.data(), n, reduce_op::sum));
        if (c % 3 == 1) works.push_back(g.broadcast(chain.data(), n, c % p));
        if (c % 3 == 2) works.push_back(g.barrier());
      }
      if (reverse_wait)
        for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
      else
        for (auto& w : works) w.wait();
      std::vector<std::int64_t> out = chain;
      for (auto& s : separate) out.push_back(s[n - 1]);
      return out;
    });
    // chain: starts at r+1; every sum multiplies the (already equal) value by p except the first.
    std::vector<std::int64_t> chain(p);
    for (int r = 0; r < p; ++r) chain[static_cast<std::size_t>(r)] = r + 1;
    for (int c = 0; c < k; ++c) {
      if (c % 3 == 0) {
        std::int64_t s = 0;
        for (auto x : chain) s += x;
        for (auto& x : chain) x = s;
      }
      if (c % 3 == 1) {
        const auto root = chain[static_cast<std::size_t>(c % p)];
        for (auto& x : chain) x = root;
      }
    }
    for (int r = 0; r < p; ++r) {
      const auto& v = results[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < n; ++i) REQUIRE(v[i] == chain[static_cast<std::size_t>(r)]);
      for (int c = 0; c < k; ++c) REQUIRE(v[n + static_cast<std::size_t>(c)] == c * 100 + (p - 1));
    }
  }
}

TEST_CASE("thread_group: a rank that throws makes the others fail with dist_error, not hang",
          "[dist][thread_group][fault]") {
  const int p = 3;
  std::vector<std::string> seen(p);
  std::vector<double> seconds(p, 0.0);
  const auto start = std::chrono::steady_clock::now();
  bool rethrown = false;
  try {
    thread_group::run(p,
                      [&](thread_group& g) {
                        const auto r = static_cast<std::size_t>(g.rank());
                        std::vector<float> v(100, 1.0f);
                        g.allreduce(v.data(), v.size(), reduce_op::sum).wait();  // everyone, fine
                        if (g.rank() == 1) throw std::runtime_error("boom on rank 1");
                        try {
                          for (int i = 0; i < 5; ++i) g.allreduce(v.data(), v.size(), reduce_op::sum).wait();
                        } catch (const dist_error& e) {
                          seen[r] = e.what();
                          seconds[r] =
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                          throw;
                        }
                      },
                      {.timeout = std::chrono::milliseconds(500)});
  } catch (const std::runtime_error& e) {
    rethrown = true;
    CHECK(std::string(e.what()) == "boom on rank 1");  // the first exception, not the peers' dist_error
  }
  CHECK(rethrown);
  for (int r : {0, 2}) {
    INFO("rank " << r << ": " << seen[static_cast<std::size_t>(r)]);
    CHECK(seen[static_cast<std::size_t>(r)].find("peer rank 1 failed: boom on rank 1") != std::string::npos);
    CHECK(seen[static_cast<std::size_t>(r)].find("allreduce(float32, 100 elements, sum) on rank " +
                                                 std::to_string(r) + " of 3 (timeout 500 ms)") !=
          std::string::npos);
    CHECK(seconds[static_cast<std::size_t>(r)] < 2.0);
  }
}

TEST_CASE("thread_group: a rank that stalls makes the others' wait() throw after the timeout",
          "[dist][thread_group][fault]") {
  const int p = 3;
  std::vector<std::string> seen(p);
  std::vector<double> seconds(p, 0.0);
  CHECK_THROWS_AS(thread_group::run(
                      p,
                      [&](thread_group& g) {
                        if (g.rank() == 2) {  // never issues the collective
                          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                          return;
                        }
                        const auto r = static_cast<std::size_t>(g.rank());
                        std::vector<double> v(1000, 1.0);
                        const auto start = std::chrono::steady_clock::now();
                        work w = g.allreduce(v.data(), v.size(), reduce_op::avg);
                        try {
                          w.wait();
                        } catch (const dist_error& e) {
                          seen[r] = e.what();
                          seconds[r] =
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                          if (!w.done()) throw std::logic_error("a failed work must report done()");
                          throw;
                        }
                      },
                      {.timeout = std::chrono::milliseconds(500)}),
                  dist_error);
  for (int r : {0, 1}) {
    INFO("rank " << r << ": " << seen[static_cast<std::size_t>(r)]);
    CHECK(seen[static_cast<std::size_t>(r)].find("allreduce(float64, 1000 elements, avg) on rank " +
                                                 std::to_string(r) + " of 3 (timeout 500 ms)") !=
          std::string::npos);
    CHECK(seen[static_cast<std::size_t>(r)].find("waiting for rank(s) 2") != std::string::npos);
    CHECK(seconds[static_cast<std::size_t>(r)] >= 0.45);
    CHECK(seconds[static_cast<std::size_t>(r)] < 1.4);  // before the stalled rank wakes up
  }
}

TEST_CASE("thread_group: mismatched collectives are reported, not left to hang",
          "[dist][thread_group][fault]") {
  std::vector<std::string> seen(2);
  CHECK_THROWS_AS(thread_group::run(2,
                                    [&](thread_group& g) {
                                      std::vector<float> v(11, 1.0f);
                                      try {
                                        g.allreduce(v.data(), g.rank() == 0 ? 10 : 11, reduce_op::sum).wait();
                                      } catch (const dist_error& e) {
                                        seen[static_cast<std::size_t>(g.rank())] = e.what();
                                        throw;
                                      }
                                    },
                                    {.timeout = std::chrono::milliseconds(2000)}),
                  dist_error);
  for (const auto& s : seen) {
    INFO(s);
    CHECK(s.find("mismatched collectives") != std::string::npos);
    CHECK(s.find("allreduce(float32, 10 elements, sum)") != std::string::npos);
    CHECK(s.find("allreduce(float32, 11 elements, sum)") != std::string::npos);
  }
}

TEST_CASE("thread_group: bad arguments", "[dist][thread_group]") {
  CHECK_THROWS_AS(thread_group::create(0), trainkit::usage_error);
  CHECK_THROWS_AS(thread_group::create(2, {.timeout = std::chrono::milliseconds(0)}), trainkit::usage_error);
  auto comms = thread_group::create(2);
  float x = 0;
  CHECK_THROWS_AS(comms[0].broadcast(&x, 1, 2), trainkit::usage_error);
  CHECK_THROWS_AS(comms[0].allreduce(static_cast<float*>(nullptr), 3, reduce_op::sum), trainkit::usage_error);
}

TEST_CASE("check_consistent: equal hashes pass, a differing rank is named on every rank",
          "[dist][thread_group]") {
  thread_group::run(3, [](thread_group& g) {
    check_consistent(g, hash_bytes("model", 5), "parameter list");
    check_consistent(g, std::vector<std::uint64_t>{1, 2, 3}, "parameter shapes");
  });
  std::vector<std::string> seen(3);
  thread_group::run(3, [&](thread_group& g) {
    try {
      check_consistent(g, g.rank() == 2 ? 7u : 5u, "parameter list");
    } catch (const dist_error& e) {
      seen[static_cast<std::size_t>(g.rank())] = e.what();
    }
  });
  for (const auto& s : seen) {
    INFO(s);
    CHECK(s.find("parameter list differs across ranks") != std::string::npos);
    CHECK(s.find("rank 2 (0x0000000000000007)") != std::string::npos);
    CHECK(s.find("rank 1") == std::string::npos);
    CHECK(s == seen[0]);
  }
  std::vector<std::string> seen_v(3);
  thread_group::run(3, [&](thread_group& g) {
    std::vector<std::uint64_t> h{1, 2, 3};
    if (g.rank() == 1) h[2] = 4;
    if (g.rank() == 2) h.push_back(9);
    try {
      check_consistent(g, h, "parameter shapes");
    } catch (const dist_error& e) {
      seen_v[static_cast<std::size_t>(g.rank())] = e.what();
    }
  });
  for (const auto& s : seen_v) {
    INFO(s);
    CHECK(s.find("rank 2 has 4 values") != std::string::npos);
  }
}
