// trainkit/core/tensor.hpp - tensor<T, Device>: sizes, strides and an offset into shared storage.
#pragma once

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "trainkit/core/device.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/storage.hpp"

namespace trainkit {

template <class T, class Device>
class tensor;

// Defined with the elementwise ops (ops/elementwise.hpp); declared here so that
// contiguous() and clone() can use them without tensor.hpp pulling in a backend.
template <class T, class Device>
void copy_(tensor<T, Device>& dst, const tensor<T, Device>& src);
template <class T, class Device>
void fill_(tensor<T, Device>& dst, T value);

/// A strided view of elements of type T on Device. Copies share storage (like torch.Tensor);
/// clone() copies the elements. Every view op (reshape, transpose, slice, expand...) returns a
/// tensor that shares storage; contiguous() copies only when the view is not dense.
/// \tparam T element type (float, double, half, bfloat16, integers)
/// \tparam Device cpu or cuda
template <class T, class Device = cpu>
class tensor {
  static_assert(element<T>, "tensor<T, Device>: T must be an arithmetic type, half or bfloat16");
  static_assert(device<Device>, "tensor<T, Device>: Device must be a device tag such as trainkit::cpu");

 public:
  using value_type = T;
  using device_type = Device;
  using storage_type = storage<T, Device>;

  /// An undefined tensor (no storage); defined() is false.
  tensor() = default;

  /// A tensor of the given sizes, zero-filled.
  explicit tensor(shape sizes) : tensor(empty(std::move(sizes))) { fill_(*this, T(0)); }

  /// Uninitialised memory of the given sizes.
  static tensor empty(shape sizes) {
    for (index_t s : sizes)
      TRAINKIT_CHECK(s >= 0, shape_error, "tensor::empty", "negative size in " << to_string(sizes));
    tensor t;
    const index_t n = trainkit::numel(sizes);
    t.storage_ = std::make_shared<storage_type>(static_cast<std::size_t>(n));
    t.strides_ = contiguous_strides(sizes);
    t.sizes_ = std::move(sizes);
    return t;
  }
  static tensor zeros(shape sizes) { return tensor(std::move(sizes)); }
  static tensor full(shape sizes, T value) {
    tensor t = empty(std::move(sizes));
    fill_(t, value);
    return t;
  }
  static tensor ones(shape sizes) { return full(std::move(sizes), T(1)); }
  static tensor scalar(T value) { return full({}, value); }

  /// Copies host values into a new tensor; values.size() must equal the element count of sizes.
  static tensor from_vector(const std::vector<T>& values, shape sizes) {
    TRAINKIT_CHECK(static_cast<index_t>(values.size()) == trainkit::numel(sizes), shape_error, "tensor::from_vector",
                   values.size() << " values do not fill shape " << to_string(sizes));
    if constexpr (std::is_same_v<Device, cpu>) {
      tensor t = empty(std::move(sizes));
      if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
      return t;
    } else {
      return tensor<T, cpu>::from_vector(values, std::move(sizes)).template to<Device>();
    }
  }
  static tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, {static_cast<index_t>(values.size())});
  }

  /// A view with explicit sizes/strides/offset into existing storage (used by backends and views).
  static tensor from_storage(std::shared_ptr<storage_type> st, shape sizes, shape strides, index_t offset) {
    tensor t;
    t.storage_ = std::move(st);
    t.sizes_ = std::move(sizes);
    t.strides_ = std::move(strides);
    t.offset_ = offset;
    return t;
  }

  // ---- metadata -------------------------------------------------------------------------
  bool defined() const noexcept { return storage_ != nullptr || !sizes_.empty(); }
  const shape& sizes() const noexcept { return sizes_; }
  const shape& strides() const noexcept { return strides_; }
  index_t offset() const noexcept { return offset_; }
  std::size_t dim() const noexcept { return sizes_.size(); }
  index_t size(index_t d) const { return sizes_[wrap_dim(d, dim(), "tensor::size")]; }
  index_t stride(index_t d) const { return strides_[wrap_dim(d, dim(), "tensor::stride")]; }
  index_t numel() const noexcept { return trainkit::numel(sizes_); }
  const std::shared_ptr<storage_type>& storage_ptr() const noexcept { return storage_; }

  /// Pointer to the first element of the view (nullptr when empty). Device memory for cuda.
  T* data() const noexcept { return storage_ ? storage_->data() + offset_ : nullptr; }

  /// True when the elements are laid out densely in row-major order (size-1 dims ignored).
  bool is_contiguous() const noexcept {
    index_t expected = 1;
    for (std::size_t i = dim(); i-- > 0;) {
      if (sizes_[i] == 1) continue;
      if (strides_[i] != expected) return false;
      expected *= sizes_[i];
    }
    return true;
  }

  // ---- views ----------------------------------------------------------------------------
  /// Same elements, new sizes; the tensor must be contiguous (one size may be -1).
  tensor view(shape sizes) const {
    sizes = infer_size(std::move(sizes), numel(), "view");
    TRAINKIT_CHECK(is_contiguous(), shape_error, "view",
                   "a tensor of sizes " << to_string(sizes_) << " and strides " << to_string(strides_)
                                        << " is not contiguous; use reshape()");
    shape st = contiguous_strides(sizes);
    return from_storage(storage_, std::move(sizes), std::move(st), offset_);
  }

  /// view() when possible, else a contiguous copy with the new sizes.
  tensor reshape(shape sizes) const {
    if (is_contiguous()) return view(std::move(sizes));
    return contiguous().view(std::move(sizes));
  }

  /// Collapses dims [start, end] into one.
  tensor flatten(index_t start = 0, index_t end = -1) const {
    if (dim() == 0) return reshape({1});
    const std::size_t s = wrap_dim(start, dim(), "flatten"), e = wrap_dim(end, dim(), "flatten");
    TRAINKIT_CHECK(s <= e, shape_error, "flatten", "start dim " << start << " is after end dim " << end);
    shape ns(sizes_.begin(), sizes_.begin() + static_cast<std::ptrdiff_t>(s));
    index_t m = 1;
    for (std::size_t i = s; i <= e; ++i) m *= sizes_[i];
    ns.push_back(m);
    ns.insert(ns.end(), sizes_.begin() + static_cast<std::ptrdiff_t>(e) + 1, sizes_.end());
    return reshape(std::move(ns));
  }

  tensor transpose(index_t d0, index_t d1) const {
    const std::size_t a = wrap_dim(d0, dim(), "transpose"), b = wrap_dim(d1, dim(), "transpose");
    tensor t = *this;
    std::swap(t.sizes_[a], t.sizes_[b]);
    std::swap(t.strides_[a], t.strides_[b]);
    return t;
  }

  /// Matrix transpose of a 2-D tensor (t() in PyTorch).
  tensor t() const {
    TRAINKIT_CHECK(dim() == 2, shape_error, "t", "expects a 2-D tensor, got sizes " << to_string(sizes_));
    return transpose(0, 1);
  }

  tensor permute(const std::vector<index_t>& order) const {
    TRAINKIT_CHECK(order.size() == dim(), shape_error, "permute",
                   "order has " << order.size() << " entries for a tensor of sizes " << to_string(sizes_));
    std::vector<bool> seen(dim(), false);
    tensor t = *this;
    for (std::size_t i = 0; i < dim(); ++i) {
      const std::size_t d = wrap_dim(order[i], dim(), "permute");
      TRAINKIT_CHECK(!seen[d], shape_error, "permute", "dimension " << d << " repeated in the order");
      seen[d] = true;
      t.sizes_[i] = sizes_[d];
      t.strides_[i] = strides_[d];
    }
    return t;
  }

  /// Elements start, start+step, ... < end along dim d (Python slicing; negative start/end count
  /// from the end and are clamped).
  tensor slice(index_t d, index_t start, index_t end, index_t step = 1) const {
    const std::size_t k = wrap_dim(d, dim(), "slice");
    TRAINKIT_CHECK(step > 0, value_error, "slice", "step must be positive, got " << step);
    const index_t n = sizes_[k];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = std::clamp<index_t>(start, 0, n);
    end = std::clamp<index_t>(end, start, n);
    tensor t = *this;
    t.offset_ += start * strides_[k];
    t.sizes_[k] = (end - start + step - 1) / step;
    t.strides_[k] = strides_[k] * step;
    return t;
  }

  /// Index i along dim d; removes that dimension.
  tensor select(index_t d, index_t i) const {
    const std::size_t k = wrap_dim(d, dim(), "select");
    const index_t n = sizes_[k];
    TRAINKIT_CHECK(i >= -n && i < n, index_error, "select",
                   "index " << i << " is out of range for dimension " << k << " of size " << n);
    if (i < 0) i += n;
    tensor t = *this;
    t.offset_ += i * strides_[k];
    t.sizes_.erase(t.sizes_.begin() + static_cast<std::ptrdiff_t>(k));
    t.strides_.erase(t.strides_.begin() + static_cast<std::ptrdiff_t>(k));
    return t;
  }

  tensor unsqueeze(index_t d) const {
    const std::size_t k = wrap_dim(d, dim() + 1, "unsqueeze");
    tensor t = *this;
    const index_t st = k < dim() ? strides_[k] * sizes_[k] : 1;
    t.sizes_.insert(t.sizes_.begin() + static_cast<std::ptrdiff_t>(k), 1);
    t.strides_.insert(t.strides_.begin() + static_cast<std::ptrdiff_t>(k), st);
    return t;
  }

  /// Removes dim d, which must have size 1.
  tensor squeeze(index_t d) const {
    const std::size_t k = wrap_dim(d, dim(), "squeeze");
    TRAINKIT_CHECK(sizes_[k] == 1, shape_error, "squeeze",
                   "dimension " << k << " of sizes " << to_string(sizes_) << " is not 1");
    tensor t = *this;
    t.sizes_.erase(t.sizes_.begin() + static_cast<std::ptrdiff_t>(k));
    t.strides_.erase(t.strides_.begin() + static_cast<std::ptrdiff_t>(k));
    return t;
  }

  /// Broadcasts size-1 dims (stride 0) and prepends new leading dims; -1 keeps a size.
  tensor expand(const shape& target) const {
    TRAINKIT_CHECK(target.size() >= dim(), shape_error, "expand",
                   "cannot expand sizes " << to_string(sizes_) << " to fewer dimensions " << to_string(target));
    const std::size_t lead = target.size() - dim();
    tensor t;
    t.storage_ = storage_;
    t.offset_ = offset_;
    t.sizes_.resize(target.size());
    t.strides_.resize(target.size());
    for (std::size_t i = 0; i < target.size(); ++i) {
      if (i < lead) {
        TRAINKIT_CHECK(target[i] >= 0, shape_error, "expand", "invalid target " << to_string(target));
        t.sizes_[i] = target[i];
        t.strides_[i] = 0;
        continue;
      }
      const index_t s = sizes_[i - lead];
      const index_t want = target[i] == -1 ? s : target[i];
      TRAINKIT_CHECK(s == want || s == 1, shape_error, "expand",
                     "cannot expand sizes " << to_string(sizes_) << " to " << to_string(target));
      t.sizes_[i] = want;
      t.strides_[i] = s == want ? strides_[i - lead] : 0;
    }
    return t;
  }

  /// This tensor if dense, else a dense copy.
  tensor contiguous() const {
    if (is_contiguous()) return *this;
    return clone();
  }

  /// A dense copy of the elements (never shares storage).
  tensor clone() const {
    tensor t = empty(sizes_);
    copy_(t, *this);
    return t;
  }

  /// Copy to another device (identity copy when the devices are the same). The CUDA backend
  /// specialises detail::transfer.
  template <class To>
  tensor<T, To> to() const;

  // ---- host element access (cpu only) -------------------------------------------------------
  /// Reference to one element; indices are checked.
  T& at(std::initializer_list<index_t> idx) const
    requires std::is_same_v<Device, cpu>
  {
    TRAINKIT_CHECK(idx.size() == dim(), index_error, "tensor::at",
                   idx.size() << " indices for a tensor of sizes " << to_string(sizes_));
    index_t off = offset_;
    std::size_t d = 0;
    for (index_t i : idx) {
      TRAINKIT_CHECK(i >= 0 && i < sizes_[d], index_error, "tensor::at",
                     "index " << i << " out of range for dimension " << d << " of sizes " << to_string(sizes_));
      off += i * strides_[d++];
    }
    return storage_->data()[off];
  }

  /// The value of a one-element tensor.
  T item() const {
    TRAINKIT_CHECK(numel() == 1, shape_error, "tensor::item",
                   "only one-element tensors have an item; sizes are " << to_string(sizes_));
    if constexpr (std::is_same_v<Device, cpu>) {
      return *data();
    } else {
      return to<cpu>().item();
    }
  }

  /// The elements in row-major order, copied to the host.
  std::vector<T> to_vector() const {
    if constexpr (std::is_same_v<Device, cpu>) {
      tensor c = contiguous();
      std::vector<T> v(static_cast<std::size_t>(c.numel()));
      if (!v.empty()) std::memcpy(v.data(), c.data(), v.size() * sizeof(T));
      return v;
    } else {
      return to<cpu>().to_vector();
    }
  }

  /// True when both views address the same storage.
  bool shares_storage_with(const tensor& o) const noexcept { return storage_ && storage_ == o.storage_; }

 private:
  std::shared_ptr<storage_type> storage_;
  shape sizes_;
  shape strides_;
  index_t offset_ = 0;
};

namespace detail {
/// Device-to-device copies of dense buffers; each backend that adds a device specialises it.
template <class From, class To>
struct transfer {
  static_assert(dependent_false<From, To>, "no transfer between these devices: include the CUDA backend");
};
template <>
struct transfer<cpu, cpu> {
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};
}  // namespace detail

template <class T, class Device>
template <class To>
tensor<T, To> tensor<T, Device>::to() const {
  if constexpr (std::is_same_v<To, Device>) {
    return *this;
  } else {
    tensor c = contiguous();
    auto out = tensor<T, To>::empty(sizes_);
    detail::transfer<Device, To>::copy(out.data(), c.data(), static_cast<std::size_t>(c.numel()) * sizeof(T));
    return out;
  }
}

/// Shapes equal, else a shape_error naming op.
template <class T, class D>
void check_same_shape(const tensor<T, D>& a, const tensor<T, D>& b, const char* op) {
  TRAINKIT_CHECK(a.sizes() == b.sizes(), shape_error, op,
                 "sizes differ: " << to_string(a.sizes()) << " vs " << to_string(b.sizes()));
}

}  // namespace trainkit
