// trainkit/backend/cuda/block_reduce.cuh - the warp and block reductions of the row-wise kernels
// (layer norm, softmax): a butterfly over a warp's lanes, then across the block's warps through
// shared memory, in a fixed order so results repeat bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

namespace trainkit::backend::gpu::detail {

// trainkit::exp / trainkit::log (the tensor ops) hide the global math functions here.
template <class A>
__device__ __forceinline__ A dexp(A x) {
  if constexpr (std::is_same_v<A, float>) return ::expf(x);
  else return ::exp(x);
}
template <class A>
__device__ __forceinline__ A dlog(A x) {
  if constexpr (std::is_same_v<A, float>) return ::logf(x);
  else return ::log(x);
}

struct sum_op {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};
/// std::max's rule (a NaN second operand is skipped), as the host softmax uses it.
struct max_op {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a < b ? b : a;
  }
};

/// Reduction over a group of G threads (G = 32: a warp; G = block_threads: the block); every
/// thread of the group gets the result. smem: block_threads / 32 values, unused for G = 32.
template <int G, class A, class Op>
__device__ __forceinline__ A group_allreduce(A v, Op op, A* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (G > 32) {
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    __syncthreads();  // smem may still be read by a previous call
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = smem[0];
#pragma unroll
    for (int w = 1; w < G / 32; ++w) v = op(v, smem[w]);
  }
  return v;
}

}  // namespace trainkit::backend::gpu::detail
