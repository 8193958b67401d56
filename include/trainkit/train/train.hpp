// trainkit/train/train.hpp - umbrella of the composed training step: train_step and its policy
// concepts, the batch-size finder and evaluation (accuracy).
#pragma once

#include "trainkit/train/batch_size_finder.hpp"  // find_max_batch_size
#include "trainkit/train/concepts.hpp"           // parallel_policy, no_parallel, step_model, step_optimizer
#include "trainkit/train/evaluate.hpp"           // accuracy, count_correct, plain_forward
#include "trainkit/train/train_step.hpp"         // train_step, make_train_step, step_result
