// tests/backend/test_vector_math.cpp - the host kernels' vector exp (backend/cpu/vector_math.hpp):
// exp_avx2 within 2 ulp of std::exp, exactly 0 below the range and for -inf, NaN kept; exp_avx512's
// 16 lanes give exp_avx2's bits lane for lane (so the attention rows' values do not depend on the
// vector width the CPU has, only their sums' order does).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "trainkit/backend/cpu/vector_math.hpp"

#if TRAINKIT_CPU_VECTOR_MATH
namespace vm = trainkit::backend::detail;

namespace {
/// The inputs: a sweep of [-100, 100] (past both ends of the range), the edges, -inf, +inf, NaN.
std::vector<float> exp_inputs() {
  std::vector<float> x;
  for (int i = -200000; i <= 200000; ++i) x.push_back(float(i) * 5e-4f);
  for (float e : {-87.33654f, -87.3365f, -87.34f, 88.37626f, 88.3762f, 0.f, -0.f, 1e-30f, -1e-30f})
    x.push_back(e);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  while (x.size() % 16 != 0) x.push_back(1.f);
  return x;
}

[[gnu::target("avx2,fma")]] void exp8(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, vm::exp_avx2(_mm256_loadu_ps(x + i)));
}
[[gnu::target("avx512f,avx512dq")]] void exp16(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) _mm512_storeu_ps(y + i, vm::exp_avx512(_mm512_loadu_ps(x + i)));
}
}  // namespace

TEST_CASE("vector exp: within 2 ulp of std::exp, 0 below the range, NaN kept; AVX-512 lanes are AVX2's bits",
          "[cpu][vector_math]") {
  if (!vm::has_avx2_fma()) {
    std::printf("SKIPPED: vector exp: this CPU (or TRAINKIT_MAX_CPU_ISA) has no AVX2 + FMA\n");
    return;
  }
  const std::vector<float> x = exp_inputs();
  std::vector<float> y8(x.size());
  exp8(x.data(), y8.data(), x.size());
  // (Failures counted, the first one named: a CAPTURE and CHECK per input made this test 13 s
  // under ASan.)
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    bool ok = true;
    if (std::isnan(x[i])) {
      ok = std::isnan(y8[i]);
    } else if (x[i] < -87.33654f) {
      ok = y8[i] == 0.f;
    } else if (std::isinf(want) || want > std::numeric_limits<float>::max() / 2) {
      ok = y8[i] >= std::numeric_limits<float>::max() / 4;  // the top of the range, clamped
    } else if (want >= std::numeric_limits<float>::min()) {
      ok = std::abs(y8[i] - want) <= 2 * std::abs(std::nextafter(want, 0.f) - want) + 1e-45f;
    }
    if (!ok && bad++ == 0) first = i;
  }
  INFO("first failure: x = " << x[first] << ", exp_avx2 " << y8[first] << ", std::exp " << std::exp(x[first]));
  REQUIRE(bad == 0);
  if (!vm::has_avx512()) {
    std::printf("SKIPPED: exp_avx512 against exp_avx2: this CPU (or TRAINKIT_MAX_CPU_ISA) has no AVX-512\n");
    return;
  }
  std::vector<float> y16(x.size());
  exp16(x.data(), y16.data(), x.size());
  CHECK(std::memcmp(y8.data(), y16.data(), x.size() * sizeof(float)) == 0);
}
#endif
