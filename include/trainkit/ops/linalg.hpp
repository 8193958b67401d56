// trainkit/ops/linalg.hpp - matmul (2-D, batched with broadcasting, vectors) through the device GEMM.
#pragma once

#include <algorithm>

#include "trainkit/backend/cpu/blas.hpp"  // the host model (the default device)
#include "trainkit/backend/blas.hpp"
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit {

namespace detail {
/// How GEMM can read a 2-D view without copying: unit column stride (as stored) or unit row
/// stride (read as the transpose). Returns false when neither holds.
template <class T, class D>
bool gemm_operand(const tensor<T, D>& m, bool& trans, index_t& ld) {
  const index_t r = m.size(0), c = m.size(1), sr = m.stride(0), sc = m.stride(1);
  if ((sc == 1 || c == 1) && (r == 1 || sr >= std::max<index_t>(1, c))) {
    trans = false;
    ld = r == 1 ? std::max<index_t>(1, c) : sr;
    return true;
  }
  if ((sr == 1 || r == 1) && (c == 1 || sc >= std::max<index_t>(1, r))) {
    trans = true;
    ld = c == 1 ? std::max<index_t>(1, r) : sc;
    return true;
  }
  return false;
}

/// c = alpha * a @ b + beta * c on 2-D views; c must have unit column stride.
template <class T, class D>
void gemm_2d(const tensor<T, D>& a, const tensor<T, D>& b, tensor<T, D>& c, double alpha, double beta) {
  bool ta, tb;
  index_t lda, ldb;
  tensor<T, D> ac = a, bc = b;
  if (!gemm_operand(ac, ta, lda)) {
    ac = a.clone();
    gemm_operand(ac, ta, lda);
  }
  if (!gemm_operand(bc, tb, ldb)) {
    bc = b.clone();
    gemm_operand(bc, tb, ldb);
  }
  const index_t m = a.size(0), k = a.size(1), n = b.size(1);
  const index_t ldc = m == 1 ? std::max<index_t>(1, n) : c.stride(0);
  if (k == 0) {
    if (beta == 0)
      fill_(c, T(0));
    else
      mul_(c, beta);
    return;
  }
  backend::blas<D>::gemm(ta, tb, m, n, k, alpha, ac.data(), lda, bc.data(), ldb, beta, c.data(), ldc);
}
}  // namespace detail

/// out = alpha * a @ b + beta * out for 2-D a [m, k], b [k, n], out [m, n] (dense rows).
template <class T, class D>
void mm_into(tensor<T, D>& out, const tensor<T, D>& a, const tensor<T, D>& b, double alpha = 1.0,
             double beta = 0.0) {
  TRAINKIT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), shape_error, "mm",
                 "cannot multiply sizes " << to_string(a.sizes()) << " and " << to_string(b.sizes()));
  TRAINKIT_CHECK(out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(1), shape_error, "mm",
                 "output sizes " << to_string(out.sizes()) << " do not match " << to_string(a.sizes()) << " @ "
                                 << to_string(b.sizes()));
  TRAINKIT_CHECK(out.size(1) <= 1 || out.stride(1) == 1, shape_error, "mm",
                 "output must have unit column stride, has strides " << to_string(out.strides()));
  detail::gemm_2d(a, b, out, alpha, beta);
}

/// 2-D matrix product [m, k] @ [k, n] -> [m, n].
template <class T, class D>
tensor<T, D> mm(const tensor<T, D>& a, const tensor<T, D>& b) {
  TRAINKIT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), shape_error, "mm",
                 "cannot multiply sizes " << to_string(a.sizes()) << " and " << to_string(b.sizes()));
  auto out = tensor<T, D>::empty({a.size(0), b.size(1)});
  detail::gemm_2d(a, b, out, 1.0, 0.0);
  return out;
}

/// torch.matmul semantics: vectors are promoted (and the added dim removed), dims before the
/// last two are batch dims and broadcast.
template <class T, class D>
tensor<T, D> matmul(const tensor<T, D>& a, const tensor<T, D>& b) {
  TRAINKIT_CHECK(a.dim() >= 1 && b.dim() >= 1, shape_error, "matmul",
                 "both arguments need at least 1 dimension, got sizes " << to_string(a.sizes()) << " and "
                                                                         << to_string(b.sizes()));
  if (a.dim() == 1 && b.dim() == 1) {
    TRAINKIT_CHECK(a.size(0) == b.size(0), shape_error, "matmul",
                   "vector sizes differ: " << to_string(a.sizes()) << " and " << to_string(b.sizes()));
    return mm(a.unsqueeze(0), b.unsqueeze(1)).view({});
  }
  if (a.dim() == 1) {
    auto r = matmul(a.unsqueeze(0), b);
    return r.squeeze(-2);
  }
  if (b.dim() == 1) {
    auto r = matmul(a, b.unsqueeze(1));
    return r.squeeze(-1);
  }
  const index_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  TRAINKIT_CHECK(b.size(-2) == k, shape_error, "matmul",
                 "cannot multiply sizes " << to_string(a.sizes()) << " and " << to_string(b.sizes())
                                          << ": inner dimensions " << k << " and " << b.size(-2) << " differ");
  if (a.dim() == 2 && b.dim() == 2) return mm(a, b);
  // [..., m, k] @ [k, n] with dense a: one GEMM over the folded rows.
  if (b.dim() == 2 && a.is_contiguous()) {
    shape os(a.sizes().begin(), a.sizes().end() - 1);
    os.push_back(n);
    return mm(a.reshape({-1, k}), b).view(os);
  }
  const shape ba(a.sizes().begin(), a.sizes().end() - 2), bb(b.sizes().begin(), b.sizes().end() - 2);
  const shape batch = broadcast_shapes(ba, bb, "matmul");
  shape ea = batch, eb = batch, os = batch;
  ea.insert(ea.end(), {m, k});
  eb.insert(eb.end(), {k, n});
  os.insert(os.end(), {m, n});
  const auto ax = a.expand(ea), bx = b.expand(eb);
  auto out = tensor<T, D>::empty(os);
  const index_t nb = numel(batch);
  for (index_t i = 0; i < nb; ++i) {
    // Select batch element i in each (broadcast) operand by decomposing i over the batch dims.
    auto ai = ax, bi = bx, oi = out;
    index_t rem = i;
    for (std::size_t d = batch.size(); d-- > 0;) {
      const index_t idx = rem % batch[d];
      rem /= batch[d];
      ai = ai.select(static_cast<index_t>(d), idx);
      bi = bi.select(static_cast<index_t>(d), idx);
      oi = oi.select(static_cast<index_t>(d), idx);
    }
    detail::gemm_2d(ai, bi, oi, 1.0, 0.0);
  }
  return out;
}

}  // namespace trainkit
