// trainkit/backend/cpu/elementwise.hpp - the strided loop on the host, parallel with OpenMP.
#pragma once

#include <algorithm>  // std::min
#include <array>
#include <cstddef>
#include <utility>

#include "trainkit/backend/cpu/convert16.hpp"  // float <-> half runs on F16C
#include "trainkit/backend/elementwise.hpp"
#include "trainkit/config.hpp"

namespace trainkit::backend {

template <>
struct elementwise<cpu> {
  /// Below this many elements a parallel region costs more than it saves.
  static constexpr index_t parallel_grain = 32768;

  template <class F, class... P>
  static void for_each(shape sizes, std::array<shape, sizeof...(P)> strides, F f, P*... ptrs) {
    constexpr std::size_t N = sizeof...(P);
    const index_t total = numel(sizes);
    if (total == 0) return;
    detail::coalesce<N>(sizes, strides);
    const std::size_t nd = sizes.size();
    const index_t inner = sizes[nd - 1];
    const index_t rows = total / inner;
    std::array<index_t, N> inner_stride;
    for (std::size_t k = 0; k < N; ++k) inner_stride[k] = strides[k][nd - 1];
    bool unit = true;
    for (std::size_t k = 0; k < N; ++k) unit = unit && inner_stride[k] == 1;

    auto run_rows = [&](index_t r0, index_t r1) {
      for (index_t r = r0; r < r1; ++r) {
        // Offset of row r in each operand: decompose r over the outer dimensions.
        std::array<index_t, N> off{};
        index_t rem = r;
        for (std::size_t d = nd - 1; d-- > 0;) {
          const index_t i = rem % sizes[d];
          rem /= sizes[d];
          for (std::size_t k = 0; k < N; ++k) off[k] += i * strides[k][d];
        }
        run_inner(f, inner, off, inner_stride, unit, std::index_sequence_for<P...>{}, ptrs...);
      }
    };

    if (total < parallel_grain) {
      run_rows(0, rows);
      return;
    }
    if (rows == 1) {
      // One long run: split it into chunks so every thread gets a piece.
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel
      {
        const index_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        const index_t chunk = (inner + nt - 1) / nt;
        const index_t b = std::min(inner, t * chunk), e = std::min(inner, b + chunk);
        std::array<index_t, N> off;
        for (std::size_t k = 0; k < N; ++k) off[k] = b * inner_stride[k];
        if (e > b) run_inner(f, e - b, off, inner_stride, unit, std::index_sequence_for<P...>{}, ptrs...);
      }
#else
      run_rows(0, 1);
#endif
      return;
    }
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (index_t r = 0; r < rows; ++r) run_rows(r, r + 1);
  }

  /// f(first[i], g[i], rest[i]...) over n dense elements, where g is `second` rounded to bfloat16
  /// values: each block of `second` is rounded onto the stack (8 lanes with AVX2) and f's loop
  /// reads it there, still in L1. For an optimizer's update of a gradient whose rounding was
  /// deferred to it (var::grad_rounding_deferred): rounding it inside f's loop kept that loop from
  /// vectorising (GCC unswitches an update's flags only while the loop is small).
  template <class F, class... P>
  static void for_each_rounding_second(index_t n, const F& f, float* first, const float* second, P*... rest) {
    constexpr index_t block = 2048;
    constexpr std::size_t N = 2 + sizeof...(P);
    const index_t blocks = (n + block - 1) / block;
    auto run = [&](index_t k) {
      alignas(64) float r[block];
      const index_t b = k * block, len = std::min(block, n - b);
      cpu_convert::round_to_bfloat16_values(second + b, r, len);
      run_inner(f, len, std::array<index_t, N>{}, std::array<index_t, N>{}, true, std::make_index_sequence<N>{},
                first + b, static_cast<const float*>(r), (rest + b)...);
    };
    if (n < parallel_grain) {
      for (index_t k = 0; k < blocks; ++k) run(k);
      return;
    }
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (index_t k = 0; k < blocks; ++k) run(k);
  }

 private:
  template <class F, std::size_t N, std::size_t... I, class... P>
  static void run_inner(F& f, index_t n, const std::array<index_t, N>& off, const std::array<index_t, N>& st,
                        bool unit, std::index_sequence<I...>, P*... ptrs) {
    if (unit) {
      if constexpr (cpu_convert::has_bulk<F, P...>) {
        cpu_convert::run_bulk(f, n, (ptrs + off[I])...);
        return;
      }
#if TRAINKIT_CPU_F16C_DISPATCH
      if (cpu_convert::has_avx2()) return run_unit_avx2(f, n, (ptrs + off[I])...);
#endif
      run_unit(f, n, (ptrs + off[I])...);
    } else {
      for (index_t i = 0; i < n; ++i) f(ptrs[off[I] + i * st[I]]...);
    }
  }

  // A local copy of the functor: its fields (an optimizer's rates, a scale) are floats that a
  // float store through the operands could alias for all the compiler knows, so read through a
  // reference they would be reloaded per element and the loop would stay scalar; a copy on this
  // stack frame cannot be aliased, and the loop vectorises.
  template <class F, class... P>
  static void run_unit(const F& f, index_t n, P*... p) {
    const F local = f;
#if TRAINKIT_HAS_OPENMP
#pragma omp simd
#endif
    for (index_t i = 0; i < n; ++i) local(p[i]...);
  }
#if TRAINKIT_CPU_F16C_DISPATCH
  // The same loop on 8 AVX2 lanes: the same operations (no FMA is enabled, so none is contracted),
  // the same bits, half the instructions of the baseline's SSE2 lanes. A functor the compiler
  // cannot vectorise (a call in it: std::sqrt may set errno) brings its own lanes: f.lanes8(p...)
  // does elements [0, 8) with the scalar operator's bits (optim::detail::adam_update).
  template <class F, class... P>
  [[gnu::target("avx2")]] static void run_unit_avx2(const F& f, index_t n, P*... p) {
    const F local = f;
    if constexpr (requires { local.lanes8(p...); }) {
      index_t i = 0;
      for (; i + 8 <= n; i += 8) local.lanes8((p + i)...);
      for (; i < n; ++i) local(p[i]...);
    } else {
#if TRAINKIT_HAS_OPENMP
#pragma omp simd
#endif
      for (index_t i = 0; i < n; ++i) local(p[i]...);
    }
  }
#endif
};

}  // namespace trainkit::backend
