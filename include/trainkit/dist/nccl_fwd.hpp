// trainkit/dist/nccl_fwd.hpp - the name and options of the NCCL communicator, for host code that
// passes one around without compiling CUDA. The class itself: <trainkit/dist/nccl.cuh>.
#pragma once

#include <chrono>

namespace trainkit::dist {

/// Options of an nccl communicator.
struct nccl_options {
  /// How long wait() (and communicator set-up) waits before it aborts the NCCL communicator
  /// (ncclCommAbort) and throws dist_error. TRAINKIT_DIST_TIMEOUT_MS overrides it, as for mpi.
  /// PyTorch's NCCL watchdog defaults to 30 minutes; a training step takes seconds, so one minute
  /// catches a dead peer long before a job's budget is gone.
  std::chrono::milliseconds timeout{30000};
};

/// A communicator over NCCL on one CUDA device (dist/nccl.cuh).
class nccl;

}  // namespace trainkit::dist
