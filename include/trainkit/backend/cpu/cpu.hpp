// trainkit/backend/cpu/cpu.hpp - every host kernel family (include before using cpu tensors).
#pragma once

#include "trainkit/backend/cpu/blas.hpp"         // GEMM through CBLAS
#include "trainkit/backend/cpu/elementwise.hpp"  // strided N-ary loops
#include "trainkit/backend/cpu/reduce.hpp"       // reductions
#include "trainkit/backend/cpu/dropout.hpp"      // dropout masks from the Philox stream
#include "trainkit/backend/cpu/gather.hpp"       // embedding rows, one-hot targets
#include "trainkit/backend/cpu/im2col.hpp"       // convolution unfold/fold
#include "trainkit/backend/cpu/norm.hpp"         // batch norm, layer norm
#include "trainkit/backend/cpu/softmax.hpp"      // softmax, log_softmax
#include "trainkit/backend/cpu/pool.hpp"         // max/avg pooling
#include "trainkit/backend/cpu/attention.hpp"    // fused scaled dot-product attention
#include "trainkit/backend/cpu/gelu.hpp"         // GELU in AVX2 lanes
