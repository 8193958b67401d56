// trainkit/autograd/ops/nn_detail.hpp - small helpers the neural-network ops share: optional
// inputs (undefined bias/weight vars) and positions of elements for error messages.
#pragma once

#include <vector>

#include "trainkit/autograd/var.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::autograd::detail {

/// The inputs of an op with optional (undefined) ones left out, and the slot each one got in
/// the recorded input list (-1 when absent).
template <class T, class D>
struct optional_inputs {
  std::vector<const var<T, D>*> list;
  int add(const var<T, D>& v) {
    if (!v.defined()) return -1;
    list.push_back(&v);
    return int(list.size()) - 1;
  }
};

template <class T, class D>
const T* data_or_null(const tensor<T, D>& t) {
  return t.defined() ? t.data() : nullptr;
}

/// The multi-index of the k-th element (row-major) of a tensor of sizes s: "position [1, 2]".
inline shape unravel_index(const shape& s, index_t k) {
  shape idx(s.size());
  for (std::size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? k % s[d] : 0;
    k = s[d] ? k / s[d] : 0;
  }
  return idx;
}

}  // namespace trainkit::autograd::detail
