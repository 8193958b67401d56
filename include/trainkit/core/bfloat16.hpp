// trainkit/core/bfloat16.hpp - bfloat16 (the top 16 bits of a float), one type for host and device.
#pragma once

#include <cstdint>      // std::uint16_t, std::uint32_t, std::uint64_t
#include <type_traits>  // std::is_integral_v

#include "trainkit/config.hpp"         // TRAINKIT_HD
#include "trainkit/core/narrow_float.hpp"  // bit_cast, round_to_narrow, isnan & co., <<, numeric_limits

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

  // Arithmetic (in float, rounded back) and comparison (as floats): core/narrow_float.hpp.

 private:
  // The usual add-and-truncate: adding 0x7fff plus the lowest kept bit rounds to nearest even,
  // and a carry out of the largest finite value lands exactly on infinity's bits. A NaN keeps its
  // sign and top payload, made quiet. Both results computed, one selected: loops that round
  // vectorise (with an early return they stayed scalar: batch norm's bf16 output).
  TRAINKIT_HD static constexpr std::uint16_t round_from_float(float f) noexcept {
    const std::uint32_t u = detail::bit_cast<std::uint32_t>(f);
    const std::uint32_t nan = (u >> 16) | 0x0040u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }


  std::uint16_t bits_;
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

namespace detail {
/// f rounded to the nearest bfloat16 value and kept a float: float(bfloat16(f)) bit for bit, in
/// 32-bit lanes only (no 16-bit intermediate): functors::round_to<bfloat16> on a float.
TRAINKIT_HD constexpr float round_to_bfloat16_value(float f) noexcept {
  const std::uint32_t u = bit_cast<std::uint32_t>(f);
  const std::uint32_t nan = (u | 0x00400000u) & 0xffff0000u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  // The NaN select as a mask (all ones for a NaN).
  const std::uint32_t is_nan = 0u - static_cast<std::uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  return bit_cast<float>((nan & is_nan) | (rounded & ~is_nan));
}
}  // namespace detail

/// bfloat16's layout and limits. Not IEC 559, as PyTorch and JAX say: it follows IEEE
/// semantics but is not one of the formats IEEE 754 defines.
template <>
inline constexpr detail::float16_layout detail::narrow_float_format<bfloat16> = {
    .exponent_mask = 0x7f80, .is_iec559 = false, .digits = 8, .digits10 = 2, .max_digits10 = 4,
    .min_exponent = -125, .min_exponent10 = -37, .max_exponent = 128, .max_exponent10 = 38, .min = 0x0080,
    .lowest = 0xff7f, .max = 0x7f7f, .epsilon = 0x3c00, .round_error = 0x3f00, .quiet_nan = 0x7fc0,
    .signaling_nan = 0x7fa0};

}  // namespace trainkit
