// trainkit/ops/ops.hpp - umbrella of the tensor operations (elementwise with broadcasting,
// reductions, matmul, concat) with the host backend, the default device. The CUDA models of the
// kernel families come in through <trainkit/cuda.cuh>.
#pragma once

#include "trainkit/backend/cpu/cpu.hpp"
#include "trainkit/core/core.hpp"
#include "trainkit/ops/concat.hpp"
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/ops/linalg.hpp"
#include "trainkit/ops/reduce.hpp"
