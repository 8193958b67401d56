// tests/data/test_batch_iterator.cpp - the per-epoch shuffle rule and the mini-batch cursor:
// coverage of every sample, reproducibility, drop_last, resume.
#include <algorithm>
#include <catch2/catch.hpp>

#include "support/values.hpp"
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "trainkit/core/philox.hpp"
#include "trainkit/data/batch_iterator.hpp"

using trainkit::index_t;
using trainkit::tensor;
namespace data = trainkit::data;

namespace {

/// x[i] = [i, 1000 + i, 2000 + i] (a [N, 3] input whose rows say which sample they are), y[i] = i % 10.
struct toy {
  tensor<float> x;
  tensor<std::int64_t> y;
};
toy make_toy(index_t n) {
  std::vector<float> xs;
  std::vector<std::int64_t> ys;
  for (index_t i = 0; i < n; ++i) {
    for (int k = 0; k < 3; ++k) xs.push_back(static_cast<float>(1000 * k + i));
    ys.push_back(i % 10);
  }
  return {tensor<float>::from_vector(xs, {n, 3}), tensor<std::int64_t>::from_vector(ys, {n})};
}

/// The sample indices of every batch of the rest of the epoch, checking x and y agree with them.
std::vector<std::vector<index_t>> drain(data::batch_iterator<float>& it) {
  std::vector<std::vector<index_t>> out;
  for (auto& b : it) {
    REQUIRE(b.x.dim() == 2);
    REQUIRE(b.x.size(1) == 3);
    REQUIRE(b.y.numel() == b.x.size(0));
    std::vector<index_t> ids;
    for (index_t r = 0; r < b.x.size(0); ++r) {
      const auto i = static_cast<index_t>(b.x.at({r, 0}));
      REQUIRE(b.x.at({r, 1}) == static_cast<float>(1000 + i));
      REQUIRE(b.x.at({r, 2}) == static_cast<float>(2000 + i));
      REQUIRE(b.y.at({r}) == i % 10);
      ids.push_back(i);
    }
    out.push_back(ids);
  }
  return out;
}

using trainkit::test::flat;

/// The shuffle rule of data/permutation.hpp, written again from its description.
std::vector<index_t> reference_permutation(index_t n, std::uint64_t seed, std::uint64_t epoch) {
  std::uint64_t t = 0;
  auto word = [&] {
    const std::uint64_t b = t / 2, k = t % 2;
    ++t;
    const auto r = trainkit::philox4x32_10(
        {std::uint32_t(b), std::uint32_t(b >> 32), std::uint32_t(epoch), std::uint32_t(epoch >> 32)},
        {std::uint32_t(seed), std::uint32_t(seed >> 32)});
    return (std::uint64_t(r.v[2 * k + 1]) << 32) | r.v[2 * k];
  };
  std::vector<index_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (index_t i = n - 1; i >= 1; --i) {
    const auto bound = static_cast<std::uint64_t>(i + 1);
    const std::uint64_t r = (UINT64_MAX % bound + 1) % bound;
    std::uint64_t w = word();
    while (w > UINT64_MAX - r) w = word();
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(w % bound)]);
  }
  return p;
}

}  // namespace

TEST_CASE("epoch_permutation follows the documented rule", "[data][shuffle]") {
  for (index_t n : {0, 1, 2, 7, 100, 1001})
    for (std::uint64_t seed : {0ull, 1ull, 0xDEADBEEFCAFEF00Dull})
      for (std::uint64_t epoch : {0ull, 1ull, 5ull, 1ull << 40}) {
        CAPTURE(n, seed, epoch);
        const auto p = data::epoch_permutation(n, seed, epoch);
        CHECK(p == reference_permutation(n, seed, epoch));
        auto s = p;
        std::sort(s.begin(), s.end());
        std::vector<index_t> id(static_cast<std::size_t>(n));
        std::iota(id.begin(), id.end(), 0);
        CHECK(s == id);
      }
  CHECK_THROWS_AS(data::epoch_permutation(-1, 0, 0), trainkit::value_error);
}

TEST_CASE("epoch_permutation is uniform over the permutations of 3", "[data][shuffle]") {
  std::map<std::vector<index_t>, int> counts;
  const int epochs = 6000;
  for (int e = 0; e < epochs; ++e) ++counts[data::epoch_permutation(3, 42, static_cast<std::uint64_t>(e))];
  REQUIRE(counts.size() == 6);
  double chi2 = 0;
  for (const auto& [perm, c] : counts) chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
  CHECK(chi2 < 20.5);  // chi-square, 5 degrees of freedom: p < 0.001 above 20.5
}

TEST_CASE("batch_iterator visits every sample exactly once per epoch", "[data][batch]") {
  const toy t = make_toy(103);
  data::batch_iterator it(t.x, t.y, 10, true, 7);
  REQUIRE(it.size() == 11);
  REQUIRE(it.samples() == 103);
  for (std::uint64_t e = 0; e < 3; ++e) {
    it.set_epoch(e);
    const auto batches = drain(it);
    REQUIRE(batches.size() == 11);
    for (std::size_t k = 0; k + 1 < batches.size(); ++k) CHECK(batches[k].size() == 10);
    CHECK(batches.back().size() == 3);  // the last partial batch
    auto ids = flat(batches);
    CHECK(ids == it.order());
    std::sort(ids.begin(), ids.end());
    std::vector<index_t> all(103);
    std::iota(all.begin(), all.end(), 0);
    CHECK(ids == all);
    CHECK(it.position() == it.size());
    CHECK_FALSE(it.has_next());
  }
}

TEST_CASE("batch_iterator orders: same seed and epoch agree, others differ", "[data][batch]") {
  const toy t = make_toy(64);
  data::batch_iterator a(t.x, t.y, 8, true, 123), b(t.x, t.y, 8, true, 123), c(t.x, t.y, 8, true, 124);
  const auto a0 = flat(drain(a)), b0 = flat(drain(b)), c0 = flat(drain(c));
  CHECK(a0 == b0);
  CHECK(a0 != c0);
  CHECK(a0 == data::epoch_permutation(64, 123, 0));

  a.set_epoch(1);
  const auto a1 = flat(drain(a));
  CHECK(a1 != a0);
  b.set_epoch(1);
  CHECK(flat(drain(b)) == a1);
  a.set_epoch(0);  // going back to an epoch gives its order again
  CHECK(flat(drain(a)) == a0);

  std::vector<index_t> identity(64);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(a0 != identity);
  data::batch_iterator plain(t.x, t.y, 8, false, 123);
  CHECK(flat(drain(plain)) == identity);
  plain.set_epoch(4);
  CHECK(flat(drain(plain)) == identity);
}

TEST_CASE("batch_iterator drop_last and batch counts", "[data][batch]") {
  const toy t = make_toy(25);
  struct expect {
    index_t batch;
    bool drop;
    index_t batches, last;
  };
  for (const expect e :
       {expect{5, false, 5, 5}, expect{5, true, 5, 5}, expect{7, false, 4, 4}, expect{7, true, 3, 7},
        expect{25, true, 1, 25}, expect{30, false, 1, 25}, expect{30, true, 0, 0}, expect{1, false, 25, 1}}) {
    CAPTURE(e.batch, e.drop);
    data::batch_iterator it(t.x, t.y, e.batch, true, 3, e.drop);
    CHECK(it.size() == e.batches);
    const auto bs = drain(it);
    REQUIRE(static_cast<index_t>(bs.size()) == e.batches);
    if (!bs.empty()) CHECK(static_cast<index_t>(bs.back().size()) == e.last);
    if (e.drop) {
      // The left-out samples are the tail of the order, not always the same samples.
      CHECK(static_cast<index_t>(flat(bs).size()) == (25 / e.batch) * e.batch);
    }
  }
}

TEST_CASE("batch_iterator seek and state resume with the same remaining batches", "[data][batch]") {
  const toy t = make_toy(50);
  data::batch_iterator full(t.x, t.y, 6, true, 99);
  full.set_epoch(2);
  const auto all = drain(full);
  REQUIRE(all.size() == 9);

  SECTION("seek") {
    data::batch_iterator it(t.x, t.y, 6, true, 99);
    it.set_epoch(2);
    it.seek(4);
    const auto rest = drain(it);
    CHECK(rest == std::vector<std::vector<index_t>>(all.begin() + 4, all.end()));
    it.seek(9);
    CHECK(drain(it).empty());
    CHECK_THROWS_AS(it.seek(10), trainkit::index_error);
    CHECK_THROWS_AS(it.seek(-1), trainkit::index_error);
  }
  SECTION("a run stopped after three steps and resumed from its state") {
    data::batch_iterator run(t.x, t.y, 6, true, 99);
    run.set_epoch(2);
    for (int k = 0; k < 3; ++k) (void)run.next();
    const auto saved = run.get_state();
    CHECK(saved == data::batch_iterator<float>::state{99, 2, 3});

    data::batch_iterator resumed(t.x, t.y, 6, true, 0);  // a fresh process with a different seed...
    resumed.set_state(saved);                            // ...takes the snapshot's seed, epoch and position
    CHECK(resumed.seed() == 99);
    CHECK(resumed.epoch() == 2);
    CHECK(resumed.position() == 3);
    CHECK(drain(resumed) == std::vector<std::vector<index_t>>(all.begin() + 3, all.end()));
  }
  SECTION("get does not move, next past the end is an error") {
    data::batch_iterator it(t.x, t.y, 6, true, 99);
    it.set_epoch(2);
    const auto b5 = it.get(5);
    CHECK(it.position() == 0);
    CHECK(b5.x.at({0, 0}) == static_cast<float>(all[5][0]));
    it.seek(8);
    (void)it.next();
    CHECK_THROWS_AS(it.next(), trainkit::usage_error);
    CHECK_THROWS_AS(it.get(9), trainkit::index_error);
  }
}

TEST_CASE("batch_iterator gathers samples of any shape into contiguous batches", "[data][batch]") {
  SECTION("image-like samples, large enough for the parallel copy") {
    const index_t n = 600, c = 1, h = 28, w = 28;
    std::vector<float> xs(static_cast<std::size_t>(n * c * h * w));
    for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 9973) * 0.5f;
    std::vector<std::int64_t> ys(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<std::int64_t>(i * 3 % 10);
    const auto x = tensor<float>::from_vector(xs, {n, c, h, w});
    const auto y = tensor<std::int64_t>::from_vector(ys, {n});
    data::batch_iterator it(x, y, 256, true, 5);
    index_t seen = 0;
    for (auto& b : it) {
      REQUIRE(b.x.is_contiguous());
      REQUIRE(b.x.sizes() == trainkit::shape{b.y.numel(), c, h, w});
      for (index_t r = 0; r < b.y.numel(); ++r) {
        const index_t src = it.order()[static_cast<std::size_t>(seen + r)];
        CHECK(b.y.at({r}) == ys[static_cast<std::size_t>(src)]);
        CHECK(b.x.at({r, 0, 13, 7}) == x.at({src, 0, 13, 7}));
        CHECK(b.x.at({r, 0, 27, 27}) == x.at({src, 0, 27, 27}));
      }
      seen += b.y.numel();
    }
    CHECK(seen == n);
  }
  SECTION("non-contiguous inputs, 1-D samples and integer elements") {
    // A transposed [3, N] tensor seen as [N, 3]: the iterator makes it contiguous once.
    const toy t = make_toy(20);
    const auto xt = t.x.t().contiguous().t();
    REQUIRE_FALSE(xt.is_contiguous());
    data::batch_iterator it(xt, t.y, 4, true, 11);
    CHECK(flat(drain(it)).size() == 20);

    const auto xi = tensor<std::int32_t>::from_vector({10, 11, 12, 13, 14}, {5});
    const auto yi = tensor<std::int64_t>::from_vector({0, 1, 2, 3, 4}, {5});
    data::batch_iterator ii(xi, yi, 2, false, 0);
    const auto b0 = ii.next();
    CHECK(b0.x.sizes() == trainkit::shape{2});
    CHECK(b0.x.to_vector() == std::vector<std::int32_t>{10, 11});
  }
  SECTION("an empty dataset has no batches") {
    const toy t = make_toy(0);
    data::batch_iterator it(t.x, t.y, 4, true, 1);
    CHECK(it.size() == 0);
    CHECK(drain(it).empty());
  }
}

TEST_CASE("batch_iterator rejects bad arguments", "[data][batch][errors]") {
  using Catch::Matchers::Contains;
  const toy t = make_toy(10);
  const auto y9 = tensor<std::int64_t>::zeros({9});
  CHECK_THROWS_WITH(data::batch_iterator(t.x, y9, 2, true, 0),
                    Contains("batch_iterator") && Contains("[10, 3]") && Contains("[9]"));
  CHECK_THROWS_AS(data::batch_iterator(t.x, y9, 2, true, 0), trainkit::shape_error);
  CHECK_THROWS_AS(data::batch_iterator(t.x, t.y.view({5, 2}), 2, true, 0), trainkit::shape_error);
  CHECK_THROWS_WITH(data::batch_iterator(t.x, t.y, 0, true, 0), Contains("batch_size must be >= 1, got 0"));
  CHECK_THROWS_AS(data::batch_iterator(tensor<float>::scalar(1.0f), t.y, 2, true, 0), trainkit::shape_error);
}
