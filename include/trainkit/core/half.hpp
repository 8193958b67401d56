// trainkit/core/half.hpp - IEEE 754 binary16, one type for host and device.
#pragma once

#include <cstdint>      // std::uint16_t, std::uint32_t, std::uint64_t
#include <type_traits>  // std::is_integral_v: one constructor for every integer type

#include "trainkit/config.hpp"         // TRAINKIT_HD
#include "trainkit/core/narrow_float.hpp"  // bit_cast, round_to_narrow, isnan & co., <<, numeric_limits

namespace trainkit {

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

  // Arithmetic (in float, rounded back) and comparison (as floats): core/narrow_float.hpp.

 private:
  std::uint16_t bits_;
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);

/// binary16's layout and limits, as IEEE 754 defines them.
template <>
inline constexpr detail::float16_layout detail::narrow_float_format<half> = {
    .exponent_mask = 0x7c00, .is_iec559 = true, .digits = 11, .digits10 = 3, .max_digits10 = 5,
    .min_exponent = -13, .min_exponent10 = -4, .max_exponent = 16, .max_exponent10 = 4, .min = 0x0400,
    .lowest = 0xfbff, .max = 0x7bff, .epsilon = 0x1400, .round_error = 0x3800, .quiet_nan = 0x7e00,
    .signaling_nan = 0x7d00};

}  // namespace trainkit
