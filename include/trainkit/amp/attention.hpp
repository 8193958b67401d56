// trainkit/amp/attention.hpp - scaled_dot_product_attention under a precision policy, as
// torch.autocast lists it (a lower-precision op): q, k and v in the compute type C, the fused
// kernel's products of C operands accumulated in fp32, the online softmax's max, sums and
// log-sum-exp in fp32, and the probabilities (P, and dS in backward) rounded to C before they are
// multiplied - the numbers of a bf16 flash attention. The output and the input gradients are C
// values.
//
// Where the products run: bf16 on a CPU with bf16 arithmetic (blas<cpu>::bf16_native), oneDNN's
// bf16 kernels with fp32 results (q, k, v and the saved output held in bf16: half the bytes) where
// they measured faster for the shape (detail::attention_tiles_native); otherwise (no bf16
// arithmetic, fp16 on the CPU, small heads) the same rounded values held in fp32 on the fp32
// kernels - the same products, exact in fp32, at fp32's speed. On the GPU the operands are bf16 or
// fp16 tensors and the kernel is cuDNN's fused attention or trainkit's (backend/cuda/attention.cuh).
#pragma once

#include <array>
#include <cstdio>  // std::snprintf
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "trainkit/amp/concepts.hpp"
#include "trainkit/amp/ops.hpp"  // on_gemm_type, to_gemm, gradient_flows
#include "trainkit/autograd/ops/attention.hpp"
#include "trainkit/backend/cpu/measured_route.hpp"  // route_table: the measured tile route

namespace trainkit::amp {

namespace ops {
/// r with the gradients nobody needs dropped (a kernel that rounds its gradients leaves nothing else to do).
template <class T, class D>
std::vector<tensor<T, D>> only_needed(std::vector<tensor<T, D>> r, const std::vector<bool>& needs) {
  for (std::size_t i = 0; i < r.size(); ++i)
    if (i >= needs.size() || !needs[i]) r[i] = tensor<T, D>();
  return r;
}

/// amp::scaled_dot_product_attention's node: q, k, v and the output as the kernel took and gave
/// them (G: bfloat16, or T holding C values), the log-sum-exp and the mask in T.
template <class Compute, class T, class D, class G>
struct scaled_dot_product_attention {
  static constexpr std::string_view name = "scaled_dot_product_attention";
  tensor<G, D> q, k, v, out;
  tensor<T, D> lse, mask;
  backend::attention_problem p;

  std::vector<tensor<T, D>> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    if constexpr (kernel_rounds)
      return only_needed(plain(detail::to_gemm<G, Compute>(g)), needs);
    else
      return detail::gradients_from_gemm<T, Compute, G, D>(plain(detail::to_gemm<G, Compute>(g)), needs);
  }
  /// bf16: the gradient in and the three gradients out stay bf16 (held or tagged, as linear's).
  std::vector<autograd::grad_flow<T, D>> backward_flow(const autograd::grad_flow<T, D>& g,
                                                       const std::vector<bool>& needs) const
    requires(detail::keeps_bf16<G, Compute> || detail::widened_bf16<G, Compute, T, D>)
  {
    if constexpr (kernel_rounds)
      return detail::flows_of_bf16_values<T, D>(only_needed(plain(detail::gradient_to_gemm<G, Compute>(g)), needs));
    else
      return detail::gradient_flows<T, Compute, G, D>(plain(detail::gradient_to_gemm<G, Compute>(g)), needs, 3);
  }

 private:
  /// Whether the kernel hands dq, dk and dv rounded to Compute already (G = T, on a backend that
  /// rounds_gradients): nothing is left to round.
  static constexpr bool kernel_rounds = std::is_same_v<G, T> && backend::attention<D>::rounds_gradients;

  /// dq, dk, dv summed in T, each in its input's layout (attention_gradient); as G (rounded to bfloat16 when G
  /// is), else rounded by the kernel (kernel_rounds) or left for the caller's rounding.
  std::vector<tensor<G, D>> plain(const tensor<G, D>& g) const {
    using autograd::detail::attention_gradient, autograd::detail::attention_out_view, autograd::detail::attention_view_of;
    auto dq = attention_gradient<T, D>(q), dk = attention_gradient<T, D>(k), dv = attention_gradient<T, D>(v);
    backend::attention<D>::template backward<Compute>(
        p, attention_view_of(q), attention_view_of(k), attention_view_of(v), autograd::detail::attention_mask_view(mask),
        attention_view_of(out), lse.data(), attention_view_of(autograd::detail::attention_operand(g)),
        attention_out_view(dq), attention_out_view(dk), attention_out_view(dv));
    if constexpr (std::is_same_v<G, T>) {
      return {std::move(dq), std::move(dk), std::move(dv)};
    } else {
      using autograd::detail::attention_cast;
      return {attention_cast<G>(dq), attention_cast<G>(dk), attention_cast<G>(dv)};
    }
  }
};

/// amp::packed_self_attention's node: the packed projection and the output as the kernel took and
/// gave them (G), the log-sum-exp and the mask in T.
template <class Compute, class T, class D, class G>
struct packed_self_attention {
  static constexpr std::string_view name = "packed_self_attention";
  tensor<G, D> qkv, out;
  tensor<T, D> lse, mask;
  index_t heads;
  backend::attention_problem p;

  std::vector<tensor<T, D>> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    if constexpr (kernel_rounds)
      return only_needed(plain(detail::to_gemm<G, Compute>(g)), needs);
    else
      return detail::gradients_from_gemm<T, Compute, G, D>(plain(detail::to_gemm<G, Compute>(g)), needs);
  }
  /// bf16: the gradient in and out stay bf16 (held or tagged, as scaled_dot_product_attention's).
  std::vector<autograd::grad_flow<T, D>> backward_flow(const autograd::grad_flow<T, D>& g,
                                                       const std::vector<bool>& needs) const
    requires(detail::keeps_bf16<G, Compute> || detail::widened_bf16<G, Compute, T, D>)
  {
    if constexpr (kernel_rounds)
      return detail::flows_of_bf16_values<T, D>(only_needed(plain(detail::gradient_to_gemm<G, Compute>(g)), needs));
    else
      return detail::gradient_flows<T, Compute, G, D>(plain(detail::gradient_to_gemm<G, Compute>(g)), needs, 1);
  }

 private:
  static constexpr bool kernel_rounds = std::is_same_v<G, T> && backend::attention<D>::rounds_gradients;

  /// The gradient of qkv summed in T (its q, k and v blocks written where they lie); as G.
  std::vector<tensor<G, D>> plain(const tensor<G, D>& g) const {
    auto d = autograd::detail::packed_attention_backward<Compute>(p, qkv, heads, mask, out, lse,
                                                                  autograd::detail::attention_operand(g));
    if constexpr (std::is_same_v<G, T>)
      return {std::move(d)};
    else
      return {cast<G>(d)};
  }
};
}  // namespace ops

namespace detail {
/// x's values as G elements holding Compute values: a bf16-held var's own tensor, a var tagged with
/// Compute's precision as it is, else rounded. attention_values: features contiguous (as
/// attention_operand).
template <class G, class Compute, class T, class D>
tensor<G, D> compute_values_as(const autograd::var<T, D>& x) {
  if constexpr (keeps_bf16<G, Compute>)
    return x.holds_bf16() ? x.value_bf16() : cast<Compute>(x.value());
  else if constexpr (std::is_same_v<G, T>)
    return x.precision() == autograd::precision_of<Compute> && !x.holds_bf16() ? x.value()
                                                                                : to_gemm<G, Compute>(x.value());
  else
    return to_gemm<G, Compute>(x.value());  // fp16 operands on the GPU
}
template <class G, class Compute, class T, class D>
tensor<G, D> attention_values(const autograd::var<T, D>& x) {
  return autograd::detail::attention_operand(compute_values_as<G, Compute>(x));
}

/// The var of a mixed attention op's output `out` (G elements, as the kernel gave it): held in bf16
/// where keeps_bf16, else T values tagged with C's precision (the kernel rounded them).
template <class C, class G, class D, class Op, class T, class... Rest>
autograd::var<T, D> record_attention(Op&& op, const tensor<G, D>& out, const autograd::var<T, D>& first,
                                     const Rest&... rest) {
  if constexpr (keeps_bf16<G, C>) {
    return autograd::record_bf16(std::forward<Op>(op), out, first, rest...);
  } else {
    tensor<T, D> o;
    if constexpr (std::is_same_v<G, T>)
      o = out;
    else
      o = from_gemm<T, C>(out);  // fp16 on the GPU: widened (exact)
    auto r = autograd::record(std::forward<Op>(op), o, first, rest...);
    r.set_precision(autograd::precision_of<C>);
    return r;
  }
}

/// Whether a bf16 attention of this problem runs its tiles on oneDNN's bf16 kernels (true) or as
/// bf16 values held in fp32 on the fp32 kernels: the route in force, or - under the automatic
/// route - the faster forward of the two for this shape and layout on this machine, measured at its
/// first call and kept in the route file (backend/cpu/measured_route.hpp; the two sum in another
/// order, so the choice must not change within a training). On the 2-core AVX512-BF16 EPYC oneDNN
/// won both shapes measured: the GPT example's [32, 4, 64, 32] heads (forward 1.36 against
/// 1.78 ms) and [4, 8, 1024, 64] (forward + backward 0.7x the fp32 time).
/// ld: the row strides of q, k and v as the kernel will read them (part of the key: oneDNN's speed
/// depends on them); values(): q, k and v as bfloat16 attention operands, asked for by the first
/// trial only (a kept choice needs none).
template <class Compute, class T, class D, class Values>
bool attention_tiles_native(const backend::attention_problem& p, const std::array<long long, 3>& ld,
                            const tensor<T, D>& mask, Values&& values) {
  if (backend::get_cpu_gemm_route() == backend::cpu_gemm_route::onednn) return true;
  if (!backend::detail::may_measure() || p.batch * p.heads * p.tq * p.tk == 0) return true;
  char key[200];
  std::snprintf(key, sizeof key, "sdpa bf16 b%lld h%lld tq%lld tk%lld d%lld dv%lld c%d m%d ld%lld,%lld,%lld t%d",
                (long long)p.batch, (long long)p.heads, (long long)p.tq, (long long)p.tk, (long long)p.d,
                (long long)p.dv, int(p.causal), int(mask.defined()), ld[0], ld[1], ld[2],
                backend::detail::route_threads());
  std::optional<std::array<tensor<bfloat16, D>, 3>> b;
  return backend::detail::route_table::get().choose(key, [&](bool native) {
    backend::attention_problem trial = p;
    trial.dropout_p = 0;
    if (!b) b = values();
    const auto& [qb, kb, vb] = *b;
    if (native)
      (void)autograd::detail::attention_forward<Compute>(trial, qb, kb, vb, mask);
    else
      (void)autograd::detail::attention_forward<Compute>(trial, cast<T>(qb), cast<T>(kb), cast<T>(vb), mask);
    return true;
  });
}
/// The same for q, k and v vars ([B, H, T, features]).
template <class Compute, class T, class D>
bool attention_tiles_native(const backend::attention_problem& p, const autograd::var<T, D>& q,
                            const autograd::var<T, D>& k, const autograd::var<T, D>& v, const tensor<T, D>& mask) {
  // The row strides attention_operand reads: as they lie when features are contiguous, else dense.
  auto row_stride = [](const autograd::var<T, D>& x) {
    const shape& st = x.holds_bf16() ? x.value_bf16().strides() : x.value().strides();
    return (long long)(st[3] == 1 || x.size(3) <= 1 ? st[2] : x.size(3));
  };
  return attention_tiles_native<Compute>(p, {row_stride(q), row_stride(k), row_stride(v)}, mask, [&] {
    return std::array<tensor<bfloat16, D>, 3>{attention_values<bfloat16, Compute>(q),
                                              attention_values<bfloat16, Compute>(k),
                                              attention_values<bfloat16, Compute>(v)};
  });
}
}  // namespace detail

/// torch.nn.functional.scaled_dot_product_attention under policy P (see the file comment); fp32:
/// autograd::scaled_dot_product_attention. Same options, masks, dropout stream and errors.
/// \tparam P a precision_policy
template <precision_policy P, class T, class D>
autograd::var<T, D> scaled_dot_product_attention(const autograd::var<T, D>& q, const autograd::var<T, D>& k,
                                                 const autograd::var<T, D>& v,
                                                 const autograd::attention_options<T, D>& o = {}) {
  if constexpr (!P::runs_in_compute_type(autocast_op::scaled_dot_product_attention)) {
    return autograd::scaled_dot_product_attention(q, k, v, o);
  } else {
    static_assert(std::is_same_v<T, float>, "amp::scaled_dot_product_attention: float vars");
    using C = typename P::compute_type;
    const backend::attention_problem p = autograd::detail::attention_problem_of(q.sizes(), k.sizes(), v.sizes(), o);
    const tensor<T, D> mask = autograd::detail::attention_additive_mask(p, o);
    auto run = [&]<class G>(std::type_identity<G>) {
      const tensor<G, D> qg = detail::attention_values<G, C>(q), kg = detail::attention_values<G, C>(k),
                         vg = detail::attention_values<G, C>(v);
      auto [out, lse] = autograd::detail::attention_forward<C>(p, qg, kg, vg, mask);
      return detail::record_attention<C>(ops::scaled_dot_product_attention<C, T, D, G>{qg, kg, vg, out, lse, mask, p},
                                         out, q, k, v);
    };
    return detail::on_gemm_type<D, C>([&]<class G>(std::type_identity<G> g) {
      if constexpr (std::is_same_v<G, bfloat16> && std::is_same_v<D, cpu>)
        if (!detail::attention_tiles_native<C>(p, q, k, v, mask)) return run(std::type_identity<T>{});
      return run(g);
    });
  }
}

/// autograd::packed_self_attention under policy P, as scaled_dot_product_attention<P> (the same
/// numbers for the same q, k and v): the packed projection's values in the compute type, its
/// gradient one [B, T, 3 H hd] tensor of Compute values.
/// \tparam P a precision_policy
template <precision_policy P, class T, class D>
autograd::var<T, D> packed_self_attention(const autograd::var<T, D>& qkv, index_t heads,
                                          const autograd::attention_options<T, D>& o = {}) {
  if constexpr (!P::runs_in_compute_type(autocast_op::scaled_dot_product_attention)) {
    return autograd::packed_self_attention(qkv, heads, o);
  } else {
    static_assert(std::is_same_v<T, float>, "amp::packed_self_attention: float vars");
    using C = typename P::compute_type;
    const backend::attention_problem p = autograd::detail::packed_attention_problem(qkv.sizes(), heads, o);
    const tensor<T, D> mask = autograd::detail::attention_additive_mask(p, o);
    auto run = [&]<class G>(std::type_identity<G>) {
      const tensor<G, D> packed = detail::compute_values_as<G, C>(qkv).contiguous();
      const auto h = autograd::detail::packed_heads(packed, heads);
      auto [out, lse] = autograd::detail::attention_forward<C>(p, h[0], h[1], h[2], mask);
      return detail::record_attention<C>(ops::packed_self_attention<C, T, D, G>{packed, out, lse, mask, heads, p}, out,
                                         qkv);
    };
    return detail::on_gemm_type<D, C>([&]<class G>(std::type_identity<G> g) {
      if constexpr (std::is_same_v<G, bfloat16> && std::is_same_v<D, cpu>) {
        const long long ld = qkv.size(2);  // the heads' row stride: the packed row
        if (!detail::attention_tiles_native<C>(p, {ld, ld, ld}, mask, [&] {
              return autograd::detail::packed_heads(detail::compute_values_as<bfloat16, C>(qkv).contiguous(), heads);
            }))
          return run(std::type_identity<T>{});
      }
      return run(g);
    });
  }
}

}  // namespace trainkit::amp
