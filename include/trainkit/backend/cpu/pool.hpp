// trainkit/backend/cpu/pool.hpp - max and average pooling on the host, parallel over planes.
// With oneDNN and the onednn route (TRAINKIT_CPU_CONV) fp32/bf16 pooling runs on oneDNN's
// primitives (backend/cpu/onednn_pool.hpp); max pooling's backward is the scatter below either way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "trainkit/backend/cpu/onednn_pool.hpp"  // onednn_*_pool2d*, cpu_conv_route
#include "trainkit/backend/pool.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"

#if defined(__SSE2__) && !defined(__CUDACC__)
#define TRAINKIT_CPU_SSE2_POOL 1
#include <emmintrin.h>
#else
#define TRAINKIT_CPU_SSE2_POOL 0
#endif

namespace trainkit::backend {

template <>
struct pool<cpu> {
  template <class T>
  static void max_forward(const pool2d_geometry& g, index_t planes, const T* x, T* y, std::int64_t* argmax) {
    const bool window_2x2 = is_window_2x2(g);
#if TRAINKIT_HAS_ONEDNN
    // Not for bfloat16 2x2 windows under the automatic route: the vector loop below is one pass;
    // oneDNN needs a finiteness pass before and an argmax pass after its own.
    if (detail::use_onednn_cnn<T>() &&
        !(std::is_same_v<T, bfloat16> && window_2x2 && get_cpu_conv_route() == cpu_conv_route::automatic) &&
        onednn_max_pool2d_forward(g, planes, x, y, argmax))
      return;
#endif
    using C = compute_t<T>;
    // NaN wins and sticks (a later value is never > NaN), as in PyTorch. Written without branches
    // (selects): the comparisons depend on the data, and mispredicted branches made this loop a
    // fifth of a CNN step.
    const auto better = [](C v, C best) { return (v > best) | ((v != v) & (best == best)); };
    if (window_2x2) {
      // The common 2x2 window, stride 2: the four values of each window in scan order.
      for_planes(g, planes, [&](index_t p) {
        const T* xp = x + p * g.height * g.width;
        T* yp = y + p * g.out_h * g.out_w;
        std::int64_t* ip = argmax + p * g.out_h * g.out_w;
        for (index_t oh = 0; oh < g.out_h; ++oh) {
          const T* r0 = xp + 2 * oh * g.width;
          const T* r1 = r0 + g.width;
          const index_t base = 2 * oh * g.width;
          index_t scalar_from = 0;  // the windows the vector steps leave
#if TRAINKIT_CPU_SSE2_POOL
          // Four windows per step with SSE2 compares and selects: the compiler turned the scalar
          // selects below back into branches, which mispredict on activations (half of them
          // zeros after a ReLU).
          // The indices are formed in 32-bit lanes and widened (steps_of_4_windows).
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
            scalar_from = steps_of_4_windows(g, [&](index_t ow) {
              const index_t w = 2 * ow;
              __m128 r0a, r0b, r1a, r1b;
              if constexpr (std::is_same_v<T, float>) {
                r0a = _mm_loadu_ps(r0 + w), r0b = _mm_loadu_ps(r0 + w + 4);
                r1a = _mm_loadu_ps(r1 + w), r1b = _mm_loadu_ps(r1 + w + 4);
              } else {  // 8 bfloat16 per row, widened exactly (each is the top half of its float)
                const __m128i z = _mm_setzero_si128();
                const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + w));
                const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + w));
                r0a = _mm_castsi128_ps(_mm_unpacklo_epi16(z, v0)), r0b = _mm_castsi128_ps(_mm_unpackhi_epi16(z, v0));
                r1a = _mm_castsi128_ps(_mm_unpacklo_epi16(z, v1)), r1b = _mm_castsi128_ps(_mm_unpackhi_epi16(z, v1));
              }
              __m128 best = _mm_shuffle_ps(r0a, r0b, _MM_SHUFFLE(2, 0, 2, 0));
              __m128i code = _mm_setzero_si128();
              const auto take_if_better = [&](__m128 v, int k) {
                const __m128 take = _mm_or_ps(_mm_cmpgt_ps(v, best),
                                              _mm_andnot_ps(_mm_cmpunord_ps(best, best), _mm_cmpunord_ps(v, v)));
                best = _mm_or_ps(_mm_and_ps(take, v), _mm_andnot_ps(take, best));
                const __m128i t = _mm_castps_si128(take);
                code = _mm_or_si128(_mm_and_si128(t, _mm_set1_epi32(k)), _mm_andnot_si128(t, code));
              };
              take_if_better(_mm_shuffle_ps(r0a, r0b, _MM_SHUFFLE(3, 1, 3, 1)), 1);
              take_if_better(_mm_shuffle_ps(r1a, r1b, _MM_SHUFFLE(2, 0, 2, 0)), 2);
              take_if_better(_mm_shuffle_ps(r1a, r1b, _MM_SHUFFLE(3, 1, 3, 1)), 3);
              if constexpr (std::is_same_v<T, float>) {
                _mm_storeu_ps(yp + oh * g.out_w + ow, best);
              } else {  // the winners are bfloat16 values: their top halves (sign-extended for the pack)
                const __m128i top = _mm_srai_epi32(_mm_castps_si128(best), 16);
                _mm_storel_epi64(reinterpret_cast<__m128i*>(yp + oh * g.out_w + ow), _mm_packs_epi32(top, top));
              }
              // index = base + w + 2j + (code & 1) + (code > 1 ? width : 0), widened to int64
              const __m128i one = _mm_set1_epi32(1);
              __m128i at = _mm_add_epi32(_mm_set_epi32(6, 4, 2, 0), _mm_set1_epi32(std::int32_t(base + w)));
              at = _mm_add_epi32(at, _mm_and_si128(code, one));
              at = _mm_add_epi32(at, _mm_and_si128(_mm_cmpgt_epi32(code, one), _mm_set1_epi32(std::int32_t(g.width))));
              const __m128i z = _mm_setzero_si128();
              std::int64_t* out = ip + oh * g.out_w + ow;
              _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi32(at, z));
              _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2), _mm_unpackhi_epi32(at, z));
            });
          }
#endif
          for (index_t ow = scalar_from; ow < g.out_w; ++ow) {
            const index_t w = 2 * ow;
            C best = C(r0[w]);
            index_t at = base + w;
            const C b = C(r0[w + 1]), c = C(r1[w]), d = C(r1[w + 1]);
            const bool tb = better(b, best);
            best = tb ? b : best;
            at = tb ? base + w + 1 : at;
            const bool tc = better(c, best);
            best = tc ? c : best;
            at = tc ? base + g.width + w : at;
            const bool td = better(d, best);
            best = td ? d : best;
            at = td ? base + g.width + w + 1 : at;
            yp[oh * g.out_w + ow] = T(best);
            ip[oh * g.out_w + ow] = at;
          }
        }
      });
      return;
    }
    for_planes(g, planes, [&](index_t p) {
      const T* xp = x + p * g.height * g.width;
      T* yp = y + p * g.out_h * g.out_w;
      std::int64_t* ip = argmax + p * g.out_h * g.out_w;
      for (index_t oh = 0; oh < g.out_h; ++oh) {
        const index_t h0 = oh * g.stride_h - g.pad_h;
        const index_t hs = std::max<index_t>(h0, 0), he = std::min(h0 + g.kernel_h, g.height);
        for (index_t ow = 0; ow < g.out_w; ++ow) {
          const index_t w0 = ow * g.stride_w - g.pad_w;
          const index_t ws = std::max<index_t>(w0, 0), we = std::min(w0 + g.kernel_w, g.width);
          C best = -std::numeric_limits<C>::infinity();
          index_t at = hs * g.width + ws;
          for (index_t h = hs; h < he; ++h) {
            const T* row = xp + h * g.width;
            for (index_t w = ws; w < we; ++w) {
              const C v = C(row[w]);
              const bool take = better(v, best);
              best = take ? v : best;
              at = take ? h * g.width + w : at;
            }
          }
          yp[oh * g.out_w + ow] = T(best);
          ip[oh * g.out_w + ow] = at;
        }
      }
    });
  }

  template <class T>
  static void max_backward(const pool2d_geometry& g, index_t planes, const T* gy, const std::int64_t* argmax, T* gx) {
    using C = compute_t<T>;
    if (is_window_2x2(g)) {
      // 2x2 windows, stride 2: each input belongs to one window, so the gradient is written once,
      // row pair by row pair, with no zero fill and no scattered read-modify-write (a bf16 one
      // rounds each sum). 0 + g, as the scatter computes it: -0 becomes +0, as in PyTorch.
      const T zero = T(C(0));
      for_planes(g, planes, [&](index_t p) {
        T* gp = gx + p * g.height * g.width;
        const T* gyp = gy + p * g.out_h * g.out_w;
        const std::int64_t* ip = argmax + p * g.out_h * g.out_w;
        for (index_t oh = 0; oh < g.out_h; ++oh) {
          T* r0 = gp + 2 * oh * g.width;
          T* r1 = r0 + g.width;
          const std::int64_t base = 2 * oh * g.width;
          index_t scalar_from = 0;
#if TRAINKIT_CPU_SSE2_POOL
          // Four windows per step, as in the forward (the scalar selects below compile to branches
          // that mispredict): each window's offset of its argmax (0, 1, width, width + 1) becomes
          // four lane masks, and the two rows are written interleaved.
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
            const __m128i off1 = _mm_set1_epi32(1), offw = _mm_set1_epi32(std::int32_t(g.width));
            const __m128i offw1 = _mm_set1_epi32(std::int32_t(g.width + 1));
            scalar_from = steps_of_4_windows(g, [&](index_t ow) {
              const std::int64_t* ix = ip + oh * g.out_w + ow;
              const std::int64_t b = base + 2 * ow;
              const __m128i d01 = _mm_sub_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ix)),
                                                _mm_set_epi64x(b + 2, b));
              const __m128i d23 = _mm_sub_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ix + 2)),
                                                _mm_set_epi64x(b + 6, b + 4));
              const __m128i d = _mm_castps_si128(
                  _mm_shuffle_ps(_mm_castsi128_ps(d01), _mm_castsi128_ps(d23), _MM_SHUFFLE(2, 0, 2, 0)));
              const __m128i m00 = _mm_cmpeq_epi32(d, _mm_setzero_si128()), m01 = _mm_cmpeq_epi32(d, off1);
              const __m128i m10 = _mm_cmpeq_epi32(d, offw), m11 = _mm_cmpeq_epi32(d, offw1);
              if constexpr (std::is_same_v<T, float>) {
                const __m128 v = _mm_add_ps(_mm_loadu_ps(gyp + oh * g.out_w + ow), _mm_setzero_ps());
                const auto row = [&](T* r, __m128i left, __m128i right) {
                  const __m128 a = _mm_and_ps(_mm_castsi128_ps(left), v), c = _mm_and_ps(_mm_castsi128_ps(right), v);
                  _mm_storeu_ps(r + 2 * ow, _mm_unpacklo_ps(a, c));
                  _mm_storeu_ps(r + 2 * ow + 4, _mm_unpackhi_ps(a, c));
                };
                row(r0, m00, m01);
                row(r1, m10, m11);
              } else {  // plus_zero on the bits, then each window's value in both halves of its lane
                __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gyp + oh * g.out_w + ow));
                const __m128i mag = _mm_and_si128(v, _mm_set1_epi16(0x7fff));
                v = _mm_andnot_si128(_mm_cmpeq_epi16(mag, _mm_setzero_si128()), v);
                v = _mm_or_si128(v, _mm_and_si128(_mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7f80)), _mm_set1_epi16(0x40)));
                const __m128i both = _mm_unpacklo_epi16(v, v);
                const __m128i lo = _mm_set1_epi32(0x0000ffff), hi = _mm_set1_epi32(std::int32_t(0xffff0000u));
                const auto row = [&](T* r, __m128i left, __m128i right) {
                  const __m128i keep = _mm_or_si128(_mm_and_si128(left, lo), _mm_and_si128(right, hi));
                  _mm_storeu_si128(reinterpret_cast<__m128i*>(r + 2 * ow), _mm_and_si128(both, keep));
                };
                row(r0, m00, m01);
                row(r1, m10, m11);
              }
            });
          }
#endif
          for (index_t ow = scalar_from; ow < g.out_w; ++ow) {
            const std::int64_t k = ip[oh * g.out_w + ow] - (base + 2 * ow);  // 0, 1, width, width + 1
            const T v = plus_zero(gyp[oh * g.out_w + ow]);
            r0[2 * ow] = k == 0 ? v : zero;
            r0[2 * ow + 1] = k == 1 ? v : zero;
            r1[2 * ow] = k == g.width ? v : zero;
            r1[2 * ow + 1] = k == g.width + 1 ? v : zero;
          }
          if (g.width > 2 * g.out_w) r0[g.width - 1] = r1[g.width - 1] = zero;  // an odd width's last column
        }
        if (g.height > 2 * g.out_h) std::fill(gp + (g.height - 1) * g.width, gp + g.height * g.width, zero);
      });
      return;
    }
    for_planes(g, planes, [&](index_t p) {
      T* gp = gx + p * g.height * g.width;
      std::fill(gp, gp + g.height * g.width, T(C(0)));
      const T* gyp = gy + p * g.out_h * g.out_w;
      const std::int64_t* ip = argmax + p * g.out_h * g.out_w;
      for (index_t k = 0; k < g.out_h * g.out_w; ++k) gp[ip[k]] = T(C(gp[ip[k]]) + C(gyp[k]));
    });
  }

  template <class T>
  static void avg_forward(const pool2d_geometry& g, index_t planes, const T* x, T* y) {
#if TRAINKIT_HAS_ONEDNN
    if (detail::use_onednn_cnn<T>() && onednn_avg_pool2d(false, g, planes, x, y)) return;
#endif
    using C = compute_t<T>;
    using A = accumulate_t<T>;
    const A inv = A(1) / A(g.kernel_h * g.kernel_w);
    for_planes(g, planes, [&](index_t p) {
      const T* xp = x + p * g.height * g.width;
      T* yp = y + p * g.out_h * g.out_w;
      for (index_t oh = 0; oh < g.out_h; ++oh) {
        const index_t h0 = oh * g.stride_h - g.pad_h;
        const index_t hs = std::max<index_t>(h0, 0), he = std::min(h0 + g.kernel_h, g.height);
        for (index_t ow = 0; ow < g.out_w; ++ow) {
          const index_t w0 = ow * g.stride_w - g.pad_w;
          const index_t ws = std::max<index_t>(w0, 0), we = std::min(w0 + g.kernel_w, g.width);
          A s = 0;
          for (index_t h = hs; h < he; ++h)
            for (index_t w = ws; w < we; ++w) s += A(C(xp[h * g.width + w]));
          yp[oh * g.out_w + ow] = T(s * inv);
        }
      }
    });
  }

  template <class T>
  static void avg_backward(const pool2d_geometry& g, index_t planes, const T* gy, T* gx) {
#if TRAINKIT_HAS_ONEDNN
    if (detail::use_onednn_cnn<T>() && onednn_avg_pool2d(true, g, planes, gy, gx)) return;
#endif
    using C = compute_t<T>;
    const C inv = C(1) / C(g.kernel_h * g.kernel_w);
    for_planes(g, planes, [&](index_t p) {
      T* gp = gx + p * g.height * g.width;
      std::fill(gp, gp + g.height * g.width, T(0));
      const T* gyp = gy + p * g.out_h * g.out_w;
      for (index_t oh = 0; oh < g.out_h; ++oh) {
        const index_t h0 = oh * g.stride_h - g.pad_h;
        const index_t hs = std::max<index_t>(h0, 0), he = std::min(h0 + g.kernel_h, g.height);
        for (index_t ow = 0; ow < g.out_w; ++ow) {
          const index_t w0 = ow * g.stride_w - g.pad_w;
          const index_t ws = std::max<index_t>(w0, 0), we = std::min(w0 + g.kernel_w, g.width);
          const C v = C(gyp[oh * g.out_w + ow]) * inv;
          for (index_t h = hs; h < he; ++h)
            for (index_t w = ws; w < we; ++w) gp[h * g.width + w] = T(C(gp[h * g.width + w]) + v);
        }
      }
    });
  }

 private:
  /// The 2x2 window with stride 2 and no padding, which has its own vector loops.
  static bool is_window_2x2(const pool2d_geometry& g) {
    return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 && g.pad_w == 0;
  }

  /// Runs step(ow) over a row of 2x2 windows four at a time: ow = 0, 4, 8, ..., and where out_w is
  /// not a multiple of 4 a last step at out_w - 4 that overlaps the one before (the same windows,
  /// written again with the same values). Returns the first window left to the scalar loop:
  /// out_w, or 0 when the row is shorter than 4 windows or the plane's indices do not fit the
  /// 32-bit lanes the steps form them in.
  template <class F>
  static index_t steps_of_4_windows(const pool2d_geometry& g, F&& step) {
    if (g.out_w < 4 || g.height * g.width > std::numeric_limits<std::int32_t>::max()) return 0;
    for (index_t ow = 0;; ow += 4) {
      if (ow + 4 > g.out_w) ow = g.out_w - 4;
      step(ow);
      if (ow + 4 == g.out_w) return g.out_w;
    }
  }

  /// T(0 + v) with no arithmetic for bfloat16: -0 becomes +0 and a NaN is made quiet, as the
  /// float sum and its rounding do; every other value is itself.
  template <class T>
  static T plus_zero(T v) {
    if constexpr (std::is_same_v<T, bfloat16>) {
      std::uint16_t b = v.bits();
      b = (b & 0x7fffu) == 0 ? std::uint16_t(0) : b;
      b = (b & 0x7fffu) > 0x7f80u ? std::uint16_t(b | 0x0040u) : b;
      return bfloat16::from_bits(b);
    } else {
      return T(compute_t<T>(v) + compute_t<T>(0));
    }
  }

  template <class F>
  static void for_planes(const pool2d_geometry& g, index_t planes, F&& f) {
    const bool big = planes > 1 && planes * std::max(g.height * g.width, g.out_h * g.out_w) >= 32768;
    (void)big;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big)
#endif
    for (index_t p = 0; p < planes; ++p) f(p);
  }
};

}  // namespace trainkit::backend
