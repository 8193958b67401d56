// trainkit/nn/norm.hpp - batch normalisation (torch.nn.BatchNorm1d/2d) and layer normalisation
// (torch.nn.LayerNorm).
#pragma once

#include <cstddef>   // std::size_t
#include <optional>  // momentum: none means a cumulative average
#include <string>
#include <utility>  // std::move
#include <vector>

#include "trainkit/autograd/ops/norm.hpp"
#include "trainkit/ops/elementwise.hpp"  // apply_, fill_
#include "trainkit/core/error.hpp"
#include "trainkit/core/functors.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// Options of batch_norm1d/2d, torch's, with its defaults.
struct batch_norm_options {
  double eps = 1e-5;
  /// Weight of the new batch in the running statistics; empty: their cumulative average
  /// (factor 1 / num_batches_tracked), torch's momentum=None.
  std::optional<double> momentum = 0.1;
  bool affine = true;               // learn weight (1) and bias (0)
  bool track_running_stats = true;  // keep running_mean/var and use them in eval
};

namespace detail {
/// The batch norm layer for inputs of `ndims` (batch_norm2d: {4}; batch_norm1d: {2, 3}).
/// Parameters weight, bias [C]; buffers running_mean (0), running_var (1), num_batches_tracked
/// (a scalar of T: exact up to 2^24 batches in float, 2^11 in half; it only matters for
/// momentum = none), in torch's state dict order.
template <class T, class Device>
class batch_norm_base : public module<T, Device> {
  using base = module<T, Device>;

 public:
  using typename base::tensor_type;
  using typename base::var_type;

  var_type forward(const var_type& x) override {
    const char* op = this->type_name().data();
    bool dims_ok = false;
    for (std::size_t d : ndims_) dims_ok = dims_ok || x.dim() == d;
    TRAINKIT_CHECK(dims_ok, shape_error, op,
                   "expected " << expected_ << " input, got sizes " << to_string(x.sizes()));
    TRAINKIT_CHECK(x.size(1) == c_, shape_error, op,
                   "expected " << c_ << " channels in dimension 1, got sizes " << to_string(x.sizes()));
    double factor = o_.momentum.value_or(0.0);
    // A checkpoint's recomputation (autograd::is_recomputing) normalises with the batch statistics
    // again but leaves the running statistics and the counter as the first forward left them.
    const bool update_stats = this->is_training() && o_.track_running_stats && !autograd::is_recomputing();
    if (update_stats) {
      apply_(functors::add_scalar<double>{1.0}, *num_batches_tracked_);
      if (!o_.momentum) factor = 1.0 / static_cast<double>(num_batches_tracked_->item());
    }
    const bool use_batch_stats = this->is_training() || !o_.track_running_stats;
    if (use_batch_stats) {
      const index_t per_channel = x.numel() / c_;
      TRAINKIT_CHECK(
          per_channel > 1, value_error, op,
          "expected more than 1 value per channel when training, got input sizes " << to_string(x.sizes()));
    }
    tensor_type none_mean, none_var;
    const bool pass_stats = o_.track_running_stats && (update_stats || !use_batch_stats);
    tensor_type& rm = pass_stats ? *running_mean_ : none_mean;
    tensor_type& rv = pass_stats ? *running_var_ : none_var;
    return autograd::batch_norm(x, weight_ ? *weight_ : var_type(), bias_ ? *bias_ : var_type(), rm, rv,
                                use_batch_stats, factor, o_.eps);
  }

  /// weight and bias are undefined vars without affine; the running statistics and counter are
  /// undefined tensors without track_running_stats.
  var_type weight() const { return weight_ ? *weight_ : var_type(); }
  var_type bias() const { return bias_ ? *bias_ : var_type(); }
  tensor_type running_mean() const { return running_mean_ ? *running_mean_ : tensor_type(); }
  tensor_type running_var() const { return running_var_ ? *running_var_ : tensor_type(); }
  tensor_type num_batches_tracked() const {
    return num_batches_tracked_ ? *num_batches_tracked_ : tensor_type();
  }
  index_t num_features() const noexcept { return c_; }
  const batch_norm_options& options() const noexcept { return o_; }

  /// Running statistics back to mean 0, variance 1, counter 0.
  void reset_running_stats() {
    if (!o_.track_running_stats) return;
    fill_(*running_mean_, T(0));
    fill_(*running_var_, T(1));
    fill_(*num_batches_tracked_, T(0));
  }

 protected:
  batch_norm_base(index_t num_features, const batch_norm_options& o, std::vector<std::size_t> ndims,
                  const char* expected, const char* op)
      : c_(num_features), o_(o), ndims_(std::move(ndims)), expected_(expected) {
    TRAINKIT_CHECK(num_features > 0, value_error, op, "num_features must be positive, got " << num_features);
    TRAINKIT_CHECK(o.eps > 0.0, value_error, op, "eps must be positive, got " << o.eps);
    TRAINKIT_CHECK(!o.momentum || (*o.momentum >= 0.0 && *o.momentum <= 1.0), value_error, op,
                   "momentum must be in [0, 1], got " << o.momentum.value_or(0.0));
    if (o.affine) {
      weight_ = &this->register_parameter("weight", tensor_type::ones({num_features}));
      bias_ = &this->register_parameter("bias", tensor_type::zeros({num_features}));
    }
    if (o.track_running_stats) {
      running_mean_ = &this->register_buffer("running_mean", tensor_type::zeros({num_features}));
      running_var_ = &this->register_buffer("running_var", tensor_type::ones({num_features}));
      num_batches_tracked_ = &this->register_buffer("num_batches_tracked", tensor_type::zeros({}));
    }
  }

 private:
  index_t c_;
  batch_norm_options o_;
  std::vector<std::size_t> ndims_;
  const char* expected_;
  var_type* weight_ = nullptr;
  var_type* bias_ = nullptr;
  tensor_type* running_mean_ = nullptr;
  tensor_type* running_var_ = nullptr;
  tensor_type* num_batches_tracked_ = nullptr;
};
}  // namespace detail

/// Batch normalisation over [N, C, H, W], per channel (torch.nn.BatchNorm2d).
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class batch_norm2d : public detail::batch_norm_base<T, Device> {
 public:
  explicit batch_norm2d(index_t num_features, const batch_norm_options& o = {})
      : detail::batch_norm_base<T, Device>(num_features, o, {4}, "a 4-D [N, C, H, W]", "batch_norm2d") {}
  std::string_view type_name() const override { return "batch_norm2d"; }
};

/// Batch normalisation over [N, C] or [N, C, L], per channel (torch.nn.BatchNorm1d).
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class batch_norm1d : public detail::batch_norm_base<T, Device> {
 public:
  explicit batch_norm1d(index_t num_features, const batch_norm_options& o = {})
      : detail::batch_norm_base<T, Device>(num_features, o, {2, 3}, "a 2-D [N, C] or 3-D [N, C, L]",
                                           "batch_norm1d") {}
  std::string_view type_name() const override { return "batch_norm1d"; }
};

/// Options of layer_norm, torch's, with its defaults.
struct layer_norm_options {
  double eps = 1e-5;
  bool elementwise_affine = true;  // learn weight (1) and, with bias, bias (0), of normalized_shape
  bool bias = true;
};

/// Layer normalisation over the trailing dims given by normalized_shape (torch.nn.LayerNorm).
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class layer_norm : public module<T, Device> {
  using base = module<T, Device>;

 public:
  using typename base::tensor_type;
  using typename base::var_type;

  explicit layer_norm(shape normalized_shape, const layer_norm_options& o = {})
      : shape_(std::move(normalized_shape)), o_(o) {
    TRAINKIT_CHECK(!shape_.empty(), value_error, "layer_norm", "normalized_shape must not be empty");
    for (index_t s : shape_)
      TRAINKIT_CHECK(s > 0, value_error, "layer_norm",
                     "normalized_shape " << to_string(shape_) << " has a size <= 0");
    TRAINKIT_CHECK(o.eps > 0.0, value_error, "layer_norm", "eps must be positive, got " << o.eps);
    if (o.elementwise_affine) {
      weight_ = &this->register_parameter("weight", tensor_type::ones(shape_));
      if (o.bias) bias_ = &this->register_parameter("bias", tensor_type::zeros(shape_));
    }
  }
  explicit layer_norm(index_t normalized_size, const layer_norm_options& o = {})
      : layer_norm(shape{normalized_size}, o) {}

  std::string_view type_name() const override { return "layer_norm"; }

  var_type forward(const var_type& x) override {
    bool ok = x.dim() >= shape_.size();
    for (std::size_t i = 0; ok && i < shape_.size(); ++i)
      ok = x.sizes()[x.dim() - shape_.size() + i] == shape_[i];
    TRAINKIT_CHECK(ok, shape_error, "layer_norm",
                   "input of sizes " << to_string(x.sizes()) << " does not end in normalized_shape "
                                     << to_string(shape_));
    return autograd::layer_norm(x, shape_, weight_ ? *weight_ : var_type(), bias_ ? *bias_ : var_type(),
                                o_.eps);
  }

  var_type weight() const { return weight_ ? *weight_ : var_type(); }
  var_type bias() const { return bias_ ? *bias_ : var_type(); }
  const shape& normalized_shape() const noexcept { return shape_; }
  const layer_norm_options& options() const noexcept { return o_; }

 private:
  shape shape_;
  layer_norm_options o_;
  var_type* weight_ = nullptr;
  var_type* bias_ = nullptr;
};

}  // namespace trainkit::nn
