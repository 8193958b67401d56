// expect: does not satisfy trainkit::amp::precision_policy
// A Precision tag without compute/master types is refused, naming the concept.
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/optim/optim.hpp"
#include "trainkit/train/train_step.hpp"

namespace tk = trainkit;
using net = tk::nn::sequential<float>;
using opt = tk::optim::sgd<float>;
struct fp8 {  // a name only
  static constexpr std::string_view name = "fp8";
};

#ifdef TRAINKIT_SHOULD_FAIL
using step_type = tk::train::train_step<net, opt, fp8, tk::amp::no_scaling>;
#else
using step_type = tk::train::train_step<net, opt, tk::amp::mixed_bf16, tk::amp::no_scaling>;
#endif

int main() { return static_cast<int>(sizeof(step_type)); }
