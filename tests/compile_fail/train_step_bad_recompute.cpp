// expect: does not satisfy trainkit::checkpoint::recompute_policy
// A Recompute policy without segments(n) is refused, naming the concept.
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/optim/optim.hpp"
#include "trainkit/train/train_step.hpp"

namespace tk = trainkit;
using net = tk::nn::sequential<float>;
using opt = tk::optim::sgd<float>;
struct every_other_layer {  // has a name, but no segments(n)
  static constexpr std::string_view name = "every_other";
};

#ifdef TRAINKIT_SHOULD_FAIL
using step_type = tk::train::train_step<net, opt, tk::amp::fp32, tk::amp::no_scaling, every_other_layer>;
#else
using step_type =
    tk::train::train_step<net, opt, tk::amp::fp32, tk::amp::no_scaling, tk::checkpoint::sqrt_segments>;
#endif

int main() { return static_cast<int>(sizeof(step_type)); }
