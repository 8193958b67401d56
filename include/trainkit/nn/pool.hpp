// trainkit/nn/pool.hpp - 2-D max and average pooling layers (torch.nn.MaxPool2d, AvgPool2d).
#pragma once

#include <array>  // std::array

#include "trainkit/autograd/ops/pool.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// Window, stride (0 = the window, torch's default) and padding of a pooling layer.
using pool2d_options = autograd::pool2d_options;

/// Max over each window of [N, C, H, W] (or [C, H, W]).
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class max_pool2d : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;
  explicit max_pool2d(const pool2d_options& o) : o_(o) {}
  /// Square window; stride 0 means stride = kernel.
  explicit max_pool2d(index_t kernel, index_t stride = 0, index_t padding = 0)
      : max_pool2d(pool2d_options{{kernel, kernel}, {stride, stride}, {padding, padding}}) {}
  std::string_view type_name() const override { return "max_pool2d"; }
  var_type forward(const var_type& x) override { return autograd::max_pool2d(x, o_); }
  const pool2d_options& options() const noexcept { return o_; }

 private:
  pool2d_options o_;
};

/// Mean over each window of [N, C, H, W] (or [C, H, W]).
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class avg_pool2d : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;
  explicit avg_pool2d(const pool2d_options& o) : o_(o) {}
  /// Square window; stride 0 means stride = kernel.
  explicit avg_pool2d(index_t kernel, index_t stride = 0, index_t padding = 0)
      : avg_pool2d(pool2d_options{{kernel, kernel}, {stride, stride}, {padding, padding}}) {}
  std::string_view type_name() const override { return "avg_pool2d"; }
  var_type forward(const var_type& x) override { return autograd::avg_pool2d(x, o_); }
  const pool2d_options& options() const noexcept { return o_; }

 private:
  pool2d_options o_;
};

}  // namespace trainkit::nn
