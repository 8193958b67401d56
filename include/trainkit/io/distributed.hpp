// trainkit/io/distributed.hpp - snapshots under data parallelism: rank 0 writes one file that holds
// the shared state once and every rank's per-rank state (error-feedback residuals differ by rank),
// gathered through the job's communicator.
//
//   io::resumable_run run({.dir = dir, .rank = comm.rank(),
//                          .any_rank = io::any_rank_of(comm),          // stop together
//                          .allgather_bytes = io::allgather_bytes_of(comm)});
//   run.track("model", *model).track("optimizer", opt)
//      .track_per_rank("compression", ddp.compression());
//
// Every rank must reach the same save() calls (resumable_run makes the periodic and the stop
// decisions collective when any_rank is given), between training steps, when no other collective
// is in flight.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "trainkit/dist/any_rank.hpp"
#include "trainkit/dist/concepts.hpp"

namespace trainkit::io {

/// allgather_bytes over comm as the std::function resumable_run takes (comm must outlive it).
template <dist::communicator Comm>
std::function<std::vector<std::vector<std::byte>>(const std::vector<std::byte>&)> allgather_bytes_of(
    Comm& comm) {
  return [c = &comm](const std::vector<std::byte>& mine) { return dist::allgather_bytes(*c, mine); };
}

/// any_rank over comm as the std::function resumable_run takes (comm must outlive it).
template <dist::communicator Comm>
std::function<bool(bool)> any_rank_of(Comm& comm) {
  return [c = &comm](bool local) { return dist::any_rank(*c, local); };
}

}  // namespace trainkit::io
