// trainkit/compression/codecs.cuh - the gradient-compression codecs of compression/codecs.hpp on
// device buffers: the same wire format and the same TRAINKIT_HD functors
// (compression/detail/kernels.hpp), so a GPU encodes exactly the bytes the host does.
//
//   gpu::compress_encode<C>(x, n, wire)   x: n device floats, wire: C::wire_bytes(n) device bytes
//   gpu::compress_decode<C>(wire, n, y)
// for C = compression::none, fp16, bf16, int8_block<B>, sign_1bit_block<B>; asynchronous on the current
// stream. The 16-bit codecs run one thread per element; the block codecs one warp per block,
// folding it in the host's order (the scale of a 1-bit block is a float sum whose rounding
// depends on that order), so the bytes agree bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/compression/codecs.hpp"
#include "trainkit/compression/detail/kernels.hpp"

namespace trainkit::compression::gpu {

using backend::gpu::check;
using backend::gpu::check_launch;
using backend::gpu::current_stream;

namespace detail {

using backend::gpu::detail::block_threads;
using backend::gpu::detail::divmod;
using backend::gpu::detail::grid_for;

template <class Fn>
__global__ void __launch_bounds__(block_threads) compress_encode16_kernel(const float* x, index_t n, std::uint8_t* w,
                                                                          Fn fn) {
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= n) return;
  const std::uint16_t b = fn(x[i]);
  w[2 * i] = static_cast<std::uint8_t>(b & 0xffu);  // little-endian bytes: a run may start at any byte
  w[2 * i + 1] = static_cast<std::uint8_t>(b >> 8);
}
template <class Fn>
__global__ void __launch_bounds__(block_threads) compress_decode16_kernel(const std::uint8_t* w, index_t n, float* y,
                                                                          Fn fn) {
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= n) return;
  y[i] = fn(static_cast<std::uint16_t>(w[2 * i] | (unsigned(w[2 * i + 1]) << 8)));
}

__device__ __forceinline__ void store_scale(std::uint8_t* p, float s) {
  const auto b = trainkit::detail::bit_cast<std::uint32_t>(s);
  for (int k = 0; k < 4; ++k) p[k] = static_cast<std::uint8_t>(b >> (8 * k));
}
__device__ __forceinline__ float load_scale(const std::uint8_t* p) {
  std::uint32_t b = 0;
  for (int k = 0; k < 4; ++k) b |= std::uint32_t(p[k]) << (8 * k);
  return trainkit::detail::bit_cast<float>(b);
}

/// Blocks a kernel block encodes: one warp each.
inline constexpr int codec_blocks_per_kernel_block = block_threads / 32;

// int8: one warp per block. max |x| is an integer max (the same whatever the order) and each
// element is quantized alone, so the bytes are the host's; the lanes read and write consecutive
// elements (coalesced), where one thread per block walked it serially.
template <int = 0>
__global__ void __launch_bounds__(block_threads) compress_encode_int8_kernel(const float* x, index_t nb, index_t B,
                                                                             std::uint8_t* w) {
  namespace dd = ::trainkit::compression::detail;
  const index_t b = index_t(blockIdx.x) * codec_blocks_per_kernel_block + index_t(threadIdx.x / 32);
  const int lane = int(threadIdx.x % 32);
  if (b >= nb) return;  // the whole warp: b is the warp's
  const float* xb = x + b * B;
  std::uint8_t* ob = w + b * (4 + B);
  std::int32_t m = 0;
  for (index_t i = lane; i < B; i += 32) {
    const std::int32_t v = trainkit::detail::bit_cast<std::int32_t>(xb[i]) & 0x7fffffff;
    m = v > m ? v : m;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const std::int32_t o = __shfl_xor_sync(0xffffffffu, m, off);
    m = o > m ? o : m;
  }
  const bool finite = m < 0x7f800000;
  const float absmax = trainkit::detail::bit_cast<float>(m);
  const float scale = dd::compress_int8_scale_fn{}(absmax, finite);
  if (lane == 0) store_scale(ob, scale);
  auto* q = reinterpret_cast<std::int8_t*>(ob + 4);
  if (scale > 0.0f) {
    const dd::compress_int8_quantize_fn quant{127.0f / absmax};
    for (index_t i = lane; i < B; i += 32) q[i] = quant(xb[i]);
  } else {
    for (index_t i = lane; i < B; i += 32) q[i] = 0;
  }
}
template <int = 0>
__global__ void __launch_bounds__(block_threads) compress_decode_int8_kernel(const std::uint8_t* w, index_t n,
                                                                             index_t B, float* y) {
  namespace dd = ::trainkit::compression::detail;
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= n) return;
  index_t b = i;
  const index_t j = divmod(b, B);
  const std::uint8_t* ib = w + b * (4 + B);
  y[i] = dd::compress_int8_dequantize_fn{load_scale(ib)}(static_cast<std::int8_t>(ib[4 + j]));
}

// 1-bit: one warp per block. The scale is a float sum whose rounding depends on its order: lane j < 8
// folds the host's partial sum s[j] (elements j, j + 8, ... in turn) and lane 0 combines the eight
// in the host's order; the sign bytes are independent, one per lane at a time.
template <int = 0>
__global__ void __launch_bounds__(block_threads) compress_encode_sign_kernel(const float* x, index_t nb, index_t B,
                                                                             std::uint8_t* w) {
  namespace dd = ::trainkit::compression::detail;
  const index_t b = index_t(blockIdx.x) * codec_blocks_per_kernel_block + index_t(threadIdx.x / 32);
  const int lane = int(threadIdx.x % 32);
  if (b >= nb) return;  // the whole warp
  const float* xb = x + b * B;
  std::uint8_t* ob = w + b * (4 + B / 8);
  float part = 0.0f;  // lane j < 8: the host's s[j] (B is a multiple of 8)
  if (lane < 8)
    for (index_t i = 0; i + 8 <= B; i += 8) part += xb[i + lane] < 0.0f ? -xb[i + lane] : xb[i + lane];
  float s[8];
  for (int j = 0; j < 8; ++j) s[j] = __shfl_sync(0xffffffffu, part, j);
  if (lane == 0) {
    const float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    store_scale(ob, dd::compress_sign_scale_fn{}(sum, B));
  }
  for (index_t k = lane; k < B / 8; k += 32) {
    unsigned byte = 0;
    for (int j = 0; j < 8; ++j) byte |= static_cast<unsigned>(dd::compress_sign_bit_fn{}(xb[8 * k + j])) << j;
    ob[4 + k] = static_cast<std::uint8_t>(byte);
  }
}
template <int = 0>
__global__ void __launch_bounds__(block_threads) compress_decode_sign_kernel(const std::uint8_t* w, index_t n,
                                                                             index_t B, float* y) {
  namespace dd = ::trainkit::compression::detail;
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= n) return;
  index_t b = i;
  const index_t j = divmod(b, B);
  const std::uint8_t* ib = w + b * (4 + B / 8);
  const int bit = (ib[4 + j / 8] >> (j % 8)) & 1;
  y[i] = dd::compress_sign_decode_fn{load_scale(ib)}(bit);
}

template <class C>
inline constexpr bool is_int8_block = false;
template <index_t B>
inline constexpr bool is_int8_block<compression::int8_block<B>> = true;
template <class C>
inline constexpr bool is_sign_block = false;
template <index_t B>
inline constexpr bool is_sign_block<compression::sign_1bit_block<B>> = true;

}  // namespace detail

/// Encodes n device floats into C's wire format in device memory (n a multiple of C::block).
template <class C>
void compress_encode(const float* x, index_t n, std::uint8_t* wire) {
  namespace d = detail;
  TRAINKIT_CHECK(n >= 0 && n % C::block == 0, value_error, "compress_encode<cuda>",
                 C::name << ": n = " << n << " is not a multiple of the block " << C::block);
  if (n == 0) return;
  const cudaStream_t st = current_stream();
  if constexpr (std::is_same_v<C, compression::none>) {
    check(cudaMemcpyAsync(wire, x, std::size_t(n) * 4, cudaMemcpyDeviceToDevice, st), "cudaMemcpyAsync");
  } else if constexpr (std::is_same_v<C, compression::fp16> || std::is_same_v<C, compression::bf16>) {
    using Fn = std::conditional_t<std::is_same_v<C, compression::fp16>, compression::detail::compress_fp16_encode_fn,
                                  compression::detail::compress_bf16_encode_fn>;
    d::compress_encode16_kernel<<<d::grid_for(n, d::block_threads), d::block_threads, 0, st>>>(x, n, wire, Fn{});
  } else if constexpr (d::is_int8_block<C>) {
    const index_t nb = n / C::block;
    d::compress_encode_int8_kernel<><<<d::grid_for(nb, d::codec_blocks_per_kernel_block), d::block_threads, 0, st>>>(
        x, nb, C::block, wire);
  } else {
    static_assert(d::is_sign_block<C>, "compress_encode<cuda>: an unknown codec");
    const index_t nb = n / C::block;
    d::compress_encode_sign_kernel<><<<d::grid_for(nb, d::codec_blocks_per_kernel_block), d::block_threads, 0, st>>>(
        x, nb, C::block, wire);
  }
  check_launch("compress_encode kernel");
}

/// Decodes C's wire format (device memory) into n device floats.
template <class C>
void compress_decode(const std::uint8_t* wire, index_t n, float* y) {
  namespace d = detail;
  TRAINKIT_CHECK(n >= 0 && n % C::block == 0, value_error, "compress_decode<cuda>",
                 C::name << ": n = " << n << " is not a multiple of the block " << C::block);
  if (n == 0) return;
  const cudaStream_t st = current_stream();
  if constexpr (std::is_same_v<C, compression::none>) {
    check(cudaMemcpyAsync(y, wire, std::size_t(n) * 4, cudaMemcpyDeviceToDevice, st), "cudaMemcpyAsync");
  } else if constexpr (std::is_same_v<C, compression::fp16> || std::is_same_v<C, compression::bf16>) {
    using Fn = std::conditional_t<std::is_same_v<C, compression::fp16>, compression::detail::compress_fp16_decode_fn,
                                  compression::detail::compress_bf16_decode_fn>;
    d::compress_decode16_kernel<<<d::grid_for(n, d::block_threads), d::block_threads, 0, st>>>(wire, n, y, Fn{});
  } else if constexpr (d::is_int8_block<C>) {
    d::compress_decode_int8_kernel<><<<d::grid_for(n, d::block_threads), d::block_threads, 0, st>>>(wire, n, C::block, y);
  } else {
    static_assert(d::is_sign_block<C>, "compress_decode<cuda>: an unknown codec");
    d::compress_decode_sign_kernel<><<<d::grid_for(n, d::block_threads), d::block_threads, 0, st>>>(wire, n, C::block, y);
  }
  check_launch("compress_decode kernel");
}

}  // namespace trainkit::compression::gpu
