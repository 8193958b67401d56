// trainkit/core/device.hpp - devices are types; backends specialise operation templates on them.
#pragma once

#include <concepts>
#include <string_view>

namespace trainkit {

/// The host: memory from the CPU allocator, kernels through OpenBLAS and OpenMP.
struct cpu {
  static constexpr std::string_view name = "cpu";
};

/// An NVIDIA GPU: memory from the caching allocator, kernels in backend/cuda (a .cu translation unit).
struct cuda {
  static constexpr std::string_view name = "cuda";
};

/// A device tag: a type with a static name. Models: cpu, cuda.
template <class D>
concept device = requires {
  { D::name } -> std::convertible_to<std::string_view>;
};

namespace detail {
template <class...>
inline constexpr bool dependent_false = false;
}  // namespace detail

}  // namespace trainkit
