// trainkit/optim/clip_grad.hpp - gradient clipping by total norm and by value
// (torch.nn.utils.clip_grad_norm_ and clip_grad_value_).
#pragma once

#include <cmath>   // std::pow, std::sqrt, std::isfinite
#include <limits>  // infinity
#include <type_traits>
#include <vector>

#include "trainkit/autograd/grad_mode.hpp"  // no_grad
#include "trainkit/autograd/var.hpp"
#include "trainkit/backend/multi_tensor.hpp"  // the fused norm and scaling of a device
#include "trainkit/core/dtype.hpp"        // accumulate_t
#include "trainkit/ops/elementwise.hpp"  // abs, square, pow, cast, mul_, apply_
#include "trainkit/core/error.hpp"
#include "trainkit/core/functors.hpp"
#include "trainkit/ops/reduce.hpp"  // sum, amax

namespace trainkit::optim {

/// The norm_type that means the largest absolute value.
inline constexpr double inf_norm = std::numeric_limits<double>::infinity();

namespace detail {
/// The norm_type-norm of one gradient, accumulated in float (double for double gradients), the
/// 16-bit types widened first so that squares of large gradients do not overflow.
template <class T, class D>
double grad_norm(const tensor<T, D>& g, double norm_type) {
  if (g.numel() == 0) return 0.0;
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const tensor<A, D> a = cast<A>(g);
  if (norm_type == inf_norm) return static_cast<double>(amax(trainkit::abs(a)).item());
  if (norm_type == 2.0) return std::sqrt(static_cast<double>(sum(square(a)).item()));
  if (norm_type == 1.0) return static_cast<double>(sum(trainkit::abs(a)).item());
  return std::pow(static_cast<double>(sum(trainkit::pow(trainkit::abs(a), norm_type)).item()),
                  1.0 / norm_type);
}

/// Whether the 2-norm clipping of params can run as multi-tensor passes on their device (a fused
/// backend::multi_tensor model and dense gradients).
template <class T, class D>
bool can_fuse_clip(const std::vector<autograd::var<T, D>>& params, double norm_type) {
  if constexpr (!backend::multi_tensor<D>::fused) {
    (void)params, (void)norm_type;
    return false;
  } else {
    if (norm_type != 2.0) return false;
    for (const auto& p : params)
      if (p.defined() && p.grad().defined() && !p.grad().is_contiguous()) return false;
    return true;
  }
}

/// The fused 2-norm clipping: one pass for the norm into a device value, one scaling pass whose
/// coefficient min(1, max_norm / (norm + 1e-6)) is computed on the device. No host read.
template <class T, class D>
tensor<backend::multi_tensor_acc_t<T>, D> fused_clip(const std::vector<autograd::var<T, D>>& params,
                                                     double max_norm) {
  using A = backend::multi_tensor_acc_t<T>;
  auto norm = tensor<A, D>::zeros({});
  if constexpr (backend::multi_tensor<D>::fused) {
    auto g = backend::gradient_list<T>(params);
    if (g.size() == 0) return norm;
    const auto cdata = g.const_data();
    backend::multi_tensor<D>::norm2(cdata.data(), g.numel.data(), g.size(), norm.data());
    backend::multi_tensor<D>::clip(g.data.data(), g.numel.data(), g.size(), norm.data(), max_norm);
  } else {
    (void)params, (void)max_norm;
  }
  return norm;
}
}  // namespace detail

/// Scales the gradients of params in place so that their total norm is at most max_norm, and
/// returns the total norm before clipping (the norm of the vector of per-gradient norms, i.e. of
/// all gradients concatenated). As torch: the scale is max_norm / (total + 1e-6), applied only
/// when it is below 1; parameters without a gradient are ignored (total 0 when none has one).
/// norm_type is p > 0 or inf_norm. error_if_nonfinite turns a NaN/inf total into a value_error
/// (otherwise the gradients are scaled by NaN, as torch does, and the caller sees the total).
template <class T, class D>
double clip_grad_norm_(const std::vector<autograd::var<T, D>>& params, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false) {
  TRAINKIT_CHECK(norm_type > 0.0, value_error, "clip_grad_norm_",
                 "norm_type must be > 0 or inf_norm, got " << norm_type);
  TRAINKIT_CHECK(max_norm >= 0.0, value_error, "clip_grad_norm_", "max_norm must be >= 0, got " << max_norm);
  autograd::no_grad guard;
  if (!error_if_nonfinite && detail::can_fuse_clip(params, norm_type))
    return static_cast<double>(detail::fused_clip(params, max_norm).item());  // the caller's one read
  std::vector<double> norms;
  for (const auto& p : params)
    if (p.defined() && p.grad().defined()) norms.push_back(detail::grad_norm(p.grad(), norm_type));
  if (norms.empty()) return 0.0;
  double total = 0.0;
  if (norm_type == inf_norm) {
    for (double n : norms) total = (n > total || n != n) ? n : total;
  } else {
    for (double n : norms) total += norm_type == 2.0 ? n * n : std::pow(n, norm_type);
    total = norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type);
  }
  TRAINKIT_CHECK(!error_if_nonfinite || std::isfinite(total), value_error, "clip_grad_norm_",
                 "the total norm of order " << norm_type << " of the gradients is " << total
                                            << "; they cannot be clipped");
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0 || coef != coef) {
    for (const auto& p : params) {
      if (!p.defined() || !p.grad().defined()) continue;
      auto g = p.grad();
      mul_(g, coef);
    }
  }
  return total;
}

/// clip_grad_norm_ returning the total norm as a 0-d tensor on the gradients' device (float, double
/// for double gradients) instead of reading it on the host, as torch returns a tensor. On a device
/// with a fused multi-tensor model (CUDA) and norm_type 2 the host waits for nothing: one pass
/// computes the norm on the device, one scales by the coefficient computed there. Elsewhere it
/// is clip_grad_norm_ with its result put in a tensor.
template <class T, class D>
tensor<backend::multi_tensor_acc_t<T>, D> clip_grad_norm_tensor_(const std::vector<autograd::var<T, D>>& params,
                                                                double max_norm, double norm_type = 2.0) {
  using A = backend::multi_tensor_acc_t<T>;
  TRAINKIT_CHECK(norm_type > 0.0, value_error, "clip_grad_norm_tensor_",
                 "norm_type must be > 0 or inf_norm, got " << norm_type);
  TRAINKIT_CHECK(max_norm >= 0.0, value_error, "clip_grad_norm_tensor_",
                 "max_norm must be >= 0, got " << max_norm);
  autograd::no_grad guard;
  if (detail::can_fuse_clip(params, norm_type)) return detail::fused_clip(params, max_norm);
  return tensor<A, D>::full({}, static_cast<A>(clip_grad_norm_(params, max_norm, norm_type)));
}

/// Clamps every gradient element of params to [-clip_value, clip_value] in place.
template <class T, class D>
void clip_grad_value_(const std::vector<autograd::var<T, D>>& params, double clip_value) {
  TRAINKIT_CHECK(clip_value >= 0.0, value_error, "clip_grad_value_",
                 "clip_value must be >= 0, got " << clip_value);
  autograd::no_grad guard;
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    auto g = p.grad();
    apply_(functors::clamp<double>{-clip_value, clip_value}, g);
  }
}

}  // namespace trainkit::optim
