// trainkit/amp/amp.hpp - umbrella of mixed precision: precision policies, the autocast ops, loss
// scalers, and amp::forward<P> over nn modules.
#pragma once

#include "trainkit/amp/autocast.hpp"        // amp::autocast<P>: the precision scope
#include "trainkit/amp/autocast_list.hpp"   // autocast_op, lower_precision_op
#include "trainkit/amp/concepts.hpp"        // precision_policy, loss_scaler
#include "trainkit/amp/loss_scaler.hpp"     // no_scaling, static_scaling, dynamic_scaling, default_scaler_t
#include "trainkit/amp/module_forward.hpp"  // amp::forward<P>(module, x), module_forward<P>
#include "trainkit/amp/ops.hpp"             // amp::linear/matmul/bmm/conv2d<P>
#include "trainkit/amp/precision.hpp"       // fp32, mixed<C>, parse_precision, visit_precision
