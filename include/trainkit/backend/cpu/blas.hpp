// trainkit/backend/cpu/blas.hpp - GEMM through CBLAS (OpenBLAS); never a hand-written one.
#pragma once

#include <cblas.h>  // cblas_sgemm, cblas_dgemm

#include <type_traits>
#include <vector>

#include "trainkit/backend/blas.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/error.hpp"

namespace trainkit::backend {

template <>
struct blas<cpu> {
  template <class T>
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, double beta, T* c, index_t ldc) {
    if (m == 0 || n == 0) return;
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), float(alpha), a, int(lda), b, int(ldb),
                  float(beta), c, int(ldc));
    } else if constexpr (std::is_same_v<T, double>) {
      cblas_dgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                  int(ldc));
    } else {
      static_assert(floating_element<T>, "gemm needs a floating-point element type");
      // 16-bit floats: widen to fp32, multiply with fp32 accumulation, round once.
      auto widen = [](const T* p, index_t rows, index_t cols, index_t ld) {
        std::vector<float> w(static_cast<std::size_t>(rows * cols));
        for (index_t i = 0; i < rows; ++i)
          for (index_t j = 0; j < cols; ++j) w[std::size_t(i * cols + j)] = static_cast<float>(p[i * ld + j]);
        return w;
      };
      const index_t ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k, bc = trans_b ? k : n;
      auto wa = widen(a, ar, ac, lda), wb = widen(b, br, bc, ldb), wc = widen(c, m, n, ldc);
      cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), float(alpha), wa.data(), int(ac), wb.data(),
                  int(bc), float(beta), wc.data(), int(n));
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) c[i * ldc + j] = static_cast<T>(wc[std::size_t(i * n + j)]);
    }
  }
};

}  // namespace trainkit::backend
