// trainkit/dist/detail/poll.hpp - how a communicator's work handle waits: poll, back off, give up
// at the timeout. One loop for every communicator (mpi, nccl), so they wait alike.
#pragma once

#include <algorithm>  // std::clamp
#include <chrono>
#include <thread>

namespace trainkit::dist::detail {

/// Calls settled() until it returns true (the operation completed or failed) and returns true;
/// returns false once `timeout` has passed without that. Between calls it yields for the first
/// 200 us (small collectives finish in microseconds), then sleeps a sixteenth of the time waited so
/// far (50 us - 1 ms): spinning would take a core from the training threads, and from the peers
/// when ranks share cores (mpirun --oversubscribe), while the added latency stays within ~6% of
/// the operation's own time.
template <class Settled>
bool poll_until(Settled&& settled, std::chrono::milliseconds timeout) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  const auto deadline = start + timeout;
  for (;;) {
    if (settled()) return true;
    const auto now = steady_clock::now();
    if (now >= deadline) return false;
    const auto waited = duration_cast<microseconds>(now - start);
    if (waited < microseconds(200))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::clamp(waited / 16, microseconds(50), microseconds(1000)));
  }
}

}  // namespace trainkit::dist::detail
