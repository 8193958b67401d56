// trainkit/dist/dist.hpp - the communicator concept and the models that need nothing but the host
// compiler. The MPI model needs <mpi.h> and MPI's libraries (CMake: trainkit::mpi), so it is included
// on its own: <trainkit/dist/mpi.hpp>; the NCCL model is CUDA code: <trainkit/dist/nccl.cuh>.
// Gradient compression (codecs, the quantized and the hierarchical allreduce) is a component of its
// own above this one: <trainkit/compression/compression.hpp>.
#pragma once

#include "trainkit/dist/bucket.hpp"
#include "trainkit/dist/check_consistent.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/local_rank.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/thread_group.hpp"
#include "trainkit/dist/work.hpp"
