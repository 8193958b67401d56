// trainkit/amp/autocast.hpp - a precision scope: inside `amp::autocast<P> scope;` every
// autograd::linear, matmul (batched too), conv2d, scaled_dot_product_attention and
// packed_self_attention on this thread runs as amp::linear<P>, amp::matmul<P>, amp::conv2d<P>,
// amp::scaled_dot_product_attention<P>, amp::packed_self_attention<P> - whoever calls it: nn
// layers, a user's own module, a function.
// The other ops (activations, norms, softmax, losses, reductions) stay fp32, as under
// torch.autocast. An fp32 scope turns an outer mixed one off (torch.autocast(enabled=False)).
//
//   {
//     amp::autocast<amp::mixed_bf16> scope;   // vars of float on the cpu; <P, float, cuda> on GPUs
//     auto y = my_net.forward(x);             // its GEMMs and convolutions in bfloat16
//   }
#pragma once

#include <cstdint>
#include <type_traits>

#include "trainkit/amp/attention.hpp"
#include "trainkit/amp/concepts.hpp"
#include "trainkit/amp/ops.hpp"
#include "trainkit/autograd/autocast.hpp"
#include "trainkit/autograd/ops/conv.hpp"
#include "trainkit/backend/cpu/cpu_features.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/device.hpp"

namespace trainkit::amp {

/// RAII precision scope for vars of T on D on this thread (see the file comment). Scopes nest;
/// the innermost wins.
/// \tparam P a precision_policy
template <precision_policy P, class T = float, class D = cpu>
class autocast {
 public:
  autocast() noexcept : guard_(P::is_mixed ? &table : nullptr) {}
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

  /// Ops this thread has run in a lower-precision compute type so far (all scopes).
  static std::uint64_t op_count() noexcept { return autograd::autocast_op_count(); }

 private:
  using var_type = autograd::var<T, D>;
  // A bf16 op on a CPU without bf16 arithmetic: the one-line notice, once per process.
  static void note() {
    if constexpr (std::is_same_v<D, cpu> && std::is_same_v<typename P::compute_type, bfloat16>)
      (void)backend::cpu_features::note_bf16_without_arithmetic();
  }
  // Each runs the amp op with the scope suspended (it is not dispatched to itself) and counts.
  static var_type linear_op(const var_type& x, const var_type& w, const var_type& b) {
    autograd::autocast_guard<T, D> off(nullptr);
    ++autograd::detail::autocast_counter();
    note();
    return amp::linear<P>(x, w, b);
  }
  static var_type matmul_op(const var_type& a, const var_type& b) {
    autograd::autocast_guard<T, D> off(nullptr);
    ++autograd::detail::autocast_counter();
    note();
    return amp::matmul<P>(a, b);
  }
  static var_type conv2d_op(const var_type& x, const var_type& w, const var_type& b,
                            const autograd::conv2d_options& o) {
    autograd::autocast_guard<T, D> off(nullptr);
    ++autograd::detail::autocast_counter();
    note();
    return amp::conv2d<P>(x, w, b, o);
  }
  static var_type attention_op(const var_type& q, const var_type& k, const var_type& v,
                               const autograd::attention_options<T, D>& o) {
    autograd::autocast_guard<T, D> off(nullptr);
    ++autograd::detail::autocast_counter();
    note();
    return amp::scaled_dot_product_attention<P>(q, k, v, o);
  }
  static var_type packed_attention_op(const var_type& qkv, index_t heads, const autograd::attention_options<T, D>& o) {
    autograd::autocast_guard<T, D> off(nullptr);
    ++autograd::detail::autocast_counter();
    note();
    return amp::packed_self_attention<P>(qkv, heads, o);
  }
  // An attention entry where the ops exist for these vars (float on the CPU so far), else null.
  template <auto Op>
  static constexpr decltype(Op) where_attention_exists() {
    if constexpr (std::is_same_v<D, cpu> && std::is_same_v<T, float>)
      return Op;
    else
      return nullptr;
  }
  static constexpr autograd::autocast_ops<T, D> table{&linear_op, &matmul_op, &conv2d_op,
                                                      where_attention_exists<&attention_op>(),
                                                      where_attention_exists<&packed_attention_op>()};

  autograd::autocast_guard<T, D> guard_;
};

}  // namespace trainkit::amp
