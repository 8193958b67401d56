// trainkit/backend/cuda/pool.cuh - pool<cuda>: max and average pooling as our own kernels.
//
// Not cuDNN: the pooling family keeps the argmax of every window (what max_pool2d's backward
// scatters through), and cuDNN's pooling backward wants x and y instead; its NaN and tie rules
// also differ from the host's (first NaN wins, first maximum wins). The backward passes are
// gathers - each input element sums the outputs whose window picked it (max) or covers it
// (average) - so they are deterministic and need no atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/pool.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

namespace gpu::detail {

template <class T>
__global__ void __launch_bounds__(block_threads) max_pool_forward_kernel(pool2d_geometry g, index_t total, const T* x,
                                                                         T* y, std::int64_t* argmax) {
  using C = compute_t<T>;
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= total) return;
  index_t q = i;
  const index_t ow = divmod(q, g.out_w), oh = divmod(q, g.out_h), p = q;
  const T* xp = x + p * g.height * g.width;
  const index_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
  const index_t hs = h0 > 0 ? h0 : 0, he = h0 + g.kernel_h < g.height ? h0 + g.kernel_h : g.height;
  const index_t ws = w0 > 0 ? w0 : 0, we = w0 + g.kernel_w < g.width ? w0 + g.kernel_w : g.width;
  C best = -std::numeric_limits<C>::infinity();
  index_t at = hs * g.width + ws;
  for (index_t h = hs; h < he; ++h)
    for (index_t w = ws; w < we; ++w) {
      const C v = C(xp[h * g.width + w]);
      if (v > best || (v != v && best == best)) {
        best = v;
        at = h * g.width + w;
      }
    }
  y[i] = T(best);
  argmax[i] = at;
}

template <class T>
__global__ void __launch_bounds__(block_threads) max_pool_backward_kernel(pool2d_geometry g, index_t total, const T* gy,
                                                                          const std::int64_t* argmax, T* gx) {
  using C = compute_t<T>;
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= total) return;
  index_t q = i;
  const index_t w = divmod(q, g.width), h = divmod(q, g.height), p = q;
  const index_t plane_out = p * g.out_h * g.out_w;
  const index_t me = h * g.width + w;
  // Windows that contain (h, w): oh * stride - pad <= h < oh * stride - pad + kernel.
  const index_t oh0 = h + g.pad_h - g.kernel_h + 1 > 0 ? (h + g.pad_h - g.kernel_h + 1 + g.stride_h - 1) / g.stride_h : 0;
  const index_t oh1 = (h + g.pad_h) / g.stride_h < g.out_h - 1 ? (h + g.pad_h) / g.stride_h : g.out_h - 1;
  const index_t ow0 = w + g.pad_w - g.kernel_w + 1 > 0 ? (w + g.pad_w - g.kernel_w + 1 + g.stride_w - 1) / g.stride_w : 0;
  const index_t ow1 = (w + g.pad_w) / g.stride_w < g.out_w - 1 ? (w + g.pad_w) / g.stride_w : g.out_w - 1;
  C acc = C(0);
  for (index_t oh = oh0; oh <= oh1; ++oh)
    for (index_t ow = ow0; ow <= ow1; ++ow) {
      const index_t k = plane_out + oh * g.out_w + ow;
      if (argmax[k] == me) acc = C(acc + C(gy[k]));
    }
  gx[i] = T(acc);
}

template <class T>
__global__ void __launch_bounds__(block_threads) avg_pool_forward_kernel(pool2d_geometry g, index_t total, const T* x,
                                                                         T* y) {
  using C = compute_t<T>;
  using A = accumulate_t<T>;
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= total) return;
  index_t q = i;
  const index_t ow = divmod(q, g.out_w), oh = divmod(q, g.out_h), p = q;
  const T* xp = x + p * g.height * g.width;
  const index_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
  const index_t hs = h0 > 0 ? h0 : 0, he = h0 + g.kernel_h < g.height ? h0 + g.kernel_h : g.height;
  const index_t ws = w0 > 0 ? w0 : 0, we = w0 + g.kernel_w < g.width ? w0 + g.kernel_w : g.width;
  A s = A(0);
  for (index_t h = hs; h < he; ++h)
    for (index_t w = ws; w < we; ++w) s += A(C(xp[h * g.width + w]));
  y[i] = T(s * (A(1) / A(g.kernel_h * g.kernel_w)));
}

template <class T>
__global__ void __launch_bounds__(block_threads) avg_pool_backward_kernel(pool2d_geometry g, index_t total, const T* gy,
                                                                          T* gx) {
  using C = compute_t<T>;
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= total) return;
  index_t q = i;
  const index_t w = divmod(q, g.width), h = divmod(q, g.height), p = q;
  const C inv = C(1) / C(g.kernel_h * g.kernel_w);
  const index_t oh0 = h + g.pad_h - g.kernel_h + 1 > 0 ? (h + g.pad_h - g.kernel_h + 1 + g.stride_h - 1) / g.stride_h : 0;
  const index_t oh1 = (h + g.pad_h) / g.stride_h < g.out_h - 1 ? (h + g.pad_h) / g.stride_h : g.out_h - 1;
  const index_t ow0 = w + g.pad_w - g.kernel_w + 1 > 0 ? (w + g.pad_w - g.kernel_w + 1 + g.stride_w - 1) / g.stride_w : 0;
  const index_t ow1 = (w + g.pad_w) / g.stride_w < g.out_w - 1 ? (w + g.pad_w) / g.stride_w : g.out_w - 1;
  const T* gyp = gy + p * g.out_h * g.out_w;
  C acc = C(0);
  for (index_t oh = oh0; oh <= oh1; ++oh)
    for (index_t ow = ow0; ow <= ow1; ++ow) acc = C(acc + C(gyp[oh * g.out_w + ow]) * inv);
  gx[i] = T(acc);
}

}  // namespace gpu::detail

/// Pooling on the GPU (contract in backend/pool.hpp); one thread per output (forward) or per
/// input element (backward), asynchronous on the current stream.
template <>
struct pool<cuda> {
  template <class T>
  static void max_forward(const pool2d_geometry& g, index_t planes, const T* x, T* y, std::int64_t* argmax) {
    launch(planes * g.out_h * g.out_w, [&](unsigned grid, cudaStream_t st, index_t total) {
      gpu::detail::max_pool_forward_kernel<T><<<grid, gpu::detail::block_threads, 0, st>>>(g, total, x, y, argmax);
      gpu::check_launch("max_pool_forward_kernel");
    });
  }
  template <class T>
  static void max_backward(const pool2d_geometry& g, index_t planes, const T* gy, const std::int64_t* argmax, T* gx) {
    launch(planes * g.height * g.width, [&](unsigned grid, cudaStream_t st, index_t total) {
      gpu::detail::max_pool_backward_kernel<T><<<grid, gpu::detail::block_threads, 0, st>>>(g, total, gy, argmax, gx);
      gpu::check_launch("max_pool_backward_kernel");
    });
  }
  template <class T>
  static void avg_forward(const pool2d_geometry& g, index_t planes, const T* x, T* y) {
    launch(planes * g.out_h * g.out_w, [&](unsigned grid, cudaStream_t st, index_t total) {
      gpu::detail::avg_pool_forward_kernel<T><<<grid, gpu::detail::block_threads, 0, st>>>(g, total, x, y);
      gpu::check_launch("avg_pool_forward_kernel");
    });
  }
  template <class T>
  static void avg_backward(const pool2d_geometry& g, index_t planes, const T* gy, T* gx) {
    launch(planes * g.height * g.width, [&](unsigned grid, cudaStream_t st, index_t total) {
      gpu::detail::avg_pool_backward_kernel<T><<<grid, gpu::detail::block_threads, 0, st>>>(g, total, gy, gx);
      gpu::check_launch("avg_pool_backward_kernel");
    });
  }

 private:
  template <class F>
  static void launch(index_t total, F&& f) {
    if (total <= 0) return;
    f(gpu::detail::grid_for(total, gpu::detail::block_threads), gpu::current_stream(), total);
  }
};

}  // namespace trainkit::backend
