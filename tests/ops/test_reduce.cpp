// Reductions on the CPU (ops/reduce.hpp): over all elements and along dimensions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "trainkit/trainkit.hpp"

#include "ops/ops_util.hpp"

using namespace trainkit;
using trainkit_test::ops::iota;
using trainkit_test::ops::random_f;

TEST_CASE("reductions", "[tensor][reduce]") {
  auto a = iota({2, 3, 4});
  REQUIRE(sum(a).item() == 276);
  REQUIRE(mean(a).item() == Approx(11.5));
  auto s0 = sum(a, {0});
  REQUIRE(s0.sizes() == shape{3, 4});
  REQUIRE(s0.at({2, 3}) == 11 + 23);
  auto s12 = sum(a, {1, 2}, true);
  REQUIRE(s12.sizes() == shape{2, 1, 1});
  REQUIRE(s12.at({1, 0, 0}) == (12 + 23) * 12 / 2);
  auto sneg = sum(a, {-1});
  REQUIRE(sneg.at({1, 2}) == 20 + 21 + 22 + 23);
  REQUIRE(amax(a, {1}).at({1, 0}) == 20);
  REQUIRE(amin(a).item() == 0);
  // Integers fold from the type's limits (an int has no infinity); NaN wins in floats.
  const auto neg = tensor<std::int64_t>::from_vector({-5, -7, std::numeric_limits<std::int64_t>::max(), -6}, {2, 2});
  REQUIRE(amax(neg, {1}).to_vector() == std::vector<std::int64_t>{-5, std::numeric_limits<std::int64_t>::max()});
  REQUIRE(amin(neg).item() == -7);
  const auto with_nan = tensor<float>::from_vector({1, std::numeric_limits<float>::quiet_NaN(), 3}, {3});
  REQUIRE(std::isnan(amax(with_nan).item()));
  REQUIRE(std::isnan(amin(with_nan).item()));
  auto t = tensor<float>::from_vector({1, 5, 5, 2, 9, 0}, {2, 3});
  REQUIRE(argmax(t, 1).to_vector() == std::vector<std::int64_t>{1, 1});  // first max wins
  REQUIRE(argmax(t, 0).to_vector() == std::vector<std::int64_t>{1, 1, 0});
  REQUIRE(argmin(t, 1).to_vector() == std::vector<std::int64_t>{0, 2});
  auto [mv, mi] = max(t, 1, true);
  REQUIRE(mv.sizes() == shape{2, 1});
  REQUIRE(mi.at({1, 0}) == 1);
  // Reduction over a transposed view.
  auto tt = a.transpose(0, 2);  // [4, 3, 2]
  REQUIRE(sum(tt, {2}).at({3, 1}) == a.at({0, 1, 3}) + a.at({1, 1, 3}));
  // Large single-output reduction (parallel partial sums) is exact for integers in double.
  auto big = iota({1000, 300});
  REQUIRE(sum(big).item() == 299999.0 * 300000.0 / 2);
  REQUIRE(argmax(big.flatten(), 0).item() == 299999);
  // sum_to reverses broadcasting.
  auto g = tensor<double>::ones({2, 3, 4});
  auto r = sum_to(g, {3, 1});
  REQUIRE(r.sizes() == shape{3, 1});
  REQUIRE(r.at({0, 0}) == 8);
  REQUIRE_THROWS_AS(sum(a, {3}), index_error);
  REQUIRE_THROWS_AS(argmax(tensor<float>::zeros({0}), 0), shape_error);
  REQUIRE_THROWS_AS(sum_to(g, {5}), shape_error);
}

TEST_CASE("column reductions (contiguous kept dim) fold each output in order, bit for bit", "[tensor][reduce]") {
  // The tiled path: outputs contiguous along the innermost kept dim, reduced dims outside it.
  for (const shape& s : {shape{300, 130}, shape{7, 33, 70}, shape{2049, 9}, shape{5, 4, 3, 65}}) {
    INFO("sizes " << to_string(s));
    const auto a = random_f(s, 11);
    const index_t inner = s.back(), n_red = a.numel() / inner;
    const auto v = a.to_vector();
    std::vector<index_t> dims;
    for (index_t d = 0; d + 1 < index_t(s.size()); ++d) dims.push_back(d);
    // Every dim but the last reduced: out[j] = sum over k in row-major order of the reduced ones.
    const auto got = sum(a, dims).to_vector();
    const auto got_max = amax(a, dims).to_vector();
    for (index_t j = 0; j < inner; ++j) {
      float want = 0, want_max = -INFINITY;
      for (index_t k = 0; k < n_red; ++k) {
        want += v[std::size_t(k * inner + j)];
        want_max = std::max(want_max, v[std::size_t(k * inner + j)]);
      }
      REQUIRE(got[std::size_t(j)] == want);
      REQUIRE(got_max[std::size_t(j)] == want_max);
    }
    // argmax over the first dim of a 2-D view: the first index of the maximum, per column.
    const auto flat = a.reshape({n_red, inner});
    const auto am = argmax(flat, 0).to_vector();
    for (index_t j = 0; j < inner; ++j) {
      index_t best = 0;
      for (index_t k = 1; k < n_red; ++k)
        if (v[std::size_t(k * inner + j)] > v[std::size_t(best * inner + j)]) best = k;
      REQUIRE(am[std::size_t(j)] == best);
    }
  }
  // A reduced dim between kept ones, and a transposed (strided) input, still right.
  const auto b = random_f({6, 5, 40}, 12);
  const auto bv = b.to_vector();
  const auto mid = sum(b, {1}).to_vector();
  for (index_t i = 0; i < 6; ++i)
    for (index_t j = 0; j < 40; ++j) {
      float want = 0;
      for (index_t k = 0; k < 5; ++k) want += bv[std::size_t((i * 5 + k) * 40 + j)];
      REQUIRE(mid[std::size_t(i * 40 + j)] == want);
    }
  const auto t = sum(b.transpose(0, 2), {2}).to_vector();  // [40, 5, 6] summed over its last dim
  for (index_t j = 0; j < 40; ++j)
    for (index_t k = 0; k < 5; ++k) {
      float want = 0;
      for (index_t i = 0; i < 6; ++i) want += bv[std::size_t((i * 5 + k) * 40 + j)];
      REQUIRE(t[std::size_t(j * 5 + k)] == want);
    }
}
