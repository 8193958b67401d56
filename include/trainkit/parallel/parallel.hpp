// trainkit/parallel/parallel.hpp - data parallelism over autograd: data_parallel registers a
// post-accumulate hook on every parameter, packs gradients into buckets and reduces each full
// bucket through a dist communicator and compression policy while backward runs.
#pragma once

#include "trainkit/parallel/data_parallel.hpp"
