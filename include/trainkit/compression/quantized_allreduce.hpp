// trainkit/compression/quantized_allreduce.hpp - the allreduce of a flat fp32 buffer through a gradient
// compression policy (docs/architecture.md, "Data parallel"; docs/compression.md):
//
//   worker:  x + worker residual --quantize--> W chunks   (worker residual = meant - sent)
//            alltoall: chunk j goes to rank j                     (the reduce-scatter phase)
//   server:  dequantize the W copies of my chunk, sum in fp32 (avg: / W), + server residual,
//            re-quantize                                          (server residual = meant - sent)
//            allgather of the re-quantized chunks
//   all:     dequantize every chunk
//
// Summing in fp32 between the two phases is what keeps it correct when the sum overflows the wire
// type (int8 values near 127 on every rank). Each rank sends 2(W-1) encoded chunks of ceil(n/W)
// elements - int8 ~1/4 and 1-bit ~1/32 (+ scales) of fp32's ring allreduce. Lengths are padded to
// W chunks of a multiple of the block, so any n works (n = 0 sends nothing). The work is done a
// tile of a few thousand elements at a time (in L1, over OpenMP threads), which relies on the
// policies' block-after-block wire layout (see gradient_compression).
#pragma once

#include <algorithm>  // std::min, std::max
#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/compression/codecs.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/reduce_op.hpp"

namespace trainkit::compression {

/// Scratch buffers of the quantized allreduce, kept between calls so that a training step
/// allocates nothing. One per thread that runs allreduces.
struct compress_workspace {
  std::vector<std::uint8_t> send, recv, gathered;
  std::vector<float> slice, padded;  // hierarchical<Comm>: this rank's slice, the bucket padded to whole slices
};

namespace detail {
template <class V>
auto* compress_grow(V& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

/// Elements per tile: the work of one chunk is done a tile at a time in buffers that stay in L1
/// (and tiles go to OpenMP threads), instead of pass after pass over buffers of megabytes.
constexpr index_t compress_tile(index_t block) { return block >= 2048 ? block : 2048 / block * block; }

/// Runs body(tile_index, scratch_a, scratch_b) for every tile in [0, tiles), with two scratch
/// buffers of `tile` floats per thread; parallel over OpenMP threads when there is enough work.
template <class Body>
void compress_for_tiles(index_t tiles, index_t tile, Body body) {
#if TRAINKIT_HAS_OPENMP
  if (tiles > 1 && tiles * tile >= compress_parallel_threshold) {
#pragma omp parallel
    {
      std::vector<float> a(static_cast<std::size_t>(tile)), b(static_cast<std::size_t>(tile));
#pragma omp for schedule(static)
      for (index_t t = 0; t < tiles; ++t) body(t, a.data(), b.data());
    }
    return;
  }
#endif
  std::vector<float> a(static_cast<std::size_t>(tile)), b(static_cast<std::size_t>(tile));
  for (index_t t = 0; t < tiles; ++t) body(t, a.data(), b.data());
}
/// Encodes meant[0, len) into wire and stores meant - sent for its first `valid` elements into
/// residual, through C::encode_residual (one pass) when the policy has it.
template <class C>
void compress_encode_feedback(float* meant, index_t len, index_t valid, std::uint8_t* wire, float* residual,
                              float* scratch) {
  if constexpr (requires { C::encode_residual(meant, len, wire, scratch); }) {
    if (valid == len) {
      C::encode_residual(meant, len, wire, residual);
    } else {
      C::encode_residual(meant, len, wire, scratch);
      std::copy(scratch, scratch + valid, residual);
    }
  } else {
    C::encode(meant, len, wire);
    if (valid == 0) return;
    C::decode(wire, len, scratch);
    compress_update_residual(meant, scratch, valid, residual);
  }
}
}  // namespace detail

/// What the quantized allreduce of n elements over world_size ranks sends from one rank, in bytes
/// (0 on one rank). For `none` it is what a ring allreduce sends: 2(W-1) fp32 chunks.
template <gradient_compression C>
constexpr std::uint64_t compressed_allreduce_bytes(index_t n, int world_size) {
  if (n == 0 || world_size <= 1) return 0;
  const index_t c = detail::compress_chunk(n, world_size, C::block);
  return 2ull * static_cast<std::uint64_t>(world_size - 1) * C::wire_bytes(c);
}

/// Collective: allreduce (sum or avg) of data[0, n) in place through compression c, with error
/// feedback under the key `bucket` (both residuals are c's state). A communicator with a member
/// compressed_allreduce(c, data, n, bucket, op, ws) does it its own way (compression::hierarchical). Every rank calls it with the
/// same n, bucket and op. Adds what this rank sent to c.counter(). For `none` (lossless), this is
/// comm.allreduce in fp32. On one rank the data is left as it is (nothing is sent, no rounding).
/// \param ws scratch; null uses a buffer of its own for this call
template <gradient_compression C, dist::communicator Comm>
void compressed_allreduce(Comm& comm, C& c, float* data, index_t n, std::size_t bucket, dist::reduce_op op = dist::reduce_op::sum,
                          compress_workspace* ws = nullptr) {
  if constexpr (requires { comm.compressed_allreduce(c, data, n, bucket, op, ws); }) {
    comm.compressed_allreduce(c, data, n, bucket, op, ws);  // a communicator with its own (hierarchical)
    return;
  }
  TRAINKIT_CHECK(op == dist::reduce_op::sum || op == dist::reduce_op::avg, value_error, "compressed_allreduce",
                 C::name << ": only sum and avg can go through compression, got " << to_string(op));
  TRAINKIT_CHECK(n >= 0, value_error, "compressed_allreduce", C::name << ": negative length " << n);
  const int w = comm.size();
  const std::uint64_t bytes = compressed_allreduce_bytes<C>(n, w);
  if (n == 0 || w == 1) {
    c.counter().add(0);
    return;
  }
  if constexpr (!C::lossy) {
    comm.allreduce(data, static_cast<std::size_t>(n), op).wait();
    c.counter().add(bytes);
    return;
  } else {
    compress_workspace local;
    compress_workspace& s = ws ? *ws : local;
    const int r = comm.rank();
    const index_t chunk = detail::compress_chunk(n, w, C::block);
    const index_t tile = std::min(detail::compress_tile(C::block), chunk);
    const index_t tiles_per_chunk = (chunk + tile - 1) / tile;
    const std::size_t cb = C::wire_bytes(chunk);
    const auto wz = static_cast<std::size_t>(w);
    std::uint8_t* send = detail::compress_grow(s.send, wz * cb);
    std::uint8_t* recv = detail::compress_grow(s.recv, wz * cb);
    std::uint8_t* gathered = detail::compress_grow(s.gathered, wz * cb);
    // Tile t of a chunk: elements [t * tile, + len) of it; its encoding starts wire_bytes(t * tile) in.
    auto tile_len = [&](index_t t) { return std::min(tile, chunk - t * tile); };

    // ---- worker: quantize x + residual tile by tile, keep what did not make it ---------------
    // Chunk j holds elements [j * chunk, (j + 1) * chunk) of the buffer padded with zeros to W chunks.
    float* wres = c.feedback().worker(bucket, n);
    detail::compress_for_tiles(tiles_per_chunk * w, tile, [&](index_t k, float* meant, float* sent) {
      const index_t j = k / tiles_per_chunk, t = k % tiles_per_chunk, len = tile_len(t);
      const index_t lo = j * chunk + t * tile, valid = std::clamp<index_t>(n - lo, 0, len);
      for (index_t i = 0; i < valid; ++i) meant[i] = data[lo + i] + wres[lo + i];
      std::fill(meant + valid, meant + len, 0.0f);
      std::uint8_t* wire = send + static_cast<std::size_t>(j) * cb + C::wire_bytes(t * tile);
      detail::compress_encode_feedback<C>(meant, len, valid, wire, wres + lo, sent);
    });
    comm.alltoall(send, recv, cb).wait();

    // ---- server: the W copies of my chunk, summed in fp32, re-quantized with feedback ----------
    const index_t mine_valid = std::clamp<index_t>(n - r * chunk, 0, chunk);
    float* sres = c.feedback().server(bucket, chunk);
    std::uint8_t* mine = send;  // the send buffer is free once the alltoall is complete
    const float scale = op == dist::reduce_op::avg ? 1.0f / static_cast<float>(w) : 1.0f;
    detail::compress_for_tiles(tiles_per_chunk, tile, [&](index_t t, float* acc, float* tmp) {
      const index_t len = tile_len(t), lo = t * tile, valid = std::clamp<index_t>(mine_valid - lo, 0, len);
      const std::size_t off = C::wire_bytes(lo);
      std::fill(acc, acc + len, 0.0f);
      for (int i = 0; i < w; ++i) {
        const std::uint8_t* in = recv + static_cast<std::size_t>(i) * cb + off;
        if constexpr (requires { C::decode_add(in, len, acc); }) {
          C::decode_add(in, len, acc);
        } else {
          C::decode(in, len, tmp);
          for (index_t e = 0; e < valid; ++e) acc[e] += tmp[e];
        }
      }
      std::fill(acc + valid, acc + len, 0.0f);  // the padding stays 0
      for (index_t e = 0; e < valid; ++e) acc[e] = acc[e] * scale + sres[lo + e];
      detail::compress_encode_feedback<C>(acc, len, valid, mine + off, sres + lo, tmp);
    });
    comm.allgather(mine, cb, gathered).wait();

    // ---- everyone: dequantize the reduced chunks -------------------------------------------------
    detail::compress_for_tiles(tiles_per_chunk * w, tile, [&](index_t k, float* tmp, float*) {
      const index_t j = k / tiles_per_chunk, t = k % tiles_per_chunk, len = tile_len(t);
      const index_t lo = j * chunk + t * tile, valid = std::clamp<index_t>(n - lo, 0, len);
      if (valid == 0) return;
      const std::uint8_t* wire = gathered + static_cast<std::size_t>(j) * cb + C::wire_bytes(t * tile);
      if (valid == len) {
        C::decode(wire, len, data + lo);
      } else {
        C::decode(wire, len, tmp);
        std::copy(tmp, tmp + valid, data + lo);
      }
    });
    c.counter().add(bytes);
  }
}

}  // namespace trainkit::compression
