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
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/reduce_op.hpp"

namespace trainkit::io {

/// A collective on comm: every rank gives its bytes and gets every rank's, in rank order.
template <dist::communicator Comm>
std::function<std::vector<std::vector<std::byte>>(const std::vector<std::byte>&)> allgather_bytes_of(
    Comm& comm) {
  return [c = &comm](const std::vector<std::byte>& mine) {
    const auto world = static_cast<std::size_t>(c->size());
    std::int64_t n = static_cast<std::int64_t>(mine.size());
    std::vector<std::int64_t> sizes(world);
    c->allgather(&n, 1, sizes.data()).wait();
    std::int64_t longest = 0;
    for (auto s : sizes) longest = s > longest ? s : longest;
    // Equal-sized chunks (what allgather moves): each rank's bytes padded to the longest.
    std::vector<std::uint8_t> padded(static_cast<std::size_t>(longest), 0),
        all(world * static_cast<std::size_t>(longest));
    if (!mine.empty()) std::memcpy(padded.data(), mine.data(), mine.size());
    if (longest > 0) c->allgather(padded.data(), static_cast<std::size_t>(longest), all.data()).wait();
    std::vector<std::vector<std::byte>> out(world);
    for (std::size_t r = 0; r < world; ++r) {
      out[r].resize(static_cast<std::size_t>(sizes[r]));
      if (sizes[r] > 0)
        std::memcpy(out[r].data(), all.data() + r * static_cast<std::size_t>(longest), out[r].size());
    }
    return out;
  };
}

/// A collective on comm: the OR of a flag over the ranks.
template <dist::communicator Comm>
std::function<bool(bool)> any_rank_of(Comm& comm) {
  return [c = &comm](bool local) {
    std::int32_t v = local ? 1 : 0;
    c->allreduce(&v, 1, dist::reduce_op::max).wait();
    return v != 0;
  };
}

}  // namespace trainkit::io
