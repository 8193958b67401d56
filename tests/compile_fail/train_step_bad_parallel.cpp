// expect: does not satisfy trainkit::train::parallel_policy
// A Parallel policy without finish() is refused, naming the concept.
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/optim/optim.hpp"
#include "trainkit/train/train_step.hpp"

namespace tk = trainkit;
using net = tk::nn::sequential<float>;
using opt = tk::optim::sgd<float>;
struct all_reduce_later {  // reduces nothing: no finish()
  void reduce() {}
};

#ifdef TRAINKIT_SHOULD_FAIL
using step_type = tk::train::train_step<net, opt, tk::amp::fp32, tk::amp::no_scaling,
                                        tk::checkpoint::store_all, all_reduce_later>;
#else
using step_type = tk::train::train_step<net, opt, tk::amp::fp32, tk::amp::no_scaling,
                                        tk::checkpoint::store_all, tk::train::no_parallel>;
#endif

int main() { return static_cast<int>(sizeof(step_type)); }
