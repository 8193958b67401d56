// trainkit/core/core.hpp - umbrella of the data types: tensor<T, Device>, shape, element types,
// storage and allocators, random generators, errors and the per-element functors. Knows no
// kernels: the operations on tensors are in <trainkit/ops/ops.hpp>.
#pragma once

#include "trainkit/core/allocator.hpp"
#include "trainkit/core/assign.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/device.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/functors.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/philox.hpp"
#include "trainkit/core/reducers.hpp"
#include "trainkit/core/seed.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/storage.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/core/threads.hpp"
#include "trainkit/core/wait_governor.hpp"
