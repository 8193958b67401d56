// trainkit/checkpoint/policies.hpp - the recompute policies: store_all, every_n{k}, sqrt_segments,
// fixed_segments{s}. Each only decides segment boundaries; apply_recompute (sequential.hpp) runs them.
//
// In every policy the last segment is stored, not recomputed (as torch.utils.checkpoint.
// checkpoint_sequential does): backward needs its activations first, so recomputing it would
// cost a forward and save nothing at the peak.
#pragma once

#include <cstddef>  // std::size_t
#include <string_view>
#include <vector>

#include "trainkit/checkpoint/concepts.hpp"
#include "trainkit/core/error.hpp"

namespace trainkit::checkpoint {

namespace detail {
/// count segments of n layers, as equal as possible (the longer ones first), all but the last
/// recomputed.
inline std::vector<segment> balanced_segments(std::size_t n, std::size_t count) {
  std::vector<segment> r;
  if (n == 0) return r;
  if (count > n) count = n;
  if (count == 0) count = 1;
  const std::size_t base = n / count, extra = n % count;
  std::size_t b = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t len = base + (i < extra ? 1 : 0);
    r.push_back({b, b + len, i + 1 < count});
    b += len;
  }
  return r;
}

/// The smallest s with s * s >= n.
constexpr std::size_t ceil_sqrt(std::size_t n) noexcept {
  std::size_t s = 0;
  while (s * s < n) ++s;
  return s;
}
}  // namespace detail

/// No recomputation: one stored segment (plain training).
struct store_all {
  static constexpr std::string_view name = "store_all";
  std::vector<segment> segments(std::size_t n) const {
    if (n == 0) return {};
    return {segment{0, n, false}};
  }
};

/// Segments of k layers each (the last one may be shorter); all but the last recomputed. Memory
/// holds n / k segment inputs plus one segment's activations.
struct every_n {
  static constexpr std::string_view name = "every_n";
  std::size_t k = 1;
  std::vector<segment> segments(std::size_t n) const {
    TRAINKIT_CHECK(k >= 1, value_error, "every_n", "the segment length k must be >= 1, got " << k);
    std::vector<segment> r;
    for (std::size_t b = 0; b < n; b += k) r.push_back({b, b + k < n ? b + k : n, b + k < n});
    return r;
  }
};

/// Chen et al. (2016): ceil(sqrt(n)) balanced segments, so memory holds O(sqrt n) segment inputs
/// plus one segment of O(sqrt n) layers, for about one extra forward pass.
struct sqrt_segments {
  static constexpr std::string_view name = "sqrt";
  std::vector<segment> segments(std::size_t n) const {
    return detail::balanced_segments(n, detail::ceil_sqrt(n));
  }
};

/// A given number of balanced segments (what checkpoint_sequential(seq, segments, x) uses);
/// more segments than layers means one layer each.
struct fixed_segments {
  static constexpr std::string_view name = "fixed_segments";
  std::size_t count = 1;
  std::vector<segment> segments(std::size_t n) const {
    TRAINKIT_CHECK(count >= 1, value_error, "fixed_segments",
                   "the number of segments must be >= 1, got " << count);
    return detail::balanced_segments(n, count);
  }
};

static_assert(recompute_policy<store_all>);
static_assert(recompute_policy<every_n>);
static_assert(recompute_policy<sqrt_segments>);
static_assert(recompute_policy<fixed_segments>);

}  // namespace trainkit::checkpoint
