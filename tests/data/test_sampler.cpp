// tests/data/test_sampler.cpp - distributed_sampler: PyTorch's sharding (rank r takes r, r + R, ...
// of one permutation), padding or drop_last, per-epoch seeded shuffle, resumable position.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <numeric>
#include <vector>

#include "trainkit/data/distributed_sampler.hpp"
#include "trainkit/data/permutation.hpp"

using Catch::Matchers::Contains;
using trainkit::index_t;
namespace data = trainkit::data;

namespace {

/// Every rank's indices of one epoch, drained with next().
std::vector<std::vector<index_t>> all_ranks(index_t n, index_t replicas, bool shuffle, bool drop_last,
                                            std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::vector<index_t>> out;
  for (index_t r = 0; r < replicas; ++r) {
    data::distributed_sampler s(
        n, {.num_replicas = replicas, .rank = r, .shuffle = shuffle, .seed = seed, .drop_last = drop_last});
    s.set_epoch(epoch);
    std::vector<index_t> v;
    while (s.has_next()) v.push_back(s.next());
    REQUIRE(static_cast<index_t>(v.size()) == s.size());
    REQUIRE(v == s.indices());
    out.push_back(v);
  }
  return out;
}

std::map<index_t, int> counts(const std::vector<std::vector<index_t>>& ranks) {
  std::map<index_t, int> c;
  for (const auto& v : ranks)
    for (index_t i : v) ++c[i];
  return c;
}

}  // namespace

TEST_CASE("distributed_sampler: every sample once per epoch across ranks; padding repeats the first",
          "[data][sampler]") {
  for (index_t n : {0, 1, 2, 7, 10, 12, 101}) {
    for (index_t replicas : {1, 2, 3, 4}) {
      for (bool shuffle : {false, true}) {
        INFO("n = " << n << ", replicas = " << replicas << ", shuffle = " << shuffle);
        // Padding (drop_last = false): ceil(n / R) each; each sample once, plus total - n repeats.
        const auto ranks = all_ranks(n, replicas, shuffle, false, 9, 2);
        const index_t per = (n + replicas - 1) / replicas;
        for (const auto& v : ranks) REQUIRE(static_cast<index_t>(v.size()) == per);
        const auto c = counts(ranks);
        REQUIRE(static_cast<index_t>(c.size()) == n);  // every sample appears
        index_t extra = 0;
        for (const auto& [i, k] : c) {
          REQUIRE(i >= 0);
          REQUIRE(i < n);
          REQUIRE(k >= 1);
          extra += k - 1;
        }
        REQUIRE(extra == per * replicas - n);
        // The padded copies are the first positions of the epoch's order (torch's rule).
        const auto order = shuffle ? data::epoch_permutation(n, 9, 2) : [&] {
          std::vector<index_t> o(static_cast<std::size_t>(n));
          std::iota(o.begin(), o.end(), index_t(0));
          return o;
        }();
        for (index_t j = 0; j < per * replicas; ++j)
          REQUIRE(ranks[static_cast<std::size_t>(j % replicas)][static_cast<std::size_t>(j / replicas)] ==
                  order[static_cast<std::size_t>(j % n)]);

        // drop_last: floor(n / R) each when R does not divide n; no sample twice.
        const auto dropped = all_ranks(n, replicas, shuffle, true, 9, 2);
        const index_t per_d = n / replicas;
        for (const auto& v : dropped) REQUIRE(static_cast<index_t>(v.size()) == per_d);
        const auto cd = counts(dropped);
        REQUIRE(static_cast<index_t>(cd.size()) == per_d * replicas);
        for (const auto& [i, k] : cd) REQUIRE(k == 1);
      }
    }
  }
  // The torch example: 10 samples, 4 ranks, no shuffle -> rank 1 gets 1, 5, 9; the pad is 0, 1.
  const auto t = all_ranks(10, 4, false, false, 0, 0);
  CHECK(t[1] == std::vector<index_t>{1, 5, 9});
  CHECK(t[2] == std::vector<index_t>{2, 6, 0});
  CHECK(t[3] == std::vector<index_t>{3, 7, 1});
  CHECK(all_ranks(10, 4, false, true, 0, 0)[3] == std::vector<index_t>{3, 7});
  // N < R - 1: the order is repeated as many times as needed.
  CHECK(all_ranks(2, 5, false, false, 0, 0) == std::vector<std::vector<index_t>>{{0}, {1}, {0}, {1}, {0}});
}

TEST_CASE("distributed_sampler: same order for the same seed and epoch, another for other epochs",
          "[data][sampler]") {
  const auto a = all_ranks(50, 3, true, false, 123, 0);
  CHECK(all_ranks(50, 3, true, false, 123, 0) == a);
  const auto b = all_ranks(50, 3, true, false, 123, 1);
  CHECK(b != a);
  CHECK(all_ranks(50, 3, true, false, 124, 0) != a);
  // Still every sample, with one repeat (51 = 3 * 17 slots); the repeated one is epoch-dependent.
  for (const auto* e : {&a, &b}) {
    const auto c = counts(*e);
    CHECK(c.size() == 50);
    CHECK(std::count_if(c.begin(), c.end(), [](const auto& kv) { return kv.second == 2; }) == 1);
  }
  // set_epoch back to 0 reproduces epoch 0, whatever came between.
  data::distributed_sampler s(50, {.num_replicas = 3, .rank = 2, .seed = 123});
  s.set_epoch(5);
  s.set_epoch(0);
  CHECK(s.indices() == a[2]);
  // No shuffle: the same every epoch.
  CHECK(all_ranks(20, 2, false, false, 1, 0) == all_ranks(20, 2, false, false, 1, 7));
  // The single-process helpers.
  auto seq = data::sequential_sampler(5);
  CHECK(seq.indices() == std::vector<index_t>{0, 1, 2, 3, 4});
  auto sh = data::shuffled_sampler(30, 8);
  sh.set_epoch(2);
  CHECK(sh.indices() == data::epoch_permutation(30, 8, 2));
}

TEST_CASE("distributed_sampler: resumable position", "[data][sampler]") {
  data::distributed_sampler s(40, {.num_replicas = 2, .rank = 1, .seed = 5});
  s.set_epoch(3);
  const std::vector<index_t> epoch3 = s.indices();
  REQUIRE(s.size() == 20);
  for (int i = 0; i < 7; ++i) (void)s.next();
  s.skip(4);
  CHECK(s.position() == 11);
  CHECK(s.remaining() == 9);
  const auto st = s.get_state();
  CHECK(st == data::distributed_sampler::state{3, 11, 2, 0});

  // A fresh sampler (a restarted process) restored from the state continues identically.
  data::distributed_sampler t(40, {.num_replicas = 2, .rank = 1, .seed = 5});
  t.set_state(st);
  CHECK(t.epoch() == 3);
  std::vector<index_t> rest;
  while (t.has_next()) rest.push_back(t.next());
  CHECK(rest == std::vector<index_t>(epoch3.begin() + 11, epoch3.end()));
  CHECK_THROWS_AS(t.next(), trainkit::usage_error);
  t.seek(0);
  CHECK(t.next() == epoch3[0]);
  t.set_epoch(4);
  CHECK(t.position() == 0);

  CHECK_THROWS_WITH(s.skip(10), Contains("skip") && Contains("10") && Contains("9 left"));
  CHECK_THROWS_AS(s.skip(-1), trainkit::index_error);
  CHECK_THROWS_AS(s.seek(21), trainkit::index_error);
  CHECK_THROWS_AS(t.set_state({0, 21, 2, 0}), trainkit::index_error);
  s.skip(9);
  CHECK_FALSE(s.has_next());
}

TEST_CASE("distributed_sampler: a state of another world size continues the epoch by global position",
          "[data][sampler]") {
  // 2 ranks take 7 indices each of epoch 3 (order[0, 14)); the rest of the epoch on R = 1, 3, 4 ranks.
  for (const bool drop_last : {false, true}) {
    data::distributed_sampler old0(41, {.num_replicas = 2, .rank = 0, .seed = 5, .drop_last = drop_last});
    old0.set_epoch(3);
    old0.skip(7);
    const auto st = old0.get_state();
    CHECK(st.num_replicas == 2);
    CHECK(old0.global_position() == 14);
    const auto order = data::epoch_permutation(41, 5, 3);
    for (const index_t r_new : {1, 3, 4}) {
      INFO("drop_last " << drop_last << ", " << r_new << " ranks");
      std::vector<int> seen(41, 0);
      for (index_t k = 0; k < 14; ++k) ++seen[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])];
      index_t per_rank = -1;
      for (index_t r = 0; r < r_new; ++r) {
        data::distributed_sampler s(41, {.num_replicas = r_new, .rank = r, .seed = 5, .drop_last = drop_last});
        s.set_state(st);
        CHECK(s.epoch() == 3);
        CHECK(s.offset() == 14);
        CHECK(s.position() == 0);
        CHECK(s.get_state() == data::distributed_sampler::state{3, 0, r_new, 14});
        per_rank = s.size();
        while (s.has_next()) ++seen[static_cast<std::size_t>(s.next())];
        // Saved and restored on the same world size mid-way, it stays where it was.
        data::distributed_sampler again(41, {.num_replicas = r_new, .rank = r, .seed = 5, .drop_last = drop_last});
        again.set_state({3, 1, r_new, 14});
        CHECK(again.next() == s.indices()[1]);
        s.set_epoch(4);  // the next epoch starts from the beginning
        CHECK(s.offset() == 0);
        CHECK(s.size() == (drop_last ? 41 / r_new : (41 + r_new - 1) / r_new));
      }
      // 27 left: every one once; drop_last leaves out 27 % R, padding repeats R - 27 % R.
      const index_t left = 27 % r_new;
      CHECK(per_rank == (drop_last ? 27 / r_new : (27 + r_new - 1) / r_new));
      index_t missing = 0, twice = 0;
      for (int v : seen) {
        missing += v == 0;
        twice += v == 2;
        CHECK(v <= 2);
      }
      CHECK(missing == (drop_last ? left : 0));
      CHECK(twice == (drop_last || left == 0 ? 0 : r_new - left));
    }
  }
  data::distributed_sampler s(41, {.num_replicas = 3, .rank = 0});
  CHECK_THROWS_WITH(s.set_state({0, 0, 0, 0}), Contains("num_replicas 0"));
  CHECK_THROWS_WITH(s.set_state({0, 0, 2, 42}), Contains("offset 42") && Contains("41 samples"));
  CHECK_THROWS_WITH(s.set_state({0, 15, 2, 14}), Contains("position 15") && Contains("[0, 14]"));
}

TEST_CASE("distributed_sampler: validation", "[data][sampler]") {
  CHECK_THROWS_WITH(data::distributed_sampler(10, {.num_replicas = 2, .rank = 2}),
                    Contains("rank 2") && Contains("[0, 2)"));
  CHECK_THROWS_AS(data::distributed_sampler(10, {.num_replicas = 2, .rank = -1}), trainkit::index_error);
  CHECK_THROWS_WITH(data::distributed_sampler(10, {.num_replicas = 0}),
                    Contains("num_replicas must be >= 1"));
  CHECK_THROWS_AS(data::distributed_sampler(-1), trainkit::value_error);
  const data::distributed_sampler s(
      10, {.num_replicas = 4, .rank = 3, .shuffle = false, .seed = 2, .drop_last = true});
  CHECK(s.num_replicas() == 4);
  CHECK(s.rank() == 3);
  CHECK_FALSE(s.shuffle());
  CHECK(s.drop_last());
  CHECK(s.seed() == 2);
  CHECK(s.dataset_size() == 10);
  CHECK(s.total_size() == 8);
}
