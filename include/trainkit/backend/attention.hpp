// trainkit/backend/attention.hpp - fused scaled dot-product attention per device: tiles of Q
// against tiles of K/V with an online softmax (flash attention), so no T x T matrix is ever held;
// the backward recomputes each tile's probabilities from the saved log-sum-exp.
#pragma once

#include <cstdint>

#include "trainkit/config.hpp"  // TRAINKIT_HD
#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// The problem: q [batch, heads, tq, d], k [batch, heads, tk, d], v [batch, heads, tk, dv], all
/// dense; out [batch, heads, tq, dv]. causal: query i sees keys j <= i (top-left aligned, as
/// torch's is_causal). dropout_p > 0: probability (b, h, i, j) is kept, scaled by 1 / (1 - p),
/// when bernoulli_at(seed, offset, ((b * heads + h) * tq + i) * tk + j, 1 - p) holds - the mask
/// autograd::dropout draws for the [batch, heads, tq, tk] probabilities from the same generator
/// state, so the fused op equals dropout(softmax(...)) and a replay (backward, recomputation)
/// regenerates it instead of storing it.
struct attention_problem {
  index_t batch = 0, heads = 0, tq = 0, tk = 0, d = 0, dv = 0;
  double scale = 1;
  bool causal = false;
  double dropout_p = 0;
  std::uint64_t seed = 0, offset = 0;
};

/// An additive mask broadcast to [batch, heads, tq, tk]: element (b, h, i, j) at
/// p[b * sb + h * sh + i * sq + j * sk] (stride 0 along a broadcast dim); p == nullptr: none.
template <class T>
struct attention_mask {
  const T* p = nullptr;
  index_t sb = 0, sh = 0, sq = 0, sk = 0;
};

/// A [batch, heads, tokens, features] operand whose features are contiguous: element (b, h, t, c)
/// at p[b * sb + h * sh + t * st + c] - a dense tensor, or the heads of a projection ([N, L, H, hd]
/// permuted) read where they lie.
template <class T>
struct attention_view {
  T* p = nullptr;
  index_t sb = 0, sh = 0, st = 0;
  TRAINKIT_HD T* at(index_t b, index_t h) const noexcept { return p + b * sb + h * sh; }
};

/// A model provides, for operand types G and accumulator types A (G = A: float, double; a mixed
/// precision run: G = bfloat16 or A, with R the compute type the probabilities, dS and the outputs
/// are rounded to before they are multiplied or handed out - flash attention's bf16 numerics):
///   forward<R>(problem, q, k, v, mask, out, lse)   views of G; lse [batch, heads, tq] of A: the
///                                                  log-sum-exp of each row's scaled, masked scores
///                                                  (+inf for a row that every key is masked from:
///                                                  its output is 0)
///   backward<R>(problem, q, k, v, mask, out, lse, dout, dq, dk, dv)   dq, dk, dv views of A: any
///                                                  whose features are contiguous where
///                                                  strided_gradients, else dense; when G = A and R
///                                                  is narrower than A, rounded to R where
///                                                  rounds_gradients (else the caller rounds them)
///   strided_gradients, rounds_gradients   constexpr bools (above)
template <class Device>
struct attention {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::attention has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
