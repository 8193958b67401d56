// trainkit/compression/quantized_allreduce.cuh - the quantized allreduce of compression/quantized_allreduce.hpp
// on device buffers, for communicators that take them (nccl): the same phases (worker quantize with
// error feedback, alltoall, server sum in fp32 + re-quantize with feedback, allgather, decode), the
// same wire format through the codecs of compression/codecs.cuh, and the same rounding step by step
// (the sums and products go through __fadd_rn/__fmul_rn, which nvcc never contracts into an FMA),
// so every byte sent and every value decoded is the host's, bit for bit.
//
// Everything is enqueued on the current stream (backend::gpu::current_stream()); nothing waits on
// the host. The error-feedback residuals live on the device in a device_feedback, which the policy's
// error_feedback routes state()/load_state() to (snapshots store them like host residuals).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainkit/backend/cuda/allocator.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/cuda/transfer.cuh"
#include "trainkit/core/error.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/compression/codecs.cuh"
#include "trainkit/compression/codecs.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/compression/quantized_allreduce.hpp"  // compressed_allreduce_bytes, compress_chunk
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::compression {

namespace detail {

// meant[i] = data[i] + residual[i] for i < n, 0 for n <= i < total (the padding to W chunks).
template <int = 0>
__global__ void qar_meant_kernel(const float* data, const float* residual, index_t n, index_t total, float* meant) {
  const index_t i = index_t(blockIdx.x) * backend::gpu::detail::block_threads + threadIdx.x;
  if (i >= total) return;
  meant[i] = i < n ? __fadd_rn(data[i], residual[i]) : 0.0f;
}

// residual[i] = meant[i] - sent[i] (0 where not finite), i < n.
template <int = 0>
__global__ void qar_residual_kernel(const float* meant, const float* sent, index_t n, float* residual) {
  const index_t i = index_t(blockIdx.x) * backend::gpu::detail::block_threads + threadIdx.x;
  if (i >= n) return;
  residual[i] = compress_residual_fn{}(meant[i], sent[i]);
}

// The server's chunk: acc[e] = (sum over the w decoded copies, in rank order) * scale + residual[e]
// for e < valid, 0 in the padding - the host's order of operations.
template <int = 0>
__global__ void qar_server_kernel(const float* decoded, int w, index_t chunk, index_t valid, float scale,
                                  const float* residual, float* acc) {
  const index_t e = index_t(blockIdx.x) * backend::gpu::detail::block_threads + threadIdx.x;
  if (e >= chunk) return;
  if (e >= valid) {
    acc[e] = 0.0f;
    return;
  }
  float a = 0.0f;
  for (int i = 0; i < w; ++i) a = __fadd_rn(a, decoded[static_cast<index_t>(i) * chunk + e]);
  acc[e] = __fadd_rn(__fmul_rn(a, scale), residual[e]);
}

inline void qar_check_launch(const char* what) { backend::gpu::check(cudaGetLastError(), what); }

}  // namespace detail

/// The error-feedback residuals of one compression policy on the device: per bucket a worker and a
/// server residual (zero the first time, fresh when the length changes, like error_feedback).
/// Residuals loaded from a snapshot wait on the host until the next allreduce needs them (then
/// they are copied on the stream it runs on). Attach it with `policy.feedback().attach(store)`.
class device_feedback final : public feedback_store {
 public:
  /// The residual of bucket b, n floats on the current device; allocated on the current stream.
  float* worker(std::size_t b, index_t n) { return get(worker_, pending_worker_, b, n); }
  float* server(std::size_t b, index_t n) { return get(server_, pending_server_, b, n); }

  compression_state state() const override {
    compression_state s;
    error_feedback::put(s, "worker.", host(worker_, pending_worker_));
    error_feedback::put(s, "server.", host(server_, pending_server_));
    return s;
  }
  void load(const std::vector<std::vector<float>>& w, const std::vector<std::vector<float>>& s) override {
    worker_.clear();
    server_.clear();
    pending_worker_ = w;
    pending_server_ = s;
  }

 private:
  using dtensor = tensor<float, cuda>;
  static float* get(std::vector<dtensor>& v, std::vector<std::vector<float>>& pending, std::size_t b, index_t n) {
    if (v.size() <= b) v.resize(b + 1);
    if (pending.size() > b && !pending[b].empty()) {
      if (static_cast<index_t>(pending[b].size()) == n)
        v[b] = tensor<float>::from_vector(pending[b], {n}).to<cuda>();
      pending[b].clear();
    }
    if (!v[b].defined() || v[b].numel() != n) v[b] = dtensor::zeros({n});
    return v[b].data();
  }
  // The residuals on the host (a device-to-host copy: for snapshots, between steps).
  static std::vector<std::vector<float>> host(const std::vector<dtensor>& v, const std::vector<std::vector<float>>& pending) {
    std::vector<std::vector<float>> out(std::max(v.size(), pending.size()));
    for (std::size_t b = 0; b < out.size(); ++b) {
      if (b < pending.size() && !pending[b].empty())
        out[b] = pending[b];
      else if (b < v.size() && v[b].defined())
        out[b] = v[b].to<cpu>().to_vector();
    }
    return out;
  }
  std::vector<dtensor> worker_, server_;
  std::vector<std::vector<float>> pending_worker_, pending_server_;
};

/// Device scratch of the device quantized allreduce, grown as needed and kept between calls; its
/// memory belongs to the stream that first ran an allreduce with it.
class device_compress_workspace {
 public:
  device_compress_workspace() = default;
  device_compress_workspace(const device_compress_workspace&) = delete;
  device_compress_workspace& operator=(const device_compress_workspace&) = delete;
  ~device_compress_workspace() {
    for (auto& b : blocks_) allocator<cuda>::deallocate(b.first, b.second);
  }
  /// Block k of at least `bytes` (its contents are not kept when it grows).
  void* get(std::size_t k, std::size_t bytes) {
    if (blocks_.size() <= k) blocks_.resize(k + 1, {nullptr, 0});
    auto& [p, n] = blocks_[k];
    if (n < bytes) {
      allocator<cuda>::deallocate(p, n);
      p = nullptr;
      n = 0;
      p = allocator<cuda>::allocate(bytes);
      n = bytes;
    }
    return p;
  }
  /// The collectives issued by the last calls (checked with done(): failures, timeouts).
  std::vector<dist::work> works;

 private:
  std::vector<std::pair<void*, std::size_t>> blocks_;
};

/// Collective, on device buffers: compressed_allreduce (compression/quantized_allreduce.hpp) of the n
/// device floats at `data`, through policy c with its residuals in `fb`, everything enqueued on the
/// current stream; comm must take device buffers (nccl). The works of the collectives go to
/// ws.works (the caller checks them later; none is waited for here). Adds what was sent to
/// c.counter(). The bytes on the wire and the result are the host version's, bit for bit.
template <gradient_compression C, dist::communicator Comm>
void compressed_allreduce_device(Comm& comm, C& c, device_feedback& fb, float* data, index_t n, std::size_t bucket,
                                 dist::reduce_op op, device_compress_workspace& ws) {
  static_assert(dist::device_buffers<Comm>, "compressed_allreduce_device: the communicator must take device buffers (nccl)");
  namespace g = backend::gpu;
  TRAINKIT_CHECK(op == dist::reduce_op::sum || op == dist::reduce_op::avg, value_error, "compressed_allreduce_device",
                 C::name << ": only sum and avg can go through compression, got " << to_string(op));
  TRAINKIT_CHECK(n >= 0, value_error, "compressed_allreduce_device", C::name << ": negative length " << n);
  const int w = comm.size();
  if (n == 0 || w == 1) {
    c.counter().add(0);
    return;
  }
  if constexpr (!C::lossy) {
    ws.works.push_back(comm.allreduce(data, static_cast<std::size_t>(n), op));
    c.counter().add(compressed_allreduce_bytes<C>(n, w));
    return;
  } else {
    const cudaStream_t st = g::current_stream();
    const int r = comm.rank();
    const index_t chunk = detail::compress_chunk(n, w, C::block);
    const index_t total = chunk * w;
    const std::size_t cb = C::wire_bytes(chunk);
    const auto wz = static_cast<std::size_t>(w);
    auto* send = static_cast<std::uint8_t*>(ws.get(0, wz * cb));
    auto* recv = static_cast<std::uint8_t*>(ws.get(1, wz * cb));
    auto* gathered = static_cast<std::uint8_t*>(ws.get(2, wz * cb));
    auto* meant = static_cast<float*>(ws.get(3, static_cast<std::size_t>(total) * 4));
    auto* decoded = static_cast<float*>(ws.get(4, static_cast<std::size_t>(total) * 4));
    const unsigned threads = g::detail::block_threads;

    // ---- worker: meant = data + residual (padded), encode, residual = meant - decode --------------
    float* wres = fb.worker(bucket, n);
    detail::qar_meant_kernel<><<<g::detail::grid_for(total, threads), threads, 0, st>>>(data, wres, n, total, meant);
    detail::qar_check_launch("quantized allreduce: worker kernel");
    gpu::compress_encode<C>(meant, total, send);
    gpu::compress_decode<C>(send, total, decoded);
    detail::qar_residual_kernel<><<<g::detail::grid_for(n, threads), threads, 0, st>>>(meant, decoded, n, wres);
    detail::qar_check_launch("quantized allreduce: residual kernel");
    ws.works.push_back(comm.alltoall(send, recv, cb));

    // ---- server: the w copies of my chunk summed in fp32, re-quantized with feedback -------------
    const index_t mine_valid = std::clamp<index_t>(n - r * chunk, 0, chunk);
    float* sres = fb.server(bucket, chunk);
    const float scale = op == dist::reduce_op::avg ? 1.0f / static_cast<float>(w) : 1.0f;
    gpu::compress_decode<C>(recv, total, decoded);
    detail::qar_server_kernel<><<<g::detail::grid_for(chunk, threads), threads, 0, st>>>(decoded, w, chunk, mine_valid,
                                                                                         scale, sres, meant);
    detail::qar_check_launch("quantized allreduce: server kernel");
    std::uint8_t* mine = send;  // free once the alltoall has run (stream order)
    gpu::compress_encode<C>(meant, chunk, mine);
    gpu::compress_decode<C>(mine, chunk, decoded);
    detail::qar_residual_kernel<><<<g::detail::grid_for(mine_valid, threads), threads, 0, st>>>(meant, decoded,
                                                                                                mine_valid, sres);
    detail::qar_check_launch("quantized allreduce: server residual kernel");
    ws.works.push_back(comm.allgather(mine, cb, gathered));

    // ---- everyone: decode the reduced chunks into data ---------------------------------------------
    gpu::compress_decode<C>(gathered, total, decoded);
    g::check(cudaMemcpyAsync(data, decoded, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToDevice, st),
             "cudaMemcpyAsync");
    c.counter().add(compressed_allreduce_bytes<C>(n, w));
  }
}

}  // namespace trainkit::compression
