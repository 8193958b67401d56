// trainkit/backend/cuda/softmax.cuh - softmax<cuda>: softmax / log_softmax on the GPU (contract in
// backend/softmax.hpp). A warp (short rows) or a block (long rows) per row when the softmax dim is
// contiguous, else a thread per column; every reduction has a fixed order, so results repeat.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <limits>

#include "trainkit/backend/cuda/block_reduce.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/softmax.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

namespace gpu::detail {

// ---- softmax ---------------------------------------------------------------------------------

template <int G, class T>
__global__ void __launch_bounds__(block_threads) softmax_row_kernel(const T* x, index_t outer, index_t dim, bool log,
                                                                    T* y) {
  using C = compute_t<T>;
  using A = accumulate_t<T>;
  __shared__ C smem_c[block_threads / 32];
  __shared__ A smem_a[block_threads / 32];
  constexpr int groups = block_threads / G;
  const index_t o = index_t(blockIdx.x) * groups + int(threadIdx.x) / G;
  const int lane = int(threadIdx.x) % G;
  const bool active = o < outer;
  const T* p = x + (active ? o : 0) * dim;
  C mx = -std::numeric_limits<C>::infinity();
  if (active)
    for (index_t d = lane; d < dim; d += G) mx = max_op{}(mx, C(p[d]));
  mx = group_allreduce<G>(mx, max_op{}, smem_c);
  if (!(mx > -std::numeric_limits<C>::infinity())) mx = C(0);  // all -inf (or NaN): as the host
  A sum = 0;
  if (active)
    for (index_t d = lane; d < dim; d += G) sum += A(dexp(C(p[d]) - mx));
  sum = group_allreduce<G>(sum, sum_op{}, smem_a);
  if (!active) return;
  T* q = y + o * dim;
  if (log) {
    const C lse = mx + C(dlog(sum));
    for (index_t d = lane; d < dim; d += G) q[d] = T(C(p[d]) - lse);
  } else {
    const C inv = C(1) / C(sum);
    for (index_t d = lane; d < dim; d += G) q[d] = T(T(dexp(C(p[d]) - mx)) * inv);
  }
}

template <class T>
__global__ void __launch_bounds__(block_threads) softmax_column_kernel(const T* x, index_t outer, index_t dim,
                                                                       index_t inner, bool log, T* y) {
  using C = compute_t<T>;
  using A = accumulate_t<T>;
  const index_t t = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (t >= outer * inner) return;
  const index_t o = t / inner, i = t % inner;
  const T* base = x + o * dim * inner + i;
  T* out = y + o * dim * inner + i;
  C mx = -std::numeric_limits<C>::infinity();
  for (index_t d = 0; d < dim; ++d) mx = max_op{}(mx, C(base[d * inner]));
  if (!(mx > -std::numeric_limits<C>::infinity())) mx = C(0);
  A sum = 0;
  for (index_t d = 0; d < dim; ++d) sum += A(dexp(C(base[d * inner]) - mx));
  if (log) {
    const C ls = C(dlog(sum));
    for (index_t d = 0; d < dim; ++d) out[d * inner] = T(C(base[d * inner]) - mx - ls);
  } else {
    for (index_t d = 0; d < dim; ++d) out[d * inner] = T(C(T(dexp(C(base[d * inner]) - mx))) / C(sum));
  }
}

template <int G, class T>
__global__ void __launch_bounds__(block_threads) softmax_backward_row_kernel(const T* y, const T* g, index_t outer,
                                                                             index_t dim, bool log, T* dx) {
  using C = compute_t<T>;
  using A = accumulate_t<T>;
  __shared__ A smem[block_threads / 32];
  constexpr int groups = block_threads / G;
  const index_t o = index_t(blockIdx.x) * groups + int(threadIdx.x) / G;
  const int lane = int(threadIdx.x) % G;
  const bool active = o < outer;
  const index_t base = (active ? o : 0) * dim;
  A dot = 0;
  if (active)
    for (index_t d = lane; d < dim; d += G) dot += log ? A(g[base + d]) : A(C(g[base + d]) * C(y[base + d]));
  dot = group_allreduce<G>(dot, sum_op{}, smem);
  if (!active) return;
  for (index_t d = lane; d < dim; d += G) {
    const index_t k = base + d;
    dx[k] = log ? T(C(g[k]) - dexp(C(y[k])) * C(dot)) : T(C(y[k]) * (C(g[k]) - C(dot)));
  }
}

template <class T>
__global__ void __launch_bounds__(block_threads) softmax_backward_column_kernel(const T* y, const T* g, index_t outer,
                                                                                index_t dim, index_t inner, bool log,
                                                                                T* dx) {
  using C = compute_t<T>;
  using A = accumulate_t<T>;
  const index_t t = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (t >= outer * inner) return;
  const index_t o = t / inner, i = t % inner;
  const index_t base = o * dim * inner + i;
  A dot = 0;
  for (index_t d = 0; d < dim; ++d) {
    const index_t k = base + d * inner;
    dot += log ? A(g[k]) : A(C(g[k]) * C(y[k]));
  }
  for (index_t d = 0; d < dim; ++d) {
    const index_t k = base + d * inner;
    dx[k] = log ? T(C(g[k]) - dexp(C(y[k])) * C(dot)) : T(C(y[k]) * (C(g[k]) - C(dot)));
  }
}

}  // namespace gpu::detail

template <>
struct softmax<cuda> {
  template <class T>
  static void forward(const T* x, index_t outer, index_t dim, index_t inner, bool log, T* y) {
    namespace d = gpu::detail;
    if (outer * dim * inner == 0) return;
    const cudaStream_t st = gpu::current_stream();
    if (inner == 1) {
      if (dim >= 1024)
        d::softmax_row_kernel<d::block_threads, T><<<d::grid_for(outer, 1), d::block_threads, 0, st>>>(x, outer, dim,
                                                                                                      log, y);
      else
        d::softmax_row_kernel<32, T><<<d::grid_for(outer, d::block_threads / 32), d::block_threads, 0, st>>>(
            x, outer, dim, log, y);
      gpu::check_launch("softmax_row_kernel");
      return;
    }
    d::softmax_column_kernel<T><<<d::grid_for(outer * inner, d::block_threads), d::block_threads, 0, st>>>(
        x, outer, dim, inner, log, y);
    gpu::check_launch("softmax_column_kernel");
  }

  template <class T>
  static void backward(const T* y, const T* g, index_t outer, index_t dim, index_t inner, bool log, T* dx) {
    namespace d = gpu::detail;
    if (outer * dim * inner == 0) return;
    const cudaStream_t st = gpu::current_stream();
    if (inner == 1) {
      if (dim >= 1024)
        d::softmax_backward_row_kernel<d::block_threads, T><<<d::grid_for(outer, 1), d::block_threads, 0, st>>>(
            y, g, outer, dim, log, dx);
      else
        d::softmax_backward_row_kernel<32, T><<<d::grid_for(outer, d::block_threads / 32), d::block_threads, 0, st>>>(
            y, g, outer, dim, log, dx);
      gpu::check_launch("softmax_backward_row_kernel");
      return;
    }
    d::softmax_backward_column_kernel<T><<<d::grid_for(outer * inner, d::block_threads), d::block_threads, 0, st>>>(
        y, g, outer, dim, inner, log, dx);
    gpu::check_launch("softmax_backward_column_kernel");
  }

 private:
};

}  // namespace trainkit::backend
