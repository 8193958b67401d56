// trainkit/autograd/ops/linalg.hpp - matmul with torch.matmul's broadcasting.
#pragma once

#include <array>
#include <string_view>

#include "trainkit/autograd/autocast.hpp"
#include "trainkit/autograd/function.hpp"
#include "trainkit/ops/linalg.hpp"
#include "trainkit/ops/reduce.hpp"

namespace trainkit::autograd {

namespace ops {
template <class T, class D>
struct matmul {
  static constexpr std::string_view name = "matmul";
  tensor<T, D> a, b;
  std::array<tensor<T, D>, 2> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    std::array<tensor<T, D>, 2> r;
    // Promote vectors exactly as forward did, so the batched rule below covers every case.
    tensor<T, D> A = a.dim() == 1 ? a.unsqueeze(0) : a, B = b.dim() == 1 ? b.unsqueeze(1) : b, G = g;
    // The column dim first: for vector @ vector G is 0-d and becomes [1] then [1, 1].
    if (b.dim() == 1) G = G.unsqueeze(-1);
    if (a.dim() == 1) G = G.unsqueeze(-2);
    if (needs[0]) {
      // dA = G @ B^T, summed over batch dims A was broadcast along.
      auto ga = trainkit::matmul(G, B.transpose(-1, -2));
      ga = sum_to(ga, A.sizes());
      r[0] = a.dim() == 1 ? ga.view(a.sizes()) : ga;
    }
    if (needs[1]) {
      tensor<T, D> gb;
      if (B.dim() == 2 && A.dim() > 2) {
        // [..., m, k]^T @ [..., m, n] summed over the batch: one GEMM over the folded rows.
        const index_t k = A.size(-1), n = G.size(-1);
        gb = trainkit::mm(A.reshape({-1, k}).t(), G.reshape({-1, n}));
      } else {
        gb = sum_to(trainkit::matmul(A.transpose(-1, -2), G), B.sizes());
      }
      r[1] = b.dim() == 1 ? gb.view(b.sizes()) : gb;
    }
    return r;
  }
};
}  // namespace ops

/// torch.matmul: 1-D, 2-D and batched (broadcast) products.
template <class T, class D>
var<T, D> matmul(const var<T, D>& a, const var<T, D>& b) {
  if (const auto* ac = current_autocast<T, D>(); ac != nullptr && ac->matmul != nullptr)
    return ac->matmul(a, b);  // inside a precision scope (amp::autocast)
  return record(ops::matmul<T, D>{a.value(), b.value()}, trainkit::matmul(a.value(), b.value()), a, b);
}

}  // namespace trainkit::autograd
