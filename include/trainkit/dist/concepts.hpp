// trainkit/dist/concepts.hpp - the communicator concept: what data_parallel needs from a transport.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/dist/detail/element.hpp"  // dist_element
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::dist {

/// The collectives of a communicator on buffers of one element type T. Every call is asynchronous:
/// it returns a `work` at once, and the buffers belong to the collective until `work::wait()`.
/// Pointers are host pointers for host models (thread_group, mpi) and device pointers for nccl.
///
///  - `allreduce(data, n, op)`: in place; every rank ends with op over the ranks' `data[0, n)`.
///  - `broadcast(data, n, root)`: every rank ends with root's `data[0, n)`.
///  - `allgather(in, n, out)`: `out` holds size()*n elements, chunk i = rank i's `in[0, n)`.
///  - `reduce_scatter(in, out, n_per_rank, op)`: `in` holds size()*n_per_rank elements; rank i's `out`
///    (n_per_rank elements) is op over the ranks' chunk i of `in`.
///  - `alltoall(in, out, n_per_rank)`: chunk j of `in` goes to rank j; chunk i of `out` came from rank i.
///    `in` and `out` must not overlap.
///
/// Semantics every model keeps:
///  - all ranks issue the same collectives in the same order with the same n, T, op and root;
///  - collectives on one communicator complete in the order they were issued, on every rank;
///  - n == 0 returns an already complete work at once (nothing is sent, no rank waits);
///  - half and bfloat16 combine in float and round once per step (like NCCL); avg = sum / size();
///    integer sums wrap in T;
///  - a failure (a peer died or stalled past the model's timeout, mismatched calls, a transport
///    error) throws dist_error from wait() (or from the call itself), naming the collective, rank,
///    world size, element count and timeout — never a hang.
template <class C, class T>
concept communicator_for = dist_element<T> &&
    requires(C& c, T* p, const T* cp, std::size_t n, reduce_op op, int root) {
  { c.allreduce(p, n, op) } -> std::same_as<work>;
  { c.broadcast(p, n, root) } -> std::same_as<work>;
  { c.allgather(cp, n, p) } -> std::same_as<work>;
  { c.reduce_scatter(cp, p, n, op) } -> std::same_as<work>;
  { c.alltoall(cp, p, n) } -> std::same_as<work>;
};

/// A group of `size()` ranks, this handle being rank `rank()`, with asynchronous collectives
/// (see communicator_for) for every dist_element type, and `barrier()`.
/// Models: thread_group (ranks are threads of one process), mpi (processes, any MPI launcher),
/// nccl (CUDA devices; dist/nccl.cuh).
/// Whether a communicator's collectives take device buffers (nccl; dist/nccl.cuh sets it) rather
/// than host ones (thread_group, mpi): data_parallel on cuda then reduces on a side stream without
/// any host wait instead of staging buckets through pinned host memory.
template <class C>
inline constexpr bool device_buffers = false;

template <class C>
concept communicator = requires(C& c, const C& cc) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { c.barrier() } -> std::same_as<work>;
}
&&communicator_for<C, float>&& communicator_for<C, double>&& communicator_for<C, half>&&
    communicator_for<C, bfloat16>&& communicator_for<C, std::int8_t>&& communicator_for<C, std::uint8_t>&&
        communicator_for<C, std::int32_t>&& communicator_for<C, std::int64_t>;

}  // namespace trainkit::dist
