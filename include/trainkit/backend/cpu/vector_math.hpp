// trainkit/backend/cpu/vector_math.hpp - 8 lanes of exp and erf in AVX2 + FMA (16 lanes of exp in
// AVX-512) for the host kernels that spend their time in them (the attention tiles' softmax, GELU),
// chosen at run time by cpu_features; each caller keeps a scalar path for other CPUs.
//   exp_avx2   Cephes-style: range reduction by ln 2, degree-6 polynomial, 2^n into the exponent;
//              within 2 ulp of std::exp, exactly 0 below ln(FLT_MIN) and for -inf, NaN kept.
//   exp_avx512 the same operations on 16 lanes: each lane's result is exp_avx2's, bit for bit.
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

/// Whether the AVX-512 lanes below may run (AVX-512 F, BW, VL, DQ; not under an ISA limit below it).
inline bool has_avx512() noexcept { return cpu_features::current().avx512; }

// The all-lanes zero-masked forms (k = all) are the plain instructions: GCC 12's plain AVX-512
// intrinsics pass an undefined vector that -W(maybe-)uninitialized reports once inlined (its bug
// 105593), and a "#pragma GCC diagnostic" does not survive a precompiled header.
[[gnu::target("avx512f,avx512dq")]] inline __m512 exp_avx512(__m512 x) {
  constexpr __mmask16 all = 0xffff;
  const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.37626f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);  // exp underflows (and -inf): exactly 0
  x = _mm512_maskz_min_ps(all, hi, _mm512_maskz_max_ps(all, lo, x));  // NaN kept, as exp_avx2
  const __m512 n = _mm512_maskz_roundscale_ps(
      all, _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_maskz_slli_epi32(all, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(all, n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(__mmask16(~tiny), y, _mm512_castsi512_ps(e));
}

/// erf(x) = sign(x) (1 - t (p1 + t (p2 + t (p3 + t (p4 + t p5)))) exp(-x^2)), t = 1 / (1 + p |x|);
/// exp_minus_x2 gets the exp(-x^2) it took (GELU's backward wants it: the normal density).
[[gnu::target("avx2,fma")]] inline __m256 erf_avx2(__m256 x, __m256& exp_minus_x2) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 s = _mm256_and_ps(x, sign), a = _mm256_andnot_ps(sign, x);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
  __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(1.061405429f), t, _mm256_set1_ps(-1.453152027f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(1.421413741f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-0.284496736f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(0.254829592f));
  const __m256 e = exp_avx2(_mm256_xor_ps(_mm256_mul_ps(a, a), sign));  // exp(-x^2)
  const __m256 y = _mm256_fnmadd_ps(_mm256_mul_ps(t, e), r, one);     // 1 - r t exp(-x^2)
  exp_minus_x2 = e;
  return _mm256_or_ps(y, s);
}
[[gnu::target("avx2,fma")]] inline __m256 erf_avx2(__m256 x) {
  __m256 e;
  return erf_avx2(x, e);
}

[[gnu::target("avx2,fma")]] inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace trainkit::backend::detail
