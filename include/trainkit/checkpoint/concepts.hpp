// trainkit/checkpoint/concepts.hpp - the recompute axis: a policy that splits a chain of n layers
// into segments and says which segments are recomputed in backward instead of stored.
#pragma once

#include <concepts>  // std::convertible_to
#include <cstddef>   // std::size_t
#include <string_view>
#include <vector>

namespace trainkit::checkpoint {

/// Layers [begin, end) of a chain; recompute: run under checkpoint() (only the segment's input is
/// kept, its activations are recomputed in backward), else run normally (activations stored).
struct segment {
  std::size_t begin = 0, end = 0;
  bool recompute = false;
  friend constexpr bool operator==(const segment&, const segment&) = default;
};

/// A recompute policy decides the segment boundaries of a chain of n layers.
/// A model provides:
///   r.segments(n) -> std::vector<segment>   consecutive segments covering [0, n) in order
///                                           (empty for n == 0);
///   R::name                                 a short name for logs ("store_all", "sqrt"...).
/// Models: store_all, every_n, sqrt_segments, fixed_segments (checkpoint/policies.hpp), and
/// recompute_choice, one of the first three chosen at run time (checkpoint/sequential.hpp).
template <class R>
concept recompute_policy = requires(const R& r, std::size_t n) {
  { r.segments(n) } -> std::convertible_to<std::vector<segment>>;
  { R::name } -> std::convertible_to<std::string_view>;
};

}  // namespace trainkit::checkpoint
