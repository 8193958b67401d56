// tests/core/test_bfloat16.cpp - trainkit::bfloat16 against references computed independently:
// ldexp decoding, exact midpoints in double, and nearest-neighbour distances in double.
#include "trainkit/core/bfloat16.hpp"
#include "support/bits.hpp"

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

using trainkit::bfloat16;

namespace {

using trainkit::test::bits32;
using trainkit::test::f32;
using trainkit::test::splitmix;
bool bf16_bits_nan(std::uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }

/// A bfloat16 pattern decoded with ldexp (2^128 for the infinity pattern, for distances).
double decode(std::uint16_t b) {
  const int e = (b >> 7) & 0xff, m = b & 0x7f;
  const double mag = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return (b & 0x8000) ? -mag : mag;
}

/// Every non-negative finite bfloat16 by bit pattern (bits 0..0x7f7f increase with the value).
const std::vector<double>& finite_values() {
  static const std::vector<double> values = [] {
    std::vector<double> v(0x7f80);
    for (std::uint32_t b = 0; b < 0x7f80; ++b) v[b] = decode(static_cast<std::uint16_t>(b));
    return v;
  }();
  return values;
}

/// Round-to-nearest-even to bfloat16 by comparing with exact midpoints (9 bits: exact in double).
std::uint16_t reference_round_bf16(double x) {
  const auto& v = finite_values();
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const double overflow = std::ldexp(256.0 - 0.5, 127 - 7);  // midpoint of max and 2^128
  if (a >= overflow) return sign | 0x7f80;
  const auto k = static_cast<std::uint16_t>(std::upper_bound(v.begin(), v.end(), a) - v.begin() - 1);
  if (v[k] == a || k == 0x7f7f) return sign | k;
  const double mid = (v[k] + v[k + 1]) / 2;
  if (a < mid) return sign | k;
  if (a > mid) return sign | static_cast<std::uint16_t>(k + 1);
  return sign | static_cast<std::uint16_t>((k & 1) == 0 ? k : k + 1);
}

/// A second reference for floats, from distances: of the truncation t and the next pattern t+1,
/// the nearer in double (both differences are exact there), the even one on a tie.
std::uint16_t reference_round_by_distance(float f) {
  const std::uint32_t u = bits32(f);
  const auto t = static_cast<std::uint16_t>(u >> 16);
  const auto up = static_cast<std::uint16_t>(t + 1);
  const double x = std::fabs(static_cast<double>(f));
  const double dt = x - std::fabs(decode(t)), du = std::fabs(decode(up)) - x;
  if (dt < du) return t;
  if (du < dt) return up;
  return (t & 1) == 0 ? t : up;
}


}  // namespace

TEST_CASE("bfloat16 is a trivial 2-byte type usable in constant expressions", "[bfloat16]") {
  STATIC_REQUIRE(sizeof(trainkit::bfloat16) == 2);
  STATIC_REQUIRE(std::is_trivially_copyable_v<trainkit::bfloat16>);
  STATIC_REQUIRE(std::is_trivially_default_constructible_v<trainkit::bfloat16>);
  STATIC_REQUIRE(trainkit::bfloat16(1.0f).bits() == 0x3f80);
  STATIC_REQUIRE(trainkit::bfloat16(-2.0).bits() == 0xc000);
  STATIC_REQUIRE(trainkit::bfloat16(3) * trainkit::bfloat16(4) == trainkit::bfloat16(12));
  STATIC_REQUIRE(!std::is_convertible_v<float, trainkit::bfloat16>);
  STATIC_REQUIRE(std::is_convertible_v<trainkit::bfloat16, float>);
}

TEST_CASE("bfloat16 to float is exact for all 65536 bit patterns", "[bfloat16]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = trainkit::bfloat16::from_bits(bits);
    INFO("bits 0x" << std::hex << b);
    REQUIRE(bits32(f) == b << 16);  // the definition, NaN payloads included
    if ((b & 0x7fffu) < 0x7f80u) REQUIRE(static_cast<double>(f) == decode(bits));
    if ((b & 0x7fffu) == 0x7f80u) REQUIRE(std::isinf(f));
    if (bf16_bits_nan(bits)) REQUIRE(std::isnan(f));
  }
}

TEST_CASE("bfloat16 -> float -> bfloat16 round-trips every bit pattern", "[bfloat16]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const trainkit::bfloat16 h = trainkit::bfloat16::from_bits(bits);
    INFO("bits 0x" << std::hex << b);
    const std::uint16_t via_float = trainkit::bfloat16(static_cast<float>(h)).bits();
    const std::uint16_t via_double = trainkit::bfloat16(static_cast<double>(static_cast<float>(h))).bits();
    const std::uint16_t expected = bf16_bits_nan(bits) ? static_cast<std::uint16_t>(bits | 0x0040u) : bits;
    REQUIRE(via_float == expected);  // a signalling NaN comes back quiet
    REQUIRE(via_double == expected);
  }
}

TEST_CASE("float -> bfloat16 rounds to nearest even at every midpoint", "[bfloat16]") {
  for (std::uint32_t k = 0; k < 0x7f80; ++k) {
    const auto a = static_cast<std::uint16_t>(k), b = static_cast<std::uint16_t>(k + 1);
    const double mid_exact = (decode(a) + decode(b)) / 2;  // for max, the midpoint to 2^128
    const auto mid = static_cast<float>(mid_exact);
    REQUIRE(static_cast<double>(mid) == mid_exact);
    const std::uint16_t even = (a & 1) == 0 ? a : b;
    const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, std::numeric_limits<float>::infinity());
    INFO("pair 0x" << std::hex << a << " 0x" << b);
    for (const std::uint16_t sign : {std::uint16_t(0), std::uint16_t(0x8000)}) {
      const float s = sign ? -1.0f : 1.0f;
      REQUIRE(trainkit::bfloat16(s * mid).bits() == (sign | even));
      REQUIRE(trainkit::bfloat16(s * below).bits() == (sign | a));
      REQUIRE(trainkit::bfloat16(s * above).bits() == (sign | b));
      const double md = s * mid_exact;
      REQUIRE(trainkit::bfloat16(md).bits() == (sign | even));
      REQUIRE(trainkit::bfloat16(std::nextafter(md, 0.0)).bits() == (sign | a));
      REQUIRE(trainkit::bfloat16(std::nextafter(md, s * 1e300)).bits() == (sign | b));
    }
  }
}

TEST_CASE("float -> bfloat16 agrees with both references on a sweep and on random floats", "[bfloat16]") {
  std::uint64_t mismatches = 0, first = 0;
  auto check = [&](std::uint32_t u) {
    const float f = f32(u);
    const std::uint16_t mine = trainkit::bfloat16(f).bits();
    bool ok;
    if (std::isnan(f)) {
      ok = mine == ((u >> 16) | 0x0040u);
    } else if (std::isinf(f)) {
      ok = mine == (u >> 16);
    } else {
      const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
      ok = mine == reference_round_bf16(f) && mine == (sign | reference_round_by_distance(f));
    }
    if (!ok && mismatches++ == 0) first = u;
  };
  for (std::uint64_t u = 0; u < (1ull << 32); u += 1021) check(static_cast<std::uint32_t>(u));
  splitmix rng{11};
  for (int i = 0; i < (1 << 21); ++i) check(static_cast<std::uint32_t>(rng.next()));
  INFO("first mismatch: float bits 0x" << std::hex << first);
  REQUIRE(mismatches == 0);
}

TEST_CASE("double -> bfloat16 rounds once, directly from double", "[bfloat16]") {
  SECTION("just above a midpoint whose float rounding lands on the midpoint") {
    // 1 + 2^-8 is the midpoint of 1 (0x3f80, even) and 1 + 2^-7.
    const double d = 1.0 + 0x1p-8 + 0x1p-40;
    REQUIRE(static_cast<double>(static_cast<float>(d)) == 1.0 + 0x1p-8);
    REQUIRE(trainkit::bfloat16(static_cast<float>(d)).bits() == 0x3f80);  // what double rounding gives
    REQUIRE(trainkit::bfloat16(d).bits() == 0x3f81);
    REQUIRE(trainkit::bfloat16(-d).bits() == 0xbf81);
  }
  SECTION("beyond float's range") {
    REQUIRE(trainkit::bfloat16(1e300).bits() == 0x7f80);
    REQUIRE(trainkit::bfloat16(-1e300).bits() == 0xff80);
    REQUIRE(trainkit::bfloat16(1e-300).bits() == 0x0000);
    REQUIRE(trainkit::bfloat16(-1e-300).bits() == 0x8000);
    // Just below the overflow midpoint, where float itself would already round to it.
    const double below = std::ldexp(255.5, 120) - std::ldexp(1.0, 80);
    REQUIRE(trainkit::bfloat16(static_cast<float>(below)).bits() == 0x7f80);
    REQUIRE(trainkit::bfloat16(below).bits() == 0x7f7f);
    // Subnormal: just above the midpoint of 0 and the smallest bfloat16 subnormal (2^-133),
    // far below float's smallest subnormal (2^-149) resolution.
    REQUIRE(trainkit::bfloat16(0x1p-134).bits() == 0x0000);
    REQUIRE(trainkit::bfloat16(0x1p-134 + 0x1p-170).bits() == 0x0001);
  }
  SECTION("random doubles against the midpoint reference") {
    splitmix rng{5};
    std::uint64_t mismatches = 0;
    double first = 0;
    for (int i = 0; i < (1 << 20); ++i) {
      std::uint64_t r = rng.next();
      const std::uint64_t exp = 1023 - 136 + (r >> 52) % 266;  // 2^-136 .. 2^129
      r = (r & 0x800fffffffffffffull) | (exp << 52);
      const double d = std::bit_cast<double>(r);
      if (trainkit::bfloat16(d).bits() != reference_round_bf16(d) && mismatches++ == 0) first = d;
    }
    INFO("first mismatch: " << first);
    REQUIRE(mismatches == 0);
  }
}

TEST_CASE("bfloat16 NaN, infinity, zeros, subnormals", "[bfloat16]") {
  REQUIRE(trainkit::bfloat16(f32(0x7f800001u)).bits() == 0x7fc0);  // a payload only in low bits: still NaN
  REQUIRE(trainkit::bfloat16(f32(0xff800001u)).bits() == 0xffc0);
  REQUIRE(trainkit::bfloat16(f32(0x7fffffffu)).bits() == 0x7fff);  // no carry out of a NaN into the sign
  REQUIRE(trainkit::bfloat16(f32(0x7fa00000u)).bits() == 0x7fe0);  // signalling NaN quieted, payload kept
  REQUIRE(trainkit::bfloat16(std::numeric_limits<double>::quiet_NaN()).bits() == 0x7fc0);
  REQUIRE(trainkit::bfloat16(std::bit_cast<double>(0x7ff0000000000001ull)).bits() == 0x7fc0);
  REQUIRE(trainkit::bfloat16(std::numeric_limits<float>::infinity()).bits() == 0x7f80);
  REQUIRE(trainkit::bfloat16(-std::numeric_limits<float>::infinity()).bits() == 0xff80);
  REQUIRE(trainkit::bfloat16(std::numeric_limits<float>::max()).bits() == 0x7f80);  // above the midpoint
  REQUIRE(trainkit::bfloat16(f32(0x7f7f7fffu)).bits() == 0x7f7f);
  REQUIRE(trainkit::bfloat16(f32(0x7f7f8000u)).bits() == 0x7f80);  // tie with an odd max: up to infinity
  REQUIRE(trainkit::bfloat16(-0.0f).bits() == 0x8000);
  REQUIRE(trainkit::bfloat16(-0.0).bits() == 0x8000);
  REQUIRE(trainkit::bfloat16(f32(0x00008000u)).bits() == 0x0000);  // tie with 0: even
  REQUIRE(trainkit::bfloat16(f32(0x00008001u)).bits() == 0x0001);
  REQUIRE(trainkit::bfloat16(f32(0x00018000u)).bits() == 0x0002);
  REQUIRE(trainkit::bfloat16(f32(0x007fffffu)).bits() == 0x0080);  // the largest subnormal carries up
  REQUIRE(trainkit::bfloat16::from_bits(0x8000) == trainkit::bfloat16::from_bits(0x0000));
}

TEST_CASE("bfloat16 from integers rounds once, 64-bit ones included", "[bfloat16]") {
  REQUIRE(trainkit::bfloat16(0).bits() == 0);
  REQUIRE(trainkit::bfloat16(257).bits() == trainkit::bfloat16(256.0f).bits());  // tie: even
  REQUIRE(trainkit::bfloat16(259).bits() == trainkit::bfloat16(260.0f).bits());
  REQUIRE(trainkit::bfloat16(-259).bits() == trainkit::bfloat16(-260.0f).bits());
  // 2^60 + 2^52 is a midpoint; +1 is above it, but converting to double first would land on it.
  const std::uint64_t above = (1ull << 60) + (1ull << 52) + 1;
  REQUIRE(static_cast<double>(above) == std::ldexp(1.0, 60) + std::ldexp(1.0, 52));
  REQUIRE(trainkit::bfloat16(above).bits() == 0x5d81);
  REQUIRE(trainkit::bfloat16((1ull << 60) + (1ull << 52)).bits() == 0x5d80);
  REQUIRE(trainkit::bfloat16(-static_cast<std::int64_t>(above)).bits() == 0xdd81);
  REQUIRE(float(trainkit::bfloat16(std::numeric_limits<std::uint64_t>::max())) == 0x1p64f);
  REQUIRE(float(trainkit::bfloat16(std::numeric_limits<std::int64_t>::min())) == -0x1p63f);
  REQUIRE(trainkit::bfloat16(true) == trainkit::bfloat16(1.0f));
}

TEST_CASE("bfloat16 arithmetic is correctly rounded", "[bfloat16]") {
  splitmix rng{9};
  std::uint64_t mismatches = 0;
  std::uint16_t first_a = 0, first_b = 0;
  for (int i = 0; i < (1 << 20); ++i) {
    const std::uint64_t r = rng.next();
    // Exponents within 2^-60 .. 2^60: no overflow or underflow. Products are exact in double;
    // sums and quotients are not always, but double's 53 bits exceed 2*8+2, so rounding the
    // double result to bfloat16 is still the correctly rounded answer.
    auto pick = [](std::uint64_t x) {
      const auto e = static_cast<std::uint16_t>(127 - 60 + (x >> 8) % 121);
      return static_cast<std::uint16_t>((x & 0x807f) | (e << 7));
    };
    const std::uint16_t ab = pick(r), bb = pick(r >> 24);
    const trainkit::bfloat16 a = trainkit::bfloat16::from_bits(ab), b = trainkit::bfloat16::from_bits(bb);
    const double x = static_cast<float>(a), y = static_cast<float>(b);
    const bool ok = (a + b).bits() == reference_round_bf16(x + y) && (a - b).bits() == reference_round_bf16(x - y) &&
                    (a * b).bits() == reference_round_bf16(x * y) && (a / b).bits() == reference_round_bf16(x / y) &&
                    (a < b) == (x < y) && (a == b) == (x == y) && (a <= b) == (x <= y) &&
                    (-a).bits() == (ab ^ 0x8000u);
    if (!ok && mismatches++ == 0) first_a = ab, first_b = bb;
  }
  INFO("first mismatch: 0x" << std::hex << first_a << " 0x" << first_b);
  REQUIRE(mismatches == 0);
  trainkit::bfloat16 c(1.0f);
  c += trainkit::bfloat16(0x1p-8f);  // a tie: stays at the even 1
  REQUIRE(c.bits() == 0x3f80);
  c -= trainkit::bfloat16(2.0f);
  REQUIRE(float(c) == -1.0f);
  c *= trainkit::bfloat16(3.0f);
  c /= trainkit::bfloat16(-1.5f);
  REQUIRE(float(c) == 2.0f);
}

TEST_CASE("bfloat16 classification matches float's", "[bfloat16]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const trainkit::bfloat16 h = trainkit::bfloat16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h;
    INFO("bits 0x" << std::hex << b);
    REQUIRE(trainkit::isnan(h) == std::isnan(f));
    REQUIRE(trainkit::isinf(h) == std::isinf(f));
    REQUIRE(trainkit::isfinite(h) == std::isfinite(f));
    REQUIRE(trainkit::signbit(h) == std::signbit(f));
  }
}

TEST_CASE("numeric_limits<bfloat16>", "[bfloat16]") {
  using L = std::numeric_limits<trainkit::bfloat16>;
  STATIC_REQUIRE(L::is_specialized);
  STATIC_REQUIRE(L::digits == 8);
  REQUIRE(float(L::max()) == std::ldexp(255.0f, 120));
  REQUIRE(float(L::lowest()) == -float(L::max()));
  REQUIRE(float(L::min()) == std::numeric_limits<float>::min());
  REQUIRE(float(L::denorm_min()) == 0x1p-133f);
  REQUIRE(float(L::epsilon()) == 0x1p-7f);
  REQUIRE(float(trainkit::bfloat16::from_bits(0x3f81)) - 1.0f == float(L::epsilon()));
  REQUIRE(float(L::round_error()) == 0.5f);
  REQUIRE(float(L::infinity()) == std::numeric_limits<float>::infinity());
  REQUIRE(trainkit::isnan(L::quiet_NaN()));
  REQUIRE(trainkit::isnan(L::signaling_NaN()));
  REQUIRE((L::quiet_NaN().bits() & 0x0040) != 0);
  REQUIRE((L::signaling_NaN().bits() & 0x0040) == 0);
  REQUIRE(L::max_exponent == std::numeric_limits<float>::max_exponent);
  REQUIRE(L::min_exponent == std::numeric_limits<float>::min_exponent);
}

TEST_CASE("bfloat16 prints as its float value", "[bfloat16]") {
  std::ostringstream os;
  os << trainkit::bfloat16(1.5f) << ' ' << trainkit::bfloat16(-0.0f) << ' ' << trainkit::bfloat16(3.140625f);
  REQUIRE(os.str() == "1.5 -0 3.14062");
}
