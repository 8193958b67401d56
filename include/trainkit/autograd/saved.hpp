// trainkit/autograd/saved.hpp - a tensor an op saves for backward, in 16 bits when its values are
// 16-bit values (a var tagged value_precision::bfloat16 or half: the outputs of a precision
// scope's ops and of the ops that keep them). The narrowing is exact - the values are already
// bfloat16/half values - so backward sees the same numbers; what changes is the memory held
// between forward and backward: half of it, as with torch.autocast's bf16/fp16 activations.
//
//   ops::pointwise<T, D, relu_backward, relu_name>{saved_tensor<T, D>::of(x)}   // in the op
//   saved.map_with(Backward{}, g)                                              // in backward
#pragma once

#include <type_traits>

#include "trainkit/autograd/grad_mode.hpp"
#include "trainkit/autograd/var.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

/// The value_precision of a 16-bit type (full for any other).
template <class C>
inline constexpr value_precision precision_of = std::is_same_v<C, bfloat16> ? value_precision::bfloat16
                                                : std::is_same_v<C, half>   ? value_precision::half
                                                                            : value_precision::full;

/// A tensor saved for backward: the tensor itself (a reference, no copy), or its 16-bit copy.
/// Implicitly made from a tensor, so ops that save a full tensor read as before.
template <class T, class D>
class saved_tensor {
 public:
  saved_tensor() = default;
  saved_tensor(tensor<T, D> t) : full_(std::move(t)) {}  // NOLINT: a plain saved tensor

  /// What backward needs of t: its 16-bit copy when t's values are p values and backward will
  /// run (grad mode on and `needed`), else t itself.
  static saved_tensor narrowed(const tensor<T, D>& t, value_precision p, bool needed = true) {
    saved_tensor s;
    if constexpr (std::is_same_v<T, float>) {
      if (needed && is_grad_enabled()) {
        if (p == value_precision::bfloat16) {
          s.bf16_ = cast<bfloat16>(t);
          return s;
        }
        if (p == value_precision::half) {
          s.half_ = cast<half>(t);
          return s;
        }
      }
    }
    s.full_ = t;
    return s;
  }
  /// A 16-bit copy an op made itself (fused into its own pass).
  static saved_tensor of_16bit(tensor<bfloat16, D> t) {
    saved_tensor s;
    s.bf16_ = std::move(t);
    return s;
  }
  static saved_tensor of_16bit(tensor<half, D> t) {
    saved_tensor s;
    s.half_ = std::move(t);
    return s;
  }
  /// x's value, in 16 bits when x's values are 16-bit values and x needs a gradient.
  static saved_tensor of(const var<T, D>& x) { return narrowed(x.value(), x.precision(), x.requires_grad()); }

  /// The saved values as T (a widening copy when they were kept in 16 bits).
  tensor<T, D> get() const {
    if (bf16_.defined()) return cast<T>(bf16_);
    if (half_.defined()) return cast<T>(half_);
    return full_;
  }
  /// The bfloat16 copy when the values were kept so (undefined otherwise): for a kernel that reads
  /// bf16 values as they are.
  const tensor<bfloat16, D>& bf16() const noexcept { return bf16_; }
  /// out[i] = f(g[i], saved[i]) as T, reading 16-bit saved values as they are (no widened copy).
  template <class F>
  tensor<T, D> map_with(F f, const tensor<T, D>& g) const {
    if constexpr (std::is_same_v<T, float>) {  // only float vars hold 16-bit values
      if (bf16_.defined()) {  // widening a bfloat16 is a shift: done inside the loop
        auto out = tensor<T, D>::empty(g.sizes());
        ::trainkit::detail::launch(::trainkit::detail::assign_fn<F, T, T, bfloat16>{f}, out, g, bf16_);
        return out;
      }
      if (half_.defined()) {
        using fn = ::trainkit::detail::assign_fn<F, T, T, half>;
        // relu's gradient reads the half copy 8 at a time on the CPU's F16C; anything else widens
        // it in bulk first (element by element a half conversion is integer code on the CPU).
        if constexpr (std::is_same_v<D, cpu> && backend::cpu_convert::has_bulk<fn, T, const T, const half>) {
          auto out = tensor<T, D>::empty(g.sizes());
          ::trainkit::detail::launch(fn{f}, out, g, half_);
          return out;
        } else {
          return map(f, g, cast<T>(half_));
        }
      }
    }
    return map(f, g, full_);
  }

 private:
  tensor<T, D> full_;
  tensor<bfloat16, D> bf16_;
  tensor<half, D> half_;
};

}  // namespace trainkit::autograd
