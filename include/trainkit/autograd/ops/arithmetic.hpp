// trainkit/autograd/ops/arithmetic.hpp - +, -, *, /, negation and powers, with broadcasting.
#pragma once

#include <array>
#include <string_view>

#include "trainkit/autograd/function.hpp"
#include "trainkit/autograd/saved.hpp"  // round_to_precision
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/ops/reduce.hpp"

namespace trainkit::autograd {

namespace ops {
template <class T, class D>
struct add {
  static constexpr std::string_view name = "add";
  shape a, b;
  double alpha = 1.0;  // out = x + alpha * y
  std::array<tensor<T, D>, 2> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    std::array<tensor<T, D>, 2> r;
    if (needs[0]) r[0] = sum_to(g, a);
    if (needs[1]) r[1] = alpha == 1.0 ? sum_to(g, b) : sum_to(g * alpha, b);
    return r;
  }
  /// A bf16 gradient of a plain sum (no broadcast, alpha 1) goes on to both inputs as it is.
  std::array<grad_flow<T, D>, 2> backward_flow(const grad_flow<T, D>& g, const std::vector<bool>& needs) const {
    if (g.is_narrow() && alpha == 1.0 && g.sizes() == a && g.sizes() == b) {
      std::array<grad_flow<T, D>, 2> r;
      if (needs[0]) r[0] = g;
      if (needs[1]) r[1] = g;
      return r;
    }
    auto t = backward(g.widened(), needs);
    return {grad_flow<T, D>(std::move(t[0])), grad_flow<T, D>(std::move(t[1]))};
  }
};
/// x + y of two bfloat16 values, rounded once (their float sum is exact before the rounding).
struct add_bfloat16 {
  TRAINKIT_HD void operator()(bfloat16& out, const bfloat16& x, const bfloat16& y) const {
    out = bfloat16(float(x) + float(y));
  }
};
template <class T, class D>
struct mul {
  static constexpr std::string_view name = "mul";
  tensor<T, D> a, b;
  std::array<tensor<T, D>, 2> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    std::array<tensor<T, D>, 2> r;
    if (needs[0]) r[0] = sum_to(g * b, a.sizes());
    if (needs[1]) r[1] = sum_to(g * a, b.sizes());
    return r;
  }
};
template <class T, class D>
struct div {
  static constexpr std::string_view name = "div";
  tensor<T, D> a, b;
  std::array<tensor<T, D>, 2> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    std::array<tensor<T, D>, 2> r;
    if (needs[0]) r[0] = sum_to(g / b, a.sizes());
    if (needs[1]) r[1] = sum_to(map(::trainkit::functors::div_backward_rhs{}, g, a, b), b.sizes());
    return r;
  }
};
/// Ops of one input whose gradient is g * scale.
template <class T, class D>
struct scale {
  static constexpr std::string_view name = "scale";
  double s;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    return {s == 1.0 ? g : g * s};
  }
};
template <class T, class D>
struct rdiv_scalar {
  static constexpr std::string_view name = "rdiv";
  double s;
  tensor<T, D> x;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    // d(s/x)/dx = -s / x^2
    return {g * (-s) / square(x)};
  }
};
template <class T, class D>
struct pow_scalar {
  static constexpr std::string_view name = "pow";
  double e;
  tensor<T, D> x;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    return {map(::trainkit::functors::pow_scalar_backward<double>{e}, g, x)};
  }
};
template <class T, class D>
struct pow_tensor {
  static constexpr std::string_view name = "pow";
  tensor<T, D> a, b, out;
  std::array<tensor<T, D>, 2> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    std::array<tensor<T, D>, 2> r;
    if (needs[0]) r[0] = sum_to(g * b * trainkit::pow(a, b - 1.0), a.sizes());
    if (needs[1]) r[1] = sum_to(g * out * trainkit::log(a), b.sizes());
    return r;
  }
};
}  // namespace ops

/// x + alpha y. Two vars of 16-bit values (value_precision) of the same type give that type's
/// rounded sum, as two bf16/fp16 tensors do in PyTorch (a residual connection under autocast).
template <class T, class D>
var<T, D> add(const var<T, D>& x, const var<T, D>& y, double alpha = 1.0) {
  if (x.holds_bf16() && y.holds_bf16() && alpha == 1.0 && x.sizes() == y.sizes()) {  // both held in bf16
    const auto &xb = x.value_bf16(), &yb = y.value_bf16();
    auto out = tensor<bfloat16, D>::empty(xb.sizes());
    backend::elementwise<D>::for_each(xb.sizes(), {out.strides(), xb.strides(), yb.strides()}, ops::add_bfloat16{},
                                      out.data(), xb.data(), yb.data());
    return record_bf16(ops::add<T, D>{x.sizes(), y.sizes(), alpha}, std::move(out), x, y);
  }
  const value_precision p = x.precision() == y.precision() ? x.precision() : value_precision::full;
  tensor<T, D> out;
  if constexpr (std::is_same_v<T, float>) {
    // A GEMM result whose rounding to bf16 was deferred (the CPU's widened route: a residual
    // branch's last linear) is rounded in the sum's pass, not in one of its own.
    const bool rx = x.rounding_deferred() == value_precision::bfloat16,
               ry = y.rounding_deferred() == value_precision::bfloat16;
    if ((rx || ry) && alpha == 1.0 && x.sizes() == y.sizes() && !x.holds_bf16() && !y.holds_bf16()) {
      const tensor<T, D>&xv = rx ? x.value_unrounded() : x.value(), &yv = ry ? y.value_unrounded() : y.value();
      out = tensor<T, D>::empty(xv.sizes());
      backend::elementwise<D>::for_each(xv.sizes(), {out.strides(), xv.strides(), yv.strides()},
                                        ::trainkit::functors::add_rounding_bfloat16{rx, ry, p == value_precision::bfloat16},
                                        out.data(), xv.data(), yv.data());
    }
  }
  if (!out.defined()) {
    out = alpha == 1.0 ? trainkit::add(x.value(), y.value())
                       : map(::trainkit::functors::add_scaled<double>{alpha}, x.value(), y.value(), "add");
    out = round_to_precision(std::move(out), p);
  }
  auto r = record(ops::add<T, D>{x.sizes(), y.sizes(), alpha}, std::move(out), x, y);
  r.set_precision(p);
  return r;
}
template <class T, class D>
var<T, D> sub(const var<T, D>& x, const var<T, D>& y) {
  return add(x, y, -1.0);
}
template <class T, class D>
var<T, D> mul(const var<T, D>& x, const var<T, D>& y) {
  return record(ops::mul<T, D>{x.value(), y.value()}, trainkit::mul(x.value(), y.value()), x, y);
}
template <class T, class D>
var<T, D> div(const var<T, D>& x, const var<T, D>& y) {
  return record(ops::div<T, D>{x.value(), y.value()}, trainkit::div(x.value(), y.value()), x, y);
}
template <class T, class D>
var<T, D> neg(const var<T, D>& x) {
  return record(ops::scale<T, D>{-1.0}, trainkit::neg(x.value()), x);
}
template <class T, class D>
var<T, D> add(const var<T, D>& x, double s) {
  return record(ops::scale<T, D>{1.0}, x.value() + s, x);
}
template <class T, class D>
var<T, D> mul(const var<T, D>& x, double s) {
  return record(ops::scale<T, D>{s}, x.value() * s, x);
}
template <class T, class D>
var<T, D> pow(const var<T, D>& x, double e) {
  return record(ops::pow_scalar<T, D>{e, x.value()}, trainkit::pow(x.value(), e), x);
}
template <class T, class D>
var<T, D> pow(const var<T, D>& x, const var<T, D>& y) {
  auto out = trainkit::pow(x.value(), y.value());
  return record(ops::pow_tensor<T, D>{x.value(), y.value(), out}, out, x, y);
}

template <class T, class D>
var<T, D> operator+(const var<T, D>& x, const var<T, D>& y) {
  return add(x, y);
}
template <class T, class D>
var<T, D> operator-(const var<T, D>& x, const var<T, D>& y) {
  return sub(x, y);
}
template <class T, class D>
var<T, D> operator*(const var<T, D>& x, const var<T, D>& y) {
  return mul(x, y);
}
template <class T, class D>
var<T, D> operator/(const var<T, D>& x, const var<T, D>& y) {
  return div(x, y);
}
template <class T, class D>
var<T, D> operator-(const var<T, D>& x) {
  return neg(x);
}
template <class T, class D>
var<T, D> operator+(const var<T, D>& x, double s) {
  return add(x, s);
}
template <class T, class D>
var<T, D> operator+(double s, const var<T, D>& x) {
  return add(x, s);
}
template <class T, class D>
var<T, D> operator-(const var<T, D>& x, double s) {
  return add(x, -s);
}
template <class T, class D>
var<T, D> operator-(double s, const var<T, D>& x) {
  return add(neg(x), s);
}
template <class T, class D>
var<T, D> operator*(const var<T, D>& x, double s) {
  return mul(x, s);
}
template <class T, class D>
var<T, D> operator*(double s, const var<T, D>& x) {
  return mul(x, s);
}
template <class T, class D>
var<T, D> operator/(const var<T, D>& x, double s) {
  return mul(x, 1.0 / s);
}
template <class T, class D>
var<T, D> operator/(double s, const var<T, D>& x) {
  return record(ops::rdiv_scalar<T, D>{s, x.value()}, s / x.value(), x);
}

}  // namespace trainkit::autograd
