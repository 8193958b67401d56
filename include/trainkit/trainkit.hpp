// trainkit/trainkit.hpp - everything that builds with a host compiler. CUDA users also include
// <trainkit/cuda.hpp> from a .cu file.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/core/core.hpp"
#include "trainkit/autograd/autograd.hpp"

namespace trainkit {
using autograd::no_grad;
using autograd::var;
}  // namespace trainkit
#include "trainkit/data/data.hpp"
