// trainkit/dist/detail/element.hpp - the element types collectives accept, and how they combine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/dist/reduce_op.hpp"

namespace trainkit::dist {

/// The element types every communicator supports (the ones NCCL supports, as host types).
template <class T>
concept dist_element = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, half> ||
    std::is_same_v<T, bfloat16> || std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t> ||
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

namespace detail {

/// Calls f.template operator()<T>() for every dist_element T (and-folded: f returns bool), so a
/// concept or a test can go over the whole list in one place.
template <class F>
constexpr bool for_each_dist_element(F&& f) {
  return f.template operator()<float>() && f.template operator()<double>() && f.template operator()<half>() &&
         f.template operator()<bfloat16>() && f.template operator()<std::int8_t>() &&
         f.template operator()<std::uint8_t>() && f.template operator()<std::int32_t>() &&
         f.template operator()<std::int64_t>();
}

/// The type values combine in: float for the 16-bit floats (rounded once at the end, like NCCL),
/// the type itself otherwise.
template <class T>
using dist_compute_t = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;

/// a (+) b in the compute type. Integer sums wrap in the element type (what MPI and NCCL do);
/// they are computed unsigned so that the wrap is defined behaviour. max/min propagate NaN.
template <class T>
constexpr dist_compute_t<T> combine(reduce_op op, dist_compute_t<T> a, dist_compute_t<T> b) noexcept {
  using C = dist_compute_t<T>;
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      } else {
        return static_cast<C>(a + b);
      }
    case reduce_op::max:
      if (b != b) return b;  // NaN wins (a NaN `a` stays: NaN < b is false)
      return a < b ? b : a;
    case reduce_op::min:
      if (b != b) return b;
      return b < a ? b : a;
  }
  return a;
}

/// The last step of a reduction: avg divides by the world size; then back to the element type.
template <class T>
constexpr T finish(reduce_op op, dist_compute_t<T> acc, int world_size) noexcept {
  if (op == reduce_op::avg)
    acc = static_cast<dist_compute_t<T>>(acc / static_cast<dist_compute_t<T>>(world_size));
  return static_cast<T>(acc);
}

template <class T>
constexpr dist_compute_t<T> to_compute(T v) noexcept {
  return static_cast<dist_compute_t<T>>(v);
}

/// A small integer naming the element type, so ranks can check that they called the same thing.
template <dist_element T>
constexpr int element_id() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return 0;
  else if constexpr (std::is_same_v<T, double>)
    return 1;
  else if constexpr (std::is_same_v<T, half>)
    return 2;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return 3;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return 4;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return 5;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return 6;
  else
    return 7;
}

/// The collectives, for messages and for matching calls across ranks.
enum class collective_kind { allreduce, broadcast, allgather, reduce_scatter, alltoall, barrier };

constexpr std::string_view to_string(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::allreduce:
      return "allreduce";
    case collective_kind::broadcast:
      return "broadcast";
    case collective_kind::allgather:
      return "allgather";
    case collective_kind::reduce_scatter:
      return "reduce_scatter";
    case collective_kind::alltoall:
      return "alltoall";
    case collective_kind::barrier:
      return "barrier";
  }
  return "unknown";
}

}  // namespace detail
}  // namespace trainkit::dist
