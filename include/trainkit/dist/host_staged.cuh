// trainkit/dist/host_staged.cuh - a host communicator (mpi, thread_group) on device buffers: every
// collective copies its device buffers to pinned host memory after the current stream's work,
// runs the host collective, and copies the result back. For GPU jobs without NCCL (and ranks that
// share a GPU, which NCCL refuses):
//
//   dist::mpi world;
//   dist::host_staged<dist::mpi> comm(world);
//   comm.allreduce(device_ptr, n, dist::reduce_op::avg).wait();
//
// Host buffers (a model check's hashes, found_inf) go to Comm as they are, without staging; a call
// with one buffer on the device and the other on the host is a usage_error.
// Each call waits for the current stream (a host synchronisation) and returns complete; data_parallel
// does better on host communicators by itself (its communication thread stages buckets while
// backward goes on), so use this for the collectives of your own code.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>

#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/cuda/transfer.cuh"  // pinned_buffer
#include "trainkit/core/error.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::dist {

/// Comm's collectives on device buffers, staged through pinned host memory (see the file comment).
/// Holds a reference to `comm`, which must outlive it; one thread at a time, like Comm.
template <communicator Comm>
class host_staged {
 public:
  explicit host_staged(Comm& comm) : comm_(&comm) {}

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  work barrier() { return comm_->barrier(); }
  Comm& host() noexcept { return *comm_; }

  template <dist_element T>
  work allreduce(T* data, std::size_t n, reduce_op op) {
    if (on_host("allreduce", data, data)) return comm_->allreduce(data, n, op);
    T* h = stage_in(data, n, 0);
    comm_->allreduce(h, n, op).wait();
    stage_out(h, data, n);
    return {};
  }
  template <dist_element T>
  work broadcast(T* data, std::size_t n, int root) {
    if (on_host("broadcast", data, data)) return comm_->broadcast(data, n, root);
    T* h = stage_in(data, n, 0);
    comm_->broadcast(h, n, root).wait();
    stage_out(h, data, n);
    return {};
  }
  template <dist_element T>
  work allgather(const T* in, std::size_t n, T* out) {
    if (on_host("allgather", in, out)) return comm_->allgather(in, n, out);
    const std::size_t all = n * static_cast<std::size_t>(size());
    reserve<T>(n + all);
    T* hi = stage_in(in, n, 0);
    T* ho = scratch<T>(all, n);
    comm_->allgather(hi, n, ho).wait();
    stage_out(ho, out, all);
    return {};
  }
  template <dist_element T>
  work reduce_scatter(const T* in, T* out, std::size_t n_per_rank, reduce_op op) {
    if (on_host("reduce_scatter", in, out)) return comm_->reduce_scatter(in, out, n_per_rank, op);
    const std::size_t all = n_per_rank * static_cast<std::size_t>(size());
    reserve<T>(all + n_per_rank);
    T* hi = stage_in(in, all, 0);
    T* ho = scratch<T>(n_per_rank, all);
    comm_->reduce_scatter(hi, ho, n_per_rank, op).wait();
    stage_out(ho, out, n_per_rank);
    return {};
  }
  template <dist_element T>
  work alltoall(const T* in, T* out, std::size_t n_per_rank) {
    if (on_host("alltoall", in, out)) return comm_->alltoall(in, out, n_per_rank);
    const std::size_t all = n_per_rank * static_cast<std::size_t>(size());
    reserve<T>(2 * all);
    T* hi = stage_in(in, all, 0);
    T* ho = scratch<T>(all, all);
    comm_->alltoall(hi, ho, n_per_rank).wait();
    stage_out(ho, out, all);
    return {};
  }

 private:
  // Whether both buffers are host memory (true) or both device memory (false).
  static bool on_host(const char* op, const void* in, const void* out) {
    const bool din = backend::gpu::detail::is_device_memory(in);
    const bool dout = in == out ? din : backend::gpu::detail::is_device_memory(out);
    TRAINKIT_CHECK(din == dout, usage_error, "dist::host_staged",
                   op << ": one buffer is in device memory and the other in host memory");
    return !din;
  }
  // The pinned buffer holds at least n elements (grown before a call stages anything into it).
  template <class T>
  void reserve(std::size_t n) {
    if (buffer_.size() < n * sizeof(T)) buffer_ = backend::gpu::pinned_buffer(n * sizeof(T));
  }
  // Elements [offset, offset + n) of the pinned buffer.
  template <class T>
  T* scratch(std::size_t n, std::size_t offset) {
    reserve<T>(offset + n);
    return static_cast<T*>(buffer_.data()) + offset;
  }
  template <class T>
  T* stage_in(const T* device, std::size_t n, std::size_t offset) {
    T* h = scratch<T>(n, offset);
    const cudaStream_t st = backend::gpu::current_stream();
    if (n > 0) {
      backend::gpu::check(cudaMemcpyAsync(h, device, n * sizeof(T), cudaMemcpyDeviceToHost, st),
                          "cudaMemcpyAsync (host_staged: to the host)");
      backend::gpu::synchronize_stream(st);
    }
    return h;
  }
  template <class T>
  void stage_out(const T* h, T* device, std::size_t n) {
    if (n == 0) return;
    const cudaStream_t st = backend::gpu::current_stream();
    backend::gpu::check(cudaMemcpyAsync(device, h, n * sizeof(T), cudaMemcpyHostToDevice, st),
                        "cudaMemcpyAsync (host_staged: to the device)");
    backend::gpu::synchronize_stream(st);  // the pinned buffer is reused by the next call
  }

  Comm* comm_;
  backend::gpu::pinned_buffer buffer_;
};

template <class Comm>
inline constexpr bool device_buffers<host_staged<Comm>> = true;

}  // namespace trainkit::dist
