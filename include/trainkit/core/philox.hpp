// trainkit/core/philox.hpp - the Philox4x32-10 counter-based generator and the maps from its
// words to uniform and normal numbers, written once for host and device.
//
// Philox (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
// the Random123 library) turns a 128-bit counter and a 64-bit key into 128 random bits with no
// state, so element i of a tensor can be drawn by whichever thread owns it, in any order, and
// the result depends only on (key, counter). That is what makes CPU and CUDA draws agree and
// what lets gradient checkpointing replay dropout.
#pragma once

#include <cmath>    // ::logf, ::sqrtf, ::sinf, ::cosf and their double versions (device-callable)
#include <cstdint>  // std::uint32_t, std::uint64_t

#include "trainkit/config.hpp"  // TRAINKIT_HD

namespace trainkit {

/// The four 32-bit words of one Philox block (a counter going in, random bits coming out).
struct philox_result {
  std::uint32_t v[4];

  TRAINKIT_HD friend constexpr bool operator==(const philox_result& a, const philox_result& b) noexcept {
    return a.v[0] == b.v[0] && a.v[1] == b.v[1] && a.v[2] == b.v[2] && a.v[3] == b.v[3];
  }
  TRAINKIT_HD friend constexpr bool operator!=(const philox_result& a, const philox_result& b) noexcept {
    return !(a == b);
  }
};

namespace detail {

// The constants of Random123's philox4x32: multipliers chosen for avalanche, Weyl increments
// (golden ratio and sqrt(3)-1, as 32-bit fractions) that bump the key between rounds.
inline constexpr std::uint32_t philox_m0 = 0xD2511F53u;
inline constexpr std::uint32_t philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u;
inline constexpr std::uint32_t philox_w1 = 0xBB67AE85u;

TRAINKIT_HD constexpr void philox_round(std::uint32_t (&c)[4], std::uint32_t k0, std::uint32_t k1) noexcept {
  // A 64-bit product compiles to mul.hi/mul.lo on device and one mul on x86-64.
  const std::uint64_t p0 = static_cast<std::uint64_t>(philox_m0) * c[0];
  const std::uint64_t p1 = static_cast<std::uint64_t>(philox_m1) * c[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
  const std::uint32_t n0 = hi1 ^ c[1] ^ k0;
  const std::uint32_t n2 = hi0 ^ c[3] ^ k1;
  c[0] = n0;
  c[1] = lo1;
  c[2] = n2;
  c[3] = lo0;
}

}  // namespace detail

/// Philox4x32 with 10 rounds, bit for bit the Random123 `philox4x32(ctr, key)` (its known-answer
/// vectors are in tests/core/test_philox.cpp).
TRAINKIT_HD constexpr philox_result philox4x32_10(const std::uint32_t (&counter)[4],
                                                  const std::uint32_t (&key)[2]) noexcept {
  std::uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
  std::uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += detail::philox_w0;
      k1 += detail::philox_w1;
    }
    detail::philox_round(c, k0, k1);
  }
  return philox_result{{c[0], c[1], c[2], c[3]}};
}

// ---- From random words to numbers ----------------------------------------------------------
// The uniform maps are exact integer-to-float steps plus multiplications by powers of two (exact,
// so an FMA contraction cannot change them): host and device give the same bits.

/// A word to a float in [0, 1): its top 24 bits times 2^-24. Every value is exact and equally
/// likely, 0 is possible, 1 is not.
TRAINKIT_HD constexpr float uniform_float(std::uint32_t x) noexcept {
  return static_cast<float>(x >> 8) * 0x1p-24f;
}

/// A word to a float in (0, 1]: curand's rule (`_curand_uniform`), x * 2^-32 + 2^-33 in float.
/// Never 0, so log() of it is finite; the largest words round to exactly 1.
TRAINKIT_HD constexpr float uniform_float_open_closed(std::uint32_t x) noexcept {
  return static_cast<float>(x) * 0x1p-32f + 0x1p-33f;
}

/// Two words (lo, hi) to a double in [0, 1): the top 53 of their 64 bits times 2^-53.
TRAINKIT_HD constexpr double uniform_double(std::uint32_t lo, std::uint32_t hi) noexcept {
  const std::uint64_t z = (static_cast<std::uint64_t>(hi) << 32) | lo;
  return static_cast<double>(z >> 11) * 0x1p-53;
}

/// Two words to a double in (0, 1]: curand's rule (`_curand_uniform_double_hq`),
/// (x ^ (y << 21)) * 2^-53 + 2^-54.
TRAINKIT_HD constexpr double uniform_double_open_closed(std::uint32_t x, std::uint32_t y) noexcept {
  const std::uint64_t z = static_cast<std::uint64_t>(x) ^ (static_cast<std::uint64_t>(y) << 21);
  return static_cast<double>(z) * 0x1p-53 + 0x1p-54;
}

/// Two normal numbers. v[0] = r cos(theta), v[1] = r sin(theta).
template <class T>
struct normal_pair {
  T v[2];
};

/// Box-Muller: u1 in (0, 1] sets the radius r = sqrt(-2 ln u1) (u1 = 0 would be infinite),
/// u2 in [0, 1] or (0, 1] the angle theta = 2 pi u2. The two results are independent N(0, 1).
/// Transcendentals differ by an ulp or two between libm and CUDA's, so normals agree across
/// devices to within a few ulps, not bit for bit (uniforms and Bernoulli draws do agree exactly).
TRAINKIT_HD inline normal_pair<float> box_muller(float u1, float u2) noexcept {
  const float r = ::sqrtf(-2.0f * ::logf(u1));
  const float theta = 6.28318530717958647692f * u2;
  return {{r * ::cosf(theta), r * ::sinf(theta)}};
}

/// Box-Muller in double; see the float version.
TRAINKIT_HD inline normal_pair<double> box_muller(double u1, double u2) noexcept {
  const double r = ::sqrt(-2.0 * ::log(u1));
  const double theta = 6.28318530717958647692 * u2;
  return {{r * ::cos(theta), r * ::sin(theta)}};
}

}  // namespace trainkit
