// trainkit/core/narrow_float.hpp - what the two 16-bit float formats, half (IEEE binary16) and
// bfloat16, share: bit-exact rounding from wider formats, classification on the bits (isnan,
// isinf, isfinite, signbit), printing, and std::numeric_limits, each written once over a
// per-format trait (detail::narrow_float_format<T>, specialised by core/half.hpp and
// core/bfloat16.hpp).
#pragma once

#include <cstdint>  // std::uint16_t, std::uint32_t, std::uint64_t
#include <iosfwd>   // std::basic_ostream: operator<< stays a template, so <ostream> is the user's
#include <concepts>  // std::same_as
#include <limits>    // std::float_denorm_style, std::float_round_style

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

/// The layout and limits of a 16-bit floating-point format: the exponent field's mask, whether
/// IEEE 754 defines it, numeric_limits' digit and exponent counts, and the bit patterns of min,
/// lowest, max, epsilon, round_error and the NaNs.
struct float16_layout {
  std::uint16_t exponent_mask = 0;  // 0: not a 16-bit float type
  bool is_iec559 = false;
  int digits = 0, digits10 = 0, max_digits10 = 0;
  int min_exponent = 0, min_exponent10 = 0, max_exponent = 0, max_exponent10 = 0;
  std::uint16_t min = 0, lowest = 0, max = 0, epsilon = 0, round_error = 0, quiet_nan = 0, signaling_nan = 0;
};

/// The layout of T; specialised beside each 16-bit float type (core/half.hpp, core/bfloat16.hpp).
template <class T>
inline constexpr float16_layout narrow_float_format{};

/// T is one of the 16-bit float types: it has a narrow_float_format, bits() and from_bits().
template <class T>
concept float16_type = narrow_float_format<T>.exponent_mask != 0 && requires(T t) {
  { t.bits() } -> std::same_as<std::uint16_t>;
  { T::from_bits(std::uint16_t{}) } -> std::same_as<T>;
};

/// std::numeric_limits<T> for a float16_type (sign bit first, subnormals, round to nearest even).
template <class T>
struct float16_limits {
  static constexpr float16_layout format = narrow_float_format<T>;
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
  static constexpr bool is_iec559 = format.is_iec559;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = format.digits;
  static constexpr int digits10 = format.digits10;
  static constexpr int max_digits10 = format.max_digits10;
  static constexpr int radix = 2;
  static constexpr int min_exponent = format.min_exponent;
  static constexpr int min_exponent10 = format.min_exponent10;
  static constexpr int max_exponent = format.max_exponent;
  static constexpr int max_exponent10 = format.max_exponent10;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  TRAINKIT_HD static constexpr T min() noexcept { return T::from_bits(format.min); }
  TRAINKIT_HD static constexpr T lowest() noexcept { return T::from_bits(format.lowest); }
  TRAINKIT_HD static constexpr T max() noexcept { return T::from_bits(format.max); }
  TRAINKIT_HD static constexpr T epsilon() noexcept { return T::from_bits(format.epsilon); }
  TRAINKIT_HD static constexpr T round_error() noexcept { return T::from_bits(format.round_error); }
  TRAINKIT_HD static constexpr T infinity() noexcept { return T::from_bits(format.exponent_mask); }
  TRAINKIT_HD static constexpr T quiet_NaN() noexcept { return T::from_bits(format.quiet_nan); }
  TRAINKIT_HD static constexpr T signaling_NaN() noexcept { return T::from_bits(format.signaling_nan); }
  TRAINKIT_HD static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }
};

}  // namespace detail

// Arithmetic happens in float and rounds back once (correctly rounded for + - * /: float holds
// more than 2p+2 bits of either format). Negation flips the sign bit: exact for every value, NaN
// included, like float's. Comparisons are made as floats, so -0 == +0 and NaN is unordered.
template <detail::float16_type T>
TRAINKIT_HD constexpr T& operator+=(T& a, T b) noexcept {
  return a = T(float(a) + float(b));
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T& operator-=(T& a, T b) noexcept {
  return a = T(float(a) - float(b));
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T& operator*=(T& a, T b) noexcept {
  return a = T(float(a) * float(b));
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T& operator/=(T& a, T b) noexcept {
  return a = T(float(a) / float(b));
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T operator+(T a, T b) noexcept {
  return a += b;
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T operator-(T a, T b) noexcept {
  return a -= b;
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T operator*(T a, T b) noexcept {
  return a *= b;
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T operator/(T a, T b) noexcept {
  return a /= b;
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T operator+(T a) noexcept {
  return a;
}
template <detail::float16_type T>
TRAINKIT_HD constexpr T operator-(T a) noexcept {
  return T::from_bits(static_cast<std::uint16_t>(a.bits() ^ 0x8000u));
}
template <detail::float16_type T>
TRAINKIT_HD constexpr bool operator==(T a, T b) noexcept {
  return float(a) == float(b);
}
template <detail::float16_type T>
TRAINKIT_HD constexpr bool operator<(T a, T b) noexcept {
  return float(a) < float(b);
}
template <detail::float16_type T>
TRAINKIT_HD constexpr bool operator<=(T a, T b) noexcept {
  return float(a) <= float(b);
}
template <detail::float16_type T>
TRAINKIT_HD constexpr bool operator>(T a, T b) noexcept {
  return float(a) > float(b);
}
template <detail::float16_type T>
TRAINKIT_HD constexpr bool operator>=(T a, T b) noexcept {
  return float(a) >= float(b);
}

// Classification on the bits: cheap, constexpr, and no float traps on device. Inside namespace
// trainkit these hide the global ::isnan for unqualified calls; call std::isnan on float/double.
template <detail::float16_type T>
TRAINKIT_HD constexpr bool isnan(T h) noexcept {
  return (h.bits() & 0x7fffu) > detail::narrow_float_format<T>.exponent_mask;
}
template <detail::float16_type T>
TRAINKIT_HD constexpr bool isinf(T h) noexcept {
  return (h.bits() & 0x7fffu) == detail::narrow_float_format<T>.exponent_mask;
}
template <detail::float16_type T>
TRAINKIT_HD constexpr bool isfinite(T h) noexcept {
  constexpr std::uint16_t e = detail::narrow_float_format<T>.exponent_mask;
  return (h.bits() & e) != e;
}
template <detail::float16_type T>
TRAINKIT_HD constexpr bool signbit(T h) noexcept {
  return (h.bits() & 0x8000u) != 0;
}

/// Prints the value as float.
template <class CharT, class Traits, detail::float16_type T>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, T h) {
  return os << static_cast<float>(h);
}

}  // namespace trainkit

/// The limits of half and bfloat16, from their detail::narrow_float_format.
template <trainkit::detail::float16_type T>
struct std::numeric_limits<T> : trainkit::detail::float16_limits<T> {};
