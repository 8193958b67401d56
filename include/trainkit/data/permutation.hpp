// trainkit/data/permutation.hpp - the seeded per-epoch shuffle every sampler uses.
//
// THE SHUFFLE RULE (snapshots rely on it: an order is recomputed from (n, seed, epoch), never stored).
// The random words of epoch e under seed s are a Philox4x32-10 stream (core/philox.hpp) with the
// epoch in the high half of the counter:
//
//   block(b) = philox4x32_10(counter = {lo32(b), hi32(b), lo32(e), hi32(e)},
//                            key     = {lo32(s), hi32(s)})                    -> words v0..v3
//   word(t)  = 64-bit value (v[2k+1] << 32) | v[2k] of block(t / 2), k = t % 2   (t = 0, 1, 2, ...)
//
// The order is a Fisher-Yates shuffle of 0..n-1 that takes the words in sequence:
//
//   p = [0, 1, ..., n-1]
//   for i = n-1 down to 1:
//     bound = i + 1; r = 2^64 mod bound
//     take words until one w satisfies w <= 2^64 - 1 - r    (rejection: keeps j exactly uniform)
//     j = w mod bound; swap(p[i], p[j])
//
// So the order depends only on (n, seed, epoch): the same on every machine and thread count.
#pragma once

#include <cstdint>  // std::uint32_t, std::uint64_t
#include <limits>   // std::numeric_limits
#include <numeric>  // std::iota
#include <utility>  // std::swap
#include <vector>

#include "trainkit/core/error.hpp"   // value_error
#include "trainkit/core/philox.hpp"  // philox4x32_10
#include "trainkit/core/shape.hpp"   // index_t

namespace trainkit::data {

/// The stream of 64-bit words of (seed, epoch) in the shuffle rule above; word(t) in order.
class epoch_word_stream {
 public:
  constexpr epoch_word_stream(std::uint64_t seed, std::uint64_t epoch) noexcept
      : seed_(seed), epoch_(epoch) {}

  /// Word t of the stream (a pure function of seed, epoch and t).
  constexpr std::uint64_t word(std::uint64_t t) const noexcept {
    const std::uint64_t b = t / 2;
    const philox_result r =
        philox4x32_10({static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32),
                       static_cast<std::uint32_t>(epoch_), static_cast<std::uint32_t>(epoch_ >> 32)},
                      {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)});
    const auto k = static_cast<unsigned>(t % 2);
    return (static_cast<std::uint64_t>(r.v[2 * k + 1]) << 32) | r.v[2 * k];
  }

  /// The next word, in sequence.
  constexpr std::uint64_t next() noexcept { return word(t_++); }

  /// A uniform integer in [0, bound) by rejection (bound >= 1).
  constexpr std::uint64_t below(std::uint64_t bound) noexcept {
    constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t r = (max % bound + 1) % bound;  // 2^64 mod bound
    for (;;) {
      const std::uint64_t w = next();
      if (w <= max - r) return w % bound;
    }
  }

 private:
  std::uint64_t seed_;
  std::uint64_t epoch_;
  std::uint64_t t_ = 0;
};

/// The order of n samples in epoch `epoch` under `seed`: a permutation of 0..n-1 by the shuffle
/// rule at the top of this header.
inline std::vector<index_t> epoch_permutation(index_t n, std::uint64_t seed, std::uint64_t epoch) {
  TRAINKIT_CHECK(n >= 0, value_error, "epoch_permutation", "n must be >= 0, got " << n);
  std::vector<index_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), index_t(0));
  epoch_word_stream words(seed, epoch);
  for (std::size_t i = p.size(); i-- > 1;) {
    const auto j = static_cast<std::size_t>(words.below(static_cast<std::uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

}  // namespace trainkit::data
