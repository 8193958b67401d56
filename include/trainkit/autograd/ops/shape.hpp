// trainkit/autograd/ops/shape.hpp - views and copies that move elements around: reshape,
// transpose, permute, slice, expand, squeeze/unsqueeze, concat.
#pragma once

#include <algorithm>
#include <array>
#include <string_view>
#include <vector>

#include "trainkit/autograd/function.hpp"
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/ops/concat.hpp"
#include "trainkit/ops/reduce.hpp"

namespace trainkit::autograd {

namespace ops {
/// A gradient moved by a view's backward (full: g.full moved), keeping g's bf16_values tag: moving
/// and zero-padding bf16 values leaves them bf16 values, so the GEMM that reads them next need not
/// round them again (the CPU's widened bf16 route: the heads' gradients into the q/k/v projections).
template <class T, class D>
grad_flow<T, D> moved_flow(const grad_flow<T, D>& g, tensor<T, D> full) {
  grad_flow<T, D> r(std::move(full));
  r.bf16_values = g.bf16_values;
  return r;
}

template <class T, class D>
struct reshape {
  static constexpr std::string_view name = "reshape";
  shape in;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    return {g.reshape(in)};
  }
  std::array<grad_flow<T, D>, 1> backward_flow(const grad_flow<T, D>& g, const std::vector<bool>&) const {
    if (g.is_narrow()) return {grad_flow<T, D>::narrow(g.bf16.reshape(in))};
    return {moved_flow(g, g.full.reshape(in))};
  }
};
template <class T, class D>
struct permute {
  static constexpr std::string_view name = "permute";
  std::vector<index_t> inverse;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    return {g.permute(inverse)};
  }
  std::array<grad_flow<T, D>, 1> backward_flow(const grad_flow<T, D>& g, const std::vector<bool>&) const {
    if (g.is_narrow()) return {grad_flow<T, D>::narrow(g.bf16.permute(inverse))};
    return {moved_flow(g, g.full.permute(inverse))};
  }
};
template <class T, class D>
struct slice {
  static constexpr std::string_view name = "slice";
  shape in;
  index_t dim, start, end, step;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    return {widen(g)};
  }
  std::array<grad_flow<T, D>, 1> backward_flow(const grad_flow<T, D>& g, const std::vector<bool>&) const {
    if (g.is_narrow()) return {grad_flow<T, D>::narrow(widen(g.bf16))};
    return {moved_flow(g, widen(g.full))};
  }

 private:
  /// g in its window of zeros shaped as the input.
  template <class E>
  tensor<E, D> widen(const tensor<E, D>& g) const {
    auto r = tensor<E, D>::zeros(in);
    auto window = r.slice(dim, start, end, step);
    copy_(window, g);
    return r;
  }
};
template <class T, class D>
struct expand {
  static constexpr std::string_view name = "expand";
  shape in;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    return {sum_to(g, in)};
  }
};
template <class T, class D>
struct concat {
  static constexpr std::string_view name = "concat";
  index_t dim;
  std::vector<index_t> lengths;
  std::vector<tensor<T, D>> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    std::vector<tensor<T, D>> r(lengths.size());
    index_t at = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (needs[i]) r[i] = g.slice(dim, at, at + lengths[i]);
      at += lengths[i];
    }
    return r;
  }
};
}  // namespace ops

namespace detail {
/// f (a view of a tensor: reshape, permute, slice) applied to x's values as they are held - in
/// bfloat16 when x holds them so - keeping their value_precision; op's backward_flow passes a
/// bf16 gradient on in bf16.
template <class T, class D, class Op, class F>
var<T, D> viewed(const var<T, D>& x, Op op, F f) {
  if (x.holds_bf16()) return record_bf16(std::move(op), f(x.value_bf16()), x);
  auto r = record(std::move(op), f(x.value()), x);
  r.set_precision(x.precision());
  return r;
}
template <class T, class D, class F>
var<T, D> reshaped(const var<T, D>& x, F f) {
  return viewed(x, ops::reshape<T, D>{x.sizes()}, f);
}
}  // namespace detail

template <class T, class D>
var<T, D> reshape(const var<T, D>& x, shape s) {
  return detail::reshaped(x, [&](const auto& t) { return t.reshape(s); });
}
template <class T, class D>
var<T, D> view(const var<T, D>& x, shape s) {
  return detail::reshaped(x, [&](const auto& t) { return t.view(s); });
}
template <class T, class D>
var<T, D> flatten(const var<T, D>& x, index_t start = 0, index_t end = -1) {
  return detail::reshaped(x, [&](const auto& t) { return t.flatten(start, end); });
}
template <class T, class D>
var<T, D> unsqueeze(const var<T, D>& x, index_t d) {
  return detail::reshaped(x, [&](const auto& t) { return t.unsqueeze(d); });
}
template <class T, class D>
var<T, D> squeeze(const var<T, D>& x, index_t d) {
  return detail::reshaped(x, [&](const auto& t) { return t.squeeze(d); });
}
template <class T, class D>
var<T, D> permute(const var<T, D>& x, const std::vector<index_t>& order) {
  std::vector<index_t> inv(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) inv[wrap_dim(order[i], order.size(), "permute")] = index_t(i);
  return detail::viewed(x, ops::permute<T, D>{inv}, [&](const auto& t) { return t.permute(order); });
}
template <class T, class D>
var<T, D> transpose(const var<T, D>& x, index_t d0, index_t d1) {
  std::vector<index_t> order(x.dim());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = index_t(i);
  std::swap(order[wrap_dim(d0, x.dim(), "transpose")], order[wrap_dim(d1, x.dim(), "transpose")]);
  return permute(x, order);
}
template <class T, class D>
var<T, D> slice(const var<T, D>& x, index_t dim, index_t start, index_t end, index_t step = 1) {
  // Store the clamped bounds forward used, so backward writes exactly the same window.
  const index_t k = index_t(wrap_dim(dim, x.dim(), "slice"));
  const index_t n = x.size(k);
  index_t s = start < 0 ? start + n : start, e = end < 0 ? end + n : end;
  s = std::clamp<index_t>(s, 0, n);
  e = std::clamp<index_t>(e, s, n);
  return detail::viewed(x, ops::slice<T, D>{x.sizes(), k, s, e, step},
                        [&](const auto& t) { return t.slice(dim, start, end, step); });
}
template <class T, class D>
var<T, D> expand(const var<T, D>& x, const shape& s) {
  return record(ops::expand<T, D>{x.sizes()}, x.value().expand(s), x);
}
/// A dense copy (the gradient passes through unchanged).
template <class T, class D>
var<T, D> contiguous(const var<T, D>& x) {
  return record(ops::reshape<T, D>{x.sizes()}, x.value().contiguous(), x);
}

template <class T, class D>
var<T, D> concat(const std::vector<var<T, D>>& xs, index_t dim) {
  std::vector<tensor<T, D>> ts;
  std::vector<index_t> lengths;
  for (auto& x : xs) ts.push_back(x.value());
  auto out = concat(ts, dim);
  const index_t k = index_t(wrap_dim(dim, out.dim(), "concat"));
  for (auto& x : xs) lengths.push_back(x.size(k));
  return record(ops::concat<T, D>{k, lengths}, std::move(out), xs);
}

}  // namespace trainkit::autograd
