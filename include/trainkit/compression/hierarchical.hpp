// trainkit/compression/hierarchical.hpp - a communicator over several hosts that compresses only the hop
// between hosts (docs/architecture.md, "Data parallel").
//
//   dist::mpi world;
//   auto comm = compression::hierarchical<dist::mpi>::by_host(std::move(world));  // MPI_COMM_TYPE_SHARED
//   parallel::data_parallel<compression::hierarchical<dist::mpi>, compression::int8> ddp(comm, model);
//
// The compressed allreduce of a bucket of n fp32 values on H hosts of L ranks each (W = H L):
//   1. reduce-scatter inside the host, fp32 (shared memory): local rank l holds the host's sum of
//      its 1 / L of the bucket;
//   2. the compressed allreduce (compression/quantized_allreduce.hpp, with error feedback on this hop
//      only) of that part among the H ranks of local index l, one per host - every rank of a host
//      takes a part, so the host's link carries L concurrent streams and no rank idles;
//   3. allgather inside the host, fp32: every rank gets the whole bucket (avg: / W).
// The bucket goes through in pieces (of L x 256 Ki elements or more, at most max_pieces), so that
// steps 1 and 3 of one piece run while step 2 of the next one waits on the link.
// Per rank, the inter-host bytes are 1 / L of a flat compressed allreduce's over W ranks, and
// nothing is quantized twice inside a host. With `none` the same path runs in fp32 (the usual
// hierarchical allreduce, e.g. NCCL's tree/ring across nodes).
//
// Every other collective (broadcast, allgather, fp32 allreduce ...) runs on the world
// communicator, so hierarchical<Comm> is itself a dist::communicator. All hosts must have the
// same number of ranks (checked at construction). The error-feedback residuals are those of the
// slices this rank reduces: they are marked (error_feedback::set_layout("hierarchical")), and a
// resume on another world size refuses them with a clear error instead of redistributing them as
// flat ones.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/compression/codecs.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/compression/quantized_allreduce.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::compression {

/// The ranks of a job seen three ways: world; local (the ranks of this host); cross (the ranks of
/// this local index, one per host). See the top of this file.
template <dist::communicator Comm>
class hierarchical {
 public:
  /// From the three communicators of this rank (moved in): local.rank() is this rank's index on
  /// its host, cross.rank() its host's index. value_error when the hosts hold different numbers
  /// of ranks or the sizes do not multiply to world.size() (a collective over world).
  hierarchical(Comm world, Comm local, Comm cross)
      : world_(std::move(world)), local_(std::move(local)), cross_(std::move(cross)) {
    std::int64_t mine[2] = {local_.size(), -static_cast<std::int64_t>(local_.size())};
    world_.allreduce(mine, 2, dist::reduce_op::max).wait();
    TRAINKIT_CHECK(mine[0] == -mine[1] && static_cast<std::int64_t>(local_.size()) * cross_.size() == world_.size(),
                   value_error, "hierarchical",
                   "every host must hold the same number of ranks: ranks per host range from "
                       << -mine[1] << " to " << mine[0] << ", " << cross_.size() << " host(s), world size "
                       << world_.size() << " (rank " << world_.rank() << ")");
  }

  /// world split by host: Comm::split_shared() (MPI_COMM_TYPE_SHARED for dist::mpi) gives the
  /// local communicator, Comm::split(local rank, world rank) the cross one.
  static hierarchical by_host(Comm world)
    requires requires(Comm& c) {
      { c.split_shared() } -> std::same_as<Comm>;
      { c.split(0, 0) } -> std::same_as<Comm>;
    }
  {
    Comm local = world.split_shared();
    Comm cross = world.split(local.rank(), world.rank());
    return hierarchical(std::move(world), std::move(local), std::move(cross));
  }

  hierarchical(hierarchical&&) noexcept = default;
  hierarchical& operator=(hierarchical&&) noexcept = default;

  Comm& world() noexcept { return world_; }
  Comm& local() noexcept { return local_; }
  Comm& cross() noexcept { return cross_; }
  /// Whether a collective of any of the three has failed (when Comm can tell).
  bool broken() const
    requires requires(const Comm& c) { c.broken(); }
  {
    return world_.broken() || local_.broken() || cross_.broken();
  }
  /// Hosts and ranks per host.
  int hosts() const noexcept { return cross_.size(); }
  int ranks_per_host() const noexcept { return local_.size(); }

  // ---- dist::communicator: the world's ----------------------------------------------------------
  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }
  dist::work barrier() { return world_.barrier(); }
  template <dist::dist_element T>
  dist::work allreduce(T* data, std::size_t n, dist::reduce_op op) {
    return world_.allreduce(data, n, op);
  }
  template <dist::dist_element T>
  dist::work broadcast(T* data, std::size_t n, int root) {
    return world_.broadcast(data, n, root);
  }
  template <dist::dist_element T>
  dist::work allgather(const T* in, std::size_t n, T* out) {
    return world_.allgather(in, n, out);
  }
  template <dist::dist_element T>
  dist::work reduce_scatter(const T* in, T* out, std::size_t n_per_rank, dist::reduce_op op) {
    return world_.reduce_scatter(in, out, n_per_rank, op);
  }
  template <dist::dist_element T>
  dist::work alltoall(const T* in, T* out, std::size_t n_per_rank) {
    return world_.alltoall(in, out, n_per_rank);
  }

  /// The hierarchical compressed allreduce (the top of this file); compressed_allreduce(*this, ...)
  /// comes here. Adds the inter-host bytes to c.counter().
  template <gradient_compression C>
  void compressed_allreduce(C& c, float* data, index_t n, std::size_t bucket, dist::reduce_op op, compress_workspace* ws) {
    TRAINKIT_CHECK(op == dist::reduce_op::sum || op == dist::reduce_op::avg, value_error, "hierarchical::compressed_allreduce",
                   C::name << ": only sum and avg, got " << to_string(op));
    TRAINKIT_CHECK(n >= 0, value_error, "hierarchical::compressed_allreduce", C::name << ": negative length " << n);
    const int w = size();
    if (n == 0 || w == 1) {
      c.counter().add(0);
      return;
    }
    if constexpr (C::lossy) c.feedback().set_layout("hierarchical");
    compress_workspace local_ws;
    compress_workspace& s = ws ? *ws : local_ws;
    const index_t l_size = local_.size(), l = local_.rank();
    // Pieces of L * P elements, rank l taking elements [l P, (l + 1) P) of each: the intra-host
    // steps of one piece overlap the inter-host step of the previous one (a pipeline of
    // non-blocking reduce-scatters and allgathers around the blocking compressed allreduce).
    const index_t per_rank = (n + l_size - 1) / l_size;
    const index_t p = std::max<index_t>(index_t(1) << 18, (per_rank + max_pieces - 1) / max_pieces);
    const index_t pieces = (n + l_size * p - 1) / (l_size * p);
    auto piece_len = [&](index_t k) { return std::min(l_size * p, n - k * l_size * p); };
    auto count = [&](index_t k) { return (piece_len(k) + l_size - 1) / l_size; };  // per rank
    // Only the last piece can need padding to L equal parts: it goes through scratch.
    const bool pad = count(pieces - 1) * l_size != piece_len(pieces - 1);
    float* mine = detail::compress_grow(s.slice, static_cast<std::size_t>(pieces * p));
    float* padded = pad ? detail::compress_grow(s.padded, static_cast<std::size_t>(2 * l_size * count(pieces - 1))) : nullptr;
    auto in_of = [&](index_t k) { return pad && k == pieces - 1 ? padded : data + k * l_size * p; };
    auto out_of = [&](index_t k) { return pad && k == pieces - 1 ? padded + l_size * count(k) : data + k * l_size * p; };
    if (pad) {
      const index_t k = pieces - 1;
      std::copy(data + k * l_size * p, data + n, padded);
      std::fill(padded + piece_len(k), padded + l_size * count(k), 0.0f);
    }
    std::vector<dist::work> gathers;
    gathers.reserve(static_cast<std::size_t>(pieces));
    auto scatter = [&](index_t k) {
      return local_.reduce_scatter(in_of(k), mine + k * p, static_cast<std::size_t>(count(k)), dist::reduce_op::sum);
    };
    dist::work next = l_size > 1 ? scatter(0) : dist::work{};
    const float inv = op == dist::reduce_op::avg ? 1.0f / static_cast<float>(w) : 1.0f;
    for (index_t k = 0; k < pieces; ++k) {
      float* part = mine + k * p;
      // 1. The host's fp32 sum of my part of piece k (started one piece ahead).
      if (l_size > 1) {
        next.wait();
        if (k + 1 < pieces) next = scatter(k + 1);
      } else {
        std::copy(in_of(k), in_of(k) + count(k), part);
      }
      // 2. Between hosts, compressed with error feedback on this hop only.
      const index_t valid = std::clamp<index_t>(piece_len(k) - l * count(k), 0, count(k));
      compression::compressed_allreduce(cross_, c, part, valid, bucket * max_pieces + static_cast<std::size_t>(k),
                                 dist::reduce_op::sum, &s);
      if (inv != 1.0f)
        for (index_t i = 0; i < valid; ++i) part[i] *= inv;
      // 3. Every part of piece k to every rank of the host, fp32 (waited for at the end).
      if (l_size > 1)
        gathers.push_back(local_.allgather(part, static_cast<std::size_t>(count(k)), out_of(k)));
      else
        std::copy(part, part + count(k), out_of(k));
    }
    for (auto& g : gathers) g.wait();
    if (pad) {
      const index_t k = pieces - 1;
      std::copy(out_of(k), out_of(k) + piece_len(k), data + k * l_size * p);
    }
  }

  /// A bucket is reduced in at most this many pieces; piece k of bucket b keeps its error
  /// feedback under the key b * max_pieces + k.
  static constexpr std::size_t max_pieces = 64;

 private:
  Comm world_, local_, cross_;
};

}  // namespace trainkit::compression
