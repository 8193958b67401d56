// trainkit/backend/cuda/stream.cuh - devices, streams and events, and the current stream every
// trainkit kernel, copy and library call of this thread is issued on.
//
// The current stream is a per-thread setting (default: the legacy default stream 0, which
// orders itself with every blocking stream). stream_guard changes it for a scope; the caching
// allocator hands out memory per stream, so work on another stream either allocates there or
// marks borrowed blocks with allocator<cuda>::record_stream.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "trainkit/backend/cuda/error.cuh"

namespace trainkit::backend::gpu {

namespace detail {
inline std::atomic<std::int64_t>& host_sync_counter() noexcept {
  static std::atomic<std::int64_t> n{0};
  return n;
}
/// Called wherever trainkit blocks the host on the device (stream, device and event
/// synchronisation, a copy to the host).
inline void count_host_sync() noexcept { host_sync_counter().fetch_add(1, std::memory_order_relaxed); }

/// Called with every owned stream (gpu::stream) just before it is destroyed, after its work has
/// finished: the caching allocator (allocator.cuh) sets it when it is first used, so that it
/// forgets the stream (blocks that recorded a use on it outlive it: gradients in a data_parallel's
/// buckets). nullptr until then.
using stream_destroyed_fn = void (*)(cudaStream_t) noexcept;
inline std::atomic<stream_destroyed_fn>& stream_destroyed_hook() noexcept {
  static std::atomic<stream_destroyed_fn> hook{nullptr};
  return hook;
}
}  // namespace detail

/// How many times trainkit itself has blocked the host on the device so far, process-wide:
/// synchronize(), stream and event synchronize(), every copy to the host (item(), to_vector(),
/// to<cpu>()), check_device_errors(), and the waits of the staging buffers and the allocator when
/// they really wait. The difference over a training step is its number of host synchronisations.
inline std::int64_t host_syncs() noexcept { return detail::host_sync_counter().load(std::memory_order_relaxed); }

/// Number of visible CUDA devices; 0 (never an exception) without a driver or a device.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// True when at least one CUDA device can be used.
inline bool available() noexcept { return device_count() > 0; }

inline int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

inline void set_device(int d) { TRAINKIT_CUDA_CHECK_CTX(cudaSetDevice(d), "device " << d); }

/// Makes device d current for a scope and restores the previous one.
class device_guard {
 public:
  explicit device_guard(int d) : previous_(current_device()) {
    if (d != previous_) set_device(d);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() { (void)cudaSetDevice(previous_); }

 private:
  int previous_;
};

namespace detail {
inline cudaStream_t& current_stream_slot() noexcept {
  thread_local cudaStream_t s = nullptr;  // the legacy default stream
  return s;
}
}  // namespace detail

/// The stream this thread's trainkit work goes to.
inline cudaStream_t current_stream() noexcept { return detail::current_stream_slot(); }
inline void set_current_stream(cudaStream_t s) noexcept { detail::current_stream_slot() = s; }

/// Makes s the current stream for a scope.
class stream_guard {
 public:
  explicit stream_guard(cudaStream_t s) noexcept : previous_(current_stream()) { set_current_stream(s); }
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;
  ~stream_guard() { set_current_stream(previous_); }

 private:
  cudaStream_t previous_;
};

/// Blocks the host until every stream of the current device is idle (and reports any
/// asynchronous fault of earlier kernels).
inline void synchronize() {
  detail::count_host_sync();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/// Blocks the host until the current stream is idle.
inline void synchronize_stream(cudaStream_t s = current_stream()) {
  detail::count_host_sync();
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

/// An owned CUDA stream (non-blocking by default: it does not wait for the legacy stream).
class stream {
 public:
  explicit stream(bool non_blocking = true, int priority = 0) {
    TRAINKIT_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault,
                                                     priority));
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  /// Waits for the stream's work, tells the caching allocator that the stream is gone, destroys it.
  ~stream() {
    if (s_ == nullptr) return;
    if (auto hook = detail::stream_destroyed_hook().load(std::memory_order_acquire)) {
      if (cudaStreamSynchronize(s_) != cudaSuccess) (void)cudaGetLastError();  // a destructor cannot report
      hook(s_);
    }
    (void)cudaStreamDestroy(s_);
  }

  cudaStream_t get() const noexcept { return s_; }
  operator cudaStream_t() const noexcept { return s_; }
  void synchronize() const {
    detail::count_host_sync();
    check(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
  }
  /// True when all work issued so far has finished.
  bool query() const {
    const cudaError_t e = cudaStreamQuery(s_);
    if (e == cudaErrorNotReady) return false;
    check(e, "cudaStreamQuery");
    return true;
  }

 private:
  cudaStream_t s_ = nullptr;
};

/// An owned CUDA event: a point in a stream that other streams or the host can wait for.
class event {
 public:
  /// timing = false: cheaper, for synchronisation only.
  explicit event(bool timing = false) {
    TRAINKIT_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~event() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }

  cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s = current_stream()) { TRAINKIT_CUDA_CHECK(cudaEventRecord(e_, s)); }
  /// Work issued to s from now on waits for this event (the host does not block).
  void wait(cudaStream_t s = current_stream()) const { TRAINKIT_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }
  void synchronize() const {
    detail::count_host_sync();
    TRAINKIT_CUDA_CHECK(cudaEventSynchronize(e_));
  }
  bool query() const {
    const cudaError_t e = cudaEventQuery(e_);
    if (e == cudaErrorNotReady) return false;
    check(e, "cudaEventQuery");
    return true;
  }
  /// Milliseconds between two recorded timing events (end must have completed).
  static float elapsed_ms(const event& start, const event& end) {
    float ms = 0;
    TRAINKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, end.e_));
    return ms;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

/// Properties of the current device that launch heuristics need, read once per device.
struct device_info {
  int multiprocessors = 1;
  int max_threads_per_multiprocessor = 2048;
  int compute_major = 0, compute_minor = 0;
  std::size_t total_memory = 0;
};

inline const device_info& current_device_info() {
  constexpr int max_devices = 64;
  thread_local device_info cache[max_devices];
  thread_local bool filled[max_devices] = {};
  const int d = current_device();
  if (d < 0 || d >= max_devices) {
    static thread_local device_info fallback;
    return fallback;
  }
  if (!filled[d]) {
    device_info& i = cache[d];
    check(cudaDeviceGetAttribute(&i.multiprocessors, cudaDevAttrMultiProcessorCount, d), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&i.max_threads_per_multiprocessor, cudaDevAttrMaxThreadsPerMultiProcessor, d),
          "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&i.compute_major, cudaDevAttrComputeCapabilityMajor, d), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&i.compute_minor, cudaDevAttrComputeCapabilityMinor, d), "cudaDeviceGetAttribute");
    std::size_t free_b = 0;
    if (cudaMemGetInfo(&free_b, &i.total_memory) != cudaSuccess) (void)cudaGetLastError();
    filled[d] = true;
  }
  return cache[d];
}

}  // namespace trainkit::backend::gpu
