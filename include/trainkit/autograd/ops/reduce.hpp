// trainkit/autograd/ops/reduce.hpp - sum and mean over dimensions.
#pragma once

#include <array>
#include <string_view>

#include "trainkit/autograd/function.hpp"
#include "trainkit/ops/reduce.hpp"

namespace trainkit::autograd {

namespace ops {
/// Gradient of a sum: the output gradient broadcast back over the reduced dims (times scale).
template <class T, class D>
struct sum {
  static constexpr std::string_view name = "sum";
  shape in;
  shape kept;  // the output with reduced dims kept as 1
  double scale = 1.0;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    auto e = g.reshape(kept).expand(in);
    return {scale == 1.0 ? e.contiguous() : e * scale};
  }
};
inline shape kept_shape(const shape& in, const std::vector<index_t>& dims) {
  shape k = in;
  if (dims.empty()) {
    for (auto& s : k) s = 1;
  } else {
    for (index_t d : dims) k[wrap_dim(d, in.size(), "sum")] = 1;
  }
  return k;
}
}  // namespace ops

/// Sum over dims (every dim when empty).
template <class T, class D>
var<T, D> sum(const var<T, D>& x, const std::vector<index_t>& dims = {}, bool keepdim = false) {
  auto out = trainkit::sum(x.value(), dims, keepdim);
  return record(ops::sum<T, D>{x.sizes(), ops::kept_shape(x.sizes(), dims), 1.0}, std::move(out), x);
}

/// Mean over dims (every dim when empty).
template <class T, class D>
var<T, D> mean(const var<T, D>& x, const std::vector<index_t>& dims = {}, bool keepdim = false) {
  auto out = trainkit::mean(x.value(), dims, keepdim);
  const shape kept = ops::kept_shape(x.sizes(), dims);
  const index_t count = numel(kept) ? x.numel() / numel(kept) : 0;
  return record(ops::sum<T, D>{x.sizes(), kept, count ? 1.0 / double(count) : 0.0}, std::move(out), x);
}

}  // namespace trainkit::autograd
