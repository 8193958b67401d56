// trainkit/core/storage.hpp - a reference-counted buffer of elements on one device.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>

#include "trainkit/core/allocator.hpp"

namespace trainkit {

/// A flat buffer owned by shared_ptr; tensors are views (sizes, strides, offset) into one.
/// \tparam T trivially copyable element type
/// \tparam Device where the memory lives
template <class T, class Device>
class storage {
  static_assert(std::is_trivially_copyable_v<T>, "tensor elements must be trivially copyable");

 public:
  explicit storage(std::size_t n)
      : data_(static_cast<T*>(allocator<Device>::allocate(n * sizeof(T)))), size_(n) {}
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() { allocator<Device>::deallocate(data_, size_ * sizeof(T)); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  T* data_;
  std::size_t size_;
};

}  // namespace trainkit
