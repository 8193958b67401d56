// trainkit/dist/check_consistent.hpp - prove that every rank holds the same thing before relying on it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::dist {

/// FNV-1a over raw bytes, chained through `seed`: a cheap, portable 64-bit fingerprint (of parameter
/// shapes and names, say) that is the same on every host.
constexpr std::uint64_t hash_bytes(const void* data, std::size_t bytes,
                                   std::uint64_t seed = 0xcbf29ce484222325ull) noexcept {
  std::uint64_t h = seed;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/// Mixes `value` into `seed` (FNV-1a over its 8 bytes, fixed little-endian order).
constexpr std::uint64_t hash_combine(std::uint64_t seed, std::uint64_t value) noexcept {
  for (int i = 0; i < 8; ++i) seed = (seed ^ ((value >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
  return seed;
}

namespace detail {
inline std::string hex64(std::uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

// Allgathers `values` (the same count on every rank) as int64 (unsigned is not a dist_element).
template <communicator C>
std::vector<std::uint64_t> allgather_u64(C& comm, const std::vector<std::uint64_t>& values) {
  const std::size_t k = values.size();
  std::vector<std::int64_t> in(k), out(k * static_cast<std::size_t>(comm.size()));
  for (std::size_t i = 0; i < k; ++i) in[i] = std::bit_cast<std::int64_t>(values[i]);
  comm.allgather(in.data(), k, out.data()).wait();
  std::vector<std::uint64_t> all(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) all[i] = std::bit_cast<std::uint64_t>(out[i]);
  return all;
}
}  // namespace detail

/// Collective: every rank passes `values` (e.g. one hash per parameter); throws dist_error on every
/// rank, with the same message, when any rank's list differs from rank 0's: the message names `what`,
/// the ranks that differ, the first differing index and the values. The lists' lengths are compared
/// first, so ranks with different lengths are reported, not left to hang.
template <communicator C>
void check_consistent(C& comm, const std::vector<std::uint64_t>& values, std::string_view what) {
  const int p = comm.size();
  const auto lengths = detail::allgather_u64(comm, {static_cast<std::uint64_t>(values.size())});
  std::ostringstream os;
  bool differ = false;
  for (int r = 1; r < p; ++r)
    if (lengths[static_cast<std::size_t>(r)] != lengths[0]) {
      if (!differ)
        os << "trainkit::dist::check_consistent: " << what << " differs across ranks: rank 0 has "
           << lengths[0] << " values;";
      os << " rank " << r << " has " << lengths[static_cast<std::size_t>(r)] << " values;";
      differ = true;
    }
  if (differ) throw dist_error(os.str());
  const std::size_t k = values.size();
  if (k == 0) return;
  const auto all = detail::allgather_u64(comm, values);
  for (int r = 1; r < p; ++r) {
    for (std::size_t i = 0; i < k; ++i) {
      const auto mine = all[static_cast<std::size_t>(r) * k + i];
      if (mine == all[i]) continue;
      if (!differ)
        os << "trainkit::dist::check_consistent: " << what << " differs across ranks (compared with rank 0):";
      os << " rank " << r << " differs first at index " << i << " (" << detail::hex64(mine) << " vs rank 0's "
         << detail::hex64(all[i]) << ");";
      differ = true;
      break;
    }
  }
  if (differ) throw dist_error(os.str());
}

/// Collective: throws dist_error on every rank when `hash` is not the same on all ranks, naming `what`
/// and the ranks whose hash differs from rank 0's.
template <communicator C>
void check_consistent(C& comm, std::uint64_t hash, std::string_view what) {
  const int p = comm.size();
  const auto all = detail::allgather_u64(comm, {hash});
  std::ostringstream os;
  bool differ = false;
  for (int r = 1; r < p; ++r) {
    if (all[static_cast<std::size_t>(r)] == all[0]) continue;
    if (!differ)
      os << "trainkit::dist::check_consistent: " << what << " differs across ranks: rank 0 has "
         << detail::hex64(all[0]) << "; differing:";
    os << " rank " << r << " (" << detail::hex64(all[static_cast<std::size_t>(r)]) << ")";
    differ = true;
  }
  if (differ) throw dist_error(os.str());
}

}  // namespace trainkit::dist
