// trainkit/dist/any_rank.hpp - the small agreements a job makes over its communicator: "is this
// true on any rank?" (a found inf, a stop request) and "give me every rank's bytes" (per-rank
// state for a snapshot). One home for both, used by parallel::data_parallel and io::resumable_run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/reduce_op.hpp"

namespace trainkit::dist {

/// Collective: true on every rank when `local` is true on any rank (the loss scaler's found_inf
/// across ranks, a stop request). Call it when no other collective is in flight on comm.
template <communicator Comm>
bool any_rank(Comm& comm, bool local) {
  std::int32_t v = local ? 1 : 0;
  comm.allreduce(&v, 1, reduce_op::max).wait();
  return v != 0;
}

/// Collective: every rank gives its bytes (any length, 0 included) and gets every rank's, in rank
/// order. Two allgathers: the lengths, then the bytes padded to the longest.
template <communicator Comm>
std::vector<std::vector<std::byte>> allgather_bytes(Comm& comm, const std::vector<std::byte>& mine) {
  const auto world = static_cast<std::size_t>(comm.size());
  std::int64_t n = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> sizes(world);
  comm.allgather(&n, 1, sizes.data()).wait();
  std::int64_t longest = 0;
  for (auto s : sizes) longest = s > longest ? s : longest;
  const auto stride = static_cast<std::size_t>(longest);
  std::vector<std::uint8_t> padded(stride, 0), all(world * stride);
  if (!mine.empty()) std::memcpy(padded.data(), mine.data(), mine.size());
  if (longest > 0) comm.allgather(padded.data(), stride, all.data()).wait();
  std::vector<std::vector<std::byte>> out(world);
  for (std::size_t r = 0; r < world; ++r) {
    out[r].resize(static_cast<std::size_t>(sizes[r]));
    if (sizes[r] > 0) std::memcpy(out[r].data(), all.data() + r * stride, out[r].size());
  }
  return out;
}

}  // namespace trainkit::dist
