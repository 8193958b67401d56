// Bit-pattern helpers of the half and bfloat16 tests, independent of the code under test.
#pragma once

#include <bit>
#include <cstdint>

namespace trainkit::test {

inline float f32(std::uint32_t b) { return std::bit_cast<float>(b); }
inline std::uint32_t bits32(float f) { return std::bit_cast<std::uint32_t>(f); }

/// splitmix64: a test-only source of bit patterns.
struct splitmix {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

}  // namespace trainkit::test
