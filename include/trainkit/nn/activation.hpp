// trainkit/nn/activation.hpp - parameter-free layers: relu, gelu, tanh, sigmoid, flatten, identity.
#pragma once

#include "trainkit/autograd/ops/shape.hpp"  // flatten
#include "trainkit/autograd/ops/unary.hpp"  // relu, gelu, tanh, sigmoid
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// max(x, 0) elementwise (torch.nn.ReLU).
template <class T = float, class Device = cpu>
class relu : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;
  std::string_view type_name() const override { return "relu"; }
  var_type forward(const var_type& x) override { return autograd::relu(x); }
};

/// x * Phi(x), the exact (erf) form (torch.nn.GELU with approximate='none').
template <class T = float, class Device = cpu>
class gelu : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;
  std::string_view type_name() const override { return "gelu"; }
  var_type forward(const var_type& x) override { return autograd::gelu(x); }
};

/// tanh elementwise (torch.nn.Tanh).
template <class T = float, class Device = cpu>
class tanh : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;
  std::string_view type_name() const override { return "tanh"; }
  var_type forward(const var_type& x) override { return autograd::tanh(x); }
};

/// 1 / (1 + e^-x) elementwise (torch.nn.Sigmoid).
template <class T = float, class Device = cpu>
class sigmoid : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;
  std::string_view type_name() const override { return "sigmoid"; }
  var_type forward(const var_type& x) override { return autograd::sigmoid(x); }
};

/// Returns its input (torch.nn.Identity): a placeholder in a sequential.
template <class T = float, class Device = cpu>
class identity : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;
  std::string_view type_name() const override { return "identity"; }
  var_type forward(const var_type& x) override { return x; }
};

/// Collapses dims [start_dim, end_dim] into one (torch.nn.Flatten: start 1 keeps the batch).
template <class T = float, class Device = cpu>
class flatten : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;
  explicit flatten(index_t start_dim = 1, index_t end_dim = -1) : start_(start_dim), end_(end_dim) {}
  std::string_view type_name() const override { return "flatten"; }
  var_type forward(const var_type& x) override { return autograd::flatten(x, start_, end_); }
  index_t start_dim() const noexcept { return start_; }
  index_t end_dim() const noexcept { return end_; }

 private:
  index_t start_, end_;
};

}  // namespace trainkit::nn
