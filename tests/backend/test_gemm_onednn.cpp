// tests/backend/test_gemm_onednn.cpp - the CPU GEMM through oneDNN (backend/cpu/onednn_gemm.hpp) against
// OpenBLAS: fp32 on odd shapes, every transpose, padded leading dimensions, alpha/beta; bfloat16 and
// half against an fp32 GEMM of the same 16-bit inputs, rounded once; the TRAINKIT_CPU_GEMM route.
// The widening fallback (route openblas, and every build without oneDNN) is checked the same way.
// And what decides the route: backend/cpu/cpu_features.hpp (the ISA limit's names, what a limit
// turns off, and that the limit in force reaches trainkit's checks and oneDNN alike; ctest runs
// this file both ways: test_backend_test_gemm_onednn and ..._avx2).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <random>
#include <vector>

#include "trainkit/backend/cpu/blas.hpp"
#include "trainkit/backend/cpu/convert16.hpp"
#include "trainkit/backend/cpu/cpu_features.hpp"
#include "trainkit/backend/cpu/onednn_gemm.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"
#include "support/cpu.hpp"

// (OpenBLAS's cblas.h declares a global `bfloat16`: trainkit's goes by these names here.)
using bf16 = trainkit::bfloat16;
using f16 = trainkit::half;
using trainkit::index_t;
namespace backend = trainkit::backend;
using cpu_blas = backend::blas<trainkit::cpu>;

namespace {

/// Sets the route for one scope and puts the previous one back.
struct route_guard {
  backend::cpu_gemm_route saved = backend::get_cpu_gemm_route();
  explicit route_guard(backend::cpu_gemm_route r) { backend::set_cpu_gemm_route(r); }
  ~route_guard() { backend::set_cpu_gemm_route(saved); }
};

struct gemm_case {
  index_t m, n, k;
  bool ta, tb;
  index_t pad;  // extra elements per row of A, B and C
  double alpha, beta;
  index_t rows_a() const { return ta ? k : m; }
  index_t cols_a() const { return ta ? m : k; }
  index_t rows_b() const { return tb ? n : k; }
  index_t cols_b() const { return tb ? k : n; }
  index_t lda() const { return cols_a() + pad; }
  index_t ldb() const { return cols_b() + pad; }
  index_t ldc() const { return n + pad; }
};

std::vector<gemm_case> cases() {
  const index_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {128, 10, 512}, {5, 300, 17}, {64, 31, 128}};
  const double scalars[][2] = {{1, 0}, {0.5, 0}, {1, 1}, {-2, 0.25}};
  std::vector<gemm_case> out;
  for (auto& s : shapes)
    for (int t = 0; t < 4; ++t)
      for (index_t pad : {index_t(0), index_t(3)})
        for (auto& ab : scalars) out.push_back({s[0], s[1], s[2], bool(t & 1), bool(t & 2), pad, ab[0], ab[1]});
  return out;
}

template <class T>
std::vector<T> random_values(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<T> v(count);
  for (auto& x : v) x = T(u(rng));
  return v;
}

template <class T>
std::vector<float> widen(const std::vector<T>& v) {
  return std::vector<float>(v.begin(), v.end());
}

/// The distance from x to the next representable T of larger magnitude (1 ulp at x).
template <class T>
double ulp(float x) {
  const std::uint16_t bits = T(x).bits();
  const float up = float(T::from_bits(static_cast<std::uint16_t>((bits & 0x7fffu) + 1)));
  return std::fabs(double(up) - std::fabs(double(float(T(x)))));
}

/// op(A) op(B) in double with |op(A)| |op(B)| (the scale of the rounding error) beside it.
template <class T>
void reference(const gemm_case& g, const std::vector<T>& a, const std::vector<T>& b, const std::vector<T>& c0,
               std::vector<double>& out, std::vector<double>& scale) {
  out.assign(std::size_t(g.m * g.n), 0.0);
  scale.assign(std::size_t(g.m * g.n), 0.0);
  for (index_t i = 0; i < g.m; ++i)
    for (index_t j = 0; j < g.n; ++j) {
      double s = 0, mag = 0;
      for (index_t p = 0; p < g.k; ++p) {
        const double x = double(float(g.ta ? a[p * g.lda() + i] : a[i * g.lda() + p]));
        const double y = double(float(g.tb ? b[j * g.ldb() + p] : b[p * g.ldb() + j]));
        s += x * y;
        mag += std::fabs(x * y);
      }
      const double c = double(float(c0[i * g.ldc() + j]));
      out[std::size_t(i * g.n + j)] = g.alpha * s + g.beta * c;
      scale[std::size_t(i * g.n + j)] = std::fabs(g.alpha) * mag + std::fabs(g.beta * c);
    }
}

/// C through blas<cpu>::gemm<T> under `route`, checked against the double reference: fp32 within
/// 1e-5 of the product's magnitude, 16-bit within 1 ulp of the fp32 result rounded once (plus the
/// fp32 accumulation error). The padding of C must be left alone.
template <class T>
void check_gemm(backend::cpu_gemm_route route, const gemm_case& g) {
  CAPTURE(g.m, g.n, g.k, g.ta, g.tb, g.pad, g.alpha, g.beta);
  auto a = random_values<T>(std::size_t(g.rows_a() * g.lda()), 1);
  auto b = random_values<T>(std::size_t(g.rows_b() * g.ldb()), 2);
  auto c = random_values<T>(std::size_t(g.m * g.ldc()), 3);
  const auto c0 = c;
  std::vector<double> ref, scale;
  reference(g, a, b, c0, ref, scale);
  {
    route_guard guard(route);
    cpu_blas::gemm<T>(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), g.lda(), b.data(), g.ldb(), g.beta, c.data(),
                      g.ldc());
  }
  int bad = 0;
  for (index_t i = 0; i < g.m; ++i) {
    for (index_t j = 0; j < g.ldc(); ++j) {
      const float got = float(c[i * g.ldc() + j]);
      if (j >= g.n) {  // padding
        bad += got != float(c0[i * g.ldc() + j]);
        continue;
      }
      const double want = ref[std::size_t(i * g.n + j)], s = scale[std::size_t(i * g.n + j)];
      double tol = 1e-5 * s + 1e-30;
      if constexpr (!std::is_same_v<T, float>) tol += ulp<T>(float(want)) + 1e-5 * s;
      if (std::fabs(double(got) - want) > tol && bad++ < 5) {
        INFO("C[" << i << "][" << j << "] = " << got << ", reference " << want << ", tolerance " << tol);
        CHECK(false);
      }
    }
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("TRAINKIT_CPU_GEMM parses openblas, onednn and auto", "[gemm][onednn]") {
  using backend::cpu_gemm_route;
  using backend::detail::parse_cpu_gemm_route;
  CHECK(parse_cpu_gemm_route(nullptr) == cpu_gemm_route::automatic);
  CHECK(parse_cpu_gemm_route("") == cpu_gemm_route::automatic);
  CHECK(parse_cpu_gemm_route("auto") == cpu_gemm_route::automatic);
  CHECK(parse_cpu_gemm_route("openblas") == cpu_gemm_route::openblas);
  CHECK(parse_cpu_gemm_route("onednn") == cpu_gemm_route::onednn);
  CHECK_THROWS_AS(parse_cpu_gemm_route("mkl"), trainkit::value_error);
  CHECK_THROWS_WITH(parse_cpu_gemm_route("mkl"), Catch::Contains("TRAINKIT_CPU_GEMM") && Catch::Contains("mkl"));
}

TEST_CASE("the route decides which library runs a GEMM", "[gemm][onednn]") {
  using backend::cpu_gemm_route;
  using choice = cpu_blas::gemm_choice;
  {
    route_guard guard(cpu_gemm_route::openblas);
    CHECK(cpu_blas::route_of<float>(128, 512, 784) == choice::openblas);
    CHECK(cpu_blas::route_of<bf16>(128, 512, 784) == choice::openblas);
    CHECK(cpu_blas::route_of<double>(128, 512, 784) == choice::openblas);
  }
#if TRAINKIT_HAS_ONEDNN
  {
    route_guard guard(cpu_gemm_route::automatic);
    CHECK(cpu_blas::route_of<bf16>(1024, 1024, 1024) ==
          (backend::onednn_supports<bf16>() ? choice::onednn : choice::openblas));
    // fp32 products from 2^16 multiply-adds: measured per shape; below, OpenBLAS.
    CHECK(cpu_blas::route_of<float>(128, 512, 784) == choice::measured);
    CHECK(cpu_blas::route_of<float>(1024, 1024, 1024) == choice::measured);
    CHECK(cpu_blas::route_of<float>(64, 64, 16) == choice::measured);
    CHECK(cpu_blas::route_of<float>(32, 32, 32) == choice::openblas);
    CHECK(cpu_blas::route_of<f16>(8, 8, 8) == (backend::onednn_supports<f16>() ? choice::onednn : choice::openblas));
    CHECK(cpu_blas::route_of<double>(8, 8, 8) == choice::openblas);
#if TRAINKIT_HAS_OPENMP
    // Inside a parallel region (a convolution's per-image GEMMs): OpenBLAS, nothing measured.
    int in_region = -1;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      in_region = int(cpu_blas::route_of<float>(128, 512, 784));
    }
    CHECK(in_region == int(choice::openblas));
#endif
  }
  {
    route_guard guard(cpu_gemm_route::onednn);
    CHECK(cpu_blas::route_of<float>(1024, 1024, 1024) == choice::onednn);
    CHECK(cpu_blas::route_of<bf16>(3, 5, 7) == (backend::onednn_supports<bf16>() ? choice::onednn : choice::openblas));
    CHECK(cpu_blas::route_of<float>(3, 5, 0) == choice::openblas);  // K = 0: C = beta C, OpenBLAS's
  }
  INFO("oneDNN half GEMM on this CPU: " << backend::onednn_supports<f16>());
  INFO(backend::cpu_features::describe());
  CHECK(backend::onednn_supports<float>());
  // oneDNN 2.x runs bf16 GEMMs from AVX-512 on (emulated below AVX512-BF16); on an AVX2 CPU the
  // automatic route widens them (the OpenBLAS fallback).
  CHECK(backend::onednn_supports<bf16>() == backend::cpu_features::current().avx512);
#else
  route_guard guard(cpu_gemm_route::onednn);
  CHECK(cpu_blas::route_of<float>(8, 8, 8) == choice::openblas);  // without oneDNN every route is OpenBLAS's
  CHECK(cpu_blas::route_of<bf16>(8, 8, 8) == choice::openblas);
#endif
}

TEST_CASE("fp32 GEMM through OpenBLAS matches a double reference", "[gemm]") {
  for (const auto& g : cases()) check_gemm<float>(backend::cpu_gemm_route::openblas, g);
}

TEST_CASE("16-bit GEMMs widened to fp32 (the fallback) round the fp32 result once", "[gemm]") {
  for (const auto& g : cases()) {
    check_gemm<bf16>(backend::cpu_gemm_route::openblas, g);
    check_gemm<f16>(backend::cpu_gemm_route::openblas, g);
  }
}

#if TRAINKIT_HAS_ONEDNN

TEST_CASE("fp32 GEMM through oneDNN matches OpenBLAS", "[gemm][onednn]") {
  for (const auto& g : cases()) {
    CAPTURE(g.m, g.n, g.k, g.ta, g.tb, g.pad, g.alpha, g.beta);
    auto a = random_values<float>(std::size_t(g.rows_a() * g.lda()), 4);
    auto b = random_values<float>(std::size_t(g.rows_b() * g.ldb()), 5);
    auto c1 = random_values<float>(std::size_t(g.m * g.ldc()), 6);
    auto c2 = c1;
    {
      route_guard guard(backend::cpu_gemm_route::openblas);
      cpu_blas::gemm<float>(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), g.lda(), b.data(), g.ldb(), g.beta,
                            c1.data(), g.ldc());
    }
    REQUIRE(backend::onednn_gemm<float>(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), g.lda(), b.data(), g.ldb(),
                                        g.beta, c2.data(), g.ldc()));
    float max_ref = 0, max_diff = 0;
    bool padding_kept = true;
    for (index_t i = 0; i < g.m; ++i)
      for (index_t j = 0; j < g.ldc(); ++j) {
        const float x = c1[std::size_t(i * g.ldc() + j)], y = c2[std::size_t(i * g.ldc() + j)];
        if (j >= g.n) padding_kept = padding_kept && x == y;
        max_ref = std::max(max_ref, std::fabs(x));
        max_diff = std::max(max_diff, std::fabs(x - y));
      }
    CHECK(padding_kept);
    CHECK(max_diff <= 1e-5f * max_ref);
  }
}

TEST_CASE("fp32 GEMM through oneDNN matches a double reference", "[gemm][onednn]") {
  for (const auto& g : cases()) check_gemm<float>(backend::cpu_gemm_route::onednn, g);
}

TEST_CASE("bfloat16 and half GEMMs through oneDNN round the fp32 result once", "[gemm][onednn]") {
  // half falls back to widening where oneDNN has no f16 kernel (most CPUs): same contract.
  for (const auto& g : cases()) {
    check_gemm<bf16>(backend::cpu_gemm_route::onednn, g);
    check_gemm<f16>(backend::cpu_gemm_route::onednn, g);
  }
}

TEST_CASE("oneDNN bfloat16 GEMM agrees with the widening fallback within 1 ulp", "[gemm][onednn]") {
  TRAINKIT_SKIP_UNLESS(backend::onednn_supports<bf16>(), "oneDNN has no bf16 GEMM on this CPU");
  const gemm_case g{128, 512, 784, false, true, 0, 1.0, 0.0};  // the MLP's first linear layer
  auto a = random_values<bf16>(std::size_t(g.rows_a() * g.lda()), 7);
  auto b = random_values<bf16>(std::size_t(g.rows_b() * g.ldb()), 8);
  std::vector<bf16> c1(std::size_t(g.m * g.n)), c2(c1.size());
  {
    route_guard guard(backend::cpu_gemm_route::openblas);
    cpu_blas::gemm<bf16>(g.ta, g.tb, g.m, g.n, g.k, 1.0, a.data(), g.lda(), b.data(), g.ldb(), 0.0, c1.data(), g.n);
  }
  REQUIRE(backend::onednn_gemm<bf16>(g.ta, g.tb, g.m, g.n, g.k, 1.0, a.data(), g.lda(), b.data(), g.ldb(), 0.0,
                                         c2.data(), g.n));
  int off_by_more = 0, equal = 0;
  for (std::size_t i = 0; i < c1.size(); ++i) {
    const float x = float(c1[i]), y = float(c2[i]);
    equal += x == y;
    off_by_more += std::fabs(x - y) > ulp<bf16>(x) + 1e-5f * std::sqrt(float(g.k));
  }
  INFO(equal << " of " << c1.size() << " equal");
  CHECK(off_by_more == 0);
  CHECK(equal > int(c1.size()) * 9 / 10);
}

TEST_CASE("oneDNN GEMMs run concurrently from OpenMP threads", "[gemm][onednn]") {
  // The convolution runs one GEMM per thread: each thread needs its own stream and scratchpad.
  TRAINKIT_SKIP_UNLESS(backend::onednn_supports<bf16>(), "oneDNN has no bf16 GEMM on this CPU");
  constexpr int jobs = 8;
  const gemm_case g{96, 200, 150, false, false, 0, 1.0, 0.0};
  std::vector<std::vector<bf16>> a(jobs), b(jobs), c(jobs), want(jobs);
  for (int t = 0; t < jobs; ++t) {
    a[std::size_t(t)] = random_values<bf16>(std::size_t(g.m * g.k), 10u + unsigned(t));
    b[std::size_t(t)] = random_values<bf16>(std::size_t(g.k * g.n), 20u + unsigned(t));
    c[std::size_t(t)].assign(std::size_t(g.m * g.n), bf16(0.f));
    want[std::size_t(t)] = c[std::size_t(t)];
    REQUIRE(backend::onednn_gemm<bf16>(false, false, g.m, g.n, g.k, 1.0, a[std::size_t(t)].data(), g.k,
                                           b[std::size_t(t)].data(), g.n, 0.0, want[std::size_t(t)].data(), g.n));
  }
  int failures = 0;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(4) reduction(+ : failures)
#endif
  for (int t = 0; t < jobs; ++t) {
    auto& ct = c[std::size_t(t)];
    failures += !backend::onednn_gemm<bf16>(false, false, g.m, g.n, g.k, 1.0, a[std::size_t(t)].data(), g.k,
                                                b[std::size_t(t)].data(), g.n, 0.0, ct.data(), g.n);
  }
  CHECK(failures == 0);
  for (int t = 0; t < jobs; ++t)
    for (std::size_t i = 0; i < c[std::size_t(t)].size(); ++i)
      if (c[std::size_t(t)][i].bits() != want[std::size_t(t)][i].bits()) {
        FAIL("job " << t << " element " << i << " differs from the same GEMM run alone");
      }
}

TEST_CASE("K = 0 falls back to OpenBLAS: C = beta C", "[gemm][onednn]") {
  route_guard guard(backend::cpu_gemm_route::onednn);
  std::vector<float> a(1), b(1), c{1, 2, 3, 4, 5, 6};
  CHECK_FALSE(backend::onednn_gemm<float>(false, false, 2, 3, 0, 1.0, a.data(), 1, b.data(), 3, 0.5, c.data(), 3));
  cpu_blas::gemm<float>(false, false, 2, 3, 0, 1.0, a.data(), 1, b.data(), 3, 0.5, c.data(), 3);
  CHECK(c == std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3});
}

TEST_CASE("the oneDNN primitive cache stays bounded", "[gemm][onednn]") {
  auto& ctx = backend::detail::onednn_gemm_cache::get();
  std::vector<float> a(1200), b(1), c(1200);
  for (index_t m = 1; m <= 1100; ++m)
    REQUIRE(backend::onednn_gemm<float>(false, false, m, 1, 1, 1.0, a.data(), 1, b.data(), 1, 0.0, c.data(), 1));
  CHECK(ctx.size() <= backend::detail::onednn_gemm_cache::max_entries);
  CHECK(ctx.size() > 0);
}

#else

TEST_CASE("oneDNN GEMM", "[gemm][onednn]") {
  WARN("SKIPPED: the oneDNN GEMM tests: built without oneDNN (TRAINKIT_HAS_ONEDNN unset; Debian: "
       "libdnnl-dev); only the OpenBLAS and widening paths are tested");
}

#endif

namespace cf = trainkit::backend::cpu_features;

TEST_CASE("ISA limits parse oneDNN's names in any case and reject the rest", "[cpu]") {
  CHECK(cf::parse_isa("avx2", "X") == cf::isa::avx2);
  CHECK(cf::parse_isa("AVX512_CORE_BF16", "X") == cf::isa::avx512_core_bf16);
  CHECK(cf::parse_isa("", "X") == cf::isa::all);
  CHECK(cf::parse_isa("All", "X") == cf::isa::all);
  CHECK_THROWS_AS(cf::parse_isa("avx3", "TRAINKIT_MAX_CPU_ISA"), trainkit::value_error);
  CHECK_THROWS_WITH(cf::parse_isa("avx3", "TRAINKIT_MAX_CPU_ISA"),
                    Catch::Contains("TRAINKIT_MAX_CPU_ISA") && Catch::Contains("avx3") && Catch::Contains("avx2"));
}

TEST_CASE("a limit turns off what its tier does not have", "[cpu]") {
  cf::features all;
  all.avx2 = all.fma = all.f16c = all.avx512 = all.avx512_bf16 = all.avx512_fp16 = all.amx_bf16 = true;
  all.avx_vnni = all.avx_ne_convert = true;
  CHECK(all.bf16_arithmetic());
  const auto avx2 = cf::limited(all, cf::isa::avx2);
  CHECK(avx2.avx2);
  CHECK(avx2.fma);
  CHECK(avx2.f16c);
  CHECK_FALSE(avx2.avx512);
  CHECK_FALSE(avx2.bf16_arithmetic());
  const auto core = cf::limited(all, cf::isa::avx512_core);
  CHECK(core.avx512);
  CHECK_FALSE(core.avx512_bf16);
  CHECK(cf::limited(all, cf::isa::avx512_core_bf16).avx512_bf16);
  CHECK_FALSE(cf::limited(all, cf::isa::avx512_core_bf16).amx_bf16);
  CHECK_FALSE(cf::limited(all, cf::isa::sse41).f16c);
  CHECK(cf::limited(all, cf::isa::all).amx_bf16);
}

TEST_CASE("the limit in force reaches trainkit's checks and oneDNN", "[cpu]") {
  const std::string line = cf::describe();
  std::printf("%s\n", line.c_str());
  CHECK(line.find(cf::detected().model) != std::string::npos);
  const auto& cur = cf::current();
  const auto& det = cf::detected();
  // current() never claims what the CPU lacks
  CHECK((!cur.avx512 || det.avx512));
  CHECK((!cur.avx512_bf16 || det.avx512_bf16));
  CHECK((!cur.f16c || det.f16c));
  CHECK(trainkit::backend::cpu_convert::has_f16c() == cur.f16c);
  const char* limit = std::getenv("TRAINKIT_MAX_CPU_ISA");
  if (limit != nullptr && std::string(limit) == "avx2") {
    CHECK(cf::max_isa() == cf::isa::avx2);
    CHECK_FALSE(cur.avx512);
    CHECK_FALSE(cur.bf16_arithmetic());
    CHECK(line.find("TRAINKIT_MAX_CPU_ISA=avx2") != std::string::npos);
    // oneDNN 2.x has no bf16 kernel below AVX-512: the limit was handed over
    CHECK_FALSE(trainkit::backend::onednn_supports<trainkit::bfloat16>());
  }
#if TRAINKIT_HAS_ONEDNN
  // oneDNN runs bf16 from AVX-512 on (emulated below AVX512-BF16), on whatever tier is in force
  CHECK(trainkit::backend::onednn_supports<trainkit::bfloat16>() == cur.avx512);
#endif
}

TEST_CASE("bf16 products run natively only on bf16 arithmetic, oneDNN and a route that takes it", "[cpu]") {
  // amp's bf16 ops hold their values in bf16 where this is true, in fp32 on the fp32 kernels elsewhere.
  const bool native = cpu_blas::bf16_native();
  INFO(cf::describe());
#if TRAINKIT_HAS_ONEDNN
  CHECK(native == (cf::current().bf16_arithmetic() && backend::onednn_supports<bf16>()));
  {
    route_guard g(backend::cpu_gemm_route::openblas);
    CHECK_FALSE(cpu_blas::bf16_native());
  }
  CHECK(cpu_blas::bf16_native() == native);
#else
  CHECK_FALSE(native);
#endif
  if (!cf::current().bf16_arithmetic()) CHECK_FALSE(native);
}

TEST_CASE("a CPU without bf16 arithmetic says so once", "[cpu]") {
  // amp::autocast's bf16 ops call this at each GEMM and convolution: one line per process.
  if (cf::current().bf16_arithmetic()) {
    CHECK_FALSE(cf::note_bf16_without_arithmetic());
    return;
  }
  CHECK(cf::note_bf16_without_arithmetic());        // the first: printed
  CHECK_FALSE(cf::note_bf16_without_arithmetic());  // never again
}
