// trainkit/backend/cpu/cpu.hpp - every host kernel family (include before using cpu tensors).
#pragma once

#include "trainkit/backend/cpu/blas.hpp"         // GEMM through CBLAS
#include "trainkit/backend/cpu/elementwise.hpp"  // strided N-ary loops
#include "trainkit/backend/cpu/reduce.hpp"       // reductions
