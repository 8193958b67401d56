// trainkit/backend/cuda/allocator.cuh - allocator<cuda>: a caching allocator of device memory.
//
// cudaMalloc and cudaFree synchronise the device and cost tens of microseconds, so, as in
// PyTorch, freed blocks are kept and handed out again:
//   - requests are rounded up to size classes (512 B minimum; four classes per power of two up
//     to 1 MiB, eight above), so a block is reused by any request of its class and rounding
//     wastes at most 25 % (12.5 % for large blocks);
//   - a block is reused only on the stream it was allocated on (stream order makes that safe
//     without events); record_stream(p, s) marks a block that another stream also uses, and
//     its reuse then waits until events recorded on those streams at free time have completed;
//   - a stream that is destroyed (gpu::stream's destructor, after its work has finished) is
//     forgotten: live blocks drop it from their uses, and its cached blocks go back to the driver -
//     blocks may outlive the streams that used them (a data_parallel's buckets outlive its side
//     stream), and an event recorded on a destroyed stream is a crash;
//   - the events of a block's uses belong to the block's device (recorded with that device
//     current, kept per device for reuse);
//   - when cudaMalloc fails (or the reserved limit is hit), every cached block of the device is
//     released and the allocation retried once; a second failure throws runtime_failure saying
//     how much was asked, allocated and reserved.
// Counters (same memory_stats as allocator<cpu>): allocated = requested bytes of live blocks,
// peak = its maximum since reset_peak(), reserved = bytes held from the driver (live + cached).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/core/allocator.hpp"

namespace trainkit {

namespace backend::gpu::detail {

inline constexpr int max_devices = 64;

struct device_block {
  void* ptr = nullptr;
  std::size_t size = 0;       // the size class: what cudaMalloc gave
  std::size_t requested = 0;  // what the caller asked for (counted in `allocated`)
  int device = 0;
  cudaStream_t stream = nullptr;
  std::vector<cudaStream_t> uses;  // other streams that read or write it (record_stream)
};

struct pending_block {
  device_block b;
  std::vector<cudaEvent_t> events;  // one per stream in b.uses, recorded at free time
};

struct device_pool {
  // (stream, size class) -> free blocks of that class allocated on that stream
  std::map<std::pair<cudaStream_t, std::size_t>, std::vector<device_block>> free;
  std::vector<cudaEvent_t> spare_events;  // created on this device, recorded and completed
  std::size_t allocated = 0, peak = 0, reserved = 0, cached = 0, allocations = 0;
};

struct allocator_state {
  std::mutex m;
  std::unordered_map<void*, device_block> live;
  device_pool pools[max_devices];
  std::vector<pending_block> pending;
  std::size_t reserved_limit = 0;  // 0: no limit but the device's memory
};

inline void forget_stream(cudaStream_t st) noexcept;

inline allocator_state& state() {
  // Leaked on purpose: tensors in static storage may be destroyed after any static here, and
  // cudaFree after the runtime has shut down fails anyway.
  static allocator_state* s = [] {
    stream_destroyed_hook().store(&forget_stream, std::memory_order_release);
    return new allocator_state;
  }();
  return *s;
}

/// Makes device `d` current for a scope (the allocator's own: no checks, a destructor may use it).
struct quiet_device_scope {
  int previous = -1;
  explicit quiet_device_scope(int d) noexcept {
    if (cudaGetDevice(&previous) != cudaSuccess) {
      (void)cudaGetLastError();
      previous = -1;
    }
    if (previous != d && cudaSetDevice(d) != cudaSuccess) (void)cudaGetLastError();
  }
  ~quiet_device_scope() {
    if (previous >= 0) (void)cudaSetDevice(previous);
  }
  quiet_device_scope(const quiet_device_scope&) = delete;
  quiet_device_scope& operator=(const quiet_device_scope&) = delete;
};

/// The size class of a request: a multiple of 512 B, then 4 (<= 1 MiB) or 8 steps per power of two:
/// (2^k, 2^(k+1)] is cut into steps of 2^(k-2) (2^(k-3)), so rounding adds less than 25 % (12.5 %),
/// or at most the 512 B minimum step. (PyTorch rounds to 512 B below 1 MiB and to 2 MiB blocks
/// above; its roundup_power2_divisions option is this rule.)
inline std::size_t round_size(std::size_t bytes) noexcept {
  constexpr std::size_t min_block = 512;
  if (bytes <= min_block) return min_block;
  int log2 = 0;
  while ((std::size_t(1) << (log2 + 1)) < bytes) ++log2;  // 2^log2 < bytes <= 2^(log2 + 1)
  const int sub = bytes <= (std::size_t(1) << 20) ? 2 : 3;
  std::size_t step = std::size_t(1) << std::max(0, log2 - sub);
  step = std::max(step, min_block);
  return (bytes + step - 1) / step * step;
}

// Moves blocks whose cross-stream uses have finished to the free lists (lock held).
inline void process_pending(allocator_state& s) {
  for (std::size_t i = 0; i < s.pending.size();) {
    pending_block& p = s.pending[i];
    bool done = true;
    for (cudaEvent_t e : p.events) {
      const cudaError_t q = cudaEventQuery(e);
      if (q == cudaErrorNotReady) {
        done = false;
        break;
      }
      if (q != cudaSuccess) (void)cudaGetLastError();  // a failed event: treat as finished
    }
    if (!done) {
      ++i;
      continue;
    }
    for (cudaEvent_t e : p.events) s.pools[p.b.device].spare_events.push_back(e);
    device_block b = std::move(p.b);
    b.uses.clear();
    s.pools[b.device].free[{b.stream, b.size}].push_back(std::move(b));
    s.pending[i] = std::move(s.pending.back());
    s.pending.pop_back();
  }
}

// Returns every cached block of `device` (all devices when -1) to the driver (lock held).
inline void release_cached(allocator_state& s, int device) {
  // Blocks still waiting for other streams must finish first.
  if (!s.pending.empty()) {
    count_host_sync();
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    process_pending(s);
  }
  for (int d = 0; d < max_devices; ++d) {
    if (device >= 0 && d != device) continue;
    device_pool& pool = s.pools[d];
    if (pool.free.empty()) continue;
    int previous = 0;
    (void)cudaGetDevice(&previous);
    if (previous != d) (void)cudaSetDevice(d);
    for (auto& [key, blocks] : pool.free)
      for (device_block& b : blocks) {
        (void)cudaFree(b.ptr);
        pool.reserved -= b.size;
        pool.cached -= b.size;
      }
    pool.free.clear();
    (void)cudaGetLastError();
    if (previous != d) (void)cudaSetDevice(previous);
  }
}

/// The hook of gpu::stream's destructor (the stream's work has finished): live blocks forget their
/// uses of `st`; cached blocks allocated on it are returned to the driver (no stream can reuse them
/// any more: a new stream may get the same handle, but nothing orders it after the old one).
inline void forget_stream(cudaStream_t st) noexcept {
  try {
    allocator_state& s = state();
    std::lock_guard<std::mutex> lock(s.m);
    for (auto& [p, b] : s.live) std::erase(b.uses, st);
    for (int d = 0; d < max_devices; ++d) {
      device_pool& pool = s.pools[d];
      for (auto it = pool.free.begin(); it != pool.free.end();) {
        if (it->first.first != st) {
          ++it;
          continue;
        }
        quiet_device_scope scope(d);
        for (device_block& b : it->second) {
          if (cudaFree(b.ptr) != cudaSuccess) (void)cudaGetLastError();
          pool.reserved -= b.size;
          pool.cached -= b.size;
        }
        it = pool.free.erase(it);
      }
    }
  } catch (...) {
    // Nothing to report from a destructor; the blocks stay cached at worst.
  }
}

}  // namespace backend::gpu::detail

/// Device memory of the current CUDA device from a caching allocator (see the file comment).
template <>
struct allocator<cuda> {
  /// cudaMalloc's alignment; every block starts on it.
  static constexpr std::size_t alignment = 256;

  /// A block of at least `bytes` on the current device, usable by work on the current stream.
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    namespace g = backend::gpu;
    auto& s = g::detail::state();
    const int device = g::current_device();
    TRAINKIT_CHECK(device >= 0 && device < g::detail::max_devices, runtime_failure, "allocator<cuda>",
                   "device " << device << " is beyond the " << g::detail::max_devices << " devices supported");
    const std::size_t size = g::detail::round_size(bytes);
    const cudaStream_t stream = g::current_stream();
    std::lock_guard<std::mutex> lock(s.m);
    g::detail::device_pool& pool = s.pools[device];
    if (!s.pending.empty()) g::detail::process_pending(s);

    g::detail::device_block b;
    auto it = pool.free.find({stream, size});
    if (it != pool.free.end() && !it->second.empty()) {
      b = std::move(it->second.back());
      it->second.pop_back();
      if (it->second.empty()) pool.free.erase(it);
      pool.cached -= b.size;
    } else {
      b.ptr = device_malloc(s, pool, device, bytes, size);
      b.size = size;
      b.device = device;
      b.stream = stream;
      pool.reserved += size;
    }
    b.requested = bytes;
    pool.allocated += bytes;
    pool.peak = std::max(pool.peak, pool.allocated);
    ++pool.allocations;
    void* p = b.ptr;
    s.live.emplace(p, std::move(b));
    return p;
  }

  /// Returns a block to the cache (never to the driver; see empty_cache()).
  static void deallocate(void* p, std::size_t /*bytes*/) noexcept {
    if (p == nullptr) return;
    namespace g = backend::gpu;
    auto& s = g::detail::state();
    try {
      std::lock_guard<std::mutex> lock(s.m);
      auto it = s.live.find(p);
      if (it == s.live.end()) return;  // not ours: ignore rather than corrupt the pools
      g::detail::device_block b = std::move(it->second);
      s.live.erase(it);
      g::detail::device_pool& pool = s.pools[b.device];
      pool.allocated -= b.requested;
      pool.cached += b.size;
      if (b.uses.empty()) {
        pool.free[{b.stream, b.size}].push_back(std::move(b));
        return;
      }
      g::detail::pending_block pb;
      g::detail::quiet_device_scope scope(b.device);  // the streams and events of the block's device
      for (cudaStream_t u : b.uses) {
        cudaEvent_t e = nullptr;
        if (!pool.spare_events.empty()) {
          e = pool.spare_events.back();
          pool.spare_events.pop_back();
        } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
          (void)cudaGetLastError();
          g::detail::count_host_sync();
          (void)cudaStreamSynchronize(u);  // no event: wait here instead
          continue;
        }
        if (cudaEventRecord(e, u) != cudaSuccess) {  // not recorded: wait for the stream instead
          (void)cudaGetLastError();
          g::detail::count_host_sync();
          (void)cudaStreamSynchronize(u);
          (void)cudaGetLastError();
          pool.spare_events.push_back(e);
          continue;
        }
        pb.events.push_back(e);
      }
      pb.b = std::move(b);
      s.pending.push_back(std::move(pb));
    } catch (...) {
      // Deallocation cannot report; the block is lost at worst.
    }
  }

  /// Marks the block that holds p as used by stream `st` too (work there may still read or
  /// write it when the owning tensor is freed): its reuse then waits for that work.
  static void record_stream(const void* p, cudaStream_t st) {
    auto& s = backend::gpu::detail::state();
    std::lock_guard<std::mutex> lock(s.m);
    auto it = s.live.find(const_cast<void*>(p));
    TRAINKIT_CHECK(it != s.live.end(), usage_error, "allocator<cuda>::record_stream",
                   "pointer " << p << " is not the start of a live block of the caching allocator");
    auto& b = it->second;
    if (st != b.stream && std::find(b.uses.begin(), b.uses.end(), st) == b.uses.end()) b.uses.push_back(st);
  }

  /// Counters of the current device.
  static memory_stats stats() { return stats(backend::gpu::current_device()); }
  static memory_stats stats(int device) {
    auto& s = backend::gpu::detail::state();
    std::lock_guard<std::mutex> lock(s.m);
    const auto& p = s.pools[device];
    return {p.allocated, p.peak, p.reserved, p.allocations};
  }
  /// Bytes held in cached (free) blocks of the current device.
  static std::size_t cached_bytes() {
    auto& s = backend::gpu::detail::state();
    const int d = backend::gpu::current_device();
    std::lock_guard<std::mutex> lock(s.m);
    return s.pools[d].cached;
  }

  /// Starts a new peak measurement from what is allocated now (current device).
  static void reset_peak() {
    auto& s = backend::gpu::detail::state();
    const int d = backend::gpu::current_device();
    std::lock_guard<std::mutex> lock(s.m);
    s.pools[d].peak = s.pools[d].allocated;
  }

  /// Returns every cached block (of every device) to the driver; live blocks stay.
  static void empty_cache() {
    auto& s = backend::gpu::detail::state();
    std::lock_guard<std::mutex> lock(s.m);
    backend::gpu::detail::release_cached(s, -1);
  }

  /// Caps the bytes reserved per device (0: no cap): an allocation beyond it first empties the
  /// cache, then fails as an out-of-memory would. For tests and for sharing a GPU.
  static void set_reserved_limit(std::size_t bytes) {
    auto& s = backend::gpu::detail::state();
    std::lock_guard<std::mutex> lock(s.m);
    s.reserved_limit = bytes;
  }

  /// The size class a request of `bytes` is served from.
  static std::size_t round_size(std::size_t bytes) noexcept { return backend::gpu::detail::round_size(bytes); }

 private:
  static void* device_malloc(backend::gpu::detail::allocator_state& s, backend::gpu::detail::device_pool& pool,
                             int device, std::size_t bytes, std::size_t size) {
    namespace g = backend::gpu;
    auto try_malloc = [&]() -> void* {
      if (s.reserved_limit != 0 && pool.reserved + size > s.reserved_limit) return nullptr;
      void* p = nullptr;
      const cudaError_t e = cudaMalloc(&p, size);
      if (e == cudaSuccess) return p;
      (void)cudaGetLastError();  // out of memory is not sticky; clear it
      if (e != cudaErrorMemoryAllocation) g::check(e, "cudaMalloc", "allocator<cuda> asked for " + std::to_string(size) + " bytes");
      return nullptr;
    };
    void* p = try_malloc();
    if (p == nullptr && pool.cached > 0) {
      g::detail::release_cached(s, device);
      p = try_malloc();
    }
    if (p == nullptr) {
      std::size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
      std::ostringstream os;
      os << "out of memory on device " << device << ": asked for " << bytes << " bytes (" << mib(bytes)
         << " MiB, a block of " << size << " bytes) with " << pool.allocated << " bytes (" << mib(pool.allocated)
         << " MiB) allocated and " << pool.reserved << " bytes (" << mib(pool.reserved)
         << " MiB) reserved by trainkit; the device has " << mib(free_b) << " MiB free of " << mib(total_b) << " MiB";
      if (s.reserved_limit != 0) os << " (reserved limit " << s.reserved_limit << " bytes)";
      throw runtime_failure("allocator<cuda>: " + os.str());
    }
    return p;
  }
  static double mib(std::size_t b) { return double(b) / double(1 << 20); }
};

namespace backend::gpu::detail {
/// Device memory of n elements of T for the length of a call (a kernel's scratch, a cuDNN
/// workspace), handed back to the caching allocator when it goes out of scope - after the work
/// using it is enqueued: stream-ordered, the block goes only to work queued after it.
template <class T = std::byte>
struct scratch {
  T* p = nullptr;
  std::size_t bytes = 0;
  explicit scratch(std::size_t n) : bytes(n * sizeof(T)) {
    if (bytes) p = static_cast<T*>(allocator<cuda>::allocate(bytes));
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() { allocator<cuda>::deallocate(p, bytes); }
};
}  // namespace backend::gpu::detail

}  // namespace trainkit
