// trainkit/amp/ops.hpp - the ops of the autocast list under a precision policy:
// amp::linear<P>, amp::matmul<P>, amp::bmm<P>, amp::conv2d<P>.
//
// The graph's element type stays fp32 (var<float>): each op here takes its operands' values in
// the policy's compute type C (rounding fp32 ones), multiplies with fp32 accumulation and rounds
// the result to C. With a native bf16 GEMM (keeps_bf16) the result stays a bf16 tensor, held by
// the var (var::value_bf16) for the next 16-bit op, and gradients come back and go on in bf16
// (grad_flow) - torch.autocast's bf16 tensors; otherwise it is handed back as fp32 values tagged
// with C's precision (value_precision). The activations
// backward needs are saved in C - the memory mixed precision saves; weights as the forward's GEMM
// took them, rounded to C (torch.autocast's weight cache) - and the gradient GEMMs round their
// operands (the incoming gradient, the saved activations, the weights) and their results to C.
// With the fp32 policy every function is the plain op of autograd/.
//
// Where the GEMM runs: on a device whose GEMM takes C operands natively (cuBLASLt; see
// backend::native_gemm) the saved C tensors go straight in. Elsewhere - the CPU, since Debian's
// OpenBLAS 0.3.21 declares cblas_sbgemm but is built without it - the operands are widened to
// fp32 once per op and multiplied by sgemm: the products of two C values are exact in fp32 (8 or
// 11 significant bits each), so this is bit for bit a C GEMM with fp32 accumulation.
#pragma once

#include <string_view>
#include <type_traits>
#include <vector>

#include "trainkit/amp/concepts.hpp"
#include "trainkit/amp/precision.hpp"
#include "trainkit/autograd/function.hpp"
#include "trainkit/autograd/grad_mode.hpp"
#include "trainkit/autograd/ops/conv.hpp"
#include "trainkit/autograd/ops/linalg.hpp"
#include "trainkit/autograd/ops/linear.hpp"
#include "trainkit/autograd/saved.hpp"  // precision_of
#include "trainkit/backend/im2col.hpp"  // backend::convolution, conv2d_geometry
#include "trainkit/backend/blas.hpp"        // native_gemm
#include "trainkit/backend/cpu/blas.hpp"    // native_gemm<cpu, bfloat16> with oneDNN
#include "trainkit/config.hpp"
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/ops/linalg.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit::amp {

namespace detail {

using backend::native_gemm;  // backend/blas.hpp and the device backends' specialisations

/// The element type the GEMMs of a mixed op run on for Device.
template <class Device, class Compute>
using gemm_t = std::conditional_t<native_gemm<Device, Compute>, Compute, float>;

/// t as G elements whose values are representable in Compute (one pass when G is t's type).
template <class G, class Compute, class T, class D>
tensor<G, D> to_gemm(const tensor<T, D>& t) {
  if constexpr (std::is_same_v<G, Compute>)
    return cast<Compute>(t);
  else if constexpr (std::is_same_v<G, T>)
    return map(functors::round_to<Compute>{}, t);
  else
    return cast<G>(cast<Compute>(t));
}

/// Every row of out [rows, n] (G elements) = bias [n] rounded to Compute, in one pass (one kernel:
/// the rounding and the broadcast copy together; on the host, the bias rounded once and its rows
/// copied - the host's loop would round each row again, 2048 calls of 128 values for one bias of
/// the GPT example).
template <class Compute, class G, class T, class D>
void bias_rows_into(tensor<G, D>& out, const tensor<T, D>& bias) {
  const tensor<T, D> rows = bias.unsqueeze(0);
  if constexpr (std::is_same_v<G, Compute>)
    ::trainkit::detail::launch(::trainkit::detail::cast_fn<G, T>{}, out, rows);
  else if constexpr (std::is_same_v<G, T> && std::is_same_v<D, cpu>)
    copy_(out, map(functors::round_to<Compute>{}, bias).unsqueeze(0));
  else if constexpr (std::is_same_v<G, T>)
    ::trainkit::detail::launch(::trainkit::detail::assign_fn<functors::round_to<Compute>, G, T>{{}}, out, rows);
  else
    copy_(out, to_gemm<G, Compute>(bias).unsqueeze(0));
}

/// A GEMM result (G elements) rounded to Compute and returned as T elements (in place when the
/// result is widened fp32 and handed over).
template <class T, class Compute, class G, class D>
tensor<T, D> from_gemm(tensor<G, D> t) {
  if constexpr (std::is_same_v<G, Compute>)
    return cast<T>(t);
  else if constexpr (std::is_same_v<G, T>)
    return rounded_to<Compute>(std::move(t));
  else
    return cast<T>(cast<Compute>(t));
}

/// Whether a mixed op on D, whose GEMMs run on G, holds bf16 values in T on the CPU's widened route
/// (blas<cpu>::bf16_native() false): its result defers its rounding (var::defer_rounding) and its
/// gradients come and go as grad_flow tagged bf16_values, so neither is rounded twice.
template <class G, class Compute, class T, class D>
inline constexpr bool widened_bf16 =
    std::is_same_v<G, T> && std::is_same_v<Compute, bfloat16> && std::is_same_v<D, cpu>;

/// saved_operand: a mixed op saves its GEMM operands for backward as the GEMM took them - Compute
/// elements where the GEMM is native, Compute values held in fp32 on the widened route (fp32's
/// memory, as an fp32 step saves them). Saving them in Compute there took a narrowing pass in
/// forward and a widening one in backward for each: with the rounding passes, the bf16 GPT step
/// under the AVX2 limits cost 1.13x its fp32 step.

/// Whether a mixed op whose GEMMs run on G leaves its result in bfloat16 (var::from_bfloat16) and
/// hands its input gradients on in bfloat16 (grad_flow): a bf16 policy on a native bf16 GEMM, where
/// the GEMM's own output is the result - as torch.autocast's bf16 ops return bf16 tensors.
template <class G, class Compute>
inline constexpr bool keeps_bf16 = std::is_same_v<Compute, bfloat16> && std::is_same_v<G, bfloat16>;

/// Whether the mixed ops of Compute on Device multiply on the widened route now: always where the
/// device has no native GEMM of Compute (fp16 on the CPU); for bf16 on the CPU, where this CPU has
/// no bf16 arithmetic or the GEMM route is OpenBLAS (blas<cpu>::bf16_native). There the operands
/// are rounded to bf16 and held in fp32, and the fp32 kernels multiply them (fp32 accumulation,
/// the result rounded to bf16): the numbers of the native route at fp32's speed, instead of
/// widening bf16 tensors before every GEMM.
template <class Device, class Compute>
bool widens_now() {
  if constexpr (std::is_same_v<gemm_t<Device, Compute>, float>)
    return true;
  else if constexpr (std::is_same_v<Device, cpu> && std::is_same_v<Compute, bfloat16>)
    return !backend::blas<cpu>::bf16_native();
  else
    return false;
}

/// f(std::type_identity<G>{}) with G the type the mixed ops of Compute on Device multiply on now:
/// gemm_t<Device, Compute>, or float where widens_now().
template <class Device, class Compute, class F>
decltype(auto) on_gemm_type(F&& f) {
  using N = gemm_t<Device, Compute>;
  if constexpr (!std::is_same_v<N, float>)
    if (widens_now<Device, Compute>()) return f(std::type_identity<float>{});
  return f(std::type_identity<N>{});
}

/// x's values as Compute elements, dense: its bfloat16 values as they are when it holds them
/// (the previous 16-bit op's result), else rounded from T.
template <class Compute, class T, class D>
tensor<Compute, D> compute_values(const autograd::var<T, D>& x) {
  if constexpr (std::is_same_v<Compute, bfloat16>)
    if (x.holds_bf16()) return x.value_bf16().contiguous();
  return cast<Compute>(x.value().contiguous());
}

/// x's values as G elements rounded to Compute, dense: x's own tensor where they are Compute values
/// already (tagged value_precision: a mixed op's result, and relu, pooling, batch norm and adds of
/// such), else rounded in one pass.
/// The rounded copy is kept on x for the next GEMM op that reads it (var::rounded_copy: the q, k
/// and v projections of one input, which rounded it three times).
template <class G, class Compute, class T, class D>
tensor<G, D> gemm_values(const autograd::var<T, D>& x) {
  if constexpr (std::is_same_v<G, T>) {
    constexpr autograd::value_precision p = autograd::precision_of<Compute>;
    if (x.precision() == p && !x.holds_bf16()) return x.value().contiguous();
    if (const auto* kept = x.rounded_copy(p)) return *kept;
    tensor<G, D> r = to_gemm<G, Compute>(x.value()).contiguous();
    x.keep_rounded(p, r);
    return r;
  } else {
    return to_gemm<G, Compute>(x.value()).contiguous();
  }
}

/// The incoming gradient as G elements rounded to Compute (a bf16 gradient as it is).
template <class G, class Compute, class T, class D>
tensor<G, D> gradient_to_gemm(const autograd::grad_flow<T, D>& g) {
  if constexpr (std::is_same_v<G, bfloat16> && std::is_same_v<Compute, bfloat16>)
    if (g.is_narrow()) return g.bf16.contiguous();
  if constexpr (std::is_same_v<G, T> && std::is_same_v<Compute, bfloat16>)
    if (g.bf16_values && g.full.defined()) return g.full.contiguous();  // rounded by its producer
  return to_gemm<G, Compute>(g.widened());
}

/// A plain op's input gradients (run on G = bfloat16): the first `activations` of them handed on
/// in bfloat16, the rest (weight, bias: master-weight gradients) widened to T.
template <class T, class D, class R>
std::vector<autograd::grad_flow<T, D>> gradients_kept_bf16(R&& r, const std::vector<bool>& needs,
                                                           std::size_t activations = 1) {
  std::vector<autograd::grad_flow<T, D>> out(needs.size());
  for (std::size_t i = 0; i < needs.size() && i < r.size(); ++i) {
    if (!needs[i] || !r[i].defined()) continue;
    out[i] = i < activations ? autograd::grad_flow<T, D>::narrow(std::move(r[i]))
                             : autograd::grad_flow<T, D>(cast<T>(r[i]));
  }
  return out;
}

/// Each input gradient rounded to bf16 values (gradients_from_gemm), handed on tagged as such.
template <class T, class D>
std::vector<autograd::grad_flow<T, D>> flows_of_bf16_values(std::vector<tensor<T, D>> r) {
  std::vector<autograd::grad_flow<T, D>> out(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    out[i] = autograd::grad_flow<T, D>(std::move(r[i]));
    out[i].bf16_values = out[i].full.defined();
  }
  return out;
}

/// Each input gradient of a plain op's backward (run on G) rounded to Compute, as T.
template <class T, class Compute, class G, class D, class R>
std::vector<tensor<T, D>> gradients_from_gemm(R r, const std::vector<bool>& needs) {
  std::vector<tensor<T, D>> out(needs.size());
  for (std::size_t i = 0; i < needs.size() && i < r.size(); ++i)
    if (needs[i] && r[i].defined()) out[i] = from_gemm<T, Compute>(std::move(r[i]));
  return out;
}

/// What a mixed op's backward_flow hands on from its plain op's gradients r (run on G): bf16
/// tensors (the first `activations`) where keeps_bf16, else T tensors rounded to bf16 and tagged so.
/// defer_params (the widened route, the weights leaves): the gradients after the first `activations`
/// are handed on unrounded, their rounding deferred (grad_flow::deferred) to the leaf's optimizer
/// pass - a pass over every weight gradient fewer per step.
template <class T, class Compute, class G, class D, class R>
std::vector<autograd::grad_flow<T, D>> gradient_flows(R&& r, const std::vector<bool>& needs,
                                                      std::size_t activations = 1, bool defer_params = false) {
  if constexpr (keeps_bf16<G, Compute>) {
    return gradients_kept_bf16<T, D>(std::forward<R>(r), needs, activations);
  } else {
    if constexpr (std::is_same_v<G, T>) {
      if (defer_params) {
        std::vector<autograd::grad_flow<T, D>> out(needs.size());
        for (std::size_t i = 0; i < needs.size() && i < r.size(); ++i) {
          if (!needs[i] || !r[i].defined()) continue;
          const bool param = i >= activations;
          out[i] = autograd::grad_flow<T, D>(param ? std::move(r[i]) : from_gemm<T, Compute>(std::move(r[i])));
          if (param)
            out[i].deferred = autograd::precision_of<Compute>;
          else
            out[i].bf16_values = true;
        }
        return out;
      }
    }
    return flows_of_bf16_values<T, D>(gradients_from_gemm<T, Compute, G, D>(std::forward<R>(r), needs));
  }
}

/// Whether a mixed op on G defers its weight's (and bias's) gradient rounding (gradient_flows'
/// defer_params): on the widened bf16 route, when they are leaves (parameters; a computed weight's
/// gradient goes on to ops that read it rounded).
template <class G, class Compute, class T, class D>
bool defers_param_rounding(const autograd::var<T, D>& w, const autograd::var<T, D>& b) {
  if constexpr (widened_bf16<G, Compute, T, D>)
    return w.is_leaf() && (!b.defined() || b.is_leaf());
  else
    return false;
}

}  // namespace detail

// Each mixed op saves its activations and its weight as its GEMM took them (saved_operand) - as
// torch's autocast ops save their cast weights for backward: rounding the master weight again in
// backward was a pass over every weight per step (a tenth of an fp16 MLP step). With a native GEMM
// that is the Compute copy (2 bytes per element); where the operands are widened (fp16 on the CPU,
// bf16 on a CPU without bf16 arithmetic) it is the rounded fp32 copy, 4 bytes per element, which
// spares forward a narrowing pass and backward a widening one per operand.
// backward rebuilds the plain op on the gemm type from them, feeds it the incoming gradient
// rounded to Compute, and rounds every input gradient to Compute.
namespace ops {

/// amp::linear's node: x folded to [rows, in] in Compute and the weight [out, in] as the forward's
/// GEMM took it (Compute values, in the GEMM's type).
template <class Compute, class T, class D, class G = detail::gemm_t<D, Compute>>
struct linear {
  static constexpr std::string_view name = "linear";
  tensor<G, D> x2;  // Compute values as the GEMM takes them (saved_operand)
  tensor<G, D> wg;
  shape x_sizes;
  bool has_bias = false;
  bool defer_params = false;  // detail::defers_param_rounding

  std::vector<tensor<T, D>> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    return detail::gradients_from_gemm<T, Compute, G, D>(plain(needs).backward(detail::to_gemm<G, Compute>(g), needs),
                                                         needs);
  }
  /// bf16: the gradient in and the input's gradient out stay bf16 (held so with a native GEMM,
  /// tagged bf16 values on the widened route, where the weight's rounding may be deferred).
  std::vector<autograd::grad_flow<T, D>> backward_flow(const autograd::grad_flow<T, D>& g,
                                                       const std::vector<bool>& needs) const
    requires(detail::keeps_bf16<G, Compute> || detail::widened_bf16<G, Compute, T, D>)
  {
    return detail::gradient_flows<T, Compute, G, D>(
        plain(needs).backward(detail::gradient_to_gemm<G, Compute>(g), needs), needs, 1, defer_params);
  }

 private:
  // The input is read only for the weight's gradient.
  autograd::ops::linear<G, D> plain(const std::vector<bool>& needs) const {
    return {needs[1] ? x2 : tensor<G, D>(), wg, x_sizes, has_bias};
  }
};

/// amp::matmul's node: both operands as Compute values in the GEMM's type (saved_operand).
template <class Compute, class T, class D, class G = detail::gemm_t<D, Compute>>
struct matmul {
  static constexpr std::string_view name = "matmul";
  tensor<G, D> a, b;

  std::vector<tensor<T, D>> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    const autograd::ops::matmul<G, D> op{a, b};
    return detail::gradients_from_gemm<T, Compute, G, D>(op.backward(detail::to_gemm<G, Compute>(g), needs),
                                                         needs);
  }
  /// bf16: the gradient in and both operands' gradients out stay bf16 (held or tagged, as linear's).
  std::vector<autograd::grad_flow<T, D>> backward_flow(const autograd::grad_flow<T, D>& g,
                                                       const std::vector<bool>& needs) const
    requires(detail::keeps_bf16<G, Compute> || detail::widened_bf16<G, Compute, T, D>)
  {
    return detail::gradient_flows<T, Compute, G, D>(
        autograd::ops::matmul<G, D>{a, b}.backward(detail::gradient_to_gemm<G, Compute>(g), needs),
        needs, 2);
  }
};

/// amp::conv2d's node: the dense input [N, C, H, W] and the weight as the forward's convolution
/// took them (Compute values, in the GEMM's type: saved_operand).
template <class Compute, class T, class D, class G = detail::gemm_t<D, Compute>>
struct conv2d {
  static constexpr std::string_view name = "conv2d";
  tensor<G, D> x;
  tensor<G, D> wg;  // dense
  shape x_sizes;
  backend::conv2d_geometry g;
  index_t groups = 1;
  bool has_bias = false;
  bool defer_params = false;  // detail::defers_param_rounding

  std::vector<tensor<T, D>> backward(const tensor<T, D>& grad, const std::vector<bool>& needs) const {
    return detail::gradients_from_gemm<T, Compute, G, D>(plain().backward(detail::to_gemm<G, Compute>(grad), needs),
                                                         needs);
  }
  /// bf16: the gradient in and the input's gradient out stay bf16 (held or tagged, as linear's).
  std::vector<autograd::grad_flow<T, D>> backward_flow(const autograd::grad_flow<T, D>& grad,
                                                       const std::vector<bool>& needs) const
    requires(detail::keeps_bf16<G, Compute> || detail::widened_bf16<G, Compute, T, D>)
  {
    return detail::gradient_flows<T, Compute, G, D>(
        plain().backward(detail::gradient_to_gemm<G, Compute>(grad), needs), needs, 1, defer_params);
  }

 private:
  autograd::ops::conv2d<G, D> plain() const { return {x, wg, x_sizes, g, groups, has_bias}; }
};

}  // namespace ops

namespace detail {
/// Records a mixed op's GEMM result (G elements) over x, w and, when defined, b: kept in bfloat16
/// where keeps_bf16, else rounded to Compute and widened to T, tagged as Compute values.
template <class T, class Compute, class Op, class G, class D>
autograd::var<T, D> record_result(Op&& op, tensor<G, D> y, const autograd::var<T, D>& x,
                                  const autograd::var<T, D>& w, const autograd::var<T, D>& b) {
  if constexpr (keeps_bf16<G, Compute>) {
    return b.defined() ? autograd::record_bf16(std::forward<Op>(op), std::move(y), x, w, b)
                       : autograd::record_bf16(std::forward<Op>(op), std::move(y), x, w);
  } else if constexpr (widened_bf16<G, Compute, T, D>) {
    // The CPU's widened bf16 route: the rounding to bf16 is deferred to the result's first reader,
    // which does it on the way when it is a batch norm or a relu (var::defer_rounding).
    auto r = b.defined() ? autograd::record(std::forward<Op>(op), std::move(y), x, w, b)
                         : autograd::record(std::forward<Op>(op), std::move(y), x, w);
    r.defer_rounding(autograd::value_precision::bfloat16);
    return r;
  } else {
    auto yt = from_gemm<T, Compute>(std::move(y));
    auto r = b.defined() ? autograd::record(std::forward<Op>(op), std::move(yt), x, w, b)
                         : autograd::record(std::forward<Op>(op), std::move(yt), x, w);
    r.set_precision(autograd::precision_of<Compute>);  // its values are Compute values (value_precision)
    return r;
  }
}

/// matmul with operands and result rounded to Compute, a and b saved as the GEMM took them.
template <class Compute, class T, class D>
autograd::var<T, D> mixed_matmul(const autograd::var<T, D>& a, const autograd::var<T, D>& b) {
  return on_gemm_type<D, Compute>([&]<class G>(std::type_identity<G>) {
    tensor<G, D> ag, bg;
    if constexpr (std::is_same_v<G, Compute>)
      ag = compute_values<Compute>(a), bg = compute_values<Compute>(b);
    else
      ag = gemm_values<G, Compute>(a), bg = gemm_values<G, Compute>(b);
    return record_result<T, Compute>(ops::matmul<Compute, T, D, G>{ag, bg}, trainkit::matmul(ag, bg), a, b,
                                     autograd::var<T, D>());
  });
}
}  // namespace detail

/// F.linear under policy P: x [*, in], weight [out, in], bias [out] or undefined -> [*, out].
/// Mixed: y = round_C(round_C(x) round_C(W)^T + round_C(b)) with fp32 accumulation; saves x and W
/// as the GEMM took them (saved_operand). fp32: autograd::linear.
/// \tparam P a precision_policy
template <precision_policy P, class T, class D>
autograd::var<T, D> linear(const autograd::var<T, D>& x, const autograd::var<T, D>& weight,
                           const autograd::var<T, D>& bias = {}) {
  if constexpr (!P::runs_in_compute_type(autocast_op::linear)) {
    return autograd::linear(x, weight, bias);
  } else {
    using C = typename P::compute_type;
    const shape& xs = x.sizes();  // x.value() would make the T copy of a bf16-held input
    const auto& wv = weight.value();
    TRAINKIT_CHECK(
        wv.dim() == 2, shape_error, "linear",
        "weight must be 2-D [out_features, in_features], got sizes " << trainkit::to_string(wv.sizes()));
    TRAINKIT_CHECK(!xs.empty() && xs.back() == wv.size(1), shape_error, "linear",
                   "input of sizes " << trainkit::to_string(xs) << " does not end in in_features = "
                                     << wv.size(1) << " of weight sizes " << trainkit::to_string(wv.sizes()));
    const index_t in = wv.size(1), out_f = wv.size(0);
    if (bias.defined())
      TRAINKIT_CHECK(bias.dim() == 1 && bias.size(0) == out_f, shape_error, "linear",
                     "bias of sizes " << trainkit::to_string(bias.sizes()) << " does not match weight sizes "
                                      << trainkit::to_string(wv.sizes()) << " (expected [" << out_f << "])");
    return detail::on_gemm_type<D, C>([&]<class G>(std::type_identity<G>) {
      // The input is saved (as the GEMM takes it: saved_operand) only for the weight's gradient;
      // without one (no_grad, the forward of a checkpointed segment, a frozen layer) it is not kept.
      const bool save_x = autograd::is_grad_enabled() && weight.requires_grad();
      tensor<G, D> xg;
      if constexpr (detail::keeps_bf16<G, C>)
        xg = detail::compute_values<C>(x).view({-1, in});  // the previous op's bf16 values as they are
      else
        xg = detail::gemm_values<G, C>(x).view({-1, in});
      const tensor<G, D> xc = save_x ? xg : tensor<G, D>();  // [rows, in], saved
      const tensor<G, D> wg = detail::to_gemm<G, C>(wv);  // saved for backward, as the GEMM takes it
      shape os(xs.begin(), xs.end() - 1);
      os.push_back(out_f);
      auto out = tensor<G, D>::empty({xg.size(0), out_f});
      if (bias.defined()) {
        // The bias rows first, then the GEMM adds x W^T onto them (beta = 1): one rounding at the end.
        detail::bias_rows_into<C>(out, bias.value());
        mm_into(out, xg, wg.t(), 1.0, 1.0);
      } else {
        mm_into(out, xg, wg.t(), 1.0, 0.0);
      }
      ops::linear<C, T, D, G> op{xc, wg, x.sizes(), bias.defined(), detail::defers_param_rounding<G, C>(weight, bias)};
      return detail::record_result<T, C>(std::move(op), out.view(os), x, weight, bias);
    });
  }
}

/// torch.matmul under policy P (1-D, 2-D and broadcast batched products). Mixed: operands and
/// result rounded to C, fp32 accumulation, a and b saved as the GEMM took them. fp32: autograd::matmul.
/// \tparam P a precision_policy
template <precision_policy P, class T, class D>
autograd::var<T, D> matmul(const autograd::var<T, D>& a, const autograd::var<T, D>& b) {
  if constexpr (!P::runs_in_compute_type(autocast_op::matmul))
    return autograd::matmul(a, b);
  else
    return detail::mixed_matmul<typename P::compute_type>(a, b);
}

/// torch.bmm under policy P: a [B, n, k] @ b [B, k, m] -> [B, n, m] (no broadcasting).
/// \tparam P a precision_policy
template <precision_policy P, class T, class D>
autograd::var<T, D> bmm(const autograd::var<T, D>& a, const autograd::var<T, D>& b) {
  TRAINKIT_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
                 shape_error, "bmm",
                 "expected [B, n, k] and [B, k, m], got sizes " << trainkit::to_string(a.sizes()) << " and "
                                                                << trainkit::to_string(b.sizes()));
  if constexpr (!P::runs_in_compute_type(autocast_op::bmm))
    return autograd::matmul(a, b);
  else
    return detail::mixed_matmul<typename P::compute_type>(a, b);
}

/// F.conv2d under policy P: x [N, C, H, W] (or [C, H, W]), weight [O, C/groups, kh, kw], bias [O]
/// or undefined. Mixed: input, weight and bias rounded to the compute type, im2col + GEMM with
/// fp32 accumulation, result rounded; x and W saved as the GEMM took them. fp32:
/// autograd::conv2d.
/// \tparam P a precision_policy
template <precision_policy P, class T, class D>
autograd::var<T, D> conv2d(const autograd::var<T, D>& x, const autograd::var<T, D>& weight,
                           const autograd::var<T, D>& bias = {}, autograd::conv2d_options o = {}) {
  if constexpr (!P::runs_in_compute_type(autocast_op::conv2d)) {
    return autograd::conv2d(x, weight, bias, o);
  } else {
    using C = typename P::compute_type;
    const bool unbatched = x.dim() == 3;
    shape xs = x.sizes();
    if (unbatched) xs.insert(xs.begin(), 1);
    const auto geo = autograd::detail::conv2d_geometry_of(xs, weight.sizes(), o);
    if (bias.defined())
      TRAINKIT_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), shape_error, "conv2d",
                     "bias of sizes " << trainkit::to_string(bias.sizes()) << " does not match weight sizes "
                                      << trainkit::to_string(weight.sizes()) << " (expected ["
                                      << weight.size(0) << "])");
    return detail::on_gemm_type<D, C>([&]<class G>(std::type_identity<G>) {
      tensor<G, D> xg;  // dense, saved as the convolution takes it (saved_operand)
      if constexpr (std::is_same_v<G, C>)
        xg = detail::compute_values<C>(x).view(xs);
      else
        xg = detail::gemm_values<G, C>(x).view(xs);
      const tensor<T, D> wv = weight.value().contiguous();
      const tensor<G, D> bg = bias.defined() ? detail::to_gemm<G, C>(bias.value()) : tensor<G, D>();
      const tensor<G, D> wg = detail::to_gemm<G, C>(wv);  // saved for backward, as the GEMM takes it
      auto yg = tensor<G, D>::empty({xg.size(0), wg.size(0), geo.out_h, geo.out_w});
      if (yg.numel() > 0)
        backend::convolution<D>::forward(geo, o.groups, xg.size(0), wg.size(0), xg.data(), wg.data(),
                                         bg.defined() ? bg.data() : nullptr, yg.data());
      ops::conv2d<C, T, D, G> op{xg, wg, x.sizes(), geo, o.groups, bias.defined(),
                                 detail::defers_param_rounding<G, C>(weight, bias)};
      return detail::record_result<T, C>(std::move(op), unbatched ? yg.squeeze(0) : yg, x, weight, bias);
    });
  }
}

}  // namespace trainkit::amp
