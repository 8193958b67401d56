// trainkit/autograd/autograd.hpp - umbrella of reverse-mode autograd.
#pragma once

#include "trainkit/autograd/backward.hpp"
#include "trainkit/autograd/function.hpp"
#include "trainkit/autograd/grad_mode.hpp"
#include "trainkit/autograd/ops/arithmetic.hpp"
#include "trainkit/autograd/ops/linalg.hpp"
#include "trainkit/autograd/ops/reduce.hpp"
#include "trainkit/autograd/ops/shape.hpp"
#include "trainkit/autograd/ops/unary.hpp"
#include "trainkit/autograd/var.hpp"
#include "trainkit/autograd/nn_ops.hpp"
