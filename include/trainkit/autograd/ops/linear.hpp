// trainkit/autograd/ops/linear.hpp - y = x W^T + b, the fully connected layer, as one GEMM.
#pragma once

#include <string_view>
#include <vector>

#include "trainkit/autograd/autocast.hpp"
#include "trainkit/autograd/function.hpp"
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/ops/linalg.hpp"
#include "trainkit/ops/reduce.hpp"

namespace trainkit::autograd {

namespace ops {
/// Saves the input folded to [rows, in] and the weight [out, in].
template <class T, class D>
struct linear {
  static constexpr std::string_view name = "linear";
  tensor<T, D> x2, weight;
  shape x_sizes;
  bool has_bias = false;

  std::vector<tensor<T, D>> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    std::vector<tensor<T, D>> r(needs.size());
    const tensor<T, D> g2 = g.reshape({-1, weight.size(0)});  // [rows, out]
    if (needs[0]) r[0] = trainkit::mm(g2, weight).view(x_sizes);      // [rows, out] @ [out, in]
    if (needs[1]) r[1] = trainkit::mm(g2.t(), x2);                   // [out, rows] @ [rows, in]
    if (has_bias && needs[2]) r[2] = trainkit::sum(g2, {0});
    return r;
  }
};
}  // namespace ops

/// PyTorch's F.linear: x [*, in], weight [out, in], bias [out] or an undefined var; returns
/// [*, out]. The weight is read through its transposed view, so no copy is made.
template <class T, class D>
var<T, D> linear(const var<T, D>& x, const var<T, D>& weight, const var<T, D>& bias = {}) {
  if (const auto* ac = current_autocast<T, D>(); ac != nullptr && ac->linear != nullptr)
    return ac->linear(x, weight, bias);  // inside a precision scope (amp::autocast)
  const auto& xv = x.value();
  const auto& wv = weight.value();
  TRAINKIT_CHECK(wv.dim() == 2, shape_error, "linear",
                 "weight must be 2-D [out_features, in_features], got sizes " << to_string(wv.sizes()));
  TRAINKIT_CHECK(xv.dim() >= 1 && xv.size(-1) == wv.size(1), shape_error, "linear",
                 "input of sizes " << to_string(xv.sizes()) << " does not end in in_features = " << wv.size(1)
                                   << " of weight sizes " << to_string(wv.sizes()));
  const index_t in = wv.size(1), out_f = wv.size(0);
  if (bias.defined())
    TRAINKIT_CHECK(bias.dim() == 1 && bias.size(0) == out_f, shape_error, "linear",
                   "bias of sizes " << to_string(bias.sizes()) << " does not match weight sizes "
                                    << to_string(wv.sizes()) << " (expected [" << out_f << "])");
  const tensor<T, D> x2 = xv.reshape({-1, in});
  shape os(xv.sizes().begin(), xv.sizes().end() - 1);
  os.push_back(out_f);
  auto out = tensor<T, D>::empty({x2.size(0), out_f});
  if (bias.defined()) {
    // Start from the bias rows and let the GEMM add x W^T (beta = 1): no second pass.
    copy_(out, bias.value().unsqueeze(0));
    mm_into(out, x2, wv.t(), 1.0, 1.0);
  } else {
    mm_into(out, x2, wv.t(), 1.0, 0.0);
  }
  ops::linear<T, D> op{x2, wv, xv.sizes(), bias.defined()};
  if (bias.defined()) return record(std::move(op), out.view(os), x, weight, bias);
  return record(std::move(op), out.view(os), x, weight);
}

}  // namespace trainkit::autograd
