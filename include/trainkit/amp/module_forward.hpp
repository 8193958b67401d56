// trainkit/amp/module_forward.hpp - running modules under a precision policy.
//
// amp::forward<P>(m, x) runs m.forward(x) inside an amp::autocast<P> scope (amp/autocast.hpp):
// every linear, matmul and conv2d the module reaches - through nn layers, a user's own module of
// any structure, or plain autograd calls - runs in P's compute type; everything else in fp32. No
// module needs to know about precision. train::train_step adds the check that mixed precision did
// something (an error naming the model when no op ran in the compute type).
#pragma once

#include <cstdint>

#include "trainkit/amp/autocast.hpp"
#include "trainkit/amp/concepts.hpp"
#include "trainkit/autograd/var.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::amp {

/// m(x) under policy P: m.forward(x) inside an amp::autocast<P, T, D> scope. With fp32 it is
/// exactly m.forward(x).
/// \tparam P a precision_policy
template <precision_policy P, class T, class D>
autograd::var<T, D> forward(nn::module<T, D>& m, const autograd::var<T, D>& x) {
  if constexpr (!P::is_mixed) {
    return m.forward(x);
  } else {
    autocast<P, T, D> scope;
    return m.forward(x);
  }
}

/// m(tokens) under policy P for a model whose forward takes integer token ids (a language model:
/// nn::embedding first), inside the same autocast scope.
template <precision_policy P, class M, class D>
  requires requires(M& m, const tensor<std::int64_t, D>& t) { m.forward(t); }
auto forward(M& m, const tensor<std::int64_t, D>& tokens) {
  if constexpr (!P::is_mixed) {
    return m.forward(tokens);
  } else {
    autocast<P, typename M::value_type, D> scope;
    return m.forward(tokens);
  }
}

/// amp::forward<P> as a callable object: the per-layer forward that checkpoint::apply_recompute
/// and checkpoint::checkpoint_sequential take, so checkpointed segments run in precision P.
/// \tparam P a precision_policy
template <precision_policy P>
struct module_forward {
  template <class T, class D>
  autograd::var<T, D> operator()(nn::module<T, D>& m, const autograd::var<T, D>& x) const {
    return amp::forward<P>(m, x);
  }
  /// A model that takes token ids (see amp::forward above).
  template <class M, class D>
    requires requires(M& m, const tensor<std::int64_t, D>& t) { m.forward(t); }
  auto operator()(M& m, const tensor<std::int64_t, D>& tokens) const {
    return amp::forward<P>(m, tokens);
  }
};

}  // namespace trainkit::amp
