// trainkit/autograd/ops/unary.hpp - exp, log, sqrt, tanh, sigmoid, relu, gelu.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "trainkit/autograd/function.hpp"
#include "trainkit/autograd/saved.hpp"
#include "trainkit/backend/elementwise.hpp"  // the fused relu + bf16 save
#include "trainkit/backend/gelu.hpp"         // GELU in vector lanes (the CPU)
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

namespace ops {
/// An op whose gradient is Backward(g, saved) with saved the input or the output.
template <class T, class D, class Backward, const char* Name>
struct pointwise {
  static constexpr std::string_view name = Name;
  saved_tensor<T, D> saved;  // in 16 bits when it holds 16-bit values (autograd/saved.hpp)
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    return {saved.map_with(Backward{}, g)};
  }
  /// relu's gradient is its incoming one with some values zeroed: a gradient of bf16 values
  /// (grad_flow::bf16_values) stays one, and the GEMM before relu need not round it again.
  std::array<grad_flow<T, D>, 1> backward_flow(const grad_flow<T, D>& g, const std::vector<bool>& needs) const
    requires std::is_same_v<Backward, ::trainkit::functors::relu_backward>
  {
    grad_flow<T, D> r(backward(g.widened(), needs)[0]);
    r.bf16_values = g.bf16_values;
    return {std::move(r)};
  }
};
struct exp_backward {  // g * exp(x), from the output
  template <class A>
  TRAINKIT_HD A operator()(A g, A y) const {
    return g * y;
  }
};
struct log_backward {  // g / x, from the input
  template <class A>
  TRAINKIT_HD A operator()(A g, A x) const {
    return g / x;
  }
};
inline constexpr char exp_name[] = "exp";
inline constexpr char log_name[] = "log";
inline constexpr char sqrt_name[] = "sqrt";
inline constexpr char tanh_name[] = "tanh";
inline constexpr char sigmoid_name[] = "sigmoid";
inline constexpr char relu_name[] = "relu";
inline constexpr char gelu_name[] = "gelu";
}  // namespace ops

template <class T, class D>
var<T, D> exp(const var<T, D>& x) {
  auto y = trainkit::exp(x.value());
  return record(ops::pointwise<T, D, ops::exp_backward, ops::exp_name>{y}, y, x);
}
template <class T, class D>
var<T, D> log(const var<T, D>& x) {
  return record(ops::pointwise<T, D, ops::log_backward, ops::log_name>{x.value()}, trainkit::log(x.value()), x);
}
template <class T, class D>
var<T, D> sqrt(const var<T, D>& x) {
  auto y = trainkit::sqrt(x.value());
  return record(ops::pointwise<T, D, ::trainkit::functors::sqrt_backward, ops::sqrt_name>{y}, y, x);
}
template <class T, class D>
var<T, D> tanh(const var<T, D>& x) {
  auto y = trainkit::tanh(x.value());
  return record(ops::pointwise<T, D, ::trainkit::functors::tanh_backward, ops::tanh_name>{y}, y, x);
}
template <class T, class D>
var<T, D> sigmoid(const var<T, D>& x) {
  auto y = trainkit::sigmoid(x.value());
  return record(ops::pointwise<T, D, ::trainkit::functors::sigmoid_backward, ops::sigmoid_name>{y}, y, x);
}
namespace ops {
/// All ones where a bfloat16 is > 0 (and not NaN), else zero - on its bits: b - 1 as an unsigned
/// 16-bit integer is below 0x7f80 exactly for +denormals..+inf (0 wraps, negatives and NaNs lie
/// above). A mask, not a branch: the loops vectorise, and relu's data would mispredict branches.
TRAINKIT_HD inline std::uint16_t positive_mask(std::uint16_t b) {
  return static_cast<std::uint16_t>(-static_cast<int>(static_cast<std::uint16_t>(b - 1u) < 0x7f80u));
}
/// relu on bfloat16 values, bf16 in and out (relu(NaN) = 0, as relu's `x > 0 ? x : 0`).
struct relu_bfloat16 {
  TRAINKIT_HD void operator()(bfloat16& y, const bfloat16& x) const {
    y = bfloat16::from_bits(static_cast<std::uint16_t>(x.bits() & positive_mask(x.bits())));
  }
};
/// relu's gradient from its bf16 output: g where y > 0 (y > 0 exactly where x > 0).
struct relu_backward_bfloat16 {
  TRAINKIT_HD void operator()(bfloat16& dx, const bfloat16& g, const bfloat16& y) const {
    dx = bfloat16::from_bits(static_cast<std::uint16_t>(g.bits() & positive_mask(y.bits())));
  }
};

/// relu of a var held in bfloat16: saves its bf16 output (the result's own storage, no copy).
/// Its gradient stays bf16 when it arrives in bf16.
template <class T, class D>
struct relu_kept_bf16 {
  static constexpr std::string_view name = relu_name;
  tensor<bfloat16, D> y;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    return {saved_tensor<T, D>::of_16bit(y).map_with(::trainkit::functors::relu_backward{}, g)};
  }
  std::array<grad_flow<T, D>, 1> backward_flow(const grad_flow<T, D>& g, const std::vector<bool>& needs) const {
    if (!g.is_narrow()) return {grad_flow<T, D>(backward(g.full, needs)[0])};
    const auto gb = g.bf16.contiguous();
    auto dx = tensor<bfloat16, D>::empty(y.sizes());
    backend::elementwise<D>::for_each(y.sizes(), {dx.strides(), gb.strides(), y.strides()}, relu_backward_bfloat16{},
                                      dx.data(), gb.data(), y.data());
    return {grad_flow<T, D>::narrow(std::move(dx))};
  }
};
}  // namespace ops

/// relu keeps 16-bit values 16-bit (value_precision) and then saves its input in 16 bits; a var
/// held in bfloat16 gives one held in bfloat16 (no T copy made).
template <class T, class D>
var<T, D> relu(const var<T, D>& x) {
  if (x.holds_bf16()) {
    const auto& xb = x.value_bf16();
    auto y = tensor<bfloat16, D>::empty(xb.sizes());
    backend::elementwise<D>::for_each(xb.sizes(), {y.strides(), xb.strides()}, ops::relu_bfloat16{}, y.data(),
                                      xb.data());
    return record_bf16(ops::relu_kept_bf16<T, D>{y}, y, x);
  }
  if constexpr (std::is_same_v<T, float>) {
    // 16-bit values: the output and the saved 16-bit copy of the input in one pass (F16C for half,
    // SSE2 for bfloat16 on the CPU); bfloat16 values whose rounding was deferred (a GEMM result on
    // the widened route) are rounded in that pass, not before it.
    auto keeping = [&]<class C>(auto keep) {
      const tensor<T, D>& xv = std::is_same_v<C, bfloat16> && x.rounding_deferred() == value_precision::bfloat16
                                   ? x.value_unrounded()
                                   : x.value();
      auto y = tensor<T, D>::empty(xv.sizes());
      auto saved = tensor<C, D>::empty(xv.sizes());
      backend::elementwise<D>::for_each(xv.sizes(), {y.strides(), saved.strides(), xv.strides()}, keep, y.data(),
                                        saved.data(), xv.data());
      auto r = record(ops::pointwise<T, D, ::trainkit::functors::relu_backward, ops::relu_name>{
                          saved_tensor<T, D>::of_16bit(std::move(saved))},
                      std::move(y), x);
      r.set_precision(x.precision());
      return r;
    };
    if (x.requires_grad() && is_grad_enabled()) {
      if (x.precision() == value_precision::half)
        return keeping.template operator()<half>(::trainkit::functors::relu_keeping_half{});
      if (x.precision() == value_precision::bfloat16)
        return keeping.template operator()<bfloat16>(::trainkit::functors::relu_keeping_bfloat16{});
    }
  }
  auto y = record(ops::pointwise<T, D, ::trainkit::functors::relu_backward, ops::relu_name>{saved_tensor<T, D>::of(x)},
                  trainkit::relu(x.value()), x);
  y.set_precision(x.precision());
  return y;
}
namespace ops {
/// GELU on a device with a backend::gelu kernel (the CPU, float): forward and backward in its
/// vector lanes; x saved dense. bf16: x holds bfloat16 values (rounded first where round_x: x's
/// rounding was deferred, and the kernels round it in their passes), and the input's gradient is
/// handed on as bfloat16 values, as torch's GELU of a bf16 tensor has a bf16 gradient.
template <class T, class D>
struct gelu_kernel {
  static constexpr std::string_view name = "gelu";
  tensor<T, D> x;
  bool bf16 = false, round_x = false;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& grad, const std::vector<bool>&) const {
    const tensor<T, D> g = grad.contiguous();
    auto dx = tensor<T, D>::empty(x.sizes());
    if (bf16)
      backend::gelu<D>::backward_bf16(x.numel(), g.data(), x.data(), dx.data(), round_x);
    else
      backend::gelu<D>::backward(x.numel(), g.data(), x.data(), dx.data());
    return {dx};
  }
  std::array<grad_flow<T, D>, 1> backward_flow(const grad_flow<T, D>& g, const std::vector<bool>& needs) const {
    grad_flow<T, D> out(backward(g.widened(), needs)[0]);
    out.bf16_values = bf16;
    return {out};
  }
};
}  // namespace ops

/// GELU; of bfloat16 values (x.precision(): an autocast op's result) on the CPU, its results and
/// its input's gradient are bfloat16 values too, rounded in the kernels' passes - as torch's GELU of
/// a bf16 tensor returns bf16, and as the next GEMM would have rounded them; an input whose rounding
/// was deferred (a GEMM result on the widened route) is rounded in those passes, not before them.
template <class T, class D>
var<T, D> gelu(const var<T, D>& x) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<D, cpu>) {
    const bool bf16 = x.precision() == value_precision::bfloat16;
    const bool round_x = bf16 && x.rounding_deferred() == value_precision::bfloat16;
    const tensor<T, D> xv = (round_x ? x.value_unrounded() : x.value()).contiguous();
    auto y = tensor<T, D>::empty(xv.sizes());
    if (bf16)
      backend::gelu<D>::forward_bf16(xv.numel(), xv.data(), y.data(), round_x);
    else
      backend::gelu<D>::forward(xv.numel(), xv.data(), y.data());
    auto r = record(ops::gelu_kernel<T, D>{xv, bf16, round_x}, std::move(y), x);
    if (bf16) r.set_precision(value_precision::bfloat16);
    return r;
  }
  return record(ops::pointwise<T, D, ::trainkit::functors::gelu_backward, ops::gelu_name>{x.value()},
                trainkit::gelu(x.value()), x);
}

}  // namespace trainkit::autograd
