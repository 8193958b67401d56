// trainkit/backend/cpu/norm.hpp - batch norm and layer norm on the host (OpenMP). With oneDNN and
// the onednn route (TRAINKIT_CPU_CONV) fp32/bf16 batch norm runs on oneDNN's primitives
// (backend/cpu/onednn_batch_norm.hpp; the running statistics are still updated here).
//
// Statistics are accumulated in double whatever T is: a channel of a batch-norm input easily
// holds 10^5 values, where a float sum loses digits, and the extra cost is nothing next to the
// memory traffic.
#pragma once

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "trainkit/backend/cpu/convert16.hpp"  // round_to_bfloat16
#include "trainkit/backend/cpu/onednn_batch_norm.hpp"  // onednn_batch_norm_*, cpu_conv_route
#include "trainkit/backend/cpu/parallel_for.hpp"
#include "trainkit/backend/norm.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {


template <>
struct norm<cpu> {
  // ---- batch norm ------------------------------------------------------------------------------
  // The batch-norm kernels take the activations (x, y, g, dx) in X / G and the parameters and
  // running statistics in W: both T for a plain graph; bfloat16 activations with float
  // parameters under a bf16 precision scope (the statistics, as always, in float and double).
  template <class X, class W, class S>
  static void batch_norm_train(const X* x, index_t n, index_t c, index_t s, const W* weight, const W* bias,
                               double eps, double momentum, W* running_mean, W* running_var, X* y, S* save_mean,
                               S* save_invstd) {
#if TRAINKIT_HAS_ONEDNN
    if (detail::use_onednn_bnorm<X, W>() && onednn_batch_norm_train(x, n, c, s, weight, bias, eps, momentum, running_mean,
                                                               running_var, y, save_mean, save_invstd))
      return;
#endif
    // One pass of sums of d = x - k and d^2 with k the channel's first value, so the variance does
    // not cancel catastrophically when |mean| >> std. Each plane is summed in the compute type
    // (vectorised: float lanes), the planes in double: in double throughout it ran 2 lanes wide
    // and was a sixth of a CNN step.
    using C = compute_t<W>;
    std::vector<C> shift(static_cast<std::size_t>(c));
    for (index_t ch = 0; ch < c; ++ch) shift[std::size_t(ch)] = n > 0 && s > 0 ? C(x[ch * s]) : C(0);
    train_planes(n, c, s, shift.data(), weight, bias, eps, momentum, running_mean, running_var, save_mean, save_invstd,
                 [&](index_t p, C k, C& ps, C& pq) { plane_moments(compute_row<C>(x + p * s, s, 0), s, k, ps, pq); },
                 [&](index_t p, double scale, double shift_) { affine_row(x + p * s, s, C(scale), C(shift_), y + p * s); });
  }

  /// Whether batch_norm_train_bf16_values is the route: float batch norm runs the built-in kernels
  /// (not oneDNN's, which a forced TRAINKIT_CPU_CONV=onednn keeps).
  static bool fuses_bf16_rounding() {
#if TRAINKIT_HAS_ONEDNN
    return !detail::use_onednn_bnorm<float, float>();
#else
    return true;
#endif
  }
  /// batch_norm_train on float-held bfloat16 values (a bf16 scope on the CPU's widened route): each
  /// x is rounded to bfloat16 as it is read - exact on bf16 values, and the rounding itself for a
  /// GEMM result whose rounding was deferred (var::defer_rounding) - its bf16 copy is written to
  /// keep (what backward saves), and y is rounded to bfloat16 as it is written. The statistics and y
  /// are bit for bit those of rounding x, batch_norm_train and rounding y (the same plane sums; a
  /// multiply and an add per value), in two passes instead of five: the second reads the 2-byte copy.
  template <class S>
  static void batch_norm_train_bf16_values(const float* x, index_t n, index_t c, index_t s, const float* weight,
                                           const float* bias, double eps, double momentum, float* running_mean,
                                           float* running_var, float* y, bfloat16* keep, S* save_mean,
                                           S* save_invstd) {
    std::vector<float> shift(static_cast<std::size_t>(c));
    for (index_t ch = 0; ch < c; ++ch) shift[std::size_t(ch)] = n > 0 && s > 0 ? float(bfloat16(x[ch * s])) : 0.0f;
    train_planes(
        n, c, s, shift.data(), weight, bias, eps, momentum, running_mean, running_var, save_mean, save_invstd,
        [&](index_t p, float k, float& ps, float& pq) {
          thread_local std::vector<float> buffer;
          if (buffer.size() < std::size_t(s)) buffer.resize(std::size_t(s));
          cpu_convert::round_keeping_bfloat16(x + p * s, buffer.data(), keep + p * s, s);
          plane_moments(static_cast<const float*>(buffer.data()), s, k, ps, pq);
        },
        [&](index_t p, double scale, double shift_) {
          cpu_convert::affine_rounded_to_bfloat16(keep + p * s, float(scale), float(shift_), y + p * s, s);
        });
  }

  /// The passes of batch norm's training forward, plane by plane. A plane (image i, channel ch) is
  /// s contiguous values and a channel's planes lie c * s apart, so both passes run over the
  /// planes in memory order (a static split: each thread streams one run of images), not channel
  /// by channel, whose short strided runs kept the loads waiting. Each plane's sums are taken on
  /// their own and a channel's are added in double in image order, as channel by channel did:
  /// the same bits.
  ///   sums(p, k, ps, pq): the shifted sums of plane p into ps and pq (both 0), k its channel's shift
  ///   row(p, scale, shift): plane p's y = x * scale + shift
  template <class C, class W, class S, class Sums, class Row>
  static void train_planes(index_t n, index_t c, index_t s, const C* shift, const W* weight, const W* bias,
                           double eps, double momentum, W* running_mean, W* running_var, S* save_mean,
                           S* save_invstd, Sums sums, Row row) {
    const index_t planes = n * c, m = n * s;
    std::vector<C> moments(static_cast<std::size_t>(2 * planes));
    detail::parallel_for(planes, 2 * s, [&](index_t p) {
      C ps = 0, pq = 0;
      sums(p, shift[p % c], ps, pq);
      moments[std::size_t(2 * p)] = ps;
      moments[std::size_t(2 * p + 1)] = pq;
    });
    std::vector<double> affine(static_cast<std::size_t>(2 * c));
    for (index_t ch = 0; ch < c; ++ch) {
      const auto [sum, sq] = channel_sums(moments.data(), n, c, ch);
      const auto [mean, invstd] = channel_statistics(ch, m, double(shift[ch]), sum, sq, eps, momentum, running_mean,
                                                     running_var, save_mean, save_invstd);
      const double scale = invstd * (weight ? double(weight[ch]) : 1.0);
      affine[std::size_t(2 * ch)] = scale;
      affine[std::size_t(2 * ch + 1)] = (bias ? double(bias[ch]) : 0.0) - mean * scale;
    }
    detail::parallel_for(planes, s, [&](index_t p) {
      row(p, affine[std::size_t(2 * (p % c))], affine[std::size_t(2 * (p % c) + 1)]);
    });
  }

  template <class X, class W, class S>
  static void batch_norm_eval(const X* x, index_t n, index_t c, index_t s, const W* weight, const W* bias,
                              const W* running_mean, const W* running_var, double eps, X* y, S* save_mean,
                              S* save_invstd) {
#if TRAINKIT_HAS_ONEDNN
    if (detail::use_onednn_bnorm<X, W>() &&
        onednn_batch_norm_eval(x, n, c, s, weight, bias, running_mean, running_var, eps, y, save_mean, save_invstd))
      return;
#endif
    for (index_t ch = 0; ch < c; ++ch) {
      save_mean[ch] = S(running_mean[ch]);
      save_invstd[ch] = S(1.0 / std::sqrt(double(running_var[ch]) + eps));
    }
    detail::parallel_for(c, n * s, [&](index_t ch) {
      affine_channel(x, n, c, s, ch, weight, bias, double(save_mean[ch]), double(save_invstd[ch]), y);
    });
  }

  template <class G, class X, class W, class S>
  static void batch_norm_backward(const G* g, const X* x, index_t n, index_t c, index_t s, const W* weight,
                                  const S* save_mean, const S* save_invstd, bool training, G* dx, W* dweight,
                                  W* dbias, bool round_dx_to_bf16 = false) {
#if TRAINKIT_HAS_ONEDNN
    if constexpr (std::is_same_v<G, X>)  // oneDNN takes the gradient in the input's type
      if (!round_dx_to_bf16 && detail::use_onednn_bnorm<X, W>() &&
          onednn_batch_norm_backward(g, x, n, c, s, weight, save_mean, save_invstd, training, dx, dweight, dbias))
        return;
#endif
    // Plane by plane in memory order, as the forward (train_planes): each plane's sums in the compute
    // type (vectorised), a channel's planes added in double in image order, then dx plane by plane.
    using C = compute_t<W>;
    const index_t m = n * s, planes = n * c;
    std::vector<C> sums(static_cast<std::size_t>(2 * planes));
    detail::parallel_for(planes, 2 * s, [&](index_t p) {
      C pg = 0, pgx = 0;
      plane_gradient_sums(compute_row<C>(g + p * s, s, 0), compute_row<C>(x + p * s, s, 1), s,
                          C(double(save_mean[p % c])), pg, pgx);
      sums[std::size_t(2 * p)] = pg;
      sums[std::size_t(2 * p + 1)] = pgx;
    });
    // dx = a * g + b * x + k: eval is a plain scale; training subtracts the gradient's mean and
    // its projection on x_hat (the batch statistics depend on x).
    std::vector<C> coefficients(static_cast<std::size_t>(3 * c));
    for (index_t ch = 0; ch < c; ++ch) {
      const double mean = double(save_mean[ch]), invstd = double(save_invstd[ch]);
      const auto [sum_g, sum_gx] = channel_sums(sums.data(), n, c, ch);
      if (dbias) dbias[ch] = W(sum_g);
      if (dweight) dweight[ch] = W(sum_gx * invstd);
      const double a = (weight ? double(weight[ch]) : 1.0) * invstd;
      double b = 0, k = 0;
      if (training && m > 0) {
        b = -a * invstd * invstd * sum_gx / double(m);
        k = -a * sum_g / double(m) - b * mean;
      }
      coefficients[std::size_t(3 * ch)] = C(a);
      coefficients[std::size_t(3 * ch + 1)] = C(b);
      coefficients[std::size_t(3 * ch + 2)] = C(k);
    }
    if (!dx) return;
    detail::parallel_for(planes, s, [&](index_t p) {
      const C* coef = coefficients.data() + 3 * (p % c);
      const C ca = coef[0], cb = coef[1], ck = coef[2];
      const index_t off = p * s;
      if constexpr (std::is_same_v<G, float> && std::is_same_v<X, bfloat16>)
        if (round_dx_to_bf16) {  // the widened bf16 route: x and the rounding in one pass
          cpu_convert::bn_gradient_rounded_to_bfloat16(g + off, x + off, ca, cb, ck, dx + off, s);
          return;
        }
      // Both rows as C (bf16 ones widened in bulk into the thread's buffers: inline, the widening
      // kept the loop from vectorising).
      const C* gp = compute_row<C>(g + off, s, 0);
      const C* xp = compute_row<C>(x + off, s, 1);
      store_row(dx + off, s, [&](index_t j) { return ca * gp[j] + cb * xp[j] + ck; });
    });
  }

  // ---- layer norm ------------------------------------------------------------------------------
  template <class T, class S>
  static void layer_norm_forward(const T* x, index_t rows, index_t cols, const T* weight, const T* bias, double eps,
                                 T* y, S* save_mean, S* save_rstd) {
    using C = compute_t<T>;
    detail::parallel_for(rows, cols * 3, [&](index_t r) {
      const T* p = x + r * cols;
      double sum = 0;
#if TRAINKIT_HAS_OPENMP
#pragma omp simd reduction(+ : sum)
#endif
      for (index_t j = 0; j < cols; ++j) sum += double(p[j]);
      const double mean = cols ? sum / double(cols) : 0.0;
      double sq = 0;
#if TRAINKIT_HAS_OPENMP
#pragma omp simd reduction(+ : sq)
#endif
      for (index_t j = 0; j < cols; ++j) {
        const double d = double(p[j]) - mean;
        sq += d * d;
      }
      const double rstd = 1.0 / std::sqrt((cols ? sq / double(cols) : 0.0) + eps);
      save_mean[r] = S(mean);
      save_rstd[r] = S(rstd);
      const C cm = C(mean), cr = C(rstd);
      T* q = y + r * cols;
      // One loop per case, the tests outside: a test inside kept the loop from vectorising.
      if (weight && bias)
        for (index_t j = 0; j < cols; ++j) q[j] = T((C(p[j]) - cm) * cr * C(weight[j]) + C(bias[j]));
      else if (weight)
        for (index_t j = 0; j < cols; ++j) q[j] = T((C(p[j]) - cm) * cr * C(weight[j]));
      else if (bias)
        for (index_t j = 0; j < cols; ++j) q[j] = T((C(p[j]) - cm) * cr + C(bias[j]));
      else
        for (index_t j = 0; j < cols; ++j) q[j] = T((C(p[j]) - cm) * cr);
    });
  }

  template <class T, class S>
  static void layer_norm_backward(const T* g, const T* x, index_t rows, index_t cols, const T* weight,
                                  const S* save_mean, const S* save_rstd, T* dx, T* dweight, T* dbias) {
    using C = compute_t<T>;
    if (dx) {
      detail::parallel_for(rows, cols * 3, [&](index_t r) {
        const T* gp = g + r * cols;
        const T* xp = x + r * cols;
        const double mean = double(save_mean[r]), rstd = double(save_rstd[r]);
        double m1 = 0, m2 = 0;  // sums of dxhat and dxhat * xhat (in double lanes)
        if (weight) {
#if TRAINKIT_HAS_OPENMP
#pragma omp simd reduction(+ : m1, m2)
#endif
          for (index_t j = 0; j < cols; ++j) {
            const double dh = double(gp[j]) * double(weight[j]);
            m1 += dh;
            m2 += dh * (double(xp[j]) - mean) * rstd;
          }
        } else {
#if TRAINKIT_HAS_OPENMP
#pragma omp simd reduction(+ : m1, m2)
#endif
          for (index_t j = 0; j < cols; ++j) {
            const double dh = double(gp[j]);
            m1 += dh;
            m2 += dh * (double(xp[j]) - mean) * rstd;
          }
        }
        m1 /= double(cols);
        m2 /= double(cols);
        T* dp = dx + r * cols;
        const C cm = C(mean), cr = C(rstd), c1 = C(m1), c2 = C(m2);
        if (weight)
          for (index_t j = 0; j < cols; ++j) dp[j] = T(cr * (C(gp[j]) * C(weight[j]) - c1 - (C(xp[j]) - cm) * cr * c2));
        else
          for (index_t j = 0; j < cols; ++j) dp[j] = T(cr * (C(gp[j]) - c1 - (C(xp[j]) - cm) * cr * c2));
      });
    }
    if (!dweight && !dbias) return;
    // Column sums over rows: each thread sums a contiguous block of rows into its own buffer;
    // the buffers are merged in thread order, so the result does not depend on scheduling.
#if TRAINKIT_HAS_OPENMP
    const int nt = rows * cols >= 32768 ? std::max(1, omp_get_max_threads()) : 1;
#else
    const int nt = 1;
#endif
    std::vector<double> pw(dweight ? std::size_t(nt * cols) : 0), pb(dbias ? std::size_t(nt * cols) : 0);
    const index_t chunk = (rows + nt - 1) / nt;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
    for (int t = 0; t < nt; ++t) {
      double* w = dweight ? pw.data() + t * cols : nullptr;
      double* b = dbias ? pb.data() + t * cols : nullptr;
      const index_t r0 = std::min(rows, t * chunk), r1 = std::min(rows, r0 + chunk);
      for (index_t r = r0; r < r1; ++r) {
        const T* gp = g + r * cols;
        const T* xp = x + r * cols;
        const double mean = double(save_mean[r]), rstd = double(save_rstd[r]);
        if (w)
          for (index_t j = 0; j < cols; ++j) w[j] += double(gp[j]) * (double(xp[j]) - mean) * rstd;
        if (b)
          for (index_t j = 0; j < cols; ++j) b[j] += double(gp[j]);
      }
    }
    for (index_t j = 0; j < cols; ++j) {
      double w = 0, b = 0;
      for (int t = 0; t < nt; ++t) {
        if (dweight) w += pw[std::size_t(t * cols + j)];
        if (dbias) b += pb[std::size_t(t * cols + j)];
      }
      if (dweight) dweight[j] = T(w);
      if (dbias) dbias[j] = T(b);
    }
  }

 private:
  // The sums of the batch-norm kernels run on compute-type rows: bf16 rows are widened into a
  // per-thread buffer first, so one loop (one instantiation per C) sums a plane whichever way its
  // values are held - a bf16-held batch norm gives the float-held one's statistics and gradients
  // bit for bit, where the vectoriser had split the two loops into different partial sums.
  /// p[0, s) as C: p itself when X is C, else its widened copy in the calling thread's buffer `slot`.
  template <class C, class X>
  static const C* compute_row(const X* p, index_t s, int slot) {
    if constexpr (std::is_same_v<X, C>) {
      return p;
    } else {
      thread_local std::vector<C> buffers[2];
      auto& b = buffers[slot];
      if (b.size() < std::size_t(s)) b.resize(std::size_t(s));
      if constexpr (std::is_same_v<X, bfloat16> && std::is_same_v<C, float>)
        cpu_convert::widen_bfloat16(p, b.data(), s);
      else
        for (index_t j = 0; j < s; ++j) b[std::size_t(j)] = C(p[j]);
      return b.data();
    }
  }
  /// ps += sum (p[j] - k), pq += sum (p[j] - k)^2 over one plane (vectorised: C lanes).
  template <class C>
  static void plane_moments(const C* p, index_t s, C k, C& ps, C& pq) {
    C a = ps, b = pq;
#if TRAINKIT_HAS_OPENMP
#pragma omp simd reduction(+ : a, b)
#endif
    for (index_t j = 0; j < s; ++j) {
      const C d = p[j] - k;
      a += d;
      b += d * d;
    }
    ps = a;
    pq = b;
  }
  /// pg += sum g[j], pgx += sum g[j] (x[j] - mean) over one plane.
  template <class C>
  static void plane_gradient_sums(const C* g, const C* x, index_t s, C mean, C& pg, C& pgx) {
    C a = pg, b = pgx;
#if TRAINKIT_HAS_OPENMP
#pragma omp simd reduction(+ : a, b)
#endif
    for (index_t j = 0; j < s; ++j) {
      a += g[j];
      b += g[j] * (x[j] - mean);
    }
    pg = a;
    pgx = b;
  }

  /// q[j] = Y(v(j)) for j in [0, s). bfloat16 goes through a float block and the vector rounding
  /// (cpu_convert::round_to_bfloat16): the compiler does not vectorise the rounding itself.
  template <class Y, class V>
  static void store_row(Y* q, index_t s, V v) {
    if constexpr (std::is_same_v<Y, bfloat16>) {
      constexpr index_t block = 256;
      alignas(64) float tmp[block];
      for (index_t j0 = 0; j0 < s; j0 += block) {
        const index_t len = std::min(block, s - j0);
#if TRAINKIT_HAS_OPENMP
#pragma omp simd
#endif
        for (index_t j = 0; j < len; ++j) tmp[j] = float(v(j0 + j));
        cpu_convert::round_to_bfloat16(tmp, q + j0, len);
      }
    } else {
#if TRAINKIT_HAS_OPENMP
#pragma omp simd
#endif
      for (index_t j = 0; j < s; ++j) q[j] = Y(v(j));
    }
  }

  /// Channel ch's two sums from the per-plane pairs (plane i * c + ch at 2 (i * c + ch)), added in
  /// double in image order.
  template <class C>
  static std::pair<double, double> channel_sums(const C* planes, index_t n, index_t c, index_t ch) {
    double a = 0, b = 0;
    for (index_t i = 0; i < n; ++i) {
      a += double(planes[2 * (i * c + ch)]);
      b += double(planes[2 * (i * c + ch) + 1]);
    }
    return {a, b};
  }

  /// A channel's statistics from its m values' shifted sums (sum of x - k and of (x - k)^2): saves
  /// mean and invstd = 1 / sqrt(var + eps) (biased variance), updates the running statistics when
  /// given (the unbiased variance, PyTorch's rule); returns {mean, invstd}.
  template <class W, class S>
  static std::pair<double, double> channel_statistics(index_t ch, index_t m, double k, double sum, double sq,
                                                      double eps, double momentum, W* running_mean, W* running_var,
                                                      S* save_mean, S* save_invstd) {
    const double dm = m ? sum / double(m) : 0.0, mean = k + dm;
    sq = std::max(0.0, sq - double(m) * dm * dm);  // sum of (x - mean)^2
    const double var = m ? sq / double(m) : 0.0;
    const double invstd = 1.0 / std::sqrt(var + eps);
    save_mean[ch] = S(mean);
    save_invstd[ch] = S(invstd);
    if (running_mean) running_mean[ch] = W((1.0 - momentum) * double(running_mean[ch]) + momentum * mean);
    if (running_var) {
      const double unbiased = m > 1 ? sq / double(m - 1) : std::numeric_limits<double>::quiet_NaN();
      running_var[ch] = W((1.0 - momentum) * double(running_var[ch]) + momentum * unbiased);
    }
    return {mean, invstd};
  }

  /// y = (x - mean) * invstd * weight + bias over one channel of every sample.
  template <class X, class W>
  static void affine_channel(const X* x, index_t n, index_t c, index_t s, index_t ch, const W* weight,
                             const W* bias, double mean, double invstd, X* y) {
    using C = compute_t<W>;
    const double scale = invstd * (weight ? double(weight[ch]) : 1.0);
    const double shift = (bias ? double(bias[ch]) : 0.0) - mean * scale;
    for (index_t i = 0; i < n; ++i)
      affine_row(x + (i * c + ch) * s, s, C(scale), C(shift), y + (i * c + ch) * s);
  }
  /// y[j] = x[j] * scale + shift over one plane.
  template <class X, class C>
  static void affine_row(const X* x, index_t s, C scale, C shift, X* y) {
    store_row(y, s, [&](index_t j) { return C(x[j]) * scale + shift; });
  }
};

}  // namespace trainkit::backend
