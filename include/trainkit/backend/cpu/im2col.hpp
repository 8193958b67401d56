// trainkit/backend/cpu/im2col.hpp - unfold/fold on the host, and convolution as im2col + GEMM
// parallel over the images of the batch (one column buffer per thread, single-threaded GEMMs).
// With oneDNN (TRAINKIT_HAS_ONEDNN) the fp32/bf16 passes run on oneDNN's convolution primitives
// (backend/cpu/onednn_conv.hpp) under the onednn route (TRAINKIT_CPU_CONV), and under the automatic
// one wherever they measured faster for the pass and shape (backend/cpu/measured_route.hpp).
#pragma once

#include <algorithm>
#include <cstdio>  // std::snprintf
#include <cstring>
#include <type_traits>
#include <vector>

#include "trainkit/backend/blas.hpp"
#include "trainkit/backend/cpu/blas.hpp"         // blas<cpu>::gemm
#include "trainkit/backend/cpu/measured_route.hpp"  // route_table
#include "trainkit/backend/cpu/onednn_conv.hpp"  // onednn_conv2d_*, cpu_conv_route
#include "trainkit/backend/im2col.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

template <>
struct im2col<cpu> {
  template <class T>
  static void unfold(const conv2d_geometry& g, index_t batch, const T* x, T* col, index_t ld,
                     index_t image_stride) {
    for_planes(g, batch, [&](index_t n, index_t c, const window_ranges& wr) {
      const T* xc = x + (n * g.channels + c) * g.height * g.width;
      T* base = col + n * image_stride;
      for (index_t ki = 0; ki < g.kernel_h; ++ki)
        for (index_t kj = 0; kj < g.kernel_w; ++kj) {
          T* dst = base + ((c * g.kernel_h + ki) * g.kernel_w + kj) * ld;
          const index_t lo = wr.lo[std::size_t(kj)], hi = wr.hi[std::size_t(kj)], off = kj * g.dilation_w - g.pad_w;
          for (index_t oh = 0; oh < g.out_h; ++oh, dst += g.out_w) {
            const index_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
            if (ih < 0 || ih >= g.height) {
              std::fill(dst, dst + g.out_w, T(0));
              continue;
            }
            // Output column ow reads input element row + ow * stride_w (in the image for ow in [lo, hi)).
            const index_t row = ih * g.width + off;
            std::fill(dst, dst + lo, T(0));
            if (g.stride_w == 1) {
              if (hi > lo) std::memcpy(dst + lo, xc + (row + lo), std::size_t(hi - lo) * sizeof(T));
            } else {
              for (index_t ow = lo; ow < hi; ++ow) dst[ow] = xc[row + ow * g.stride_w];
            }
            std::fill(dst + hi, dst + g.out_w, T(0));
          }
        }
    });
  }

  template <class T>
  static void fold(const conv2d_geometry& g, index_t batch, const T* col, index_t ld, index_t image_stride,
                   T* x) {
    using C = compute_t<T>;
    for_planes(g, batch, [&](index_t n, index_t c, const window_ranges& wr) {
      T* xc = x + (n * g.channels + c) * g.height * g.width;
      std::fill(xc, xc + g.height * g.width, T(0));
      const T* base = col + n * image_stride;
      for (index_t ki = 0; ki < g.kernel_h; ++ki)
        for (index_t kj = 0; kj < g.kernel_w; ++kj) {
          const T* src = base + ((c * g.kernel_h + ki) * g.kernel_w + kj) * ld;
          const index_t lo = wr.lo[std::size_t(kj)], hi = wr.hi[std::size_t(kj)], off = kj * g.dilation_w - g.pad_w;
          for (index_t oh = 0; oh < g.out_h; ++oh, src += g.out_w) {
            const index_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
            if (ih < 0 || ih >= g.height) continue;
            const index_t row = ih * g.width + off;
            if (g.stride_w == 1) {
              T* dst = xc + (row + lo);
              const T* s = src + lo;
#if TRAINKIT_HAS_OPENMP
#pragma omp simd
#endif
              for (index_t j = 0; j < hi - lo; ++j) dst[j] = T(C(dst[j]) + C(s[j]));
            } else {
              for (index_t ow = lo; ow < hi; ++ow) {
                T& d = xc[row + ow * g.stride_w];
                d = T(C(d) + C(src[ow]));
              }
            }
          }
        }
    });
  }

 private:
  /// For each kernel column kj, the output columns [lo, hi) whose input column lies inside the
  /// image; the others read padding.
  struct window_ranges {
    std::vector<index_t> lo, hi;
  };

  template <class F>
  static void for_planes(const conv2d_geometry& g, index_t batch, F&& f) {
    window_ranges wr;
    wr.lo.resize(std::size_t(g.kernel_w));
    wr.hi.resize(std::size_t(g.kernel_w));
    for (index_t kj = 0; kj < g.kernel_w; ++kj) {
      const index_t off = kj * g.dilation_w - g.pad_w;  // iw = ow * stride_w + off
      const index_t lo = off >= 0 ? 0 : (-off + g.stride_w - 1) / g.stride_w;
      const index_t lim = g.width - off;  // need ow * stride_w < lim
      const index_t hi = lim <= 0 ? 0 : (lim + g.stride_w - 1) / g.stride_w;
      wr.lo[std::size_t(kj)] = std::min(lo, g.out_w);
      wr.hi[std::size_t(kj)] = std::clamp(hi, wr.lo[std::size_t(kj)], g.out_w);
    }
    const index_t planes = batch * g.channels;
#if TRAINKIT_HAS_OPENMP
    // Inside a parallel region (convolution<cpu> runs one image per thread) stay serial.
    const bool big = planes > 1 && !omp_in_parallel() && planes * g.kernel_h * g.kernel_w * g.out_h * g.out_w >= 32768;
#pragma omp parallel for schedule(static) if (big)
#endif
    for (index_t p = 0; p < planes; ++p) f(p / g.channels, p % g.channels, wr);
  }
};

template <>
struct convolution<cpu> {
  template <class T>
  static void forward(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels, const T* x,
                      const T* w, const T* bias, T* y) {
    run_pass<T>(
        "conv_fwd", g, groups, batch, out_channels, bias != nullptr,
        [&] { return onednn_conv2d_forward(g, groups, batch, out_channels, x, w, bias, y); },
        [&] { forward_im2col(g, groups, batch, out_channels, x, w, bias, y); });
  }

  template <class T>
  static void backward_input(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                             const T* gy, const T* w, T* gx) {
    run_pass<T>(
        "conv_bwd_data", g, groups, batch, out_channels, false,
        [&] { return onednn_conv2d_backward_input(g, groups, batch, out_channels, gy, w, gx); },
        [&] { backward_input_im2col(g, groups, batch, out_channels, gy, w, gx); });
  }

  template <class T>
  static void backward_weight(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                              const T* gy, const T* x, T* gw) {
    run_pass<T>(
        "conv_bwd_weights", g, groups, batch, out_channels, false,
        [&] { return onednn_conv2d_backward_weight(g, groups, batch, out_channels, gy, x, gw); },
        [&] { backward_weight_im2col(g, groups, batch, out_channels, gy, x, gw); });
  }

  template <class T>
  static void backward_bias(index_t batch, index_t out_channels, index_t pixels, const T* gy, T* gb) {
    const bool big = out_channels > 1 && batch * out_channels * pixels >= 32768;
    (void)big;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big && !omp_in_parallel())
#endif
    for (index_t o = 0; o < out_channels; ++o) {
      double s = 0;
      for (index_t n = 0; n < batch; ++n) {
        const T* p = gy + (n * out_channels + o) * pixels;
#if TRAINKIT_HAS_OPENMP
#pragma omp simd reduction(+ : s)
#endif
        for (index_t j = 0; j < pixels; ++j) s += double(p[j]);
      }
      gb[o] = T(s);
    }
  }

  /// Passes of at least this many multiply-adds are measured under the automatic route; below,
  /// timings are mostly noise and the type's rule decides (built-in fp32, oneDNN bfloat16).
  static constexpr double measured_grain = double(1 << 18);

 private:
  /// One pass: on oneDNN (onednn() returns false where it has no kernel for the call) where the
  /// route sends it, else on the built-in kernel.
  template <class T, class OneDNN, class Builtin>
  static void run_pass(const char* pass, const conv2d_geometry& g, index_t groups, index_t batch,
                       index_t out_channels, bool bias, OneDNN onednn, Builtin builtin) {
    if (!(takes_onednn<T>(pass, g, groups, batch, out_channels, bias, onednn, builtin) && onednn())) builtin();
  }

  /// Whether a pass goes to oneDNN: the route in force, the type, then (automatic route, passes of
  /// measured_grain and more, outside a parallel region) the choice measured for this shape.
  template <class T, class OneDNN, class Builtin>
  static bool takes_onednn(const char* pass, const conv2d_geometry& g, index_t groups, index_t batch,
                           index_t out_channels, bool bias, OneDNN& onednn, Builtin& builtin) {
#if !TRAINKIT_HAS_ONEDNN
    (void)pass, (void)g, (void)groups, (void)batch, (void)out_channels, (void)bias, (void)onednn, (void)builtin;
    return false;
#else
    if constexpr (!detail::onednn_cnn_type<T>) {
      return false;
    } else {
      // Forced routes, small passes and parallel regions: the rule pooling and batch norm follow.
      const double work = double(batch) * double(g.col_rows()) * double(g.col_cols()) * double(out_channels / groups);
      if (get_cpu_conv_route() != cpu_conv_route::automatic || work < measured_grain || !detail::may_measure())
        return detail::use_onednn_cnn<T>();
      char key[224];
      std::snprintf(key, sizeof key,
                    "%s %s n%lld c%lld h%lld w%lld o%lld g%lld k%lldx%lld s%lldx%lld p%lldx%lld d%lldx%lld b%d t%d",
                    pass, std::is_same_v<T, float> ? "f32" : "bf16", (long long)batch, (long long)g.channels,
                    (long long)g.height, (long long)g.width, (long long)out_channels, (long long)groups,
                    (long long)g.kernel_h, (long long)g.kernel_w, (long long)g.stride_h, (long long)g.stride_w,
                    (long long)g.pad_h, (long long)g.pad_w, (long long)g.dilation_h, (long long)g.dilation_w,
                    int(bias), detail::route_threads());
      return detail::route_table::get().choose(key, [&](bool use_onednn) {
        if (use_onednn) return onednn();
        builtin();
        return true;
      });
    }
#endif
  }

  template <class T>
  static void forward_im2col(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels, const T* x,
                             const T* w, const T* bias, T* y) {
    const index_t l = g.col_cols(), kg = g.col_rows() / groups, og = out_channels / groups;
    for_images<T>(g, batch, out_channels, [&](index_t n, T* col) {
      const T* cols = columns(g, x + n * g.image_size(), col);
      T* yn = y + n * out_channels * l;
      if (bias)
        for (index_t o = 0; o < out_channels; ++o) std::fill(yn + o * l, yn + (o + 1) * l, bias[o]);
      // y_n[group rows] (+)= W_g [O/g, Kg] @ col_g [Kg, L]
      for (index_t gi = 0; gi < groups; ++gi)
        blas<cpu>::gemm(false, false, og, l, kg, 1.0, w + gi * og * kg, kg, cols + gi * kg * l, l, bias ? 1.0 : 0.0,
                        yn + gi * og * l, l);
    });
  }

  template <class T>
  static void backward_input_im2col(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                                    const T* gy, const T* w, T* gx) {
    const index_t l = g.col_cols(), kg = g.col_rows() / groups, og = out_channels / groups;
    const bool direct = is_pointwise(g);
    for_images<T>(g, batch, out_channels, [&](index_t n, T* col) {
      // dcol_g [Kg, L] = W_g^T [Kg, O/g] @ dy_g [O/g, L], folded back onto the image (a 1x1
      // convolution's columns are the image itself).
      T* dst = direct ? gx + n * g.image_size() : col;
      const T* gyn = gy + n * out_channels * l;
      for (index_t gi = 0; gi < groups; ++gi)
        blas<cpu>::gemm(true, false, kg, l, og, 1.0, w + gi * og * kg, kg, gyn + gi * og * l, l, 0.0, dst + gi * kg * l,
                        l);
      if (!direct) im2col<cpu>::fold(g, 1, col, l, 0, gx + n * g.image_size());
    });
  }

  template <class T>
  static void backward_weight_im2col(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                                     const T* gy, const T* x, T* gw) {
    const index_t l = g.col_cols(), kg = g.col_rows() / groups, og = out_channels / groups;
    const index_t wsize = out_channels * kg;
    // Each thread sums its images into its own copy of dW; the copies are added in thread order.
    const int nt = threads_for(g, batch, out_channels);
    std::vector<T> partial(std::size_t(nt > 1 ? nt * wsize : 0), T(0));
    std::fill(gw, gw + wsize, T(0));
    for_images<T>(g, batch, out_channels, [&](index_t n, T* col) {
      T* acc = gw;
#if TRAINKIT_HAS_OPENMP
      if (nt > 1) acc = partial.data() + omp_get_thread_num() * wsize;
#endif
      const T* cols = columns(g, x + n * g.image_size(), col);
      const T* gyn = gy + n * out_channels * l;
      // dW_g [O/g, Kg] += dy_g [O/g, L] @ col_g^T [L, Kg]
      for (index_t gi = 0; gi < groups; ++gi)
        blas<cpu>::gemm(false, true, og, kg, l, 1.0, gyn + gi * og * l, l, cols + gi * kg * l, l, 1.0, acc + gi * og * kg,
                        kg);
    });
    using C = compute_t<T>;
    for (int t = 0; t < (nt > 1 ? nt : 0); ++t)
      for (index_t i = 0; i < wsize; ++i) gw[i] = T(C(gw[i]) + C(partial[std::size_t(t * wsize + i)]));
  }

  /// A 1x1 kernel with stride 1 and no padding reads the image as its own column matrix.
  static bool is_pointwise(const conv2d_geometry& g) {
    return g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0;
  }

  template <class T>
  static const T* columns(const conv2d_geometry& g, const T* image, T* col) {
    if (is_pointwise(g)) return image;
    im2col<cpu>::unfold(g, 1, image, col, g.col_cols(), 0);
    return col;
  }

  /// Threads for a pass over `batch` images: one per image up to the OpenMP limit, none when the
  /// batch is a single image (then the unfold and the GEMMs parallelise themselves) or tiny.
  static int threads_for(const conv2d_geometry& g, index_t batch, index_t out_channels) {
#if TRAINKIT_HAS_OPENMP
    const double work = double(batch) * double(g.col_rows()) * double(g.col_cols()) * double(out_channels);
    if (batch < 2 || omp_in_parallel() || work < double(1 << 18)) return 1;
    return int(std::min<index_t>(batch, omp_get_max_threads()));
#else
    (void)g;
    (void)batch;
    (void)out_channels;
    return 1;
#endif
  }

  /// f(n, col) for every image n, with col a private [C*kh*kw, OH*OW] buffer of the thread.
  template <class T, class F>
  static void for_images(const conv2d_geometry& g, index_t batch, index_t out_channels, F&& f) {
    const int nt = threads_for(g, batch, out_channels);
    const std::size_t per = is_pointwise(g) ? 0 : std::size_t(g.col_rows() * g.col_cols());
    std::vector<T> buf(per * std::size_t(nt));
    if (nt <= 1) {
      for (index_t n = 0; n < batch; ++n) f(n, buf.data());
      return;
    }
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) num_threads(nt)
    for (index_t n = 0; n < batch; ++n) f(n, buf.data() + per * std::size_t(omp_get_thread_num()));
#endif
  }
};

}  // namespace trainkit::backend
