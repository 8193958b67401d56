// trainkit/backend/multi_tensor.hpp - passes over many dense tensors of one device at once (the
// gradients of a model): loss-scaler unscaling with one found-inf flag, the total 2-norm and
// scaling by a device scalar (clip_grad_norm_), each a few launches whatever the number of
// tensors, and no read on the host.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// The accumulation type of a multi-tensor pass: double for double tensors, float otherwise.
template <class T>
using multi_tensor_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Per-device multi-tensor passes. The primary (the host among others) has none: callers go
/// tensor by tensor. A model provides
///   static constexpr bool fused = true;
///   `template <class T>` static void unscale(T* const* data, const index_t* numel, std::size_t n,
///       float inv_scale, float* found_inf);
///     x *= inv_scale (in compute_t<T>, as mul_) over the n tensors, and *found_inf = 1 (a device
///     float, never reset here) when one of them held an inf or a NaN before.
///   `template <class T>` static void norm2(const T* const* data, const index_t* numel, std::size_t n,
///       multi_tensor_acc_t<T>* out);
///     *out (device) = sqrt of the sum of squares of every element, summed in a fixed order.
///   `template <class T>` static void clip(T* const* data, const index_t* numel, std::size_t n,
///       const multi_tensor_acc_t<T>* norm, double max_norm);
///     coef = max_norm / (*norm + 1e-6) computed on the device; x *= coef when coef < 1 or NaN.
template <class Device>
struct multi_tensor {
  static constexpr bool fused = false;
};

/// The data pointers and sizes of the defined gradients of params (vars), the lists a multi-tensor
/// pass takes.
template <class T>
struct tensor_list {
  std::vector<T*> data;
  std::vector<index_t> numel;
  std::size_t size() const noexcept { return data.size(); }
  /// The same list read-only (norm2 takes const pointers).
  std::vector<const T*> const_data() const { return {data.begin(), data.end()}; }
};
template <class T, class Params>
tensor_list<T> gradient_list(const Params& params) {
  tensor_list<T> l;
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    auto g = p.grad();
    l.data.push_back(g.data());
    l.numel.push_back(g.numel());
  }
  return l;
}

}  // namespace trainkit::backend
