// trainkit/ops/reduce.hpp - sum, mean, max, min, argmax along dimensions; sum_to for broadcasting.
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "trainkit/backend/cpu/reduce.hpp"  // the host model (the default device)
#include "trainkit/backend/reduce.hpp"
#include "trainkit/core/reducers.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit {

namespace detail {
inline std::vector<bool> reduce_mask(const std::vector<index_t>& dims, std::size_t ndim, const char* op) {
  std::vector<bool> m(ndim, dims.empty());
  for (index_t d : dims) {
    const std::size_t k = wrap_dim(d, ndim, op);
    TRAINKIT_CHECK(!m[k] || dims.empty(), shape_error, op, "dimension " << d << " listed twice");
    m[k] = true;
  }
  return m;
}

template <class Out, class R, class T, class D>
tensor<Out, D> reduce_impl(const tensor<T, D>& a, const std::vector<bool>& mask, bool keepdim, R r, const char* /*op*/) {
  shape kept, out_sizes;
  for (std::size_t d = 0; d < a.dim(); ++d) {
    kept.push_back(mask[d] ? 1 : a.sizes()[d]);
    if (!mask[d]) out_sizes.push_back(a.sizes()[d]);
  }
  auto out = tensor<Out, D>::empty(kept);
  shape ost = out.strides();
  for (std::size_t d = 0; d < a.dim(); ++d)
    if (mask[d]) ost[d] = 0;
  backend::reduce<D>::run(a.sizes(), mask, static_cast<const T*>(a.data()), a.strides(), out.data(), ost, r);
  return keepdim ? out : out.view(out_sizes);
}
}  // namespace detail

/// Sum over `dims` (all dims when empty). keepdim leaves size-1 dims in their place.
template <class T, class D>
tensor<T, D> sum(const tensor<T, D>& a, const std::vector<index_t>& dims = {}, bool keepdim = false) {
  return detail::reduce_impl<T>(a, detail::reduce_mask(dims, a.dim(), "sum"), keepdim,
                                reducers::sum<accumulate_t<T>>{}, "sum");
}

template <class T, class D>
tensor<T, D> mean(const tensor<T, D>& a, const std::vector<index_t>& dims = {}, bool keepdim = false) {
  return detail::reduce_impl<T>(a, detail::reduce_mask(dims, a.dim(), "mean"), keepdim,
                                reducers::mean<accumulate_t<T>>{}, "mean");
}

/// Largest value over `dims` (all dims when empty).
template <class T, class D>
tensor<T, D> amax(const tensor<T, D>& a, const std::vector<index_t>& dims = {}, bool keepdim = false) {
  TRAINKIT_CHECK(a.numel() > 0, shape_error, "amax", "empty tensor of sizes " << to_string(a.sizes()));
  return detail::reduce_impl<T>(a, detail::reduce_mask(dims, a.dim(), "amax"), keepdim,
                                reducers::extreme_value<accumulate_t<T>>{true}, "amax");
}
template <class T, class D>
tensor<T, D> amin(const tensor<T, D>& a, const std::vector<index_t>& dims = {}, bool keepdim = false) {
  TRAINKIT_CHECK(a.numel() > 0, shape_error, "amin", "empty tensor of sizes " << to_string(a.sizes()));
  return detail::reduce_impl<T>(a, detail::reduce_mask(dims, a.dim(), "amin"), keepdim,
                                reducers::extreme_value<accumulate_t<T>>{false}, "amin");
}

/// Index of the largest value along dim (first one on ties), as int64.
template <class T, class D>
tensor<std::int64_t, D> argmax(const tensor<T, D>& a, index_t dim, bool keepdim = false) {
  TRAINKIT_CHECK(a.dim() > 0 && a.size(dim) > 0, shape_error, "argmax",
                 "cannot take argmax over an empty dimension of sizes " << to_string(a.sizes()));
  return detail::reduce_impl<std::int64_t>(a, detail::reduce_mask({dim}, a.dim(), "argmax"), keepdim,
                                           reducers::extreme_index<accumulate_t<T>>{{true}}, "argmax");
}
template <class T, class D>
tensor<std::int64_t, D> argmin(const tensor<T, D>& a, index_t dim, bool keepdim = false) {
  TRAINKIT_CHECK(a.dim() > 0 && a.size(dim) > 0, shape_error, "argmin",
                 "cannot take argmin over an empty dimension of sizes " << to_string(a.sizes()));
  return detail::reduce_impl<std::int64_t>(a, detail::reduce_mask({dim}, a.dim(), "argmin"), keepdim,
                                           reducers::extreme_index<accumulate_t<T>>{{false}}, "argmin");
}

/// Values and indices of the max along dim (torch.max(x, dim)).
template <class T, class D>
std::pair<tensor<T, D>, tensor<std::int64_t, D>> max(const tensor<T, D>& a, index_t dim, bool keepdim = false) {
  return {amax(a, {dim}, keepdim), argmax(a, dim, keepdim)};
}

/// Sums a broadcast result back to `target` sizes: the gradient of broadcasting.
template <class T, class D>
tensor<T, D> sum_to(const tensor<T, D>& g, const shape& target) {
  if (g.sizes() == target) return g;
  TRAINKIT_CHECK(broadcast_shapes(target, g.sizes(), "sum_to") == g.sizes(), shape_error, "sum_to",
                 "sizes " << to_string(g.sizes()) << " are not a broadcast of " << to_string(target));
  const std::size_t lead = g.dim() - target.size();
  std::vector<bool> mask(g.dim(), false);
  for (std::size_t d = 0; d < g.dim(); ++d)
    mask[d] = d < lead || (target[d - lead] == 1 && g.sizes()[d] != 1);
  auto r = detail::reduce_impl<T>(g, mask, true, reducers::sum<accumulate_t<T>>{}, "sum_to");
  return r.view(target);
}

}  // namespace trainkit
