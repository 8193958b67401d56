// trainkit/nn/conv2d.hpp - 2-D convolution over [N, C, H, W] (torch.nn.Conv2d, zero padding).
#pragma once

#include <array>  // std::array
#include <cmath>  // std::sqrt

#include "trainkit/autograd/ops/conv.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// Options of conv2d, torch.nn.Conv2d's, with its defaults.
struct conv2d_options {
  std::array<index_t, 2> stride{1, 1};
  std::array<index_t, 2> padding{0, 0};
  std::array<index_t, 2> dilation{1, 1};
  index_t groups = 1;
  bool bias = true;
};

/// Convolution layer: weight [out, in / groups, kh, kw], bias [out]; input [N, in, H, W] (or
/// [in, H, W]). Initialised as PyTorch: kaiming_uniform_(a = sqrt(5)) on the weight, i.e.
/// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in / groups * kh * kw, and the bias from the
/// same bound, weight first, from gen.
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class conv2d : public module<T, Device> {
  using base = module<T, Device>;

 public:
  using typename base::tensor_type;
  using typename base::var_type;

  conv2d(index_t in_channels, index_t out_channels, std::array<index_t, 2> kernel,
         const conv2d_options& o = {}, generator& gen = default_generator())
      : in_(in_channels), out_(out_channels), kernel_(kernel), o_(o) {
    TRAINKIT_CHECK(
        in_channels > 0 && out_channels > 0, value_error, "conv2d",
        "in_channels and out_channels must be positive, got " << in_channels << " and " << out_channels);
    TRAINKIT_CHECK(kernel[0] > 0 && kernel[1] > 0, value_error, "conv2d",
                   "kernel sizes must be positive, got [" << kernel[0] << ", " << kernel[1] << "]");
    TRAINKIT_CHECK(o.groups > 0 && in_channels % o.groups == 0 && out_channels % o.groups == 0, value_error,
                   "conv2d",
                   "groups = " << o.groups << " must be positive and divide in_channels = " << in_channels
                               << " and out_channels = " << out_channels);
    TRAINKIT_CHECK(o.stride[0] > 0 && o.stride[1] > 0 && o.dilation[0] > 0 && o.dilation[1] > 0 &&
                       o.padding[0] >= 0 && o.padding[1] >= 0,
                   value_error, "conv2d",
                   "stride and dilation must be positive and padding non-negative, got stride ["
                       << o.stride[0] << ", " << o.stride[1] << "], padding [" << o.padding[0] << ", "
                       << o.padding[1] << "], dilation [" << o.dilation[0] << ", " << o.dilation[1] << "]");
    weight_ = &this->register_parameter(
        "weight", tensor_type::empty({out_channels, in_channels / o.groups, kernel[0], kernel[1]}));
    init::kaiming_uniform_(weight_->value(), std::sqrt(5.0), init::fan_mode::fan_in,
                           init::nonlinearity::leaky_relu, gen);
    if (o.bias) {
      bias_ = &this->register_parameter("bias", tensor_type::empty({out_channels}));
      const index_t fan_in = in_channels / o.groups * kernel[0] * kernel[1];
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      init::uniform_(bias_->value(), -bound, bound, gen);
    }
  }
  /// A square kernel.
  conv2d(index_t in_channels, index_t out_channels, index_t kernel, const conv2d_options& o = {},
         generator& gen = default_generator())
      : conv2d(in_channels, out_channels, std::array<index_t, 2>{kernel, kernel}, o, gen) {}

  std::string_view type_name() const override { return "conv2d"; }

  var_type forward(const var_type& x) override {
    TRAINKIT_CHECK((x.dim() == 4 || x.dim() == 3) && x.size(-3) == in_, shape_error, "conv2d",
                   "expected an input [N, " << in_ << ", H, W] or [" << in_ << ", H, W], got sizes "
                                            << to_string(x.sizes()));
    return autograd::conv2d(x, *weight_, bias_ ? *bias_ : var_type(), op_options());
  }

  var_type weight() const { return *weight_; }
  /// The bias, or an undefined var when the layer has none.
  var_type bias() const { return bias_ ? *bias_ : var_type(); }
  index_t in_channels() const noexcept { return in_; }
  index_t out_channels() const noexcept { return out_; }
  std::array<index_t, 2> kernel_size() const noexcept { return kernel_; }
  const conv2d_options& options() const noexcept { return o_; }
  /// The options as autograd::conv2d takes them (what forward passes; for calling the op, or a
  /// mixed-precision amp::conv2d, on this layer's weights).
  autograd::conv2d_options op_options() const {
    autograd::conv2d_options co;
    co.stride = o_.stride;
    co.padding = o_.padding;
    co.dilation = o_.dilation;
    co.groups = o_.groups;
    return co;
  }

 private:
  index_t in_, out_;
  std::array<index_t, 2> kernel_;
  conv2d_options o_;
  var_type* weight_ = nullptr;
  var_type* bias_ = nullptr;
};

}  // namespace trainkit::nn
