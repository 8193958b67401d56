// trainkit/ops/elementwise.hpp - broadcasting elementwise ops on tensors of any device.
#pragma once

#include <array>
#include <type_traits>

#include "trainkit/backend/cpu/elementwise.hpp"  // the host model (the default device)
#include "trainkit/backend/elementwise.hpp"
#include "trainkit/core/assign.hpp"
#include "trainkit/core/functors.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit {

namespace detail {
/// Runs f(out, in...) over out's index space with every input broadcast to out's sizes.
template <class F, class Out, class D, class... In>
void launch(F f, const tensor<Out, D>& out, const tensor<In, D>&... in) {
  std::array<shape, 1 + sizeof...(In)> st{out.strides(), in.expand(out.sizes()).strides()...};
  backend::elementwise<D>::for_each(out.sizes(), std::move(st), f, out.data(),
                                    const_cast<const In*>(in.data())...);
}
}  // namespace detail

/// Throws unless src broadcasts to exactly dst's sizes.
template <class T, class U, class D>
bool broadcast_check(const tensor<T, D>& dst, const tensor<U, D>& src, const char* op = "in-place op") {
  TRAINKIT_CHECK(broadcast_shapes(dst.sizes(), src.sizes(), op) == dst.sizes(), shape_error, op,
                 "cannot write sizes " << to_string(src.sizes()) << " into sizes " << to_string(dst.sizes()));
  return true;
}

/// out[i] = f(a[i]) in a new dense tensor.
template <class F, class T, class D>
tensor<T, D> map(F f, const tensor<T, D>& a) {
  auto out = tensor<T, D>::empty(a.sizes());
  detail::launch(detail::assign_fn<F, T, T>{f}, out, a);
  return out;
}

/// out[i] = f(a[i], b[i]) with NumPy broadcasting.
template <class F, class T, class D>
tensor<T, D> map(F f, const tensor<T, D>& a, const tensor<T, D>& b, const char* op = "map") {
  auto out = tensor<T, D>::empty(broadcast_shapes(a.sizes(), b.sizes(), op));
  detail::launch(detail::assign_fn<F, T, T, T>{f}, out, a, b);
  return out;
}

/// out[i] = f(a[i], b[i], c[i]) with NumPy broadcasting.
template <class F, class T, class D>
tensor<T, D> map(F f, const tensor<T, D>& a, const tensor<T, D>& b, const tensor<T, D>& c, const char* op = "map") {
  auto out = tensor<T, D>::empty(broadcast_shapes(broadcast_shapes(a.sizes(), b.sizes(), op), c.sizes(), op));
  detail::launch(detail::assign_fn<F, T, T, T, T>{f}, out, a, b, c);
  return out;
}

/// dst[i] = f(dst[i], src[i]...) in place; each src broadcasts to dst's sizes.
template <class F, class T, class D, class... In>
void apply_(F f, tensor<T, D>& dst, const tensor<In, D>&... src) {
  ((void)broadcast_check(dst, src), ...);
  detail::launch(detail::update_fn<F, T, In...>{f}, dst, src...);
}

template <class T, class Device>
void copy_(tensor<T, Device>& dst, const tensor<T, Device>& src) {
  broadcast_check(dst, src, "copy_");
  detail::launch(detail::cast_fn<T, T>{}, dst, src);
}

template <class T, class Device>
void fill_(tensor<T, Device>& dst, T value) {
  detail::launch(detail::assign_fn<functors::fill_value<T>, T>{{value}}, dst);  // dst is written, never read
}

/// The same values as another element type (rounding to nearest even into half/bfloat16).
template <class To, class From, class D>
tensor<To, D> cast(const tensor<From, D>& a) {
  if constexpr (std::is_same_v<To, From>) {
    return a;
  } else {
    auto out = tensor<To, D>::empty(a.sizes());
    detail::launch(detail::cast_fn<To, From>{}, out, a);
    return out;
  }
}

/// t's values rounded to those of C (half, bfloat16), kept as T: in place when t is the only
/// holder of its storage (a fresh result handed over with std::move), else in a new tensor.
/// In place saves the new tensor and a write stream: a 16-bit precision scope rounds every GEMM
/// result and batch-norm output of its fp32-held values this way.
template <class C, class T, class D>
tensor<T, D> rounded_to(tensor<T, D> t) {
  if (t.storage_ptr() && t.storage_ptr().use_count() == 1) {
    detail::launch(detail::assign_fn<functors::round_to<C>, T, T>{{}}, t, t);
    return t;
  }
  return map(functors::round_to<C>{}, t);
}

// ---- named ops (no autograd; autograd/ops wraps them) ---------------------------------------
#define TRAINKIT_UNARY(name)                          \
  template <class T, class D>                         \
  tensor<T, D> name(const tensor<T, D>& a) {          \
    return map(functors::name{}, a);                  \
  }
TRAINKIT_UNARY(neg)
TRAINKIT_UNARY(exp)
TRAINKIT_UNARY(log)
TRAINKIT_UNARY(sqrt)
TRAINKIT_UNARY(abs)
TRAINKIT_UNARY(square)
TRAINKIT_UNARY(reciprocal)
TRAINKIT_UNARY(sign)
TRAINKIT_UNARY(tanh)
TRAINKIT_UNARY(sigmoid)
TRAINKIT_UNARY(relu)
TRAINKIT_UNARY(gelu)
#undef TRAINKIT_UNARY

#define TRAINKIT_BINARY(name)                                              \
  template <class T, class D>                                              \
  tensor<T, D> name(const tensor<T, D>& a, const tensor<T, D>& b) {        \
    return map(functors::name{}, a, b, #name);                             \
  }
TRAINKIT_BINARY(add)
TRAINKIT_BINARY(sub)
TRAINKIT_BINARY(mul)
TRAINKIT_BINARY(div)
TRAINKIT_BINARY(pow)
TRAINKIT_BINARY(maximum)
TRAINKIT_BINARY(minimum)
#undef TRAINKIT_BINARY

template <class T, class D>
tensor<T, D> pow(const tensor<T, D>& a, double e) {
  return map(functors::pow_scalar<double>{e}, a);
}
template <class T, class D>
tensor<T, D> clamp(const tensor<T, D>& a, double lo, double hi) {
  return map(functors::clamp<double>{lo, hi}, a);
}

template <class T, class D>
tensor<T, D> operator+(const tensor<T, D>& a, const tensor<T, D>& b) {
  return add(a, b);
}
template <class T, class D>
tensor<T, D> operator-(const tensor<T, D>& a, const tensor<T, D>& b) {
  return sub(a, b);
}
template <class T, class D>
tensor<T, D> operator*(const tensor<T, D>& a, const tensor<T, D>& b) {
  return mul(a, b);
}
template <class T, class D>
tensor<T, D> operator/(const tensor<T, D>& a, const tensor<T, D>& b) {
  return div(a, b);
}
template <class T, class D>
tensor<T, D> operator-(const tensor<T, D>& a) {
  return neg(a);
}
template <class T, class D>
tensor<T, D> operator+(const tensor<T, D>& a, double s) {
  return map(functors::add_scalar<double>{s}, a);
}
template <class T, class D>
tensor<T, D> operator+(double s, const tensor<T, D>& a) {
  return a + s;
}
template <class T, class D>
tensor<T, D> operator-(const tensor<T, D>& a, double s) {
  return a + (-s);
}
template <class T, class D>
tensor<T, D> operator-(double s, const tensor<T, D>& a) {
  return map(functors::rsub_scalar<double>{s}, a);
}
template <class T, class D>
tensor<T, D> operator*(const tensor<T, D>& a, double s) {
  return map(functors::mul_scalar<double>{s}, a);
}
template <class T, class D>
tensor<T, D> operator*(double s, const tensor<T, D>& a) {
  return a * s;
}
template <class T, class D>
tensor<T, D> operator/(const tensor<T, D>& a, double s) {
  return a * (1.0 / s);
}
template <class T, class D>
tensor<T, D> operator/(double s, const tensor<T, D>& a) {
  return map(functors::rdiv_scalar<double>{s}, a);
}

// ---- in place ------------------------------------------------------------------------------
/// dst += alpha * src (src broadcasts to dst).
template <class T, class D>
void add_(tensor<T, D>& dst, const tensor<T, D>& src, double alpha = 1.0) {
  if (alpha == 1.0)
    apply_(functors::add{}, dst, src);
  else
    apply_(functors::add_scaled<double>{alpha}, dst, src);
}
template <class T, class D>
void mul_(tensor<T, D>& dst, double s) {
  apply_(functors::mul_scalar<double>{s}, dst);
}
template <class T, class D>
void mul_(tensor<T, D>& dst, const tensor<T, D>& src) {
  apply_(functors::mul{}, dst, src);
}
template <class T, class D>
void zero_(tensor<T, D>& dst) {
  fill_(dst, T(0));
}

}  // namespace trainkit
