// trainkit/backend/cuda/launch.cuh - what the kernels of the CUDA backend share: launch sizes,
// vectors for 16-byte accesses, a register tuple for operand packs, and offset calculators that
// turn a linear index into per-operand offsets of a strided view.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend::gpu::detail {

/// Threads per block of the elementwise and reduction kernels.
inline constexpr int block_threads = 256;
/// Dimensions an offset calculator handles (after coalescing); more are split on the host.
inline constexpr int max_dims = 8;

inline unsigned grid_for(index_t work_items, index_t per_block) {
  const index_t g = (work_items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<index_t>(g, 1, index_t(0x7fffffff)));
}

/// K elements of T loaded or stored as one access (16 bytes or less, naturally aligned).
template <class T, int K>
struct alignas(sizeof(T) * K <= 16 ? sizeof(T) * K : 16) vec {
  T v[K];
};

/// A minimal tuple that works in device code (std::tuple's members are host-only in places).
template <std::size_t I, class T>
struct tuple_leaf {
  T value;
};
template <class Seq, class... T>
struct tuple_impl;
template <std::size_t... I, class... T>
struct tuple_impl<std::index_sequence<I...>, T...> : tuple_leaf<I, T>... {};
template <class... T>
using dtuple = tuple_impl<std::index_sequence_for<T...>, T...>;
template <std::size_t I, class T>
__host__ __device__ __forceinline__ T& get(tuple_leaf<I, T>& l) {
  return l.value;
}

/// q / d and q % d for non-negative 64-bit values, in 32-bit arithmetic when both fit (GPU
/// integer division is emulated; the 32-bit one is about a third of the 64-bit cost).
__device__ __forceinline__ index_t divmod(index_t& q, index_t d) {
  if (((q | d) >> 32) == 0) {
    const auto uq = static_cast<std::uint32_t>(q), ud = static_cast<std::uint32_t>(d);
    const std::uint32_t quot = uq / ud;
    q = quot;
    return static_cast<index_t>(uq - quot * ud);
  }
  const index_t quot = q / d;
  const index_t r = q - quot * d;
  q = quot;
  return r;
}

/// Offsets of N operands for a row-major linear index over `dims` dimensions.
template <int N>
struct offset_calc {
  int dims = 0;
  index_t sizes[max_dims] = {};
  index_t strides[N > 0 ? N : 1][max_dims] = {};

  __device__ __forceinline__ void get(index_t linear, index_t (&off)[N > 0 ? N : 1]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = dims - 1; d >= 0; --d) {
      const index_t i = d > 0 ? divmod(linear, sizes[d]) : linear;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }
};

template <int N>
offset_calc<N> make_offset_calc(const shape& sizes, const std::array<shape, std::size_t(N)>& strides) {
  offset_calc<N> c;
  c.dims = static_cast<int>(sizes.size());
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    c.sizes[d] = sizes[d];
    for (int k = 0; k < N; ++k) c.strides[k][d] = strides[std::size_t(k)][d];
  }
  return c;
}

/// True when p is aligned to `bytes`.
__host__ __device__ inline bool aligned(const void* p, std::size_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace trainkit::backend::gpu::detail
