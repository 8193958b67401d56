// expect: recompute policy other than store_all needs an nn::sequential model or a module that names its segments
// Recomputation needs layers to segment: a plain module with sqrt_segments is refused.
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/optim/optim.hpp"
#include "trainkit/train/train_step.hpp"

namespace tk = trainkit;
using net = tk::nn::sequential<float>;
using opt = tk::optim::sgd<float>;
using plain = tk::nn::linear<float>;

#ifdef TRAINKIT_SHOULD_FAIL
using step_type =
    tk::train::train_step<plain, opt, tk::amp::fp32, tk::amp::no_scaling, tk::checkpoint::sqrt_segments>;
#else
using step_type =
    tk::train::train_step<plain, opt, tk::amp::fp32, tk::amp::no_scaling, tk::checkpoint::store_all>;
#endif

int main() { return static_cast<int>(sizeof(step_type)); }
