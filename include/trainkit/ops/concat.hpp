// trainkit/ops/concat.hpp - joining tensors along a dimension.
#pragma once

#include <vector>

#include "trainkit/ops/elementwise.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit {

/// Joins tensors along dim; all other sizes must match.
template <class T, class D>
tensor<T, D> concat(const std::vector<tensor<T, D>>& xs, index_t dim) {
  TRAINKIT_CHECK(!xs.empty(), shape_error, "concat", "needs at least one tensor");
  const std::size_t k = wrap_dim(dim, xs[0].dim(), "concat");
  shape out = xs[0].sizes();
  out[k] = 0;
  for (auto& x : xs) {
    bool ok = x.dim() == out.size();
    for (std::size_t d = 0; ok && d < out.size(); ++d) ok = d == k || x.sizes()[d] == out[d];
    TRAINKIT_CHECK(ok, shape_error, "concat",
                   "sizes " << to_string(x.sizes()) << " do not match " << to_string(xs[0].sizes())
                            << " outside dimension " << k);
    out[k] += x.sizes()[k];
  }
  auto r = tensor<T, D>::empty(out);
  index_t at = 0;
  for (auto& x : xs) {
    auto w = r.slice(index_t(k), at, at + x.sizes()[k]);
    copy_(w, x);
    at += x.sizes()[k];
  }
  return r;
}
}  // namespace trainkit
