// trainkit/dist/work.hpp - the handle an asynchronous collective returns, and the error it throws.
#pragma once

#include <memory>  // std::shared_ptr: a handle shares the completion state with its communicator
#include <string>
#include <utility>

#include "trainkit/core/error.hpp"

namespace trainkit::dist {

/// A collective that failed: a peer died, stalled past the communicator's timeout, called a different
/// collective, or the transport (MPI, NCCL, CUDA) returned an error. The message names the collective,
/// the rank, the world size, the element count and the timeout.
class dist_error : public runtime_failure {
 public:
  using runtime_failure::runtime_failure;
};

/// What a communicator model implements behind a `work` handle.
class work_state {
 public:
  work_state() = default;
  work_state(const work_state&) = delete;
  work_state& operator=(const work_state&) = delete;
  virtual ~work_state() = default;

  /// Non-blocking: true once wait() would return or throw without blocking. May make progress
  /// (MPI_Test). Never throws for a failed collective; wait() reports that.
  virtual bool done() = 0;

  /// Blocks until the collective is complete; throws dist_error when it failed or the communicator's
  /// timeout expired. Called again after it returned (threw), it returns (throws the same) at once.
  virtual void wait() = 0;
};

/// Handle of an asynchronous collective. The buffers given to the collective belong to it until wait()
/// has returned or thrown. Copies share one completion state; a handle is used by one thread at a time.
/// A default-constructed handle is already complete (what a collective on zero elements returns).
class work {
 public:
  work() = default;
  explicit work(std::shared_ptr<work_state> state) : state_(std::move(state)) {}

  /// Blocks until complete; throws dist_error on failure or timeout (see work_state::wait).
  void wait() {
    if (state_) state_->wait();
  }

  /// True once wait() would not block (complete, or failed: wait() then throws).
  [[nodiscard]] bool done() { return !state_ || state_->done(); }

 private:
  std::shared_ptr<work_state> state_;
};

}  // namespace trainkit::dist
