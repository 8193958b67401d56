// expect: does not satisfy trainkit::optim::optimizer
// An Optimizer without lr()/set_lr() is refused, naming the concept.
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/optim/optim.hpp"
#include "trainkit/train/train_step.hpp"

namespace tk = trainkit;
using net = tk::nn::sequential<float>;
using opt = tk::optim::sgd<float>;
struct plain_descent {  // steps, but has no learning rate to schedule
  using var_type = tk::autograd::var<float>;
  void step() {}
  void zero_grad() {}
  const std::vector<var_type>& params() const { return p; }
  std::vector<var_type> p;
};

#ifdef TRAINKIT_SHOULD_FAIL
using step_type = tk::train::train_step<net, plain_descent>;
#else
using step_type = tk::train::train_step<net, tk::optim::adamw<float>>;
#endif

int main() { return static_cast<int>(sizeof(step_type)); }
