// trainkit/core/core.hpp - umbrella of the tensor layer with the host backend.
#pragma once

#include "trainkit/backend/cpu/cpu.hpp"
#include "trainkit/core/allocator.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/concat.hpp"
#include "trainkit/core/device.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/elementwise.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/linalg.hpp"
#include "trainkit/core/philox.hpp"
#include "trainkit/core/reduce.hpp"
#include "trainkit/core/seed.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
