// trainkit/core/allocator.hpp - where tensor memory comes from, and how much of it is in use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // getenv, strtoull
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "trainkit/core/device.hpp"
#include "trainkit/core/error.hpp"

namespace trainkit {

/// Byte counters every allocator keeps. Checkpointing tests and OOM messages read them.
struct memory_stats {
  std::size_t allocated = 0;    ///< bytes handed out to live tensors now
  std::size_t peak = 0;         ///< highest `allocated` since the last reset_peak()
  std::size_t reserved = 0;     ///< bytes held from the system: allocated + the caching allocator's free blocks
  std::size_t allocations = 0;  ///< number of allocate() calls so far
};

/// Memory of one device. Each backend specialises it; models provide
/// allocate(bytes) -> void*, deallocate(ptr, bytes), stats(), reset_peak().
/// \tparam Device a device tag (cpu, cuda)
template <class Device>
struct allocator {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::allocator has no specialisation for this device: include its backend header");
};

namespace detail {
struct byte_counter {
  std::atomic<std::size_t> allocated{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::size_t> allocations{0};

  void add(std::size_t bytes) {
    const std::size_t now = allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    allocations.fetch_add(1, std::memory_order_relaxed);
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void sub(std::size_t bytes) { allocated.fetch_sub(bytes, std::memory_order_relaxed); }
};
}  // namespace detail

namespace detail {
/// The host allocator's cache of freed blocks of 64 KiB and more, by size (rounded up to 4 KiB):
/// a training step frees and asks again for the same activation and gradient buffers every
/// step, and through malloc those above its mmap threshold came back from the kernel as fresh,
/// zero-filled pages each time, and the page faults cost a sizeable share of a step. Never destroyed
/// (a tensor in a static may be freed after any other static's destructor), so it is a pointer.
struct host_block_cache {
  static constexpr std::size_t min_bytes = std::size_t(64) << 10;
  static constexpr std::size_t granule = std::size_t(4) << 10;
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free;  // rounded size -> blocks
  std::size_t cached = 0;                                     // bytes in `free`
  std::size_t limit = 0;                                      // most bytes `free` may hold

  static std::size_t rounded(std::size_t bytes) noexcept { return (bytes + granule - 1) / granule * granule; }
  /// TRAINKIT_CPU_CACHE_MB (default 1024; 0 turns the cache off). Off in sanitizer builds: a
  /// reused block would hide a use after free from AddressSanitizer.
  static std::size_t limit_from_env() {
#if defined(__SANITIZE_ADDRESS__)
    return 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return 0;
#endif
#endif
    const char* v = std::getenv("TRAINKIT_CPU_CACHE_MB");
    if (!v || !*v) return std::size_t(1024) << 20;
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    TRAINKIT_CHECK(end && *end == '\0' && v[0] != '-', value_error, "TRAINKIT_CPU_CACHE_MB",
                   "expected a number of MiB (0: no cache), got '" << v << "'");
    return static_cast<std::size_t>(mb) << 20;
  }
  static host_block_cache& get() {
    static host_block_cache* c = [] {
      auto* p = new host_block_cache;
      p->limit = limit_from_env();
      return p;
    }();
    return *c;
  }
};
}  // namespace detail

/// Host memory: 64-byte aligned (one cache line, the widest AVX-512 load), counted. Blocks of
/// 64 KiB and more are kept when freed and handed out again for the same size (rounded to 4 KiB),
/// up to TRAINKIT_CPU_CACHE_MB (default 1024) - a caching allocator like the CUDA one; empty_cache()
/// gives them back. `allocated` counts what live tensors asked for; `reserved` adds the cache.
template <>
struct allocator<cpu> {
  static constexpr std::size_t alignment = 64;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    if (bytes >= detail::host_block_cache::min_bytes) {
      auto& c = detail::host_block_cache::get();
      const std::size_t r = c.rounded(bytes);
      if (c.limit > 0) {
        std::lock_guard<std::mutex> lock(c.mutex);
        if (auto it = c.free.find(r); it != c.free.end() && !it->second.empty()) {
          p = it->second.back();
          it->second.pop_back();
          c.cached -= r;
        }
      }
      if (!p) p = ::operator new(r, std::align_val_t{alignment}, std::nothrow);
    } else {
      p = ::operator new(bytes, std::align_val_t{alignment}, std::nothrow);
    }
    TRAINKIT_CHECK(p != nullptr, runtime_failure, "allocator<cpu>",
                   "out of memory: asked for " << bytes << " bytes with " << counter().allocated.load()
                                               << " bytes allocated");
    counter().add(bytes);
    return p;
  }

  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    counter().sub(bytes);
    if (bytes >= detail::host_block_cache::min_bytes) {
      auto& c = detail::host_block_cache::get();
      const std::size_t r = c.rounded(bytes);
      if (c.limit > 0) {
        try {
          std::lock_guard<std::mutex> lock(c.mutex);
          if (c.cached + r <= c.limit) {
            c.free[r].push_back(p);
            c.cached += r;
            return;
          }
        } catch (...) {  // no room for the bookkeeping: give the block back instead
        }
      }
      ::operator delete(p, std::align_val_t{alignment});
      return;
    }
    ::operator delete(p, std::align_val_t{alignment});
  }

  static memory_stats stats() {
    const auto& c = counter();
    const std::size_t a = c.allocated.load();
    return {a, c.peak.load(), a + cached_bytes(), c.allocations.load()};
  }

  /// Bytes of freed blocks the cache holds for reuse.
  static std::size_t cached_bytes() {
    auto& c = detail::host_block_cache::get();
    std::lock_guard<std::mutex> lock(c.mutex);
    return c.cached;
  }

  /// Gives every cached block back to the system (torch.cuda.empty_cache's host twin).
  static void empty_cache() {
    auto& c = detail::host_block_cache::get();
    std::lock_guard<std::mutex> lock(c.mutex);
    for (auto& [size, blocks] : c.free)
      for (void* b : blocks) ::operator delete(b, std::align_val_t{alignment});
    c.free.clear();
    c.cached = 0;
  }

  /// Starts a new peak measurement from what is allocated now.
  static void reset_peak() { counter().peak.store(counter().allocated.load()); }

 private:
  static detail::byte_counter& counter() {
    static detail::byte_counter c;
    return c;
  }
};

}  // namespace trainkit
