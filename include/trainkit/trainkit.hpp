// trainkit/trainkit.hpp - everything that builds with a host compiler. CUDA users also include
// <trainkit/cuda.cuh> from a .cu file.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/ops/ops.hpp"
#include "trainkit/autograd/autograd.hpp"
#include "trainkit/data/data.hpp"
#include "trainkit/dist/dist.hpp"
#include "trainkit/compression/compression.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/optim/optim.hpp"
#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/parallel/parallel.hpp"
#include "trainkit/io/io.hpp"
#include "trainkit/monitor/monitor.hpp"
#include "trainkit/train/train.hpp"

namespace trainkit {
using autograd::no_grad;
using autograd::var;
}  // namespace trainkit

// Explicit instantiation declarations of the float/CPU ops (definitions in trainkit::precompiled).
#if defined(TRAINKIT_PRECOMPILED) || defined(TRAINKIT_PRECOMPILED_DEFINITIONS)
#include "trainkit/precompiled.hpp"
#endif
