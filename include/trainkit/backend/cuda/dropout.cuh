// trainkit/backend/cuda/dropout.cuh - dropout<cuda>::mask: the dropout mask from the Philox stream,
// bit for bit the host's (core/generator.hpp's stream rule: value i from block offset + i / 4).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/dropout.hpp"
#include "trainkit/core/generator.hpp"

namespace trainkit::backend {

namespace gpu::detail {
/// One thread per Philox block: four mask values from its four words.
template <class T>
__global__ void __launch_bounds__(block_threads) dropout_mask_kernel(std::uint64_t seed, std::uint64_t offset, index_t n,
                                                                     float keep, T on, T off, T* out) {
  const index_t b = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (4 * b >= n) return;
  const philox_result r = philox_block(seed, offset + std::uint64_t(b));
  if (4 * b + 4 <= n && sizeof(T) * 4 <= 16 && aligned(out + 4 * b, sizeof(T) * 4)) {
    vec<T, 4> v;
#pragma unroll
    for (int k = 0; k < 4; ++k) v.v[k] = uniform_float(r.v[k]) < keep ? on : off;
    *reinterpret_cast<vec<T, 4>*>(out + 4 * b) = v;
    return;
  }
  for (int k = 0; k < 4 && 4 * b + k < n; ++k) out[4 * b + k] = uniform_float(r.v[k]) < keep ? on : off;
}
}  // namespace gpu::detail

/// The dropout mask on the GPU (contract in backend/dropout.hpp); asynchronous on the current stream.
template <>
struct dropout<cuda> {
  template <class T>
  static void mask(std::uint64_t seed, std::uint64_t offset, index_t n, float keep, double scale, T* out) {
    namespace d = gpu::detail;
    if (n <= 0) return;
    const index_t blocks = (n + 3) / 4;
    d::dropout_mask_kernel<T><<<d::grid_for(blocks, d::block_threads), d::block_threads, 0, gpu::current_stream()>>>(
        seed, offset, n, keep, T(scale), T(0), out);
    gpu::check_launch("dropout_mask_kernel");
  }
};

}  // namespace trainkit::backend
