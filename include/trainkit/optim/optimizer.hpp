// trainkit/optim/optimizer.hpp - what every optimizer shares: the parameter list, zero_grad, and
// the state dict a snapshot saves (named tensors, step counters, hyper-parameters).
#pragma once

#include <charconv>  // std::from_chars: "3.exp_avg" -> 3
#include <cstddef>   // std::size_t
#include <cstdint>   // std::int64_t
#include <initializer_list>
#include <limits>  // infinity in check_lr
#include <optional>  // a group's weight decay
#include <string>
#include <string_view>
#include <system_error>   // std::errc
#include <type_traits>    // std::is_same_v
#include <unordered_set>  // duplicate parameters
#include <utility>        // std::pair
#include <vector>

#include "trainkit/autograd/var.hpp"
#include "trainkit/backend/cpu/elementwise.hpp"  // for_each_rounding_second
#include "trainkit/optim/fused.hpp"  // fused_update
#include "trainkit/ops/elementwise.hpp"  // fill_
#include "trainkit/core/error.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit::optim {

/// An optimizer's state for a snapshot, the analogue of torch's optimizer.state_dict():
///   tensors   "<i>.<buffer>" for parameter i (e.g. "0.momentum_buffer", "2.exp_avg"); a buffer
///             that was never created (no gradient yet) is absent;
///   counters  "step" (calls of step()) and "<i>.step" (updates parameter i received, Adam's
///             bias-correction count);
///   scalars   the hyper-parameters by option name ("lr", "momentum"...; booleans as 0/1).
/// Parameters are identified by their position in the list the optimizer was built from.
template <class T, class Device = cpu>
struct optimizer_state_dict {
  std::vector<std::pair<std::string, tensor<T, Device>>> tensors;
  std::vector<std::pair<std::string, std::int64_t>> counters;
  std::vector<std::pair<std::string, double>> scalars;
};

/// Parameters that share a weight decay of their own - torch's param_groups for the case they are
/// mostly used for (no decay on biases and norms); the optimizer's other hyper-parameters, the
/// learning rate included, stay common. weight_decay empty: the optimizer's.
template <class T, class Device = cpu>
struct param_group {
  std::vector<autograd::var<T, Device>> params;
  std::optional<double> weight_decay{};
};

/// The GPT recipe (nanoGPT, minGPT) as two groups of named parameters: the matrices (2-D and
/// more: linear and embedding weights) with `weight_decay`, the vectors (biases, norm weights)
/// with none. Give it module.named_parameters(); tied parameters (the same var twice) once.
template <class T, class Device>
std::vector<param_group<T, Device>> decay_groups(
    const std::vector<std::pair<std::string, autograd::var<T, Device>>>& named, double weight_decay) {
  std::vector<param_group<T, Device>> g{{{}, weight_decay}, {{}, 0.0}};
  std::unordered_set<const void*> seen;
  for (const auto& [name, p] : named) {
    if (!seen.insert(p.get()).second) continue;
    g[p.dim() >= 2 ? 0 : 1].params.push_back(p);
  }
  if (g[1].params.empty()) g.pop_back();
  if (g[0].params.empty()) g.erase(g.begin());
  return g;
}

/// The parameter list and the operations every optimizer has in common.
/// \tparam T element type of the parameters
/// \tparam Device device of the parameters
template <class T, class Device>
class optimizer_base {
 public:
  using var_type = autograd::var<T, Device>;
  using tensor_type = tensor<T, Device>;
  using state_dict_type = optimizer_state_dict<T, Device>;

  /// The parameters, in the order they were given (state dict indices refer to it).
  const std::vector<var_type>& params() const noexcept { return params_; }

  /// Drops every parameter's gradient (set_to_none, PyTorch's default), or zeroes it in place.
  void zero_grad(bool set_to_none = true) {
    for (auto& p : params_) {
      if (set_to_none)
        p.zero_grad();
      else if (p.has_grad())
        fill_(p.grad(), T(0));
    }
  }

 protected:
  optimizer_base(std::vector<var_type> params, const char* op) : params_(std::move(params)) {
    TRAINKIT_CHECK(!params_.empty(), value_error, op, "got an empty parameter list");
    std::unordered_set<const void*> seen;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      TRAINKIT_CHECK(params_[i].defined(), value_error, op, "parameter " << i << " is an undefined var");
      TRAINKIT_CHECK(params_[i].is_leaf(), value_error, op,
                     "parameter " << i << " is not a leaf (an optimizer can only update leaves)");
      TRAINKIT_CHECK(seen.insert(params_[i].get()).second, value_error, op,
                     "parameter " << i << " appears more than once in the parameter list");
    }
  }
  ~optimizer_base() = default;
  optimizer_base(const optimizer_base&) = default;
  optimizer_base& operator=(const optimizer_base&) = default;
  optimizer_base(optimizer_base&&) noexcept = default;
  optimizer_base& operator=(optimizer_base&&) noexcept = default;

  /// One fused pass of the update f over parameter p, its gradient and its buffers (f(p, g,
  /// buf...)). A gradient whose bf16 rounding was deferred to the update (var::grad_rounding_deferred:
  /// the weight gradients of the CPU's widened bf16 GEMMs) is rounded as the update reads it, block
  /// by block (elementwise<cpu>::for_each_rounding_second) - a pass over every weight gradient fewer
  /// per step - and stays deferred in the var (grad() rounds it for any other reader).
  template <class F, class... B>
  void fused_step(var_type& p, const F& f, B&... bufs) {
    if constexpr (std::is_same_v<Device, cpu> && std::is_same_v<T, float>) {
      if (p.grad_rounding_deferred() == autograd::value_precision::bfloat16) {
        tensor_type& value = p.value();
        const tensor_type& g = p.grad_unrounded();
        if (value.is_contiguous() && g.is_contiguous() && g.sizes() == value.sizes() &&
            ((bufs.is_contiguous() && bufs.sizes() == value.sizes()) && ...)) {
          backend::elementwise<cpu>::for_each_rounding_second(value.numel(), f, value.data(), g.data(),
                                                              bufs.data()...);
          return;
        }
      }
    }
    detail::fused_update(f, p.value(), p.grad(), bufs...);  // grad() rounds a deferred gradient
  }

  /// Splits "<i>.<name>" into (i, name); value_error for anything else or i out of range.
  std::pair<std::size_t, std::string_view> parse_key(std::string_view key, const char* op) const {
    const std::size_t dot = key.find('.');
    std::size_t idx = 0;
    const char* first = key.data();
    const char* last = key.data() + (dot == std::string_view::npos ? key.size() : dot);
    const auto [ptr, ec] = std::from_chars(first, last, idx);
    TRAINKIT_CHECK(dot != std::string_view::npos && dot > 0 && ec == std::errc() && ptr == last, value_error,
                   op, "key '" << key << "' is not of the form '<parameter index>.<name>'");
    TRAINKIT_CHECK(
        idx < params_.size(), value_error, op,
        "key '" << key << "' names parameter " << idx << " but the optimizer has " << params_.size());
    return {idx, key.substr(dot + 1)};
  }

  /// A loaded buffer for parameter i: same sizes as the parameter, cloned so that the optimizer
  /// never shares storage with the snapshot it was loaded from.
  tensor_type load_buffer(std::size_t i, const std::string& key, const tensor_type& t, const char* op) const {
    TRAINKIT_CHECK(t.defined(), value_error, op, "the tensor for key '" << key << "' is undefined");
    TRAINKIT_CHECK(t.sizes() == params_[i].sizes(), shape_error, op,
                   "size mismatch for '" << key << "': the state dict holds shape " << to_string(t.sizes())
                                         << ", parameter " << i << " has shape "
                                         << to_string(params_[i].sizes()));
    return t.clone();
  }

  std::vector<var_type> params_;
};

namespace detail {
/// The value of `name` among the scalars of a state dict; value_error when absent.
inline double find_scalar(const std::vector<std::pair<std::string, double>>& scalars, std::string_view name,
                          const char* op) {
  for (const auto& [k, v] : scalars)
    if (k == name) return v;
  TRAINKIT_CHECK(false, value_error, op, "the state dict has no hyper-parameter '" << name << "'");
  return 0.0;
}
inline void check_scalar_names(const std::vector<std::pair<std::string, double>>& scalars,
                               std::initializer_list<std::string_view> known, const char* op) {
  for (const auto& [k, v] : scalars) {
    bool ok = false;
    for (auto n : known) ok = ok || k == n;
    TRAINKIT_CHECK(ok, value_error, op, "unexpected hyper-parameter '" << k << "' in the state dict");
  }
}
/// Validates a learning rate (finite and >= 0), as torch does.
inline void check_lr(double lr, const char* op) {
  TRAINKIT_CHECK(lr >= 0.0 && lr < std::numeric_limits<double>::infinity(), value_error, op,
                 "invalid learning rate: " << lr);
}
}  // namespace detail

}  // namespace trainkit::optim
