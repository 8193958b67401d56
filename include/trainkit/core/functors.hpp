// trainkit/core/functors.hpp - per-element math, written once for both backends.
//
// Every functor takes and returns the compute type (float for half/bfloat16) and is
// TRAINKIT_HD, so the CUDA kernels call exactly the code the CPU tests exercise.
#pragma once

#include <cmath>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"

namespace trainkit::functors {

// ---- unary ------------------------------------------------------------------------------
/// a rounded to the nearest Compute value (ties to even) and kept in a's type: what a value
/// carries after a trip through a 16-bit type (the mixed-precision ops' operands and results).
template <class Compute>
struct round_to {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    if constexpr (std::is_same_v<Compute, bfloat16> && std::is_same_v<A, float>)
      return ::trainkit::detail::round_to_bfloat16_value(a);  // the same bits, in 32-bit lanes
    else
      return static_cast<A>(static_cast<float>(Compute(static_cast<float>(a))));
  }
};
struct identity {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return a;
  }
};
struct neg {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return -a;
  }
};
struct exp {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    using std::exp;
    return exp(a);
  }
};
struct log {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    using std::log;
    return log(a);
  }
};
struct sqrt {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    using std::sqrt;
    return sqrt(a);
  }
};
struct abs {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return a < A(0) ? -a : a;
  }
};
struct square {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return a * a;
  }
};
struct reciprocal {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return A(1) / a;
  }
};
struct sign {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return a > A(0) ? A(1) : (a < A(0) ? A(-1) : A(0));
  }
};
struct tanh {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    using std::tanh;
    return tanh(a);
  }
};
/// 1 / (1 + e^-x), written so that neither branch overflows.
struct sigmoid {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    using std::exp;
    if (a >= A(0)) return A(1) / (A(1) + exp(-a));
    const A e = exp(a);
    return e / (A(1) + e);
  }
};
struct relu {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return a > A(0) ? a : A(0);
  }
};
/// The exact GELU, x * Phi(x) with the erf form (PyTorch's default approximate='none').
struct gelu {
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    using std::erf;
    return A(0.5) * a * (A(1) + erf(a * A(0.70710678118654752440)));
  }
};

// ---- with a scalar ----------------------------------------------------------------------
template <class S>
struct add_scalar {
  S s;
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return a + A(s);
  }
};
template <class S>
struct mul_scalar {
  S s;
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return a * A(s);
  }
};
/// s - a (the scalar on the left).
template <class S>
struct rsub_scalar {
  S s;
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return A(s) - a;
  }
};
/// s / a (the scalar on the left).
template <class S>
struct rdiv_scalar {
  S s;
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return A(s) / a;
  }
};
template <class S>
struct pow_scalar {
  S s;
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    using std::pow;
    if (s == S(2)) return a * a;
    return pow(a, A(s));
  }
};
template <class S>
struct clamp {
  S lo, hi;
  template <class A>
  TRAINKIT_HD A operator()(A a) const {
    return a < A(lo) ? A(lo) : (a > A(hi) ? A(hi) : a);
  }
};
template <class S>
struct fill_value {
  S s;
  template <class A>
  TRAINKIT_HD A operator()(A) const {
    return A(s);
  }
  /// With no operand: what fill_ assigns, without reading the destination (fresh memory may hold
  /// any bytes - for bool, values that are not a bool at all).
  TRAINKIT_HD S operator()() const { return s; }
};

// ---- binary -----------------------------------------------------------------------------
struct add {
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    return a + b;
  }
};
/// a + alpha * b (PyTorch's add with alpha; SGD and gradient accumulation use it).
template <class S>
struct add_scaled {
  S alpha;
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    return a + A(alpha) * b;
  }
};
struct sub {
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    return a - b;
  }
};
struct mul {
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    return a * b;
  }
};
struct div {
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    return a / b;
  }
};
struct pow {
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    using std::pow;
    return pow(a, b);
  }
};
struct maximum {
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    return a > b || a != a ? a : b;
  }
};
struct minimum {
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    return a < b || a != a ? a : b;
  }
};

// ---- derivatives used by autograd ---------------------------------------------------------
/// g * (x > 0)
/// relu's output and the half copy of its input in one pass (an input of half values: relu saves
/// it in 16 bits). The CPU runs it 8 at a time on F16C (backend/cpu/convert16.hpp).
struct relu_keeping_half {
  TRAINKIT_HD void operator()(float& y, half& saved, const float& x) const {
    y = x > 0.0f ? x : 0.0f;
    saved = half(x);
  }
};
/// relu of its input rounded to bfloat16, and that rounded input's bf16 copy, in one pass:
/// saved = bf16(x), y = relu(saved). On an input of bf16 values the rounding is exact; on one whose
/// rounding was deferred (var::defer_rounding: a GEMM result) it is that rounding, done on the way.
/// The CPU runs it 8 at a time with SSE2 (backend/cpu/convert16.hpp).
struct relu_keeping_bfloat16 {
  TRAINKIT_HD void operator()(float& y, bfloat16& saved, const float& x) const {
    saved = bfloat16(x);
    const float r = static_cast<float>(saved);
    y = r > 0.0f ? r : 0.0f;
  }
};
/// out = round_out(round_a(a) + round_b(b)), each round_* to bfloat16 values where set: the sum of
/// a residual connection that reads a GEMM result whose rounding was deferred (the CPU's widened
/// bf16 route) rounds it on the way. The CPU runs it 8 at a time with AVX2 (cpu_convert).
struct add_rounding_bfloat16 {
  bool round_a = false, round_b = false, round_out = false;
  TRAINKIT_HD void operator()(float& out, const float& a, const float& b) const {
    constexpr round_to<bfloat16> r{};
    const float x = round_a ? r(a) : a, y = round_b ? r(b) : b;
    out = round_out ? r(x + y) : x + y;
  }
};
struct relu_backward {
  template <class A>
  TRAINKIT_HD A operator()(A g, A x) const {
    return x > A(0) ? g : A(0);
  }
};
/// g * d/dx [x Phi(x)] = g * (Phi(x) + x phi(x))
struct gelu_backward {
  template <class A>
  TRAINKIT_HD A operator()(A g, A x) const {
    using std::erf;
    using std::exp;
    const A cdf = A(0.5) * (A(1) + erf(x * A(0.70710678118654752440)));
    const A pdf = exp(A(-0.5) * x * x) * A(0.39894228040143267794);
    return g * (cdf + x * pdf);
  }
};
/// g * (1 - y^2), from the saved output y = tanh(x)
struct tanh_backward {
  template <class A>
  TRAINKIT_HD A operator()(A g, A y) const {
    return g * (A(1) - y * y);
  }
};
/// g * y * (1 - y), from the saved output y = sigmoid(x)
struct sigmoid_backward {
  template <class A>
  TRAINKIT_HD A operator()(A g, A y) const {
    return g * y * (A(1) - y);
  }
};
/// g * s * x^(s-1)
template <class S>
struct pow_scalar_backward {
  S s;
  template <class A>
  TRAINKIT_HD A operator()(A g, A x) const {
    using std::pow;
    if (s == S(2)) return g * A(2) * x;
    return g * A(s) * pow(x, A(s) - A(1));
  }
};
/// g / (2 sqrt(x)), from the saved output y = sqrt(x)
struct sqrt_backward {
  template <class A>
  TRAINKIT_HD A operator()(A g, A y) const {
    return g / (A(2) * y);
  }
};
/// -g a / b^2 (the gradient of a / b with respect to b)
struct div_backward_rhs {
  template <class A>
  TRAINKIT_HD A operator()(A g, A a, A b) const {
    return -g * a / (b * b);
  }
};

}  // namespace trainkit::functors
