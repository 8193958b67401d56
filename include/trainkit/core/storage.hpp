// trainkit/core/storage.hpp - a reference-counted buffer of elements on one device.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>

#include "trainkit/core/allocator.hpp"

namespace trainkit {

/// A flat buffer owned by shared_ptr; tensors are views (sizes, strides, offset) into one. The
/// memory comes from allocator<Device> (counted in its stats), or is adopted together with the
/// function that frees it (memory of another kind, such as page-locked host memory for the CUDA
/// data loader; not counted).
/// \tparam T trivially copyable element type
/// \tparam Device where the memory lives
template <class T, class Device>
class storage {
  static_assert(std::is_trivially_copyable_v<T>, "tensor elements must be trivially copyable");

 public:
  /// Frees adopted memory: release(data, bytes).
  using release_fn = void (*)(void*, std::size_t) noexcept;

  explicit storage(std::size_t n)
      : data_(static_cast<T*>(allocator<Device>::allocate(n * sizeof(T)))), size_(n) {}
  /// Adopts n elements at data; the destructor calls release(data, n * sizeof(T)).
  storage(T* data, std::size_t n, release_fn release) noexcept : data_(data), size_(n), release_(release) {}
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() {
    if (release_ != nullptr)
      release_(data_, size_ * sizeof(T));
    else
      allocator<Device>::deallocate(data_, size_ * sizeof(T));
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  T* data_;
  std::size_t size_;
  release_fn release_ = nullptr;
};

}  // namespace trainkit
