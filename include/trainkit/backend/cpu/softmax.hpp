// trainkit/backend/cpu/softmax.hpp - softmax / log_softmax on the host (OpenMP): a row at a time
// when the softmax dim is contiguous, else blocks of 256 columns so every access is a unit-stride run.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "trainkit/backend/cpu/parallel_for.hpp"
#include "trainkit/backend/softmax.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

template <>
struct softmax<cpu> {
  template <class T>
  static void forward(const T* x, index_t outer, index_t dim, index_t inner, bool log, T* y) {
    using C = compute_t<T>;
    using A = accumulate_t<T>;
    if (inner == 1) {
      detail::parallel_for(outer, dim * 3, [&](index_t o) {
        const T* p = x + o * dim;
        T* q = y + o * dim;
        C mx = -std::numeric_limits<C>::infinity();
        for (index_t d = 0; d < dim; ++d) mx = std::max(mx, C(p[d]));
        if (!(mx > -std::numeric_limits<C>::infinity())) mx = C(0);  // all -inf (or NaN): keep the NaN/0s
        A sum = 0;
        if (log) {
          for (index_t d = 0; d < dim; ++d) sum += A(std::exp(C(p[d]) - mx));
          const C lse = mx + C(std::log(sum));
          for (index_t d = 0; d < dim; ++d) q[d] = T(C(p[d]) - lse);
        } else {
          for (index_t d = 0; d < dim; ++d) {
            const C e = std::exp(C(p[d]) - mx);
            sum += A(e);
            q[d] = T(e);
          }
          const C inv = C(1) / C(sum);
          for (index_t d = 0; d < dim; ++d) q[d] = T(C(q[d]) * inv);
        }
      });
      return;
    }
    // Strided: walk a block of `inner` columns at once so every access is a unit-stride run.
    constexpr index_t block = 256;
    const index_t nb = (inner + block - 1) / block;
    detail::parallel_for(outer * nb, std::min(block, inner) * dim * 3, [&](index_t task) {
      const index_t o = task / nb, i0 = (task % nb) * block, len = std::min(block, inner - i0);
      C mx[block];
      A sum[block];
      for (index_t i = 0; i < len; ++i) {
        mx[i] = -std::numeric_limits<C>::infinity();
        sum[i] = A(0);
      }
      const T* base = x + o * dim * inner + i0;
      T* out = y + o * dim * inner + i0;
      for (index_t d = 0; d < dim; ++d)
        for (index_t i = 0; i < len; ++i) mx[i] = std::max(mx[i], C(base[d * inner + i]));
      for (index_t i = 0; i < len; ++i)
        if (!(mx[i] > -std::numeric_limits<C>::infinity())) mx[i] = C(0);
      for (index_t d = 0; d < dim; ++d)
        for (index_t i = 0; i < len; ++i) {
          const C e = std::exp(C(base[d * inner + i]) - mx[i]);
          sum[i] += A(e);
          if (!log) out[d * inner + i] = T(e);
        }
      for (index_t d = 0; d < dim; ++d)
        for (index_t i = 0; i < len; ++i) {
          if (log)
            out[d * inner + i] = T(C(base[d * inner + i]) - mx[i] - C(std::log(sum[i])));
          else
            out[d * inner + i] = T(C(out[d * inner + i]) / C(sum[i]));
        }
    });
  }

  template <class T>
  static void backward(const T* y, const T* g, index_t outer, index_t dim, index_t inner, bool log, T* dx) {
    using C = compute_t<T>;
    using A = accumulate_t<T>;
    // softmax: dx = y * (g - sum(g * y));  log_softmax: dx = g - exp(y) * sum(g).
    constexpr index_t block = 256;
    const index_t len_max = std::min(block, std::max<index_t>(inner, 1));
    const index_t nb = (inner + block - 1) / block;
    detail::parallel_for(outer * nb, len_max * dim * 2, [&](index_t task) {
      const index_t o = task / nb, i0 = (task % nb) * block, len = std::min(block, inner - i0);
      A dot[block];
      for (index_t i = 0; i < len; ++i) dot[i] = A(0);
      const index_t base = o * dim * inner + i0;
      for (index_t d = 0; d < dim; ++d)
        for (index_t i = 0; i < len; ++i) {
          const index_t k = base + d * inner + i;
          dot[i] += log ? A(g[k]) : A(C(g[k]) * C(y[k]));
        }
      for (index_t d = 0; d < dim; ++d)
        for (index_t i = 0; i < len; ++i) {
          const index_t k = base + d * inner + i;
          dx[k] = log ? T(C(g[k]) - std::exp(C(y[k])) * C(dot[i])) : T(C(y[k]) * (C(g[k]) - C(dot[i])));
        }
    });
  }
};

}  // namespace trainkit::backend
