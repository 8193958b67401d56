// trainkit/checkpoint/checkpoint.hpp - umbrella of gradient checkpointing (activation
// recomputation): checkpoint(fn, inputs...), the recompute policies, apply_recompute and
// checkpoint_sequential over nn::sequential.
#pragma once

#include "trainkit/checkpoint/concepts.hpp"    // recompute_policy, segment
#include "trainkit/checkpoint/function.hpp"    // checkpoint(fn, inputs...), preserve_rng
#include "trainkit/checkpoint/policies.hpp"    // store_all, every_n, sqrt_segments, fixed_segments
#include "trainkit/checkpoint/sequential.hpp"  // apply_recompute, checkpoint_sequential, parse_recompute
