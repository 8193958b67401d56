// trainkit/backend/cuda/transfer.cuh - copies between host and device memory (tensor::to<cuda>(),
// to<cpu>(), item(), to_vector()), staged through pinned host buffers.
//
// Tensor memory on the host is pageable. Large copies go through two pinned staging buffers in
// turn, so that the host-side memcpy of one chunk overlaps the DMA of the other:
//   host -> device returns once the source has been read (the DMA may still run: the caller may
//     free or change the source at once, and work on the current stream sees the data);
//   device -> host returns once the destination holds the data (it waits for the current stream);
//   device -> device is asynchronous on the current stream.
// Small copies (<= 256 KiB) go straight through cudaMemcpyAsync, which stages them itself.
// A source in page-locked memory (gpu::pinned_memory: the batches of a CUDA data_loader) is copied
// by one asynchronous DMA, like PyTorch's non_blocking=True from pinned memory: the source may be
// dropped at once (its pooled buffer is reused only after the current stream has passed the
// copy) but must not be written until the current stream has passed the copy.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "trainkit/backend/cuda/device_error.cuh"
#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/core/dtype.hpp"   // element
#include "trainkit/core/shape.hpp"   // numel, contiguous_strides
#include "trainkit/core/storage.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit {

namespace backend::gpu {

/// Page-locked host memory (cudaMallocHost): what DMA engines read and write at full speed.
/// Data loaders fill batches here before copying them to the device.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t bytes) : size_(bytes) {
    if (bytes) TRAINKIT_CUDA_CHECK_CTX(cudaMallocHost(&p_, bytes), "pinned host buffer of " << bytes << " bytes");
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  pinned_buffer(pinned_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~pinned_buffer() {
    if (p_ != nullptr) (void)cudaFreeHost(p_);
  }
  void* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return size_; }

 private:
  void* p_ = nullptr;
  std::size_t size_ = 0;
};

namespace detail {

/// The page-locked buffers of pinned_memory, reused from batch to batch. A buffer given back
/// (its last tensor gone) gets an event on the current stream, after the copy that read it; it
/// is handed out again only once that event has completed (cudaEventQuery: the host never waits
/// here). Buffers beyond max_free that are done are freed.
class pinned_pool {
 public:
  static constexpr std::size_t max_free = 8;

  void* acquire(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(m_);
    // The smallest finished buffer that fits (and is at most twice as big: no waste).
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i) {
      const block& b = free_[i];
      if (b.size < bytes || b.size > 2 * bytes + 4096) continue;
      if (best != free_.size() && free_[best].size <= b.size) continue;
      if (!done(b)) continue;
      best = i;
    }
    if (best != free_.size()) {
      block b = free_[best];
      free_.erase(free_.begin() + std::ptrdiff_t(best));
      live_.push_back(b);
      return b.p;
    }
    trim();
    block b{nullptr, bytes, nullptr};
    TRAINKIT_CUDA_CHECK_CTX(cudaMallocHost(&b.p, bytes), "pinned batch buffer of " << bytes << " bytes");
    if (cudaEventCreateWithFlags(&b.ready, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      b.ready = nullptr;  // no event: the buffer is freed, not reused
    }
    live_.push_back(b);
    return b.p;
  }

  void release(void* p) noexcept {
    std::lock_guard<std::mutex> lock(m_);
    for (std::size_t i = 0; i < live_.size(); ++i) {
      if (live_[i].p != p) continue;
      block b = live_[i];
      live_[i] = live_.back();
      live_.pop_back();
      if (b.ready == nullptr || cudaEventRecord(b.ready, current_stream()) != cudaSuccess) {
        (void)cudaGetLastError();
        destroy(b);  // cudaFreeHost waits for the copies in flight
        return;
      }
      free_.push_back(b);
      trim();
      return;
    }
  }

 private:
  struct block {
    void* p;
    std::size_t size;
    cudaEvent_t ready;  // recorded when the buffer was given back
  };
  static bool done(const block& b) noexcept {
    const cudaError_t e = cudaEventQuery(b.ready);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) (void)cudaGetLastError();
    return false;
  }
  static void destroy(block& b) noexcept {
    if (b.ready != nullptr) (void)cudaEventDestroy(b.ready);
    (void)cudaFreeHost(b.p);
  }
  // Frees finished buffers beyond max_free, oldest first (lock held).
  void trim() noexcept {
    for (std::size_t i = 0; free_.size() > max_free && i < free_.size();) {
      if (done(free_[i])) {
        destroy(free_[i]);
        free_.erase(free_.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
  }

  std::mutex m_;
  std::vector<block> free_, live_;
};

inline pinned_pool& pinned_buffers() {
  static pinned_pool* p = new pinned_pool;  // leaked: pinned memory outlives static tensors
  return *p;
}

}  // namespace detail

/// The CUDA model of data::batch_memory: batches of a data_loader in page-locked host memory, so
/// that batch.x.to<cuda>() is one asynchronous DMA on the current stream (no staging copy):
///
///   data::data_loader<data::tensor_dataset, data::distributed_sampler, gpu::pinned_memory> loader(...);
///
/// The buffers come from a pool (detail::pinned_pool): when the last tensor that uses one goes,
/// it returns to the pool with an event on the current stream (the stream the batch was copied
/// on), and is reused once that event has completed - no cudaMallocHost/cudaFreeHost per batch,
/// and the host never waits. It is not counted by allocator<cpu>.
struct pinned_memory {
  static constexpr bool pinned = true;
  /// The loader's workers run on the device of the thread that starts them (data::binds_workers):
  /// a worker thread's current device is 0 otherwise, and every rank would make a context there.
  static int worker_context() { return current_device(); }
  static void enter_worker(int device) noexcept {
    if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();  // the first allocation reports it
  }
  template <element T>
  static tensor<T> empty(shape sizes) {
    const std::size_t n = static_cast<std::size_t>(numel(sizes));
    if (n == 0) return tensor<T>::empty(std::move(sizes));
    void* p = detail::pinned_buffers().acquire(n * sizeof(T));
    auto st = std::make_shared<storage<T, cpu>>(
        static_cast<T*>(p), n, [](void* q, std::size_t) noexcept { detail::pinned_buffers().release(q); });
    shape strides = contiguous_strides(sizes);
    return tensor<T>::from_storage(std::move(st), std::move(sizes), std::move(strides), 0);
  }
};

namespace detail {

/// The two staging buffers and the events that say when the DMA of each has finished.
struct staging_area {
  static constexpr std::size_t chunk = std::size_t(4) << 20;
  static constexpr std::size_t direct_limit = std::size_t(256) << 10;
  std::mutex m;
  void* buf[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
  int device = -1;

  void ensure() {
    const int d = current_device();
    if (buf[0] != nullptr && d == device) return;
    // Another device: pinned memory is usable from every device, the events are not.
    for (int i = 0; i < 2; ++i) {
      if (done[i] != nullptr) {
        (void)cudaEventSynchronize(done[i]);  // the buffer may still be in a DMA of the old device
        (void)cudaEventDestroy(done[i]);
      }
      done[i] = nullptr;
      if (buf[i] == nullptr) TRAINKIT_CUDA_CHECK_CTX(cudaMallocHost(&buf[i], chunk), "staging buffer of " << chunk << " bytes");
      TRAINKIT_CUDA_CHECK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    }
    device = d;
  }
};

inline staging_area& staging() {
  static staging_area* s = new staging_area;  // leaked: pinned memory outlives static tensors
  return *s;
}

/// What kind of memory p points into; cudaMemoryTypeUnregistered for pageable host memory.
inline cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes and some drivers: an unregistered host pointer is an error
    return cudaMemoryTypeUnregistered;
  }
  return a.type;
}

/// Whether p is page-locked host memory (cudaMallocHost, cudaHostRegister): the DMA engines read
/// it directly, so a copy from it needs no staging and does not wait for the host.
inline bool is_pinned(const void* p) { return memory_type(p) == cudaMemoryTypeHost; }

/// Whether p is memory a kernel can use (device or managed); host memory, pinned or pageable, is not.
inline bool is_device_memory(const void* p) {
  const cudaMemoryType t = memory_type(p);
  return t == cudaMemoryTypeDevice || t == cudaMemoryTypeManaged;
}

inline void copy_host_to_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  const cudaStream_t st = current_stream();
  // Small copies, and copies from pinned memory (batches of a data_loader<..., pinned_memory>),
  // go straight to the DMA engine, asynchronously on the current stream.
  if (bytes <= staging_area::direct_limit || is_pinned(src)) {
    TRAINKIT_CUDA_CHECK_CTX(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st),
                            "host -> device copy of " << bytes << " bytes");
    return;
  }
  staging_area& s = staging();
  std::lock_guard<std::mutex> lock(s.m);
  s.ensure();
  auto* d = static_cast<char*>(dst);
  const auto* h = static_cast<const char*>(src);
  for (std::size_t off = 0, i = 0; off < bytes; off += staging_area::chunk, ++i) {
    const int k = int(i % 2);
    const std::size_t len = std::min(staging_area::chunk, bytes - off);
    // The last DMA out of buf[k] must be done (counted as a host synchronisation when it is not yet).
    const cudaError_t q = cudaEventQuery(s.done[k]);
    if (q == cudaErrorNotReady) {
      count_host_sync();
      check(cudaEventSynchronize(s.done[k]), "cudaEventSynchronize");
    } else {
      check(q, "cudaEventQuery");
    }
    std::memcpy(s.buf[k], h + off, len);
    TRAINKIT_CUDA_CHECK_CTX(cudaMemcpyAsync(d + off, s.buf[k], len, cudaMemcpyHostToDevice, st),
                            "host -> device copy of " << bytes << " bytes (chunk at " << off << ")");
    TRAINKIT_CUDA_CHECK(cudaEventRecord(s.done[k], st));
  }
}

/// One host synchronisation; the device's error record (device_error.cuh) is read back in the
/// same wait and its error raised once the data has arrived.
inline void copy_device_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  const cudaStream_t st = current_stream();
  device_fault* const fault = enqueue_fault_readback(st);
  count_host_sync();
  if (bytes <= staging_area::direct_limit) {
    TRAINKIT_CUDA_CHECK_CTX(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st),
                            "device -> host copy of " << bytes << " bytes");
    TRAINKIT_CUDA_CHECK_CTX(cudaStreamSynchronize(st), "device -> host copy of " << bytes << " bytes");
    raise_fault(fault, st);
    return;
  }
  staging_area& s = staging();
  std::lock_guard<std::mutex> lock(s.m);
  s.ensure();
  auto* h = static_cast<char*>(dst);
  const auto* d = static_cast<const char*>(src);
  const std::size_t n_chunks = (bytes + staging_area::chunk - 1) / staging_area::chunk;
  auto issue = [&](std::size_t i) {
    const int k = int(i % 2);
    const std::size_t off = i * staging_area::chunk, len = std::min(staging_area::chunk, bytes - off);
    // buf[k] may still be read by the DMA of an earlier host -> device copy, maybe on another
    // stream: this copy into it waits for that one (on the device; the host goes on).
    TRAINKIT_CUDA_CHECK(cudaStreamWaitEvent(st, s.done[k], 0));
    TRAINKIT_CUDA_CHECK_CTX(cudaMemcpyAsync(s.buf[k], d + off, len, cudaMemcpyDeviceToHost, st),
                            "device -> host copy of " << bytes << " bytes (chunk at " << off << ")");
    TRAINKIT_CUDA_CHECK(cudaEventRecord(s.done[k], st));
  };
  issue(0);
  if (n_chunks > 1) issue(1);
  for (std::size_t i = 0; i < n_chunks; ++i) {
    const int k = int(i % 2);
    const std::size_t off = i * staging_area::chunk, len = std::min(staging_area::chunk, bytes - off);
    TRAINKIT_CUDA_CHECK_CTX(cudaEventSynchronize(s.done[k]), "device -> host copy of " << bytes << " bytes");
    std::memcpy(h + off, s.buf[k], len);
    if (i + 2 < n_chunks) issue(i + 2);
  }
  raise_fault(fault, st);  // the readback was issued before the first chunk
}

}  // namespace detail
}  // namespace backend::gpu

namespace detail {
template <>
struct transfer<cpu, cuda> {
  static void copy(void* dst, const void* src, std::size_t bytes) {
    backend::gpu::detail::copy_host_to_device(dst, src, bytes);
  }
};
template <>
struct transfer<cuda, cpu> {
  static void copy(void* dst, const void* src, std::size_t bytes) {
    backend::gpu::detail::copy_device_to_host(dst, src, bytes);
  }
};
template <>
struct transfer<cuda, cuda> {
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    TRAINKIT_CUDA_CHECK_CTX(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, backend::gpu::current_stream()),
                            "device -> device copy of " << bytes << " bytes");
  }
};
}  // namespace detail

}  // namespace trainkit
