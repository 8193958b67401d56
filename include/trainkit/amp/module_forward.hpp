// trainkit/amp/module_forward.hpp - running nn modules under a precision policy.
//
// nn layers call the plain fp32 ops in their forward(). amp::forward<P>(m, x) runs a module tree
// with the autocast list applied: nn::linear and nn::conv2d go through amp::linear<P> and
// amp::conv2d<P> (with the layer's own parameters), nn::sequential recurses into its children,
// every other module runs its own forward() (activations, pooling, norms, dropout, losses: fp32
// ops, as autocast keeps them). The policy is a template argument, so nothing is decided at run
// time but the layer kind. A model written by hand dispatches the same way by taking P as a
// template parameter of its forward and calling the amp ops itself:
//
//   template <amp::precision_policy P>
//   var<float> forward(const var<float>& x) {
//     auto h = autograd::relu(amp::linear<P>(x, fc1->weight(), fc1->bias()));
//     return amp::linear<P>(h, fc2->weight(), fc2->bias());
//   }
//
// This header is the one place where amp/ depends on nn/ (the amp ops themselves do not).
#pragma once

#include "trainkit/amp/concepts.hpp"
#include "trainkit/amp/ops.hpp"
#include "trainkit/autograd/ops/conv.hpp"
#include "trainkit/autograd/var.hpp"
#include "trainkit/nn/conv2d.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/module.hpp"
#include "trainkit/nn/sequential.hpp"

namespace trainkit::amp {

/// The forward options of an nn::conv2d layer as the op takes them.
inline autograd::conv2d_options conv_options_of(const nn::conv2d_options& o) {
  autograd::conv2d_options co;
  co.stride = o.stride;
  co.padding = o.padding;
  co.dilation = o.dilation;
  co.groups = o.groups;
  return co;
}

/// m(x) under policy P: linear and conv2d layers in the compute type, sequentials recursively,
/// everything else through its own forward(). With fp32 it is exactly m.forward(x).
/// \tparam P a precision_policy
template <precision_policy P, class T, class D>
autograd::var<T, D> forward(nn::module<T, D>& m, const autograd::var<T, D>& x) {
  if constexpr (!P::is_mixed) {
    return m.forward(x);
  } else {
    if (auto* l = dynamic_cast<nn::linear<T, D>*>(&m)) {
      TRAINKIT_CHECK(x.dim() >= 1 && x.size(-1) == l->in_features(), shape_error, "linear",
                     "expected an input whose last dimension is in_features = "
                         << l->in_features() << ", got sizes " << trainkit::to_string(x.sizes()));
      return amp::linear<P>(x, l->weight(), l->bias());
    }
    if (auto* c = dynamic_cast<nn::conv2d<T, D>*>(&m)) {
      TRAINKIT_CHECK((x.dim() == 4 || x.dim() == 3) && x.size(-3) == c->in_channels(), shape_error, "conv2d",
                     "expected an input [N, " << c->in_channels() << ", H, W] or [" << c->in_channels()
                                              << ", H, W], got sizes " << trainkit::to_string(x.sizes()));
      return amp::conv2d<P>(x, c->weight(), c->bias(), conv_options_of(c->options()));
    }
    if (auto* s = dynamic_cast<nn::sequential<T, D>*>(&m)) {
      autograd::var<T, D> y = x;
      for (const auto& layer : *s) y = amp::forward<P>(*layer, y);
      return y;
    }
    return m.forward(x);
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
};

}  // namespace trainkit::amp
