// expect: does not satisfy trainkit::amp::loss_scaler
// A Scaler without unscale/step/update/state is refused, naming the concept.
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/optim/optim.hpp"
#include "trainkit/train/train_step.hpp"

namespace tk = trainkit;
using net = tk::nn::sequential<float>;
using opt = tk::optim::sgd<float>;
struct not_a_scaler {  // scales, but cannot unscale, step or be snapshotted
  template <class T, class D>
  tk::autograd::var<T, D> scale(const tk::autograd::var<T, D>& l) const {
    return l;
  }
  double get_scale() const { return 1.0; }
};

#ifdef TRAINKIT_SHOULD_FAIL
using step_type = tk::train::train_step<net, opt, tk::amp::fp32, not_a_scaler>;
#else
using step_type = tk::train::train_step<net, opt, tk::amp::fp32, tk::amp::no_scaling>;
#endif

int main() { return static_cast<int>(sizeof(step_type)); }
