// trainkit/dist/hierarchical.hpp - a communicator over several hosts that compresses only the hop
// between hosts (DESIGN.md section 5).
//
//   dist::mpi world;
//   auto comm = dist::hierarchical<dist::mpi>::by_host(std::move(world));  // MPI_COMM_TYPE_SHARED
//   parallel::data_parallel<dist::hierarchical<dist::mpi>, dist::int8> ddp(comm, model);
//
// The compressed allreduce of a bucket of n fp32 values on H hosts of L ranks each (W = H L):
//   1. reduce-scatter inside the host, fp32 (shared memory): local rank l holds the host's sum of
//      slice l of the bucket (ceil(n / L) elements);
//   2. the compressed allreduce (dist/quantized_allreduce.hpp, with error feedback on this hop
//      only) of slice l among the H ranks of local index l, one per host - every rank of a host
//      takes a slice, so the host's link carries L concurrent streams and no rank idles;
//   3. allgather inside the host, fp32: every rank gets the whole bucket (avg: / W).
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
#include "trainkit/dist/compression.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/quantized_allreduce.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::dist {

/// The ranks of a job seen three ways: world; local (the ranks of this host); cross (the ranks of
/// this local index, one per host). See the top of this file.
template <communicator Comm>
class hierarchical {
 public:
  /// From the three communicators of this rank (moved in): local.rank() is this rank's index on
  /// its host, cross.rank() its host's index. value_error when the hosts hold different numbers
  /// of ranks or the sizes do not multiply to world.size() (a collective over world).
  hierarchical(Comm world, Comm local, Comm cross)
      : world_(std::move(world)), local_(std::move(local)), cross_(std::move(cross)) {
    std::int64_t mine[2] = {local_.size(), -static_cast<std::int64_t>(local_.size())};
    world_.allreduce(mine, 2, reduce_op::max).wait();
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
  /// Hosts and ranks per host.
  int hosts() const noexcept { return cross_.size(); }
  int ranks_per_host() const noexcept { return local_.size(); }

  // ---- dist::communicator: the world's ----------------------------------------------------------
  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }
  work barrier() { return world_.barrier(); }
  template <dist_element T>
  work allreduce(T* data, std::size_t n, reduce_op op) {
    return world_.allreduce(data, n, op);
  }
  template <dist_element T>
  work broadcast(T* data, std::size_t n, int root) {
    return world_.broadcast(data, n, root);
  }
  template <dist_element T>
  work allgather(const T* in, std::size_t n, T* out) {
    return world_.allgather(in, n, out);
  }
  template <dist_element T>
  work reduce_scatter(const T* in, T* out, std::size_t n_per_rank, reduce_op op) {
    return world_.reduce_scatter(in, out, n_per_rank, op);
  }
  template <dist_element T>
  work alltoall(const T* in, T* out, std::size_t n_per_rank) {
    return world_.alltoall(in, out, n_per_rank);
  }

  /// The hierarchical compressed allreduce (the top of this file); compressed_allreduce(*this, ...)
  /// comes here. Adds the inter-host bytes to c.counter().
  template <gradient_compression C>
  void compressed_allreduce(C& c, float* data, index_t n, std::size_t bucket, reduce_op op, compress_workspace* ws) {
    TRAINKIT_CHECK(op == reduce_op::sum || op == reduce_op::avg, value_error, "hierarchical::compressed_allreduce",
                   C::name << ": only sum and avg, got " << to_string(op));
    TRAINKIT_CHECK(n >= 0, value_error, "hierarchical::compressed_allreduce", C::name << ": negative length " << n);
    const int w = size(), l_size = local_.size(), l = local_.rank();
    if (n == 0 || w == 1) {
      c.counter().add(0);
      return;
    }
    if constexpr (C::lossy) c.feedback().set_layout("hierarchical");
    compress_workspace local_ws;
    compress_workspace& s = ws ? *ws : local_ws;
    const index_t slice = (n + l_size - 1) / l_size;
    const index_t lo = std::min<index_t>(n, l * slice), valid = std::min<index_t>(n, lo + slice) - lo;
    float* mine = detail::compress_grow(s.slice, static_cast<std::size_t>(slice));
    // 1. The host's sum of my slice, in fp32 (the bucket padded to L slices when n % L != 0).
    const float* in = data;
    if (slice * l_size != n) {
      float* padded = detail::compress_grow(s.padded, static_cast<std::size_t>(slice * l_size));
      std::copy(data, data + n, padded);
      std::fill(padded + n, padded + slice * l_size, 0.0f);
      in = padded;
    }
    if (l_size > 1)
      local_.reduce_scatter(in, mine, static_cast<std::size_t>(slice), reduce_op::sum).wait();
    else
      std::copy(in, in + slice, mine);
    // 2. Between hosts, compressed with error feedback (the residuals of my slice, under `bucket`).
    dist::compressed_allreduce(cross_, c, mine, valid, bucket, reduce_op::sum, &s);
    if (op == reduce_op::avg) {
      const float inv = 1.0f / static_cast<float>(w);
      for (index_t i = 0; i < valid; ++i) mine[i] *= inv;
    }
    // 3. Every slice to every rank of the host, in fp32.
    if (l_size > 1) {
      float* all = detail::compress_grow(s.padded, static_cast<std::size_t>(slice * l_size));
      local_.allgather(mine, static_cast<std::size_t>(slice), all).wait();
      std::copy(all, all + n, data);
    } else {
      std::copy(mine, mine + n, data);
    }
  }

 private:
  Comm world_, local_, cross_;
};

namespace detail {
template <class X>
inline constexpr bool is_hierarchical = false;
template <class Comm>
inline constexpr bool is_hierarchical<hierarchical<Comm>> = true;
}  // namespace detail

}  // namespace trainkit::dist
