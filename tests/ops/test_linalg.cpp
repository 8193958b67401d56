// matmul on the CPU (ops/linalg.hpp) against a reference product.
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

TEST_CASE("matmul", "[tensor][linalg]") {
  auto a = random_f({5, 7}, 2), b = random_f({7, 3}, 3);
  auto c = matmul(a, b);
  REQUIRE(c.sizes() == shape{5, 3});
  for (index_t i = 0; i < 5; ++i)
    for (index_t j = 0; j < 3; ++j) {
      double ref = 0;
      for (index_t k = 0; k < 7; ++k) ref += double(a.at({i, k})) * b.at({k, j});
      REQUIRE(c.at({i, j}) == Approx(ref).margin(1e-5));
    }
  SECTION("transposed operands go straight to GEMM") {
    auto at = a.t().contiguous().t();  // same values, column-major layout
    REQUIRE_FALSE(at.is_contiguous());
    auto c2 = matmul(at, b);
    for (index_t i = 0; i < 5; ++i) REQUIRE(c2.at({i, 2}) == Approx(c.at({i, 2})));
    auto sl = random_f({5, 14}, 4).slice(1, 0, 14, 2);  // column stride 2: needs a copy
    auto c3 = matmul(sl, b);
    REQUIRE(c3.sizes() == shape{5, 3});
  }
  SECTION("batched with broadcasting, and vectors") {
    auto x = random_f({2, 1, 5, 7}, 5), y = random_f({3, 7, 4}, 6);
    auto z = matmul(x, y);
    REQUIRE(z.sizes() == shape{2, 3, 5, 4});
    auto ref = matmul(x.select(0, 1).select(0, 0), y.select(0, 2));
    for (index_t i = 0; i < 5; ++i) REQUIRE(z.at({1, 2, i, 3}) == Approx(ref.at({i, 3})));
    auto v = random_f({7}, 7);
    REQUIRE(matmul(a, v).sizes() == shape{5});
    REQUIRE(matmul(v, b).sizes() == shape{3});
    REQUIRE(matmul(v, v).dim() == 0);
    auto x3 = random_f({4, 5, 7}, 8);
    auto folded = matmul(x3, b);
    REQUIRE(folded.sizes() == shape{4, 5, 3});
    REQUIRE(folded.at({3, 4, 2}) == Approx(matmul(x3.select(0, 3), b).at({4, 2})));
  }
  SECTION("matches cblas_sgemm bit for bit") {
    // On the OpenBLAS route: the automatic one may measure oneDNN faster for this shape, which
    // rounds differently (tests/backend/test_measured_route.cpp checks that route against itself).
    const auto saved = backend::get_cpu_gemm_route();
    backend::set_cpu_gemm_route(backend::cpu_gemm_route::openblas);
    struct put_back {
      backend::cpu_gemm_route r;
      ~put_back() { backend::set_cpu_gemm_route(r); }
    } restore{saved};
    auto p = random_f({64, 96}, 9), q = random_f({96, 80}, 10);
    auto r = matmul(p, q);
    std::vector<float> ref(64 * 80);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 64, 80, 96, 1.f, p.data(), 96, q.data(), 80, 0.f,
                ref.data(), 80);
    REQUIRE(r.to_vector() == ref);
  }
  SECTION("half and double") {
    auto ah = cast<half>(a), bh = cast<half>(b);
    auto ch = cast<float>(matmul(ah, bh));
    for (index_t i = 0; i < 5; ++i) REQUIRE(ch.at({i, 1}) == Approx(c.at({i, 1})).epsilon(2e-2).margin(2e-2));
    auto ad = cast<double>(a), bd = cast<double>(b);
    REQUIRE(cast<float>(matmul(ad, bd)).at({4, 2}) == Approx(c.at({4, 2})).epsilon(1e-5));
  }
  REQUIRE_THROWS_AS(matmul(a, a), shape_error);
  REQUIRE_THROWS_WITH(matmul(a, a), Catch::Contains("[5, 7]"));
  REQUIRE_THROWS_AS(matmul(random_f({2, 5, 7}, 1), random_f({3, 7, 2}, 1)), shape_error);
}
