// trainkit/core/seed.hpp - one call that seeds every random stream of a run, and the rule that
// derives the seeds of the streams that take theirs explicitly.
//
// REPRODUCIBILITY. On the CPU a run is bit-identical to another one with the same seed, the same
// thread count (OMP_NUM_THREADS; reductions split their work by thread) and the same build:
//   - the default generator (initialisers, nn::dropout unless given another) is reseeded here;
//   - batch iterators, samplers, augmentation generators and data loaders take their seed as a
//     constructor argument and never read a global: pass derive_seed(seed, "<purpose>") (or the
//     seed itself) so that one --seed flag fixes them all;
//   - the shuffle of an epoch is a pure function of (seed, epoch) (data/permutation.hpp), so a
//     resumed run reproduces it without storing it.
// On CUDA, bit-identical runs also need the deterministic mode of the backend (no atomics in
// reductions); it comes with the CUDA backend.
#pragma once

#include <cstdint>
#include <string_view>

#include "trainkit/core/generator.hpp"

namespace trainkit {

/// SplitMix64's finaliser: a bijection of 64-bit words that spreads every input bit.
constexpr std::uint64_t mix_seed(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The seed of the stream named `purpose` ("data", "augment", "dropout.3") of a run seeded with
/// `seed`: mix_seed(seed ^ FNV-1a-64(purpose)). Distinct purposes give unrelated streams; the same
/// (seed, purpose) always gives the same seed, on every machine.
constexpr std::uint64_t derive_seed(std::uint64_t seed, std::string_view purpose) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : purpose) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return mix_seed(seed ^ h);
}

/// Seeds every global stream of the process: the default generator gets `seed` at offset 0 (as
/// manual_seed). Streams that take explicit seeds are listed at the top of this file.
inline void set_seed(std::uint64_t seed) { manual_seed(seed); }

}  // namespace trainkit
