// trainkit/backend/cuda/multi_tensor.cuh - multi_tensor<cuda>: unscaling with one found-inf flag,
// the total 2-norm and clipping over many gradients at once (contract in backend/multi_tensor.hpp).
//
// Up to max_tensors pointers and sizes go in the kernel's arguments; blockIdx.y picks the tensor,
// the x blocks stride over it. The norm sums each (tensor, block) into its own slot, then one
// block adds the slots in index order: the same gradients give the same norm bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "trainkit/backend/cuda/allocator.cuh"
#include "trainkit/backend/cuda/block_reduce.cuh"
#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/multi_tensor.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit::backend {

namespace gpu::detail {

inline constexpr int mt_max_tensors = 48;
inline constexpr index_t mt_max_blocks = 128;  // x blocks per tensor, when a launch has many tensors

/// x blocks per tensor for a launch over k tensors of at most `most` elements: enough for the
/// tensor, and up to a full device of resident blocks shared by the k tensors (at least
/// mt_max_blocks each), so that one large tensor (a 4096 x 4096 weight's gradient) is spread over
/// every multiprocessor instead of 128 blocks.
inline index_t mt_blocks_per_tensor(index_t most, int k) {
  const device_info& d = current_device_info();
  const index_t resident = index_t(d.multiprocessors) * std::max(1, d.max_threads_per_multiprocessor / block_threads);
  const index_t cap = std::max(mt_max_blocks, resident / std::max(1, k));
  return std::clamp<index_t>((most + block_threads - 1) / block_threads, 1, cap);
}

template <class P>
struct tensor_batch {
  P data[mt_max_tensors];
  index_t numel[mt_max_tensors];
};

template <class T>
__global__ void __launch_bounds__(block_threads) mt_unscale_kernel(tensor_batch<T*> b, float inv, float* found) {
  using C = compute_t<T>;
  T* p = b.data[blockIdx.y];
  const index_t n = b.numel[blockIdx.y];
  bool bad = false;
  for (index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x; i < n;
       i += index_t(gridDim.x) * block_threads) {
    const C x = static_cast<C>(p[i]);
    bad = bad || !(x - x == C(0));
    p[i] = static_cast<T>(x * C(inv));
  }
  if (bad) *found = 1.0f;  // every writer writes the same value
}

template <class T, class A>
__global__ void __launch_bounds__(block_threads) mt_sum_squares_kernel(tensor_batch<const T*> b, A* partial) {
  using C = compute_t<T>;
  __shared__ A smem[block_threads / 32];
  const T* p = b.data[blockIdx.y];
  const index_t n = b.numel[blockIdx.y];
  A s = A(0);
  for (index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x; i < n;
       i += index_t(gridDim.x) * block_threads) {
    const A x = static_cast<A>(static_cast<C>(p[i]));
    s += x * x;
  }
  s = group_allreduce<block_threads>(s, sum_op{}, smem);
  if (threadIdx.x == 0) partial[index_t(blockIdx.y) * gridDim.x + blockIdx.x] = s;
}

template <class A>
__global__ void __launch_bounds__(block_threads) mt_finish_norm_kernel(const A* partial, index_t n, A* out) {
  __shared__ A smem[block_threads / 32];
  A s = A(0);
  for (index_t i = threadIdx.x; i < n; i += block_threads) s += partial[i];
  s = group_allreduce<block_threads>(s, sum_op{}, smem);
  if (threadIdx.x == 0) *out = ::sqrt(s);  // float or double overload
}

template <class T, class A>
__global__ void __launch_bounds__(block_threads) mt_clip_kernel(tensor_batch<T*> b, const A* norm, double max_norm) {
  using C = compute_t<T>;
  const double coef = max_norm / (static_cast<double>(*norm) + 1e-6);  // clip_grad_norm_'s, in double
  if (!(coef < 1.0 || coef != coef)) return;
  T* p = b.data[blockIdx.y];
  const index_t n = b.numel[blockIdx.y];
  for (index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x; i < n;
       i += index_t(gridDim.x) * block_threads)
    p[i] = static_cast<T>(static_cast<C>(p[i]) * C(coef));
}

/// Calls f(batch, count, grid) for each group of up to mt_max_tensors non-empty tensors.
template <class P, class F>
void for_each_batch(P const* data, const index_t* numel, std::size_t n, F&& f) {
  tensor_batch<P> b{};
  int k = 0;
  index_t most = 0;
  auto flush = [&] {
    if (k == 0) return;
    const index_t gx = mt_blocks_per_tensor(most, k);
    f(b, k, dim3(unsigned(gx), unsigned(k)));
    k = 0;
    most = 0;
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (numel[i] == 0) continue;
    b.data[k] = data[i];
    b.numel[k] = numel[i];
    most = std::max(most, numel[i]);
    if (++k == mt_max_tensors) flush();
  }
  flush();
}

}  // namespace gpu::detail

template <>
struct multi_tensor<cuda> {
  static constexpr bool fused = true;

  template <class T>
  static void unscale(T* const* data, const index_t* numel, std::size_t n, float inv_scale, float* found_inf) {
    namespace d = gpu::detail;
    const cudaStream_t st = gpu::current_stream();
    d::for_each_batch(data, numel, n, [&](const d::tensor_batch<T*>& b, int, dim3 grid) {
      d::mt_unscale_kernel<T><<<grid, d::block_threads, 0, st>>>(b, inv_scale, found_inf);
      gpu::check_launch("mt_unscale_kernel");
    });
  }

  template <class T>
  static void norm2(const T* const* data, const index_t* numel, std::size_t n, multi_tensor_acc_t<T>* out) {
    namespace d = gpu::detail;
    using A = multi_tensor_acc_t<T>;
    const cudaStream_t st = gpu::current_stream();
    // Slots: one per (tensor, x block) of every launch, in launch order.
    index_t slots = 0;
    d::for_each_batch(data, numel, n,
                      [&](const d::tensor_batch<const T*>&, int k, dim3 grid) { slots += index_t(k) * grid.x; });
    auto partial = tensor<A, cuda>::empty({std::max<index_t>(slots, 1)});
    A* const base = partial.data();
    index_t at = 0;
    d::for_each_batch(data, numel, n, [&](const d::tensor_batch<const T*>& b, int k, dim3 grid) {
      d::mt_sum_squares_kernel<T, A><<<grid, d::block_threads, 0, st>>>(b, base + at);
      gpu::check_launch("mt_sum_squares_kernel");
      at += index_t(k) * grid.x;
    });
    d::mt_finish_norm_kernel<A><<<1, d::block_threads, 0, st>>>(base, slots, out);
    gpu::check_launch("mt_finish_norm_kernel");
  }

  template <class T>
  static void clip(T* const* data, const index_t* numel, std::size_t n, const multi_tensor_acc_t<T>* norm,
                   double max_norm) {
    namespace d = gpu::detail;
    using A = multi_tensor_acc_t<T>;
    const cudaStream_t st = gpu::current_stream();
    d::for_each_batch(data, numel, n, [&](const d::tensor_batch<T*>& b, int, dim3 grid) {
      d::mt_clip_kernel<T, A><<<grid, d::block_threads, 0, st>>>(b, norm, max_norm);
      gpu::check_launch("mt_clip_kernel");
    });
  }
};

}  // namespace trainkit::backend
