// trainkit/autograd/ops/softmax.hpp - softmax and log_softmax along one dimension.
#pragma once

#include <algorithm>
#include <array>
#include <string_view>

#include "trainkit/autograd/function.hpp"
#include "trainkit/backend/softmax.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

namespace detail {
/// x viewed as [outer, size(dim), inner] around dim (a 0-d tensor counts as [1]).
struct softmax_layout {
  index_t outer = 1, dim = 1, inner = 1;
};
inline softmax_layout softmax_layout_of(const shape& s, index_t dim, const char* op) {
  softmax_layout l;
  if (s.empty()) {
    wrap_dim(dim, 1, op);
    return l;
  }
  const std::size_t d = wrap_dim(dim, s.size(), op);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i < d) l.outer *= s[i];
    if (i > d) l.inner *= s[i];
  }
  l.dim = s[d];
  return l;
}
}  // namespace detail

namespace ops {
/// Backward from the saved output y: softmax dx = y (g - sum(g y)); log_softmax dx = g - e^y sum(g).
template <class T, class D, bool Log>
struct softmax {
  static constexpr std::string_view name = Log ? "log_softmax" : "softmax";
  tensor<T, D> y;  // dense
  detail::softmax_layout l;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& grad, const std::vector<bool>&) const {
    const tensor<T, D> g = grad.contiguous();
    auto dx = tensor<T, D>::empty(y.sizes());
    backend::softmax<D>::backward(y.data(), g.data(), l.outer, l.dim, l.inner, Log, dx.data());
    return {dx};
  }
};
}  // namespace ops

namespace detail {
template <bool Log, class T, class D>
tensor<T, D> softmax_forward(const tensor<T, D>& x, const softmax_layout& l) {
  const tensor<T, D> xv = x.contiguous();
  auto y = tensor<T, D>::empty(x.sizes());
  if (y.numel() > 0) backend::softmax<D>::forward(xv.data(), l.outer, l.dim, l.inner, Log, y.data());
  return y;
}
}  // namespace detail

/// exp(x - max) / sum(exp(x - max)) along dim (max-subtracted, so large logits do not overflow).
template <class T, class D>
var<T, D> softmax(const var<T, D>& x, index_t dim) {
  const auto l = detail::softmax_layout_of(x.sizes(), dim, "softmax");
  auto y = detail::softmax_forward<false>(x.value(), l);
  return record(ops::softmax<T, D, false>{y, l}, y, x);
}

/// x - max - log(sum(exp(x - max))) along dim: the log of softmax without its round-off.
template <class T, class D>
var<T, D> log_softmax(const var<T, D>& x, index_t dim) {
  const auto l = detail::softmax_layout_of(x.sizes(), dim, "log_softmax");
  auto y = detail::softmax_forward<true>(x.value(), l);
  return record(ops::softmax<T, D, true>{y, l}, y, x);
}

}  // namespace trainkit::autograd
