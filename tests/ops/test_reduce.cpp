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
