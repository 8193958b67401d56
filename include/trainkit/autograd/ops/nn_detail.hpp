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

}  // namespace trainkit::autograd::detail
