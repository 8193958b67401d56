// trainkit/backend/cpu/blas.hpp - GEMM through CBLAS (OpenBLAS) or oneDNN (backend/cpu/onednn_gemm.hpp,
// TRAINKIT_HAS_ONEDNN); never a hand-written one.
#pragma once

#include <cblas.h>  // cblas_sgemm, cblas_dgemm, openblas_set_num_threads

#include <algorithm>
#include <cstdio>  // std::snprintf
#include <type_traits>
#include <vector>

#include "trainkit/backend/blas.hpp"
#include "trainkit/backend/cpu/cpu_features.hpp"  // bf16_arithmetic
#include "trainkit/backend/cpu/measured_route.hpp"  // route_table
#include "trainkit/backend/cpu/onednn_gemm.hpp"  // onednn_gemm, cpu_gemm_route
#include "trainkit/config.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/wait_governor.hpp"  // start_wait_governor

namespace trainkit::backend {

#if TRAINKIT_HAS_ONEDNN
/// With oneDNN the CPU multiplies bfloat16 itself (blas<cpu> and convolution<cpu> take it to
/// oneDNN's bf16 kernels, fp32 accumulation). On a CPU without bf16 arithmetic oneDNN converts
/// inside its kernels; the mixed ops still save and pass bf16 tensors.
template <>
inline constexpr bool native_gemm<cpu, bfloat16> = true;
#endif

namespace detail {
/// Whether OpenBLAS threads through OpenMP (Debian's libopenblas-openmp-dev, which the build
/// prefers): then its threads are OpenMP's own pool, it runs single-threaded by itself inside a
/// parallel region, and gemm simply calls it. (openblas_get_parallel(): 0 sequential, 1 pthreads,
/// 2 OpenMP.)
inline bool blas_threads_are_openmp() {
  static const bool openmp = openblas_get_parallel() == 2;
  return openmp;
}

/// With any other OpenBLAS build, one thread pool for the whole library. The pthreads build keeps
/// its own workers spinning for a while after each call; next to OpenMP's workers on the same
/// cores the two pools fight, and an OpenMP loop right after a GEMM waits for cores the spinning
/// workers hold (benchmarks/README.md, "Figures behind the code"). So that OpenBLAS runs single-threaded and gemm below splits large
/// products over OpenMP threads itself (and stays single-threaded inside a parallel region, so
/// kernels such as convolution can run one GEMM per thread).
/// Never called for the OpenMP build: there openblas_set_num_threads(1) is omp_set_num_threads(1),
/// which would leave every later OpenMP region of the calling thread with a single thread.
inline void use_single_threaded_blas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}
}  // namespace detail

template <>
struct blas<cpu> {
  /// Products below this many multiply-adds run on one thread (a parallel region costs more).
  static constexpr double parallel_grain = double(1 << 20);
  /// fp32 products of at least this many multiply-adds are measured under the automatic route
  /// (below, a few microseconds: timings are noise and OpenBLAS's lower call overhead decides).
  static constexpr double measured_grain = double(1 << 16);

  /// Where gemm<T> of this shape goes under the route in force (get_cpu_gemm_route()): OpenBLAS,
  /// oneDNN, or - an fp32 product of at least measured_grain multiply-adds under the automatic
  /// route, outside a parallel region - whichever measured faster for this shape on this machine
  /// (backend/cpu/measured_route.hpp; measured at its first call, kept in the route file).
  enum class gemm_choice { openblas, onednn, measured };
  template <class T>
  static gemm_choice route_of([[maybe_unused]] index_t m, [[maybe_unused]] index_t n, [[maybe_unused]] index_t k) {
#if TRAINKIT_HAS_ONEDNN
    if constexpr (std::is_same_v<T, double>) {
      return gemm_choice::openblas;
    } else {
      const cpu_gemm_route route = get_cpu_gemm_route();
      if (route == cpu_gemm_route::openblas || k == 0 || !onednn_supports<T>()) return gemm_choice::openblas;
      if constexpr (std::is_same_v<T, float>) {
        if (route == cpu_gemm_route::onednn) return gemm_choice::onednn;
        // Inside a parallel region (a convolution's per-image GEMMs) and below the grain,
        // OpenBLAS: oneDNN's per-call overhead (about 8 us) is paid once per image there.
        if (!detail::may_measure() || double(m) * double(n) * double(k) < measured_grain) return gemm_choice::openblas;
        return gemm_choice::measured;
      } else {
        return gemm_choice::onednn;  // bfloat16, half: native 16-bit kernels beat widening to sgemm
      }
    }
#else
    return gemm_choice::openblas;
#endif
  }

  /// Whether bfloat16 products run natively now: oneDNN's bf16 kernels, on a CPU with bf16
  /// arithmetic (AVX512-BF16, AMX-BF16, AVX-NE-CONVERT; within TRAINKIT_MAX_CPU_ISA), under a GEMM
  /// route that takes oneDNN. amp's bf16 ops check it: elsewhere they hold bf16-rounded values in
  /// fp32 and multiply them on the fp32 kernels (oneDNN's AVX-512 emulation of bf16, and widening
  /// bf16 tensors before every product, cost 1.3-1.4x the fp32 step).
  static bool bf16_native() {
#if TRAINKIT_HAS_ONEDNN
    return get_cpu_gemm_route() != cpu_gemm_route::openblas && cpu_features::current().bf16_arithmetic() &&
           onednn_supports<bfloat16>();
#else
    return false;
#endif
  }

  template <class T>
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, double beta, T* c, index_t ldc) {
    if (m == 0 || n == 0) return;
    ::trainkit::detail::start_wait_governor();
#if TRAINKIT_HAS_ONEDNN
    if constexpr (!std::is_same_v<T, double>) {
      const gemm_choice route = route_of<T>(m, n, k);
      bool onednn = route == gemm_choice::onednn;
      if constexpr (std::is_same_v<T, float>)
        if (route == gemm_choice::measured)
          onednn = measured_onednn(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      if (onednn && onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
    }
#endif
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {
      static_assert(floating_element<T>, "gemm needs a floating-point element type");
      // 16-bit floats without oneDNN (or TRAINKIT_CPU_GEMM=openblas): widen to fp32, multiply with
      // fp32 accumulation, round once.
      auto widen = [](const T* p, index_t rows, index_t cols, index_t ld) {
        std::vector<float> w(static_cast<std::size_t>(rows * cols));
        for (index_t i = 0; i < rows; ++i)
          for (index_t j = 0; j < cols; ++j) w[std::size_t(i * cols + j)] = static_cast<float>(p[i * ld + j]);
        return w;
      };
      const index_t ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k, bc = trans_b ? k : n;
      auto wa = widen(a, ar, ac, lda), wb = widen(b, br, bc, ldb);
      std::vector<float> wc = beta == 0.0 ? std::vector<float>(std::size_t(m * n)) : widen(c, m, n, ldc);
      gemm<float>(trans_a, trans_b, m, n, k, alpha, wa.data(), ac, wb.data(), bc, beta, wc.data(), n);
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) c[i * ldc + j] = static_cast<T>(wc[std::size_t(i * n + j)]);
    }
  }

 private:
#if TRAINKIT_HAS_ONEDNN
  /// The measured choice for this product: each route runs on a copy of C when beta is not 0.
  static bool measured_onednn(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const float* a,
                              index_t lda, const float* b, index_t ldb, double beta, float* c, index_t ldc) {
    char key[160];
    std::snprintf(key, sizeof key, "gemm f32 %c%c m%lld n%lld k%lld lda%lld ldb%lld ldc%lld beta%d t%d",
                  trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', (long long)m, (long long)n, (long long)k, (long long)lda,
                  (long long)ldb, (long long)ldc, beta == 0.0 ? 0 : 1, detail::route_threads());
    std::vector<float> scratch;
    return detail::route_table::get().choose(key, [&](bool onednn) {
      float* out = c;
      if (beta != 0.0) {
        scratch.assign(c, c + (m - 1) * ldc + n);
        out = scratch.data();
      }
      if (onednn) return onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc);
      openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc);
      return true;
    });
  }
#endif

  /// fp32/fp64 through OpenBLAS: as is when it threads through OpenMP, else single-threaded
  /// OpenBLAS calls split over OpenMP threads here.
  template <class T>
  static void openblas_gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const T* a,
                            index_t lda, const T* b, index_t ldb, double beta, T* c, index_t ldc) {
    if (detail::blas_threads_are_openmp()) {
      call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    detail::use_single_threaded_blas();
    // Split C along its longer side: each thread then re-packs only the smaller operand.
    const bool by_rows = m >= n;
    const index_t extent = by_rows ? m : n;
    const int nt = threads_for(double(m) * double(n) * double(k), extent);
    if (nt <= 1) {
      call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    const index_t chunk = ((extent + nt - 1) / nt + 15) / 16 * 16;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) num_threads(nt)
#endif
    for (int t = 0; t < nt; ++t) {
      const index_t i0 = std::min(extent, t * chunk), i1 = std::min(extent, i0 + chunk);
      if (i0 >= i1) continue;
      if (by_rows)
        call(trans_a, trans_b, i1 - i0, n, k, alpha, trans_a ? a + i0 : a + i0 * lda, lda, b, ldb, beta, c + i0 * ldc,
             ldc);
      else
        call(trans_a, trans_b, m, i1 - i0, k, alpha, a, lda, trans_b ? b + i0 * ldb : b + i0, ldb, beta, c + i0, ldc);
    }
  }

  /// Threads for a product of `work` multiply-adds whose split side has `extent` rows/columns:
  /// one inside a parallel region or for small products; at least 32 rows/columns per thread.
  static int threads_for(double work, index_t extent) {
#if TRAINKIT_HAS_OPENMP
    if (omp_in_parallel() || work < parallel_grain) return 1;
    return int(std::clamp<index_t>(extent / 32, 1, omp_get_max_threads()));
#else
    (void)work;
    (void)extent;
    return 1;
#endif
  }

  template <class T>
  static void call(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const T* a, index_t lda,
                   const T* b, index_t ldb, double beta, T* c, index_t ldc) {
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), float(alpha), a, int(lda), b, int(ldb), float(beta),
                  c, int(ldc));
    else
      cblas_dgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
  }
};

}  // namespace trainkit::backend
