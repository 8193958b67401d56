// trainkit/backend/cpu/gelu.hpp - GELU forward and backward on the host: 8 lanes at a time with
// erf_avx2 / exp_avx2 (backend/cpu/vector_math.hpp) on CPUs with AVX2 + FMA, the functors' std::erf
// elsewhere and for the tail; chunks of the buffer over OpenMP threads when it is big. GELU of
// bfloat16 values (autocast) rounds its results, and an input whose rounding was deferred, to
// bfloat16 values in the same pass (forward_bf16, backward_bf16).
#pragma once

#include <algorithm>

#include "trainkit/backend/cpu/convert16.hpp"  // bf16_round_high_avx2
#include "trainkit/core/bfloat16.hpp"

#include "trainkit/backend/cpu/parallel_for.hpp"
#include "trainkit/backend/cpu/vector_math.hpp"
#include "trainkit/backend/gelu.hpp"
#include "trainkit/core/functors.hpp"

namespace trainkit::backend {

namespace detail {
#if TRAINKIT_CPU_VECTOR_MATH && TRAINKIT_CPU_SSE2_BF16 && TRAINKIT_CPU_F16C_DISPATCH
/// v rounded to bfloat16 values (nearest even, NaN kept quiet) where Round, else v.
template <bool Round>
[[gnu::target("avx2,fma")]] inline __m256 gelu_round_avx2(__m256 v) {
  if constexpr (Round)
    return cpu_convert::bf16_round_values_avx2(v);
  else
    return v;
}

/// y = gelu(x), 8 at a time; RoundX: of x rounded to bfloat16 values; RoundY: y rounded so.
template <bool RoundX = false, bool RoundY = false>
[[gnu::target("avx2,fma")]] inline index_t gelu_forward_avx2(index_t n, const float* x, float* y) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), rsqrt2 = _mm256_set1_ps(0.70710678118654752f);
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = gelu_round_avx2<RoundX>(_mm256_loadu_ps(x + i));
    const __m256 cdf = _mm256_mul_ps(half, _mm256_add_ps(one, erf_avx2(_mm256_mul_ps(v, rsqrt2))));
    _mm256_storeu_ps(y + i, gelu_round_avx2<RoundY>(_mm256_mul_ps(v, cdf)));
  }
  return i;
}
/// dx = g gelu'(x), 8 at a time; RoundX: at x rounded to bfloat16 values; RoundDx: dx rounded so.
template <bool RoundX = false, bool RoundDx = false>
[[gnu::target("avx2,fma")]] inline index_t gelu_backward_avx2(index_t n, const float* g, const float* x, float* dx) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), rsqrt2 = _mm256_set1_ps(0.70710678118654752f);
  const __m256 rsqrt2pi = _mm256_set1_ps(0.39894228040143267794f);
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = gelu_round_avx2<RoundX>(_mm256_loadu_ps(x + i));
    __m256 e;  // exp(-(x / sqrt 2)^2) = exp(-x^2 / 2): the erf's own exp is the density's
    const __m256 cdf = _mm256_mul_ps(half, _mm256_add_ps(one, erf_avx2(_mm256_mul_ps(v, rsqrt2), e)));
    const __m256 pdf = _mm256_mul_ps(e, rsqrt2pi);
    _mm256_storeu_ps(dx + i, gelu_round_avx2<RoundDx>(_mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_fmadd_ps(v, pdf, cdf))));
  }
  return i;
}
#endif
}  // namespace detail

template <>
struct gelu<cpu> {
  static constexpr index_t chunk = 16384;  // elements per parallel work item

  static void forward(index_t n, const float* x, float* y) { forward_as<false, false>(n, x, y); }
  static void backward(index_t n, const float* g, const float* x, float* dx) { backward_as<false, false>(n, g, x, dx); }

  /// GELU of bfloat16 values (autocast): y = round(gelu(x')) and dx = round(g gelu'(x')), where
  /// x' = x, or round(x) when round_x (an input whose rounding was deferred: rounded here, in the
  /// same pass, instead of in a pass of its own) - round() to bfloat16 values, nearest even.
  static void forward_bf16(index_t n, const float* x, float* y, bool round_x) {
    round_x ? forward_as<true, true>(n, x, y) : forward_as<false, true>(n, x, y);
  }
  static void backward_bf16(index_t n, const float* g, const float* x, float* dx, bool round_x) {
    round_x ? backward_as<true, true>(n, g, x, dx) : backward_as<false, true>(n, g, x, dx);
  }

 private:
  template <bool Round>
  static float round_if(float v) {
    if constexpr (Round)
      return functors::round_to<bfloat16>{}(v);
    else
      return v;
  }

  template <bool RoundX, bool RoundY>
  static void forward_as(index_t n, const float* x, float* y) {
    each_chunk(n, [&](index_t b, index_t e) {
      index_t i = b;
#if TRAINKIT_CPU_VECTOR_MATH && TRAINKIT_CPU_SSE2_BF16 && TRAINKIT_CPU_F16C_DISPATCH
      if (detail::has_avx2_fma()) i += detail::gelu_forward_avx2<RoundX, RoundY>(e - b, x + b, y + b);
#endif
      for (; i < e; ++i) y[i] = round_if<RoundY>(functors::gelu{}(round_if<RoundX>(x[i])));
    });
  }
  template <bool RoundX, bool RoundDx>
  static void backward_as(index_t n, const float* g, const float* x, float* dx) {
    each_chunk(n, [&](index_t b, index_t e) {
      index_t i = b;
#if TRAINKIT_CPU_VECTOR_MATH && TRAINKIT_CPU_SSE2_BF16 && TRAINKIT_CPU_F16C_DISPATCH
      if (detail::has_avx2_fma()) i += detail::gelu_backward_avx2<RoundX, RoundDx>(e - b, g + b, x + b, dx + b);
#endif
      for (; i < e; ++i) dx[i] = round_if<RoundDx>(functors::gelu_backward{}(g[i], round_if<RoundX>(x[i])));
    });
  }

  template <class F>
  static void each_chunk(index_t n, F&& f) {
    const index_t chunks = (n + chunk - 1) / chunk;
    detail::parallel_for(chunks, chunk, [&](index_t c) { f(c * chunk, std::min(n, (c + 1) * chunk)); });
  }
};

}  // namespace trainkit::backend
