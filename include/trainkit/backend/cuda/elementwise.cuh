// trainkit/backend/cuda/elementwise.cuh - elementwise<cuda>::for_each: the strided N-ary loop of
// every map, apply_, copy_, fill_, cast and fused optimizer update, as a CUDA kernel that calls the
// same TRAINKIT_HD functors as the host loop.
//
// Dims are coalesced first (backend/elementwise.hpp). A dense run of aligned operands takes the
// fast path: each thread loads 4 vectors of K elements per operand (16-byte accesses; K = 16 /
// the smallest element size), calls the functor on the registers and stores the operands it may
// have changed. Operands that need no store: const ones, those the functor takes by const
// reference or by value, and the output of the assign/cast/fill functors of core/assign.hpp,
// which is not even loaded. Everything else (broadcast strides, views) runs the strided kernel,
// which decomposes each linear index into per-operand offsets; work beyond 2^31 elements or
// max_dims dims is split on the host.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <type_traits>
#include <utility>

#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/elementwise.hpp"
#include "trainkit/core/assign.hpp"  // the assign/update/cast functors recognised below
#include "trainkit/core/functors.hpp"

namespace trainkit::backend {

namespace gpu::detail {

/// True when F overwrites its first operand without reading it (so the fast path skips loading it).
template <class F>
inline constexpr bool first_is_output_only = false;
template <class F, class Out, class... In>
inline constexpr bool first_is_output_only<::trainkit::detail::assign_fn<F, Out, In...>> = true;
template <class To, class From>
inline constexpr bool first_is_output_only<::trainkit::detail::cast_fn<To, From>> = true;
template <class S, class T>
inline constexpr bool first_is_output_only<::trainkit::detail::update_fn<functors::fill_value<S>, T>> = true;

/// Argument types for probing F with an rvalue (read-only use) at position I.
template <std::size_t I, std::size_t J, class P>
using probe_arg = std::conditional_t<I == J, std::remove_const_t<P>&&, std::remove_const_t<P>&>;

template <class F, std::size_t I, class Seq, class... P>
struct reads_only_impl;
template <class F, std::size_t I, std::size_t... J, class... P>
struct reads_only_impl<F, I, std::index_sequence<J...>, P...> {
  using PI = std::tuple_element_t<I, std::tuple<P...>>;
  // const operand, or a parameter that binds an rvalue (const T&, by value): never written back.
  static constexpr bool value = std::is_const_v<PI> || std::is_invocable_v<const F&, probe_arg<I, J, P>...>;
};
template <class F, std::size_t I, class... P>
inline constexpr bool reads_only = reads_only_impl<F, I, std::index_sequence_for<P...>, P...>::value;

inline constexpr int ew_unroll = 4;  // vectors per operand and thread in flight

template <class... P>
constexpr int ew_vector_elems() {
  constexpr std::size_t smallest = std::min({sizeof(P)...});
  return static_cast<int>(16 / smallest > 16 ? 16 : (16 / smallest < 1 ? 1 : 16 / smallest));
}

template <int K, class F, class... P, std::size_t... I>
__device__ __forceinline__ void ew_dense_body(index_t first_vec, index_t nvec, const F& f,
                                              std::index_sequence<I...>, P*... p) {
  constexpr int U = ew_unroll;
  constexpr bool out_only = first_is_output_only<F>;
  dtuple<vec<std::remove_const_t<P>, K>[U]...> r;
  // Issue every load before the first use: several independent 16-byte loads per thread in flight.
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const index_t v = first_vec + index_t(u) * block_threads;
    if (v < nvec) {
      ((void)((out_only && I == 0) ? 0
                                   : (get<I>(r)[u] = reinterpret_cast<const vec<std::remove_const_t<P>, K>*>(p)[v], 0)),
       ...);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int j = 0; j < K; ++j) f(get<I>(r)[u].v[j]...);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const index_t v = first_vec + index_t(u) * block_threads;
    if (v < nvec) {
      (
          [&] {
            if constexpr (!reads_only<F, I, P...>)
              reinterpret_cast<vec<std::remove_const_t<P>, K>*>(const_cast<std::remove_const_t<P>*>(p))[v] =
                  get<I>(r)[u];
          }(),
          ...);
    }
  }
}

template <int K, class F, class... P>
__global__ void __launch_bounds__(block_threads) ew_dense_kernel(index_t n, F f, P*... p) {
  const index_t nvec = n / K;
  const index_t first = index_t(blockIdx.x) * (block_threads * ew_unroll) + threadIdx.x;
  ew_dense_body<K>(first, nvec, f, std::index_sequence_for<P...>{}, p...);
  // The last n % K elements, one per thread of the first block.
  if (blockIdx.x == 0) {
    const index_t t = nvec * K + threadIdx.x;
    if (threadIdx.x < K && t < n) f(p[t]...);
  }
}

template <int N, class F, class... P, std::size_t... I>
__device__ __forceinline__ void ew_strided_one(index_t i, const offset_calc<N>& oc, const F& f,
                                               std::index_sequence<I...>, P*... p) {
  index_t off[N];
  oc.get(i, off);
  f(p[off[I]]...);
}

template <int N, class F, class... P>
__global__ void __launch_bounds__(block_threads) ew_strided_kernel(index_t n, offset_calc<N> oc, F f, P*... p) {
  index_t i = index_t(blockIdx.x) * (block_threads * ew_unroll) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < ew_unroll; ++u, i += block_threads)
    if (i < n) ew_strided_one<N>(i, oc, f, std::index_sequence_for<P...>{}, p...);
}

inline std::string ew_context(const shape& sizes) {
  std::ostringstream os;
  os << "elementwise kernel over sizes " << to_string(sizes);
  return os.str();
}

}  // namespace gpu::detail

/// The CUDA model of the strided loop (see backend/elementwise.hpp for the contract). Runs on
/// the current stream and returns at once; the functor is copied to the device by value.
template <>
struct elementwise<cuda> {
  template <class F, class... P>
  static void for_each(shape sizes, std::array<shape, sizeof...(P)> strides, F f, P*... ptrs) {
    static_assert(std::is_trivially_copyable_v<F>, "elementwise<cuda>: the functor is copied to the device");
    constexpr std::size_t N = sizeof...(P);
    if (numel(sizes) == 0) return;
    detail::coalesce<N>(sizes, strides);
    bool dense = sizes.size() == 1;
    for (std::size_t k = 0; k < N && dense; ++k) dense = strides[k][0] == 1;
    if (dense) {
      run_dense(sizes[0], f, ptrs...);
      return;
    }
    run_strided(sizes, strides, f, ptrs...);
  }

 private:
  template <class F, class... P>
  static void run_dense(index_t n, const F& f, P*... ptrs) {
    namespace g = gpu::detail;
    constexpr int K = g::ew_vector_elems<P...>();
    const bool vectorisable = (g::aligned(ptrs, alignof(g::vec<std::remove_const_t<P>, K>)) && ...);
    const cudaStream_t st = gpu::current_stream();
    if (vectorisable && K > 1) {
      const index_t nvec = n / K;
      const unsigned grid = g::grid_for(std::max<index_t>(nvec, 1), index_t(g::block_threads) * g::ew_unroll);
      g::ew_dense_kernel<K><<<grid, g::block_threads, 0, st>>>(n, f, ptrs...);
      gpu::check_launch("ew_dense_kernel", g::ew_context({n}));
      return;
    }
    run_strided({n}, std::array<shape, sizeof...(P)>{((void)ptrs, shape{1})...}, f, ptrs...);
  }

  template <class F, class... P>
  static void run_strided(const shape& sizes, const std::array<shape, sizeof...(P)>& strides, const F& f,
                          P*... ptrs) {
    namespace g = gpu::detail;
    constexpr int N = int(sizeof...(P));
    constexpr index_t limit = index_t(1) << 31;
    const index_t n = numel(sizes);
    if (n == 0) return;
    if (n >= limit || sizes.size() > std::size_t(g::max_dims)) {
      // Split along dim 0: each piece is a view with shifted pointers and fewer elements.
      const index_t inner = n / sizes[0];
      const index_t step = sizes.size() > std::size_t(g::max_dims) ? 1 : std::max<index_t>(1, (limit - 1) / inner);
      for (index_t s0 = 0; s0 < sizes[0]; s0 += step) {
        shape sub = sizes;
        sub[0] = std::min(step, sizes[0] - s0);
        std::array<index_t, sizeof...(P)> shift;
        for (std::size_t k = 0; k < sizeof...(P); ++k) shift[k] = s0 * strides[k][0];
        if (sub[0] == 1 && sub.size() > 1) {
          shape rest(sub.begin() + 1, sub.end());
          std::array<shape, sizeof...(P)> rst;
          for (std::size_t k = 0; k < sizeof...(P); ++k) rst[k] = shape(strides[k].begin() + 1, strides[k].end());
          run_shifted(rest, rst, f, shift, std::index_sequence_for<P...>{}, ptrs...);
        } else {
          run_shifted(sub, strides, f, shift, std::index_sequence_for<P...>{}, ptrs...);
        }
      }
      return;
    }
    const auto oc = g::make_offset_calc<N>(sizes, strides);
    const unsigned grid = g::grid_for(n, index_t(g::block_threads) * g::ew_unroll);
    g::ew_strided_kernel<N><<<grid, g::block_threads, 0, gpu::current_stream()>>>(n, oc, f, ptrs...);
    gpu::check_launch("ew_strided_kernel", g::ew_context(sizes));
  }

  template <class F, std::size_t... I, class... P>
  static void run_shifted(const shape& sizes, const std::array<shape, sizeof...(P)>& strides, const F& f,
                          const std::array<index_t, sizeof...(P)>& shift, std::index_sequence<I...>, P*... ptrs) {
    run_strided(sizes, strides, f, (ptrs + shift[I])...);
  }
};

}  // namespace trainkit::backend
