// trainkit/backend/cpu/gelu.hpp - GELU forward and backward on the host: 8 lanes at a time with
// erf_avx2 / exp_avx2 (backend/cpu/vector_math.hpp) on CPUs with AVX2 + FMA, the functors' std::erf
// elsewhere and for the tail; chunks of the buffer over OpenMP threads when it is big.
#pragma once

#include <algorithm>

#include "trainkit/backend/cpu/parallel_for.hpp"
#include "trainkit/backend/cpu/vector_math.hpp"
#include "trainkit/backend/gelu.hpp"
#include "trainkit/core/functors.hpp"

namespace trainkit::backend {

namespace detail {
#if TRAINKIT_CPU_VECTOR_MATH
[[gnu::target("avx2,fma")]] inline index_t gelu_forward_avx2(index_t n, const float* x, float* y) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), rsqrt2 = _mm256_set1_ps(0.70710678118654752f);
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 cdf = _mm256_mul_ps(half, _mm256_add_ps(one, erf_avx2(_mm256_mul_ps(v, rsqrt2))));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, cdf));
  }
  return i;
}
[[gnu::target("avx2,fma")]] inline index_t gelu_backward_avx2(index_t n, const float* g, const float* x, float* dx) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), rsqrt2 = _mm256_set1_ps(0.70710678118654752f);
  const __m256 mhalf = _mm256_set1_ps(-0.5f), rsqrt2pi = _mm256_set1_ps(0.39894228040143267794f);
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 cdf = _mm256_mul_ps(half, _mm256_add_ps(one, erf_avx2(_mm256_mul_ps(v, rsqrt2))));
    const __m256 pdf = _mm256_mul_ps(exp_avx2(_mm256_mul_ps(mhalf, _mm256_mul_ps(v, v))), rsqrt2pi);
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_fmadd_ps(v, pdf, cdf)));
  }
  return i;
}
#endif
}  // namespace detail

template <>
struct gelu<cpu> {
  static constexpr index_t chunk = 16384;  // elements per parallel work item

  static void forward(index_t n, const float* x, float* y) {
    each_chunk(n, [&](index_t b, index_t e) {
      index_t i = b;
#if TRAINKIT_CPU_VECTOR_MATH
      if (detail::has_avx2_fma()) i += detail::gelu_forward_avx2(e - b, x + b, y + b);
#endif
      for (; i < e; ++i) y[i] = functors::gelu{}(x[i]);
    });
  }
  static void backward(index_t n, const float* g, const float* x, float* dx) {
    each_chunk(n, [&](index_t b, index_t e) {
      index_t i = b;
#if TRAINKIT_CPU_VECTOR_MATH
      if (detail::has_avx2_fma()) i += detail::gelu_backward_avx2(e - b, g + b, x + b, dx + b);
#endif
      for (; i < e; ++i) dx[i] = functors::gelu_backward{}(g[i], x[i]);
    });
  }

 private:
  template <class F>
  static void each_chunk(index_t n, F&& f) {
    const index_t chunks = (n + chunk - 1) / chunk;
    detail::parallel_for(chunks, chunk, [&](index_t c) { f(c * chunk, std::min(n, (c + 1) * chunk)); });
  }
};

}  // namespace trainkit::backend
