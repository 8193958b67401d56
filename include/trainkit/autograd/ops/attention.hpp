// trainkit/autograd/ops/attention.hpp - scaled_dot_product_attention with PyTorch's semantics,
// fused (backend::attention: tiles and an online softmax, never a T x T matrix).
//
//   out = softmax(q k^T * scale + mask) v        q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv]
//
// Saved for backward: q, k, v, the output and one log-sum-exp per query row - O(B H T d) memory;
// a dropout mask is regenerated from its Philox offset, not stored.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "trainkit/autograd/autocast.hpp"
#include "trainkit/autograd/function.hpp"
#include "trainkit/backend/attention.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"

namespace trainkit::autograd {

/// The options of torch.nn.functional.scaled_dot_product_attention.
template <class T, class D>
struct attention_options {
  /// Added to the scores; broadcastable to [B, H, Tq, Tk] (-inf hides a key). Undefined: none.
  tensor<T, D> attn_mask{};
  /// torch's boolean attn_mask: true where a query may attend a key. Undefined: none.
  tensor<bool, D> attn_bool_mask{};
  /// Query i sees keys j <= i (top-left aligned); no mask may be given with it (as torch).
  bool is_causal = false;
  /// Dropout on the attention probabilities, in [0, 1] (torch applies it whenever it is given:
  /// pass 0 in evaluation). The mask is the one autograd::dropout would draw from gen for the
  /// [B, H, Tq, Tk] probabilities (gen advances by B H Tq Tk / 4 Philox blocks), regenerated in
  /// backward and by recomputation, never stored.
  double dropout_p = 0;
  /// The generator of the dropout mask; nullptr: default_generator().
  generator* gen = nullptr;
  /// Multiplies q k^T; default 1 / sqrt(d).
  std::optional<double> scale{};
};

namespace detail {
/// The checked problem of q, k, v (their sizes) and the options (dropout not yet reserved).
template <class T, class D>
backend::attention_problem attention_problem_of(const shape& q, const shape& k, const shape& v,
                                                const attention_options<T, D>& o) {
  constexpr const char* op = "scaled_dot_product_attention";
  TRAINKIT_CHECK(q.size() == 4 && k.size() == 4 && v.size() == 4, shape_error, op,
                 "q, k and v must be [batch, heads, tokens, features]; got q " << to_string(q) << ", k " << to_string(k)
                                                                               << ", v " << to_string(v));
  TRAINKIT_CHECK(q[0] == k[0] && k[0] == v[0] && q[1] == k[1] && k[1] == v[1], shape_error, op,
                 "q, k and v must share batch and heads; got q " << to_string(q) << ", k " << to_string(k) << ", v "
                                                                 << to_string(v));
  TRAINKIT_CHECK(q[3] == k[3], shape_error, op,
                 "q and k must have the same feature size; got q " << to_string(q) << ", k " << to_string(k));
  TRAINKIT_CHECK(k[2] == v[2], shape_error, op,
                 "k and v must have the same number of tokens; got k " << to_string(k) << ", v " << to_string(v));
  TRAINKIT_CHECK(!(o.is_causal && (o.attn_mask.defined() || o.attn_bool_mask.defined())), usage_error, op,
                 "is_causal and an explicit attn_mask cannot both be given");
  TRAINKIT_CHECK(!(o.attn_mask.defined() && o.attn_bool_mask.defined()), usage_error, op,
                 "give attn_mask (additive) or attn_bool_mask, not both");
  TRAINKIT_CHECK(o.dropout_p >= 0 && o.dropout_p <= 1, value_error, op,
                 "dropout_p must be in [0, 1], got " << o.dropout_p);
  TRAINKIT_CHECK(!o.scale || std::isfinite(*o.scale), usage_error, op, "scale must be finite, got " << *o.scale);
  backend::attention_problem p;
  p.batch = q[0], p.heads = q[1], p.tq = q[2], p.tk = k[2], p.d = q[3], p.dv = v[3];
  p.scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(p.d > 0 ? p.d : 1));
  p.causal = o.is_causal;
  p.dropout_p = o.dropout_p;
  if (p.dropout_p > 0) {  // the mask's Philox blocks, taken from the generator now
    generator& gen = o.gen != nullptr ? *o.gen : default_generator();
    p.seed = gen.seed();
    p.offset = gen.reserve(std::uint64_t(p.batch * p.heads * p.tq * p.tk));
  }
  return p;
}

/// t as the kernels read it: as it lies when its features are contiguous (the heads of a packed
/// projection, permuted), else a dense copy.
template <class T, class D>
tensor<T, D> attention_operand(const tensor<T, D>& t) {
  return t.stride(3) == 1 || t.size(3) <= 1 ? t : t.contiguous();
}

/// The kernels' view of a [B, H, T, features] tensor from attention_operand.
template <class T, class D>
backend::attention_view<const T> attention_view_of(const tensor<T, D>& t) {
  return {t.data(), t.stride(0), t.stride(1), t.stride(2)};
}

/// The kernels' writable view of an output or gradient from attention_output / attention_gradient.
template <class T, class D>
backend::attention_view<T> attention_out_view(tensor<T, D>& t) {
  return {t.data(), t.stride(0), t.stride(1), t.stride(2)};
}

/// The gradient of an input tensor `like` ([B, H, T, features], features contiguous) in its layout
/// where the device's backward writes any (backend::attention<D>::strided_gradients), as torch's
/// fused CPU kernels do, else dense. The heads of a projection ([B, T, H, features] memory,
/// permuted: nn::multi_head_attention's q, k and v) so get a gradient that merges back into the
/// projection's [B, T, H features] without a copy (a copy of each of the three a layer, before).
template <class T, class D, class U>
tensor<T, D> attention_gradient(const tensor<U, D>& like) {
  const shape& s = like.sizes();
  if constexpr (backend::attention<D>::strided_gradients)
    if (s[1] > 1 && s[2] > 1 && like.stride(1) < like.stride(2))  // heads inside tokens
      return tensor<T, D>::empty({s[0], s[2], s[1], s[3]}).permute({0, 2, 1, 3});
  return tensor<T, D>::empty(s);
}

/// cast<G>(t) in t's layout: dense, or an attention_gradient / attention_output whose
/// [B, T, H, features] memory stays so.
template <class G, class T, class D>
tensor<G, D> attention_cast(const tensor<T, D>& t) {
  if (t.is_contiguous()) return cast<G>(t);
  return cast<G>(t.permute({0, 2, 1, 3})).permute({0, 2, 1, 3});
}

/// The output, [B, Tq, H, dv] in memory seen as [B, H, Tq, dv] (the layout of torch's fused CPU
/// kernels): merging the heads after it (permute to [B, Tq, H, dv], reshape to [B, Tq, H dv]) is
/// then a view, and the gradient of that merge comes back in this layout - no copy either way.
template <class T, class D>
tensor<T, D> attention_output(const backend::attention_problem& p) {
  return tensor<T, D>::empty({p.batch, p.tq, p.heads, p.dv}).permute({0, 2, 1, 3});
}


/// A boolean mask as an additive one of its sizes: -inf where an element equals `hidden`, else 0
/// (scaled_dot_product_attention hides false; nn::multi_head_attention's masks hide true) - the log
/// of its 1 / 0 visibility, exact on every device.
template <class T, class D>
tensor<T, D> additive_mask(const tensor<bool, D>& mask, bool hidden) {
  const tensor<T, D> seen = ::trainkit::cast<T>(mask);
  return ::trainkit::log(hidden ? 1.0 - seen : seen);
}

/// The additive mask as [B, H, Tq, Tk] (a broadcast view; a boolean one turned into 0 / -inf).
template <class T, class D>
tensor<T, D> attention_additive_mask(const backend::attention_problem& p, const attention_options<T, D>& o) {
  const shape full{p.batch, p.heads, p.tq, p.tk};
  auto check = [&](const shape& s) {
    bool ok = s.size() <= 4;
    for (std::size_t i = 0; ok && i < s.size(); ++i) {
      const index_t want = full[4 - s.size() + i];
      ok = s[i] == want || s[i] == 1;
    }
    TRAINKIT_CHECK(ok, shape_error, "scaled_dot_product_attention",
                   "attn_mask " << to_string(s) << " does not broadcast to [batch, heads, Tq, Tk] = " << to_string(full));
  };
  if (o.attn_mask.defined()) {
    check(o.attn_mask.sizes());
    return o.attn_mask.expand(full);
  }
  if (o.attn_bool_mask.defined()) {
    check(o.attn_bool_mask.sizes());
    return additive_mask<T>(o.attn_bool_mask, /*hidden=*/false).expand(full);  // torch's SDPA: true attends
  }
  return {};
}

template <class T, class D>
backend::attention_mask<T> attention_mask_view(const tensor<T, D>& m) {
  if (!m.defined()) return {};
  return {m.data(), m.stride(0), m.stride(1), m.stride(2), m.stride(3)};
}
/// The fused forward of q, k, v (attention_operand tensors of G) with R's rounding (void: none):
/// the output (attention_output) and the log-sum-exp [B, H, Tq] in A.
template <class R = void, class A, class G, class D>
std::pair<tensor<G, D>, tensor<A, D>> attention_forward(const backend::attention_problem& p, const tensor<G, D>& q,
                                                        const tensor<G, D>& k, const tensor<G, D>& v,
                                                        const tensor<A, D>& mask) {
  auto out = attention_output<G, D>(p);
  auto lse = tensor<A, D>::empty({p.batch, p.heads, p.tq});
  if (out.numel() > 0)
    backend::attention<D>::template forward<R>(p, attention_view_of(q), attention_view_of(k), attention_view_of(v),
                                               attention_mask_view(mask), attention_out_view(out), lse.data());
  return {std::move(out), std::move(lse)};
}

/// The q, k and v heads, [B, H, T, hd] views, of a packed projection qkv [B, T, 3 H hd] (dense; torch's
/// in_proj layout: the q, k and v blocks, each H heads of hd features).
template <class T, class D>
std::array<tensor<T, D>, 3> packed_heads(const tensor<T, D>& qkv, index_t heads) {
  const index_t b = qkv.size(0), t = qkv.size(1), hd = qkv.size(2) / (3 * heads);
  const tensor<T, D> s = qkv.view({b, t, 3, heads, hd});
  return {s.select(2, 0).permute({0, 2, 1, 3}), s.select(2, 1).permute({0, 2, 1, 3}),
          s.select(2, 2).permute({0, 2, 1, 3})};
}

/// The checked problem of packed_self_attention: qkv [B, T, 3 H hd], heads H.
template <class T, class D>
backend::attention_problem packed_attention_problem(const shape& s, index_t heads, const attention_options<T, D>& o) {
  TRAINKIT_CHECK(heads > 0 && s.size() == 3 && s[2] > 0 && s[2] % (3 * heads) == 0, shape_error, "packed_self_attention",
                 "qkv must be [batch, tokens, 3 * heads * head_dim] (q, k and v blocks); got "
                     << to_string(s) << " with heads = " << heads);
  const shape h{s[0], heads, s[1], s[2] / (3 * heads)};
  return attention_problem_of(h, h, h, o);
}

/// The backward of packed_self_attention: the gradient of qkv [B, T, 3 H hd] in A, its q, k and v
/// blocks written by the device's backward where they lie (strided_gradients), else dense and copied
/// in. R as attention_forward's.
template <class R = void, class A, class G, class D>
tensor<A, D> packed_attention_backward(const backend::attention_problem& p, const tensor<G, D>& qkv, index_t heads,
                                       const tensor<A, D>& mask, const tensor<G, D>& out, const tensor<A, D>& lse,
                                       const tensor<G, D>& dout) {
  auto dqkv = tensor<A, D>::empty(qkv.sizes());
  const auto in = packed_heads(qkv, heads);
  auto d = packed_heads(dqkv, heads);
  auto run = [&](std::array<tensor<A, D>, 3>& g) {
    backend::attention<D>::template backward<R>(p, attention_view_of(in[0]), attention_view_of(in[1]),
                                                attention_view_of(in[2]), attention_mask_view(mask),
                                                attention_view_of(out), lse.data(), attention_view_of(dout),
                                                attention_out_view(g[0]), attention_out_view(g[1]),
                                                attention_out_view(g[2]));
  };
  if constexpr (backend::attention<D>::strided_gradients) {
    run(d);
  } else {
    std::array<tensor<A, D>, 3> dense{tensor<A, D>::empty(d[0].sizes()), tensor<A, D>::empty(d[1].sizes()),
                                      tensor<A, D>::empty(d[2].sizes())};
    run(dense);
    for (std::size_t i = 0; i < 3; ++i) copy_(d[i], dense[i]);
  }
  return dqkv;
}
}  // namespace detail

namespace ops {
/// packed_self_attention's node: the packed projection (dense), the output, log-sum-exp and mask.
template <class T, class D>
struct packed_self_attention {
  static constexpr std::string_view name = "packed_self_attention";
  tensor<T, D> qkv, out, lse, mask;
  index_t heads;
  backend::attention_problem p;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& grad, const std::vector<bool>&) const {
    return {detail::packed_attention_backward(p, qkv, heads, mask, out, lse, detail::attention_operand(grad))};
  }
};

template <class T, class D>
struct scaled_dot_product_attention {
  static constexpr std::string_view name = "scaled_dot_product_attention";
  tensor<T, D> q, k, v, out, lse, mask;  // q, k, v: attention_operand; out: attention_output; lse [B, H, Tq]
  backend::attention_problem p;
  std::array<tensor<T, D>, 3> backward(const tensor<T, D>& grad, const std::vector<bool>&) const {
    const tensor<T, D> g = detail::attention_operand(grad);
    auto dq = detail::attention_gradient<T, D>(q), dk = detail::attention_gradient<T, D>(k),
         dv = detail::attention_gradient<T, D>(v);
    using detail::attention_out_view, detail::attention_view_of;
    backend::attention<D>::backward(p, attention_view_of(q), attention_view_of(k), attention_view_of(v),
                                    detail::attention_mask_view(mask), attention_view_of(out), lse.data(),
                                    attention_view_of(g), attention_out_view(dq), attention_out_view(dk),
                                    attention_out_view(dv));
    return {dq, dk, dv};
  }
};
}  // namespace ops

/// torch.nn.functional.scaled_dot_product_attention on [B, H, T, d] inputs: fused on the CPU and
/// the GPU (float, double; inside an amp::autocast scope, amp::scaled_dot_product_attention: its GEMMs in
/// the compute type, as torch.autocast lists it). Rows that every key is masked from give 0 (and
/// no gradient), as torch's fused kernels do. Inputs whose features are contiguous are read where
/// they lie (the heads of a projection, permuted: no copy); the output is a [B, H, Tq, dv] view of
/// [B, Tq, H, dv] memory, as torch's CPU kernels return it (attention_output).
template <class T, class D>
var<T, D> scaled_dot_product_attention(const var<T, D>& q, const var<T, D>& k, const var<T, D>& v,
                                       const attention_options<T, D>& o = {}) {
  static_assert(std::is_floating_point_v<T>, "scaled_dot_product_attention: float or double");
  if (const auto* ac = current_autocast<T, D>(); ac != nullptr && ac->attention != nullptr)
    return ac->attention(q, k, v, o);  // inside a precision scope (amp::autocast)
  const backend::attention_problem p = detail::attention_problem_of(q.sizes(), k.sizes(), v.sizes(), o);
  const tensor<T, D> mask = detail::attention_additive_mask(p, o);
  const tensor<T, D> qc = detail::attention_operand(q.value()), kc = detail::attention_operand(k.value()),
                     vc = detail::attention_operand(v.value());
  auto [out, lse] = detail::attention_forward(p, qc, kc, vc, mask);
  return record(ops::scaled_dot_product_attention<T, D>{qc, kc, vc, out, lse, mask, p}, out, q, k, v);
}

/// Self-attention of a packed projection: scaled_dot_product_attention(q, k, v, o) with q, k and v
/// the three blocks of qkv [B, T, 3 H hd] (torch's in_proj layout: one linear projects all three, as
/// nn::multi_head_attention does when query, key and value are one input), split into H heads;
/// returns [B, H, T, hd] as scaled_dot_product_attention does (the same numbers, masks, dropout
/// stream and errors). The heads are read where they lie and, on the CPU, the backward writes dq,
/// dk and dv into one [B, T, 3 H hd] gradient where they lie: the projection's backward is then one
/// GEMM for the input and one for the packed weight, where three projections took three of each,
/// three slices' zero-filled gradients of the packed weight and two sums of the input's.
template <class T, class D>
var<T, D> packed_self_attention(const var<T, D>& qkv, index_t heads, const attention_options<T, D>& o = {}) {
  static_assert(std::is_floating_point_v<T>, "packed_self_attention: float or double");
  if (const auto* ac = current_autocast<T, D>(); ac != nullptr && ac->packed_attention != nullptr)
    return ac->packed_attention(qkv, heads, o);  // inside a precision scope (amp::autocast)
  const backend::attention_problem p = detail::packed_attention_problem(qkv.sizes(), heads, o);
  const tensor<T, D> mask = detail::attention_additive_mask(p, o);
  const tensor<T, D> packed = qkv.value().contiguous();
  const auto h = detail::packed_heads(packed, heads);
  auto [out, lse] = detail::attention_forward(p, h[0], h[1], h[2], mask);
  return record(ops::packed_self_attention<T, D>{packed, out, lse, mask, heads, p}, out, qkv);
}

}  // namespace trainkit::autograd
