// trainkit/core/half.hpp - IEEE 754 binary16, one type for host and device.
#pragma once

#include <cstdint>      // std::uint16_t, std::uint32_t, std::uint64_t
#include <iosfwd>       // std::basic_ostream: operator<< stays a template, so <ostream> is the user's
#include <limits>       // std::numeric_limits<half>
#include <type_traits>  // std::is_integral_v: one constructor for every integer type

#include "trainkit/config.hpp"  // TRAINKIT_HD

namespace trainkit {

namespace detail {

/// std::bit_cast is a host function to nvcc; the builtin behind it is not.
template <class To, class From>
TRAINKIT_HD constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs types of the same size");
  return __builtin_bit_cast(To, from);
}

/// Rounds a binary floating-point number (SrcExp exponent bits, SrcMan stored mantissa bits,
/// given as its raw bits) to the nearest number of a narrower format (DstExp, DstMan) that fits
/// in 16 bits, ties to even, in integers only so that host and device agree bit for bit.
/// Rounding once from the source is what avoids double rounding (double -> float -> half).
/// Overflow gives infinity, underflow gives the nearest subnormal or a signed zero, and a NaN
/// keeps its sign and top payload bits and comes back quiet.
template <int SrcExp, int SrcMan, int DstExp, int DstMan, class U>
TRAINKIT_HD constexpr std::uint16_t round_to_narrow(U bits) noexcept {
  static_assert(SrcExp >= DstExp && SrcMan > DstMan && 1 + DstExp + DstMan == 16);
  constexpr int src_bias = (1 << (SrcExp - 1)) - 1;
  constexpr int dst_bias = (1 << (DstExp - 1)) - 1;
  constexpr int drop = SrcMan - DstMan;  // mantissa bits that a normal result loses
  constexpr U src_inf = ((U(1) << SrcExp) - 1) << SrcMan;
  constexpr std::uint32_t dst_inf = ((1u << DstExp) - 1) << DstMan;
  constexpr std::uint32_t dst_quiet = 1u << (DstMan - 1);

  const auto sign = static_cast<std::uint32_t>(bits >> (SrcExp + SrcMan)) << 15;
  const U mag = bits & ((U(1) << (SrcExp + SrcMan)) - 1);

  if (mag >= src_inf) {
    if (mag == src_inf) return static_cast<std::uint16_t>(sign | dst_inf);
    const auto payload = static_cast<std::uint32_t>(mag >> drop) & ((1u << DstMan) - 1);
    return static_cast<std::uint16_t>(sign | dst_inf | dst_quiet | payload);
  }

  const int src_exp = static_cast<int>(mag >> SrcMan);
  if (src_exp - src_bias + dst_bias >= 1) {
    // Normal in the destination's exponent range (or above it): drop bits and rebias in one
    // subtraction; a carry out of the mantissa moves into the exponent, as it should.
    U q = (mag >> drop) - (U(src_bias - dst_bias) << DstMan);
    const U rem = mag & ((U(1) << drop) - 1);
    constexpr U halfway = U(1) << (drop - 1);
    if (rem > halfway || (rem == halfway && (q & 1))) ++q;
    if (q >= dst_inf) return static_cast<std::uint16_t>(sign | dst_inf);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(q));
  }

  // Subnormal (or zero) in the destination: count in units of its smallest subnormal.
  const int eff_exp = src_exp == 0 ? 1 : src_exp;
  const U mant = (mag & ((U(1) << SrcMan) - 1)) | (src_exp == 0 ? U(0) : U(1) << SrcMan);
  const int shift = drop + 1 - (eff_exp - src_bias + dst_bias);
  if (shift > SrcMan + 1) return static_cast<std::uint16_t>(sign);  // below half the smallest
  U q = mant >> shift;
  const U rem = mant & ((U(1) << shift) - 1);
  const U halfway = U(1) << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1))) ++q;
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(q));
}

/// An integer as a double that rounds to any format of at most 51 mantissa bits exactly as the
/// integer itself would: a 64-bit integer may have more than 53 significant bits, and plain
/// conversion would then round twice, so the bits double cannot hold fold into a sticky bit.
template <class I>
TRAINKIT_HD constexpr double integer_to_double_for_rounding(I i) noexcept {
  bool negative = false;
  if constexpr (std::is_signed_v<I>) negative = i < 0;
  std::uint64_t mag = static_cast<std::uint64_t>(i);
  if (negative) mag = std::uint64_t(0) - mag;
  int drop = 0;
  while ((mag >> drop) >= (std::uint64_t(1) << 53)) ++drop;
  if (drop > 0) {
    const std::uint64_t sticky = (mag & ((std::uint64_t(1) << drop) - 1)) != 0 ? 1 : 0;
    mag = ((mag >> drop) | sticky) << drop;  // at most 53 significant bits: converts exactly
  }
  const double d = static_cast<double>(mag);
  return negative ? -d : d;
}

}  // namespace detail

/// IEEE 754 binary16: 1 sign bit, 5 exponent bits, 10 mantissa bits; the same type on host and
/// device. Conversions are bit-exact and round to nearest even; arithmetic happens in float and
/// rounds back, which is correctly rounded for + - * / because float has more than 2*11+2 bits.
/// Construction from a wider type is explicit (it rounds); conversion to float is implicit
/// (it is exact), so mixed expressions such as `h * 2.0f` are float expressions.
struct half {
  half() = default;  // trivial, so half can live in __shared__ arrays and raw buffers

  TRAINKIT_HD explicit constexpr half(float f) noexcept
      : bits_(detail::round_to_narrow<8, 23, 5, 10>(detail::bit_cast<std::uint32_t>(f))) {}
  TRAINKIT_HD explicit constexpr half(double d) noexcept
      : bits_(detail::round_to_narrow<11, 52, 5, 10>(detail::bit_cast<std::uint64_t>(d))) {}
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  TRAINKIT_HD explicit constexpr half(I i) noexcept : half(detail::integer_to_double_for_rounding(i)) {}

  TRAINKIT_HD static constexpr trainkit::half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits_ = b;
    return h;
  }
  TRAINKIT_HD constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// Exact. A NaN keeps its sign and payload (a signalling one stays signalling here; it is
  /// the rounding direction, float -> half, that quiets).
  TRAINKIT_HD constexpr operator float() const noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits_ & 0x8000u) << 16;
    const std::uint32_t exp = (bits_ >> 10) & 0x1fu;
    std::uint32_t mant = bits_ & 0x3ffu;
    if (exp == 0x1f) return detail::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return detail::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
    if (mant == 0) return detail::bit_cast<float>(sign);
    // Subnormal: every one is a normal float; shift the leading 1 up to the implicit bit.
    std::uint32_t e = 113;  // float biased exponent of 2^-14, the smallest normal half
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    return detail::bit_cast<float>(sign | (e << 23) | ((mant & 0x3ffu) << 13));
  }

  TRAINKIT_HD constexpr half& operator+=(half o) noexcept { return *this = half(float(*this) + float(o)); }
  TRAINKIT_HD constexpr half& operator-=(half o) noexcept { return *this = half(float(*this) - float(o)); }
  TRAINKIT_HD constexpr half& operator*=(half o) noexcept { return *this = half(float(*this) * float(o)); }
  TRAINKIT_HD constexpr half& operator/=(half o) noexcept { return *this = half(float(*this) / float(o)); }

  TRAINKIT_HD friend constexpr half operator+(half a, half b) noexcept { return a += b; }
  TRAINKIT_HD friend constexpr half operator-(half a, half b) noexcept { return a -= b; }
  TRAINKIT_HD friend constexpr half operator*(half a, half b) noexcept { return a *= b; }
  TRAINKIT_HD friend constexpr half operator/(half a, half b) noexcept { return a /= b; }
  TRAINKIT_HD friend constexpr half operator+(half a) noexcept { return a; }
  // Sign flip on the bits: exact for every value, NaN included, like float's negation.
  TRAINKIT_HD friend constexpr half operator-(half a) noexcept {
    return from_bits(static_cast<std::uint16_t>(a.bits_ ^ 0x8000u));
  }

  // As floats, so that -0 == +0 and NaN compares unequal to everything.
  TRAINKIT_HD friend constexpr bool operator==(half a, half b) noexcept { return float(a) == float(b); }
  TRAINKIT_HD friend constexpr bool operator!=(half a, half b) noexcept { return float(a) != float(b); }
  TRAINKIT_HD friend constexpr bool operator<(half a, half b) noexcept { return float(a) < float(b); }
  TRAINKIT_HD friend constexpr bool operator<=(half a, half b) noexcept { return float(a) <= float(b); }
  TRAINKIT_HD friend constexpr bool operator>(half a, half b) noexcept { return float(a) > float(b); }
  TRAINKIT_HD friend constexpr bool operator>=(half a, half b) noexcept { return float(a) >= float(b); }

 private:
  std::uint16_t bits_;
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);

// Classification on the bits: cheap, constexpr, and no float traps on device. Inside namespace
// trainkit these hide the global ::isnan for unqualified calls; call std::isnan on float/double.
TRAINKIT_HD constexpr bool isnan(half h) noexcept { return (h.bits() & 0x7fffu) > 0x7c00u; }
TRAINKIT_HD constexpr bool isinf(half h) noexcept { return (h.bits() & 0x7fffu) == 0x7c00u; }
TRAINKIT_HD constexpr bool isfinite(half h) noexcept { return (h.bits() & 0x7c00u) != 0x7c00u; }
TRAINKIT_HD constexpr bool signbit(half h) noexcept { return (h.bits() & 0x8000u) != 0; }

template <class CharT, class Traits>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, half h) {
  return os << static_cast<float>(h);
}

}  // namespace trainkit

namespace std {

/// The limits of binary16, as IEEE 754 defines them.
template <>
struct numeric_limits<trainkit::half> {
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
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  TRAINKIT_HD static constexpr trainkit::half min() noexcept { return trainkit::half::from_bits(0x0400); }
  TRAINKIT_HD static constexpr trainkit::half lowest() noexcept { return trainkit::half::from_bits(0xfbff); }
  TRAINKIT_HD static constexpr trainkit::half max() noexcept { return trainkit::half::from_bits(0x7bff); }
  TRAINKIT_HD static constexpr trainkit::half epsilon() noexcept { return trainkit::half::from_bits(0x1400); }
  TRAINKIT_HD static constexpr trainkit::half round_error() noexcept { return trainkit::half::from_bits(0x3800); }
  TRAINKIT_HD static constexpr trainkit::half infinity() noexcept { return trainkit::half::from_bits(0x7c00); }
  TRAINKIT_HD static constexpr trainkit::half quiet_NaN() noexcept { return trainkit::half::from_bits(0x7e00); }
  TRAINKIT_HD static constexpr trainkit::half signaling_NaN() noexcept { return trainkit::half::from_bits(0x7d00); }
  TRAINKIT_HD static constexpr trainkit::half denorm_min() noexcept { return trainkit::half::from_bits(0x0001); }
};

}  // namespace std
