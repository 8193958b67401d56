// trainkit/core/allocator.hpp - where tensor memory comes from, and how much of it is in use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "trainkit/core/device.hpp"
#include "trainkit/core/error.hpp"

namespace trainkit {

/// Byte counters every allocator keeps. Checkpointing tests and OOM messages read them.
struct memory_stats {
  std::size_t allocated = 0;    ///< bytes handed out to live tensors now
  std::size_t peak = 0;         ///< highest `allocated` since the last reset_peak()
  std::size_t reserved = 0;     ///< bytes held from the system (equals allocated on the CPU)
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

/// Host memory: 64-byte aligned (one cache line, the widest AVX-512 load), counted.
template <>
struct allocator<cpu> {
  static constexpr std::size_t alignment = 64;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = ::operator new(bytes, std::align_val_t{alignment}, std::nothrow);
    TRAINKIT_CHECK(p != nullptr, runtime_failure, "allocator<cpu>",
                   "out of memory: asked for " << bytes << " bytes with " << counter().allocated.load()
                                               << " bytes allocated");
    counter().add(bytes);
    return p;
  }

  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    ::operator delete(p, std::align_val_t{alignment});
    counter().sub(bytes);
  }

  static memory_stats stats() {
    const auto& c = counter();
    const std::size_t a = c.allocated.load();
    return {a, c.peak.load(), a, c.allocations.load()};
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
