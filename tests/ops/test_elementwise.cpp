// Broadcasting elementwise ops and casts between element types on the CPU (ops/elementwise.hpp).
#include <catch2/catch.hpp>

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "trainkit/trainkit.hpp"

#include "ops/ops_util.hpp"

using namespace trainkit;
using trainkit_test::ops::iota;
using trainkit_test::ops::random_f;

TEST_CASE("broadcasting elementwise ops", "[tensor][elementwise]") {
  auto a = iota({2, 3});
  auto b = tensor<double>::from_vector({10, 20, 30}, {3});
  auto c = a + b;
  REQUIRE(c.at({1, 2}) == 5 + 30);
  auto col = tensor<double>::from_vector({1, 2}, {2, 1});
  auto d = a * col;
  REQUIRE(d.at({1, 1}) == 4 * 2);
  REQUIRE((a - 1.0).at({0, 0}) == -1);
  REQUIRE((2.0 / (a + 1.0)).at({0, 1}) == 1);
  REQUIRE(exp(a).at({0, 1}) == Approx(std::exp(1.0)));
  REQUIRE(relu(a - 2.0).at({0, 0}) == 0);
  REQUIRE(sigmoid(tensor<double>::from_vector({-1000, 0, 1000})).to_vector() == std::vector<double>{0, 0.5, 1});
  REQUIRE(gelu(tensor<double>::from_vector({1.0})).item() == Approx(0.8413447460685429));
  // Non-contiguous operands.
  auto t = a.t();  // [3, 2]
  auto s = t + t;
  REQUIRE(s.at({2, 1}) == 2 * a.at({1, 2}));
  // In place with broadcast source.
  auto x = a.clone();
  add_(x, b, 2.0);
  REQUIRE(x.at({1, 0}) == 3 + 20);
  REQUIRE_THROWS_AS(add_(b, a), shape_error);
  REQUIRE_THROWS_AS(a + tensor<double>::zeros({4}), shape_error);
  REQUIRE_THROWS_WITH(a + tensor<double>::zeros({4}), Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
  // Large tensor (parallel path) matches serial math.
  auto big = random_f({300, 257}, 1);
  auto bb = big * big;
  auto v = big.to_vector(), w = bb.to_vector();
  for (std::size_t i = 0; i < v.size(); i += 97) REQUIRE(w[i] == v[i] * v[i]);
  auto bt = big.t() * 2.0;
  REQUIRE(bt.at({256, 299}) == 2 * big.at({299, 256}));
}

TEST_CASE("casts between element types", "[tensor][dtype]") {
  auto a = tensor<float>::from_vector({1.5f, -2.25f, 65504.f, 1e-8f});
  auto h = cast<half>(a);
  auto back = cast<float>(h);
  REQUIRE(back.to_vector()[0] == 1.5f);
  REQUIRE(back.to_vector()[2] == 65504.f);
  // OpenBLAS's cblas.h declares a global ::bfloat16 typedef, so qualify ours.
  auto bf = cast<trainkit::bfloat16>(a);
  REQUIRE(cast<float>(bf).to_vector()[1] == -2.25f);
  auto i = cast<int>(tensor<double>::from_vector({2.7, -1.2}));
  REQUIRE(i.to_vector() == std::vector<int>{2, -1});
  // half arithmetic computes in float and rounds once
  auto hs = h + h;
  REQUIRE(float(hs.to_vector()[0]) == 3.0f);
}
