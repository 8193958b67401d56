// trainkit/amp/precision.hpp - the precision policies fp32, mixed<half>, mixed<bfloat16>, and the
// bridge from a command-line word ("--precision bf16") to the compile-time policy.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>  // std::forward

#include "trainkit/amp/autocast_list.hpp"
#include "trainkit/amp/concepts.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/half.hpp"

namespace trainkit::amp {

/// Everything in fp32: the amp ops are the plain ops.
struct fp32 {
  using compute_type = float;
  using master_type = float;
  static constexpr bool is_mixed = false;
  static constexpr std::string_view name = "fp32";
  static constexpr bool runs_in_compute_type(autocast_op) noexcept { return false; }
};

/// Mixed precision: fp32 parameters, gradients and graph (master weights); the ops of the
/// autocast list (matmul, bmm, linear, conv2d) round their operands to Compute, multiply with
/// fp32 accumulation, save what backward needs in Compute and round their results to Compute.
/// Everything else (softmax, losses, norms, reductions) runs in fp32, as under torch.autocast.
/// \tparam Compute half or bfloat16
template <class Compute>
struct mixed {
  static_assert(std::is_same_v<Compute, half> || std::is_same_v<Compute, bfloat16>,
                "amp::mixed<Compute>: Compute must be trainkit::half or trainkit::bfloat16");
  using compute_type = Compute;
  using master_type = float;
  static constexpr bool is_mixed = true;
  static constexpr std::string_view name = std::is_same_v<Compute, half> ? "fp16" : "bf16";
  static constexpr bool runs_in_compute_type(autocast_op op) noexcept { return lower_precision_op(op); }
};

using mixed_fp16 = mixed<half>;
using mixed_bf16 = mixed<bfloat16>;

static_assert(precision_policy<fp32>);
static_assert(precision_policy<mixed_fp16>);
static_assert(precision_policy<mixed_bf16>);

/// The policies as a run-time value, for command lines and configuration files.
enum class precision_kind { fp32, fp16, bf16 };

constexpr std::string_view to_string(precision_kind k) noexcept {
  switch (k) {
    case precision_kind::fp32:
      return "fp32";
    case precision_kind::fp16:
      return "fp16";
    case precision_kind::bf16:
      return "bf16";
  }
  return "?";
}

/// Parses "fp32", "fp16" or "bf16" (the values of --precision); value_error for anything else.
inline precision_kind parse_precision(std::string_view s) {
  if (s == "fp32") return precision_kind::fp32;
  if (s == "fp16") return precision_kind::fp16;
  if (s == "bf16") return precision_kind::bf16;
  TRAINKIT_CHECK(false, value_error, "parse_precision",
                 "unknown precision '" << s << "'; expected one of fp32, fp16, bf16");
  return precision_kind::fp32;
}

/// The policy type of a precision_kind known at compile time.
template <precision_kind K>
using policy_of = std::conditional_t<K == precision_kind::fp32, fp32,
                                     std::conditional_t<K == precision_kind::fp16, mixed_fp16, mixed_bf16>>;

/// Calls f with a value of the policy type that k names (f(fp32{}), f(mixed_fp16{}) or
/// f(mixed_bf16{})), so a program turns its --precision flag into a template argument once:
///
///   `amp::visit_precision(amp::parse_precision(arg), [&]<class P>(P) { train<P>(...); });`
///
/// f must return the same type for the three policies.
template <class F>
decltype(auto) visit_precision(precision_kind k, F&& f) {
  switch (k) {
    case precision_kind::fp16:
      return std::forward<F>(f)(mixed_fp16{});
    case precision_kind::bf16:
      return std::forward<F>(f)(mixed_bf16{});
    case precision_kind::fp32:
      break;
  }
  return std::forward<F>(f)(fp32{});
}

}  // namespace trainkit::amp
