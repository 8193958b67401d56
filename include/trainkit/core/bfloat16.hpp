// trainkit/core/bfloat16.hpp - bfloat16 (the top 16 bits of a float), one type for host and device.
#pragma once

#include <cstdint>      // std::uint16_t, std::uint32_t, std::uint64_t
#include <iosfwd>       // std::basic_ostream: operator<< stays a template, so <ostream> is the user's
#include <limits>       // std::numeric_limits<bfloat16>
#include <type_traits>  // std::is_integral_v

#include "trainkit/config.hpp"     // TRAINKIT_HD
#include "trainkit/core/half.hpp"  // detail::bit_cast, detail::round_to_narrow (shared rounding)

namespace trainkit {

/// bfloat16: 1 sign bit, 8 exponent bits, 7 mantissa bits - float's range with 8 bits of
/// precision. Same type on host and device; conversions are bit-exact and round to nearest
/// even, arithmetic happens in float and rounds back (correctly rounded for + - * /, since
/// float's 24 bits exceed 2*8+2). Construction from a wider type is explicit (it rounds);
/// conversion to float is implicit (it is exact).
struct bfloat16 {
  bfloat16() = default;  // trivial, so bfloat16 can live in __shared__ arrays and raw buffers

  TRAINKIT_HD explicit constexpr bfloat16(float f) noexcept : bits_(round_from_float(f)) {}
  TRAINKIT_HD explicit constexpr bfloat16(double d) noexcept
      : bits_(detail::round_to_narrow<11, 52, 8, 7>(detail::bit_cast<std::uint64_t>(d))) {}
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  TRAINKIT_HD explicit constexpr bfloat16(I i) noexcept : bfloat16(detail::integer_to_double_for_rounding(i)) {}

  TRAINKIT_HD static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits_ = b;
    return h;
  }
  TRAINKIT_HD constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// Exact: the bits are the top half of the float. A NaN keeps its sign and payload.
  TRAINKIT_HD constexpr operator float() const noexcept {
    return detail::bit_cast<float>(static_cast<std::uint32_t>(bits_) << 16);
  }

  TRAINKIT_HD constexpr bfloat16& operator+=(bfloat16 o) noexcept { return *this = bfloat16(float(*this) + float(o)); }
  TRAINKIT_HD constexpr bfloat16& operator-=(bfloat16 o) noexcept { return *this = bfloat16(float(*this) - float(o)); }
  TRAINKIT_HD constexpr bfloat16& operator*=(bfloat16 o) noexcept { return *this = bfloat16(float(*this) * float(o)); }
  TRAINKIT_HD constexpr bfloat16& operator/=(bfloat16 o) noexcept { return *this = bfloat16(float(*this) / float(o)); }

  TRAINKIT_HD friend constexpr bfloat16 operator+(bfloat16 a, bfloat16 b) noexcept { return a += b; }
  TRAINKIT_HD friend constexpr bfloat16 operator-(bfloat16 a, bfloat16 b) noexcept { return a -= b; }
  TRAINKIT_HD friend constexpr bfloat16 operator*(bfloat16 a, bfloat16 b) noexcept { return a *= b; }
  TRAINKIT_HD friend constexpr bfloat16 operator/(bfloat16 a, bfloat16 b) noexcept { return a /= b; }
  TRAINKIT_HD friend constexpr bfloat16 operator+(bfloat16 a) noexcept { return a; }
  TRAINKIT_HD friend constexpr bfloat16 operator-(bfloat16 a) noexcept {
    return from_bits(static_cast<std::uint16_t>(a.bits_ ^ 0x8000u));
  }

  // As floats, so that -0 == +0 and NaN compares unequal to everything.
  TRAINKIT_HD friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return float(a) == float(b); }
  TRAINKIT_HD friend constexpr bool operator!=(bfloat16 a, bfloat16 b) noexcept { return float(a) != float(b); }
  TRAINKIT_HD friend constexpr bool operator<(bfloat16 a, bfloat16 b) noexcept { return float(a) < float(b); }
  TRAINKIT_HD friend constexpr bool operator<=(bfloat16 a, bfloat16 b) noexcept { return float(a) <= float(b); }
  TRAINKIT_HD friend constexpr bool operator>(bfloat16 a, bfloat16 b) noexcept { return float(a) > float(b); }
  TRAINKIT_HD friend constexpr bool operator>=(bfloat16 a, bfloat16 b) noexcept { return float(a) >= float(b); }

 private:
  // The usual add-and-truncate: adding 0x7fff plus the lowest kept bit rounds to nearest even,
  // and a carry out of the largest finite value lands exactly on infinity's bits.
  TRAINKIT_HD static constexpr std::uint16_t round_from_float(float f) noexcept {
    const std::uint32_t u = detail::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }


  std::uint16_t bits_;
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

// Classification on the bits. Inside namespace trainkit these hide the global ::isnan for
// unqualified calls; call std::isnan on float/double.
TRAINKIT_HD constexpr bool isnan(bfloat16 h) noexcept { return (h.bits() & 0x7fffu) > 0x7f80u; }
TRAINKIT_HD constexpr bool isinf(bfloat16 h) noexcept { return (h.bits() & 0x7fffu) == 0x7f80u; }
TRAINKIT_HD constexpr bool isfinite(bfloat16 h) noexcept { return (h.bits() & 0x7f80u) != 0x7f80u; }
TRAINKIT_HD constexpr bool signbit(bfloat16 h) noexcept { return (h.bits() & 0x8000u) != 0; }

template <class CharT, class Traits>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, bfloat16 h) {
  return os << static_cast<float>(h);
}

}  // namespace trainkit

namespace std {

/// The limits of bfloat16. is_iec559 is false, as PyTorch and JAX say: bfloat16 follows IEEE
/// semantics but is not one of the formats IEEE 754 defines.
template <>
struct numeric_limits<trainkit::bfloat16> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = false;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  TRAINKIT_HD static constexpr trainkit::bfloat16 min() noexcept { return trainkit::bfloat16::from_bits(0x0080); }
  TRAINKIT_HD static constexpr trainkit::bfloat16 lowest() noexcept { return trainkit::bfloat16::from_bits(0xff7f); }
  TRAINKIT_HD static constexpr trainkit::bfloat16 max() noexcept { return trainkit::bfloat16::from_bits(0x7f7f); }
  TRAINKIT_HD static constexpr trainkit::bfloat16 epsilon() noexcept { return trainkit::bfloat16::from_bits(0x3c00); }
  TRAINKIT_HD static constexpr trainkit::bfloat16 round_error() noexcept { return trainkit::bfloat16::from_bits(0x3f00); }
  TRAINKIT_HD static constexpr trainkit::bfloat16 infinity() noexcept { return trainkit::bfloat16::from_bits(0x7f80); }
  TRAINKIT_HD static constexpr trainkit::bfloat16 quiet_NaN() noexcept { return trainkit::bfloat16::from_bits(0x7fc0); }
  TRAINKIT_HD static constexpr trainkit::bfloat16 signaling_NaN() noexcept { return trainkit::bfloat16::from_bits(0x7fa0); }
  TRAINKIT_HD static constexpr trainkit::bfloat16 denorm_min() noexcept { return trainkit::bfloat16::from_bits(0x0001); }
};

}  // namespace std
