// trainkit/core/dtype.hpp - what each element type computes in, and what it is called.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"

namespace trainkit {

/// Element types a tensor may hold.
template <class T>
concept element = std::is_arithmetic_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// Floating-point element types (the ones autograd differentiates).
template <class T>
concept floating_element = std::is_floating_point_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

namespace detail {
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<half> {
  using type = float;
};
template <>
struct compute_type<bfloat16> {
  using type = float;
};
template <>
struct compute_type<std::int8_t> {
  using type = std::int32_t;
};
template <>
struct compute_type<std::uint8_t> {
  using type = std::int32_t;
};
template <>
struct compute_type<std::int16_t> {
  using type = std::int32_t;
};
template <>
struct compute_type<bool> {
  using type = bool;
};
}  // namespace detail

/// The type per-element math runs in: 16-bit floats compute in float (as PyTorch does on CPU),
/// small integers in int32; everything else in itself.
template <class T>
using compute_t = typename detail::compute_type<T>::type;

/// The type reductions accumulate in: double stays double, every other float sums in float.
template <class T>
using accumulate_t = std::conditional_t<std::is_same_v<T, double>, double,
                                        std::conditional_t<floating_element<T>, float, std::int64_t>>;

/// A short name for messages ("float32", "bfloat16"...), the same names PyTorch prints.
template <class T>
constexpr std::string_view dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, half>) return "float16";
  else if constexpr (std::is_same_v<T, bfloat16>) return "bfloat16";
  else if constexpr (std::is_same_v<T, std::int8_t>) return "int8";
  else if constexpr (std::is_same_v<T, std::uint8_t>) return "uint8";
  else if constexpr (std::is_same_v<T, std::int16_t>) return "int16";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, bool>) return "bool";
  else return "unknown";
}

}  // namespace trainkit
