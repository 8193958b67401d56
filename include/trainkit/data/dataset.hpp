// trainkit/data/dataset.hpp - what the loaders read from: a data set in memory (basic_dataset, as
// the readers return it), the split it came from, the indexable_dataset concept the data_loader
// reads sample by sample, and tensor_dataset, its model over tensors in memory.
#pragma once

#include <concepts>  // std::convertible_to, std::copy_constructible
#include <cstddef>   // std::size_t
#include <cstdint>   // std::int64_t
#include <cstring>   // std::memcpy

#include "trainkit/backend/cpu/elementwise.hpp"  // host loops behind copy_: the data lives on the host
#include "trainkit/core/dtype.hpp"               // floating_element
#include "trainkit/core/error.hpp"               // shape_error, value_error, index_error
#include "trainkit/core/shape.hpp"               // index_t, shape, to_string
#include "trainkit/core/tensor.hpp"              // tensor
#include "trainkit/ops/elementwise.hpp"          // copy_, behind tensor::contiguous()

namespace trainkit::data {

/// Which half of the dataset: the training files (train-*) or the test files (t10k-*).
enum class split { train, test };

/// Images and labels of one split of a data set in memory (what load_mnist and load_cifar10 return).
/// \tparam T element type of the images (float by default)
template <floating_element T = float>
struct basic_dataset {
  tensor<T> images;             ///< [N, C, H, W] ([N, 1, rows, cols] for MNIST), pixels scaled (and normalised)
  tensor<std::int64_t> labels;  ///< [N], each below the data set's number of classes

  index_t size() const { return labels.defined() ? labels.numel() : 0; }
};

/// The float dataset, the common case.
using dataset = basic_dataset<float>;

namespace detail {
template <class D>
struct dataset_input {
  using type = float;
};
template <class D>
  requires requires { typename D::input_type; }
struct dataset_input<D> {
  using type = typename D::input_type;
};
}  // namespace detail

/// The element type of a dataset's samples: D::input_type when it names one (std::int64_t for
/// token ids), else float.
template <class D>
using dataset_input_t = typename detail::dataset_input<D>::type;

/// The shape of one sample's labels: d.label_shape() when the dataset has one (a language model's
/// [T] next tokens), else one label per sample ([]).
template <class D>
shape dataset_label_shape(const D& d) {
  if constexpr (requires { d.label_shape(); })
    return shape(d.label_shape());
  else
    return shape{};
}

/// A dataset the loader can read sample by sample. A model provides
///   index_t size() const                                 - number of samples
///   shape sample_shape() const                           - sizes of one sample ([C, H, W], [T], ...)
///   void get(index_t i, X* sample, std::int64_t* label) const
///                                                        - writes sample i (numel(sample_shape())
///                                                          values of X = dataset_input_t) and its
///                                                          labels (numel(label_shape())); may throw
/// and optionally `using input_type = std::int64_t` (token ids; default float) and
/// `shape label_shape() const` (default []: one label per sample).
/// get() is called concurrently from the worker threads, so it must be safe to call in parallel
/// (read-only state, or its own locking). The loader holds a copy: make copies cheap (share the
/// data, as tensor_dataset does).
template <class D>
concept indexable_dataset = std::copy_constructible<D> &&
    requires(const D& d, index_t i, dataset_input_t<D>* sample, std::int64_t* label) {
  { d.size() } -> std::convertible_to<index_t>;
  { d.sample_shape() } -> std::convertible_to<shape>;
  d.get(i, sample, label);
};

/// images [N, ...] and labels [N] in memory as an indexable_dataset (shares the tensors; a
/// non-contiguous tensor is made contiguous once). Converts from a loaded dataset (load_mnist,
/// load_cifar10).
class tensor_dataset {
 public:
  tensor_dataset(const tensor<float>& images, const tensor<std::int64_t>& labels) {
    TRAINKIT_CHECK(images.defined() && labels.defined(), value_error, "tensor_dataset",
                   "images and labels must be defined");
    TRAINKIT_CHECK(images.dim() >= 1, shape_error, "tensor_dataset",
                   "images need a sample dimension, got sizes " << trainkit::to_string(images.sizes()));
    TRAINKIT_CHECK(labels.dim() == 1 && labels.size(0) == images.size(0), shape_error, "tensor_dataset",
                   "labels must be [N] with N = images.size(0); images "
                       << trainkit::to_string(images.sizes()) << ", labels "
                       << trainkit::to_string(labels.sizes()));
    x_ = images.contiguous();
    y_ = labels.contiguous();
    sample_shape_.assign(x_.sizes().begin() + 1, x_.sizes().end());
    row_ = trainkit::numel(sample_shape_);
  }
  tensor_dataset(const basic_dataset<float>& d) : tensor_dataset(d.images, d.labels) {}  // NOLINT: implicit

  index_t size() const noexcept { return y_.numel(); }
  const shape& sample_shape() const noexcept { return sample_shape_; }

  void get(index_t i, float* image, std::int64_t* label) const {
    TRAINKIT_CHECK(i >= 0 && i < size(), index_error, "tensor_dataset::get",
                   "sample " << i << " is outside [0, " << size() << ")");
    if (row_) std::memcpy(image, x_.data() + i * row_, static_cast<std::size_t>(row_) * sizeof(float));
    *label = y_.data()[i];
  }

  const tensor<float>& images() const noexcept { return x_; }
  const tensor<std::int64_t>& labels() const noexcept { return y_; }

 private:
  tensor<float> x_;
  tensor<std::int64_t> y_;
  shape sample_shape_;
  index_t row_ = 0;
};

}  // namespace trainkit::data
