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
#include <utility>  // std::pair
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/compression/codecs.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::compression {

/// Scratch buffers of the quantized allreduce, kept between calls so that a training step
/// allocates nothing. One per thread that runs allreduces.
struct compress_workspace {
  std::vector<std::uint8_t> send, recv, gathered;
  std::vector<float> slice, padded;  // hierarchical<Comm>: this rank's slice, the bucket padded to whole slices
  std::vector<dist::work> works;     // the pieces' collectives in flight
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
/// poll() is called every few tiles, by one thread only (the collectives in flight are tested
/// there: their handles are not shared between threads). The scratch is each thread's own and kept
/// between calls: the pipelined allreduce makes three calls per piece.
template <class Body, class Poll>
void compress_for_tiles(index_t tiles, index_t tile, Body body, Poll poll) {
  constexpr index_t poll_every = 8;
  auto scratch = [tile] {
    thread_local std::vector<float> a, b;
    if (a.size() < static_cast<std::size_t>(tile)) {
      a.resize(static_cast<std::size_t>(tile));
      b.resize(static_cast<std::size_t>(tile));
    }
    return std::pair<float*, float*>(a.data(), b.data());
  };
#if TRAINKIT_HAS_OPENMP
  if (tiles > 1 && tiles * tile >= compress_parallel_threshold) {
    ::trainkit::detail::start_wait_governor();
#pragma omp parallel
    {
      const auto [a, b] = scratch();
      const bool polls = omp_get_thread_num() == 0;
#pragma omp for schedule(static)
      for (index_t t = 0; t < tiles; ++t) {
        body(t, a, b);
        if (polls && t % poll_every == poll_every - 1) poll();
      }
    }
    return;
  }
#endif
  const auto [a, b] = scratch();
  for (index_t t = 0; t < tiles; ++t) {
    body(t, a, b);
    if (t % poll_every == poll_every - 1) poll();
  }
}

/// The quantized allreduce's pieces (see compressed_allreduce): a chunk of `chunk` elements is cut
/// into `count` pieces of `piece` elements (the last one shorter), whole blocks, each at most
/// compress_piece_wire bytes on the wire per rank and compress_piece_elements elements, in at most
/// compress_max_pieces pieces. Small messages because of how MPI moves them: Open MPI sends up to
/// 64 KiB (its TCP eager limit) at once, a larger one only after a round trip with the receiver,
/// which happens when that one is inside an MPI call - the 25 MiB allreduce on 2 hosts at 1 Gbit/s
/// reached 54 % of the link's bound in 64 KiB pieces (bf16) and 96 % in 32 KiB ones.
struct compress_pieces {
  index_t piece, count;
};
inline constexpr std::size_t compress_piece_wire = std::size_t(1) << 15;
inline constexpr index_t compress_piece_elements = index_t(1) << 18;
inline constexpr index_t compress_max_pieces = 1024;
template <class C>
constexpr compress_pieces compress_split(index_t chunk) {
  const auto by_wire = static_cast<index_t>((C::wire_bytes(chunk) + compress_piece_wire - 1) / compress_piece_wire);
  const index_t by_elements = (chunk + compress_piece_elements - 1) / compress_piece_elements;
  const index_t wanted = std::clamp<index_t>(std::max(by_wire, by_elements), 1, compress_max_pieces);
  const index_t piece = (chunk / C::block + wanted - 1) / wanted * C::block;
  return {piece, (chunk + piece - 1) / piece};
}
/// Below this many elements `none` takes the communicator's own allreduce (one collective; the
/// pipeline pays off only where the transfer dominates).
inline constexpr index_t compress_pipeline_min = index_t(1) << 16;

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
/// compressed_allreduce(c, data, n, bucket, op, ws) does it its own way (compression::hierarchical).
/// Every rank calls it with the same n, bucket and op. Adds what this rank sent to c.counter().
/// For `none` (lossless) it is an fp32 allreduce: comm.allreduce below compress_pipeline_min
/// elements, above it the same pipelined alltoall + allgather as the codecs (every rank sends and
/// receives 2(W-1)/W of the buffer at once, where a reduce-then-broadcast allreduce - Open MPI's
/// choice on 2 and 3 ranks - sends it twice one way after the other). On one rank the data is
/// left as it is (nothing is sent, no rounding).
///
/// The pipeline: each rank's chunk is cut into pieces of whole blocks (detail::compress_split), and
/// piece p's alltoall and allgather are collectives of their own, so that while piece p is on the
/// wire the next one is encoded and the one before is summed or decoded:
///
///   step s:  encode piece s, alltoall(s)  |  wait alltoall(s-1), sum, re-encode, allgather(s-1)
///            |  wait allgather(s-2), decode
///
/// Between tiles the compute loops test the collectives in flight (MPI moves bytes only inside its
/// calls). Every element is encoded, summed (ranks 0..W-1 in order) and decoded exactly as in one
/// piece, so the bytes and both residuals do not depend on the pieces.
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
    if (n < detail::compress_pipeline_min) {
      comm.allreduce(data, static_cast<std::size_t>(n), op).wait();
      c.counter().add(bytes);
      return;
    }
  }
  compress_workspace local;
  compress_workspace& s = ws ? *ws : local;
  const int r = comm.rank();
  const index_t chunk = detail::compress_chunk(n, w, C::block);
  const auto [piece, pieces] = detail::compress_split<C>(chunk);
  const index_t tile = std::min(detail::compress_tile(C::block), piece);
  const auto wz = static_cast<std::size_t>(w);
  std::uint8_t* send = detail::compress_grow(s.send, wz * C::wire_bytes(chunk));
  std::uint8_t* recv = detail::compress_grow(s.recv, wz * C::wire_bytes(chunk));
  std::uint8_t* gathered = detail::compress_grow(s.gathered, wz * C::wire_bytes(chunk));
  float* wres = nullptr;
  float* sres = nullptr;
  if constexpr (C::lossy) {
    wres = c.feedback().worker(bucket, n);
    sres = c.feedback().server(bucket, chunk);
  }
  // Piece p: elements [p * piece, + plen(p)) of every chunk. Its bytes in send, recv and gathered
  // start at region(p); within it, chunk j's encoding starts at j * part(p).
  auto plen = [&](index_t p) { return std::min(piece, chunk - p * piece); };
  auto region = [&](index_t p) { return wz * C::wire_bytes(p * piece); };
  auto part = [&](index_t p) { return C::wire_bytes(plen(p)); };
  auto tiles_of = [&](index_t p) { return (plen(p) + tile - 1) / tile; };
  // The collectives in flight, in issue order: alltoall of piece p at 2p, allgather at 2p + 1.
  std::vector<dist::work>& works = s.works;
  works.assign(static_cast<std::size_t>(2 * pieces), dist::work{});
  std::size_t oldest = 0;  // works before it are complete
  auto poll = [&] {
    while (oldest < works.size() && works[oldest].done()) ++oldest;
  };
  const float scale = op == dist::reduce_op::avg ? 1.0f / static_cast<float>(w) : 1.0f;

  // ---- worker: quantize x + residual, keep what did not make it; chunk j goes to rank j ---------
  // Chunk j holds elements [j * chunk, (j + 1) * chunk) of the buffer padded with zeros to W chunks.
  auto encode_piece = [&](index_t p) {
    const index_t tp = tiles_of(p), base = p * piece;
    std::uint8_t* out = send + region(p);
    detail::compress_for_tiles(tp * w, tile, [&](index_t k, float* meant, float* sent) {
      const index_t j = k / tp, t = k % tp, len = std::min(tile, plen(p) - t * tile);
      const index_t lo = j * chunk + base + t * tile, valid = std::clamp<index_t>(n - lo, 0, len);
      std::uint8_t* wire = out + static_cast<std::size_t>(j) * part(p) + C::wire_bytes(t * tile);
      if constexpr (C::lossy) {
        for (index_t i = 0; i < valid; ++i) meant[i] = data[lo + i] + wres[lo + i];
        std::fill(meant + valid, meant + len, 0.0f);
        detail::compress_encode_feedback<C>(meant, len, valid, wire, wres + lo, sent);
      } else if (valid == len) {
        C::encode(data + lo, len, wire);
      } else {
        std::copy(data + lo, data + lo + valid, meant);
        std::fill(meant + valid, meant + len, 0.0f);
        C::encode(meant, len, wire);
      }
    }, poll);
    works[static_cast<std::size_t>(2 * p)] = comm.alltoall(out, recv + region(p), part(p));
  };

  // ---- server: the W copies of my chunk's piece, summed in fp32, re-quantized with feedback -----
  auto reduce_piece = [&](index_t p) {
    works[static_cast<std::size_t>(2 * p)].wait();
    const index_t base = p * piece, mine_valid = std::clamp<index_t>(n - r * chunk - base, 0, plen(p));
    const std::uint8_t* in = recv + region(p);
    std::uint8_t* mine = send + region(p);  // piece p's send bytes are free once its alltoall is complete
    detail::compress_for_tiles(tiles_of(p), tile, [&](index_t t, float* acc, float* tmp) {
      const index_t lo = t * tile, len = std::min(tile, plen(p) - lo), valid = std::clamp<index_t>(mine_valid - lo, 0, len);
      const std::size_t off = C::wire_bytes(lo);
      std::fill(acc, acc + len, 0.0f);
      for (int i = 0; i < w; ++i) {
        const std::uint8_t* from = in + static_cast<std::size_t>(i) * part(p) + off;
        if constexpr (requires { C::decode_add(from, len, acc); }) {
          C::decode_add(from, len, acc);
        } else {
          C::decode(from, len, tmp);
          for (index_t e = 0; e < valid; ++e) acc[e] += tmp[e];
        }
      }
      std::fill(acc + valid, acc + len, 0.0f);  // the padding stays 0
      if constexpr (C::lossy) {
        float* res = sres + base + lo;
        for (index_t e = 0; e < valid; ++e) acc[e] = acc[e] * scale + res[e];
        detail::compress_encode_feedback<C>(acc, len, valid, mine + off, res, tmp);
      } else {
        if (op == dist::reduce_op::avg)
          for (index_t e = 0; e < valid; ++e) acc[e] = dist::detail::finish<float>(op, acc[e], w);
        C::encode(acc, len, mine + off);
      }
    }, poll);
    works[static_cast<std::size_t>(2 * p + 1)] = comm.allgather(mine, part(p), gathered + region(p));
  };

  // ---- everyone: dequantize the reduced chunks' piece ---------------------------------------------
  auto decode_piece = [&](index_t p) {
    works[static_cast<std::size_t>(2 * p + 1)].wait();
    const index_t tp = tiles_of(p), base = p * piece;
    const std::uint8_t* in = gathered + region(p);
    detail::compress_for_tiles(tp * w, tile, [&](index_t k, float* tmp, float*) {
      const index_t j = k / tp, t = k % tp, len = std::min(tile, plen(p) - t * tile);
      const index_t lo = j * chunk + base + t * tile, valid = std::clamp<index_t>(n - lo, 0, len);
      if (valid == 0) return;
      const std::uint8_t* wire = in + static_cast<std::size_t>(j) * part(p) + C::wire_bytes(t * tile);
      if (valid == len) {
        C::decode(wire, len, data + lo);
      } else {
        C::decode(wire, len, tmp);
        std::copy(tmp, tmp + valid, data + lo);
      }
    }, poll);
  };

  for (index_t step = 0; step < pieces + 2; ++step) {
    if (step < pieces) encode_piece(step);
    if (step >= 1 && step <= pieces) reduce_piece(step - 1);
    if (step >= 2) decode_piece(step - 2);
  }
  c.counter().add(bytes);
}

}  // namespace trainkit::compression
