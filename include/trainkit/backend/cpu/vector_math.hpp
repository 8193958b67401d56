// trainkit/backend/cpu/vector_math.hpp - 8 lanes of exp and erf in AVX2 + FMA for the host kernels
// that spend their time in them (the attention tiles' softmax, GELU), chosen at run time by
// cpu_features; each caller keeps a scalar path for other CPUs.
//   exp_avx2   Cephes-style: range reduction by ln 2, degree-6 polynomial, 2^n into the exponent;
//              within 2 ulp of std::exp, exactly 0 below ln(FLT_MIN) and for -inf, NaN kept.
//   erf_avx2   Abramowitz & Stegun 7.1.26 with exp_avx2: |error| < 1.5e-7, the approximation
//              PyTorch's vectorised CPU erf (and so its GELU) uses.
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define TRAINKIT_CPU_VECTOR_MATH 1
#include <immintrin.h>

#include "trainkit/backend/cpu/cpu_features.hpp"
#else
#define TRAINKIT_CPU_VECTOR_MATH 0
#endif

namespace trainkit::backend::detail {

#if TRAINKIT_CPU_VECTOR_MATH
/// Whether the AVX2 + FMA lanes below may run on this CPU.
inline bool has_avx2_fma() noexcept { return cpu_features::current().avx2 && cpu_features::current().fma; }

[[gnu::target("avx2,fma")]] inline __m256 exp_avx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.37626f);
  const __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);  // exp underflows (and -inf): exactly 0
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));          // NaN kept: max/min return the second operand
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/// erf(x) = sign(x) (1 - t (p1 + t (p2 + t (p3 + t (p4 + t p5)))) exp(-x^2)), t = 1 / (1 + p |x|).
[[gnu::target("avx2,fma")]] inline __m256 erf_avx2(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 s = _mm256_and_ps(x, sign), a = _mm256_andnot_ps(sign, x);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
  __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(1.061405429f), t, _mm256_set1_ps(-1.453152027f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(1.421413741f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-0.284496736f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(0.254829592f));
  const __m256 e = exp_avx2(_mm256_xor_ps(_mm256_mul_ps(a, a), sign));  // exp(-x^2)
  const __m256 y = _mm256_fnmadd_ps(_mm256_mul_ps(t, e), r, one);     // 1 - r t exp(-x^2)
  return _mm256_or_ps(y, s);
}

[[gnu::target("avx2,fma")]] inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace trainkit::backend::detail
