// trainkit/optim/optim.hpp - umbrella of the optimizers, gradient clipping and learning-rate
// schedules.
#pragma once

#include "trainkit/optim/adam.hpp"
#include "trainkit/optim/clip_grad.hpp"
#include "trainkit/optim/concepts.hpp"
#include "trainkit/optim/optimizer.hpp"
#include "trainkit/optim/schedule.hpp"
#include "trainkit/optim/schedule_cosine.hpp"
#include "trainkit/optim/schedule_cyclic.hpp"
#include "trainkit/optim/schedule_step_lr.hpp"
#include "trainkit/optim/sgd.hpp"
