// trainkit/backend/cpu/gather.hpp - indexed row copies and one-hot targets on the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "trainkit/backend/gather.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

template <>
struct gather<cpu> {
  /// The host validates indices before any kernel runs (autograd/ops/loss.hpp, embedding.hpp).
  static constexpr bool checks_on_device = false;

  template <class T>
  static void gather_rows(const T* table, index_t cols, const std::int64_t* idx, index_t n, T* out,
                          const index_check* = nullptr) {
    const bool big = n > 1 && n * cols >= 32768;
    (void)big;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big)
#endif
    for (index_t i = 0; i < n; ++i)
      std::memcpy(out + i * cols, table + idx[i] * cols, std::size_t(cols) * sizeof(T));
  }

  template <class T>
  static void scatter_add_rows(const T* src, index_t cols, const std::int64_t* idx, index_t n, T* table,
                               const index_check* = nullptr) {
    using C = compute_t<T>;
    // Threads own disjoint column blocks, so repeated indices never race and the sum order is
    // the index order, whatever the number of threads.
    constexpr index_t block = 64;
    const index_t nb = (cols + block - 1) / block;
    const bool big = nb > 1 && n * cols >= 32768;
    (void)big;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big)
#endif
    for (index_t b = 0; b < nb; ++b) {
      const index_t c0 = b * block, c1 = std::min(cols, c0 + block);
      for (index_t i = 0; i < n; ++i) {
        const T* s = src + i * cols;
        T* d = table + idx[i] * cols;
        for (index_t c = c0; c < c1; ++c) d[c] = T(C(d[c]) + C(s[c]));
      }
    }
  }

  template <class T>
  static void one_hot(const std::int64_t* target, index_t n, index_t classes, index_t inner, double on, double off,
                      std::int64_t ignore_index, T* out, const index_check* = nullptr) {
    const bool big = n > 1 && n * classes * inner >= 32768;
    (void)big;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big)
#endif
    for (index_t i = 0; i < n; ++i)
      for (index_t c = 0; c < classes; ++c) {
        T* o = out + (i * classes + c) * inner;
        const std::int64_t* t = target + i * inner;
        for (index_t j = 0; j < inner; ++j) o[j] = t[j] == ignore_index ? T(0) : T(t[j] == c ? on : off);
      }
  }
};

}  // namespace trainkit::backend
