// trainkit/nn/linear.hpp - the fully connected layer y = x W^T + b (torch.nn.Linear).
#pragma once

#include <cmath>  // std::sqrt

#include "trainkit/autograd/ops/linear.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// Linear layer: weight [out_features, in_features], bias [out_features]; input [*, in_features],
/// output [*, out_features]. Initialised as PyTorch: weight by kaiming_uniform_(a = sqrt(5)), i.e.
/// U(-1/sqrt(in), 1/sqrt(in)), and the bias from the same bound, weight first, from gen.
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class linear : public module<T, Device> {
  using base = module<T, Device>;

 public:
  using typename base::tensor_type;
  using typename base::var_type;

  linear(index_t in_features, index_t out_features, bool bias = true, generator& gen = default_generator())
      : in_(in_features), out_(out_features) {
    TRAINKIT_CHECK(
        in_features > 0 && out_features > 0, value_error, "linear",
        "in_features and out_features must be positive, got " << in_features << " and " << out_features);
    weight_ = &this->register_parameter("weight", tensor_type::empty({out_features, in_features}));
    init::kaiming_uniform_(weight_->value(), std::sqrt(5.0), init::fan_mode::fan_in,
                           init::nonlinearity::leaky_relu, gen);
    if (bias) {
      bias_ = &this->register_parameter("bias", tensor_type::empty({out_features}));
      const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
      init::uniform_(bias_->value(), -bound, bound, gen);
    }
  }

  std::string_view type_name() const override { return "linear"; }

  var_type forward(const var_type& x) override {
    TRAINKIT_CHECK(x.dim() >= 1 && x.size(-1) == in_, shape_error, "linear",
                   "expected an input whose last dimension is in_features = " << in_ << ", got sizes "
                                                                              << to_string(x.sizes()));
    return autograd::linear(x, *weight_, bias_ ? *bias_ : var_type());
  }

  var_type weight() const { return *weight_; }
  /// The bias, or an undefined var when the layer has none.
  var_type bias() const { return bias_ ? *bias_ : var_type(); }
  index_t in_features() const noexcept { return in_; }
  index_t out_features() const noexcept { return out_; }

 private:
  index_t in_, out_;
  var_type* weight_ = nullptr;
  var_type* bias_ = nullptr;
};

}  // namespace trainkit::nn
