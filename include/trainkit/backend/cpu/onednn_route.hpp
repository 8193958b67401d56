// trainkit/backend/cpu/onednn_route.hpp - which library runs the CPU's GEMMs (TRAINKIT_CPU_GEMM) and
// its convolutions, poolings and batch norms (TRAINKIT_CPU_CONV): the built-in route or oneDNN.
// Both routes are read from the environment once, at their first use, and can be overridden for the
// rest of the process (tests, benchmarks). This header also says whether oneDNN is built in
// (TRAINKIT_HAS_ONEDNN; CMake: TRAINKIT_ONEDNN, on when libdnnl is found); the routes exist in every
// build, and without oneDNN every setting means the built-in route.
#pragma once

#include <atomic>
#include <cstdlib>  // std::getenv
#include <string_view>

#include "trainkit/config.hpp"  // TRAINKIT_CUDA_COMPILER
#include "trainkit/core/error.hpp"

#if !defined(TRAINKIT_HAS_ONEDNN)
#define TRAINKIT_HAS_ONEDNN 0
#endif
// nvcc 13's front end aborts on <dnnl.hpp> (internal error in stl_construct.h): .cu files take the
// built-in routes for their host-side CPU kernels.
#if TRAINKIT_HAS_ONEDNN && TRAINKIT_CUDA_COMPILER
#undef TRAINKIT_HAS_ONEDNN
#define TRAINKIT_HAS_ONEDNN 0
#endif

namespace trainkit::backend {

/// Which library runs the CPU GEMMs. automatic: oneDNN for bfloat16 (and half where oneDNN
/// supports it on this CPU); for an fp32 product of at least 2^16 multiply-adds outside a parallel
/// region, whichever of OpenBLAS and oneDNN measured faster for its shape on this machine
/// (backend/cpu/measured_route.hpp); OpenBLAS for the rest. openblas: OpenBLAS only, 16-bit floats
/// widened to fp32. onednn: oneDNN wherever it has a kernel.
enum class cpu_gemm_route { automatic, openblas, onednn };

/// Which kernels run the CPU's convolutions, poolings and batch norms. im2col: the built-in host
/// kernels (convolution as im2col + GEMM); onednn: oneDNN primitives where they exist for the
/// type and shape, the built-in kernels elsewhere; automatic: each convolution pass (forward,
/// backward-data, backward-weights) of at least 2^18 multiply-adds, fp32 or bfloat16, on whichever
/// kernel measured faster for its shape on this machine (backend/cpu/measured_route.hpp; smaller
/// ones: built-in for fp32, oneDNN for bfloat16); poolings and batch norms on oneDNN for bfloat16
/// and the built-in kernels for fp32, where oneDNN's on plain layouts cost 1.3-1.9x a residual
/// net's step (benchmarks/README.md has the figures).
enum class cpu_conv_route { automatic, im2col, onednn };

namespace detail {

/// A route's environment variable and the name and value of its built-in route.
template <class Route>
struct route_variable;
template <>
struct route_variable<cpu_gemm_route> {
  static constexpr const char* name = "TRAINKIT_CPU_GEMM";
  static constexpr std::string_view builtin_name = "openblas";
  static constexpr cpu_gemm_route builtin = cpu_gemm_route::openblas;
};
template <>
struct route_variable<cpu_conv_route> {
  static constexpr const char* name = "TRAINKIT_CPU_CONV";
  static constexpr std::string_view builtin_name = "im2col";
  static constexpr cpu_conv_route builtin = cpu_conv_route::im2col;
};

/// A route variable's value: "auto" / "" / unset -> automatic, the built-in name -> the built-in
/// route, "onednn" -> onednn; anything else is a value_error naming the variable.
template <class Route>
Route parse_route(const char* value) {
  using var = route_variable<Route>;
  const std::string_view v = value ? value : "";
  if (v.empty() || v == "auto") return Route::automatic;
  if (v == "onednn") return Route::onednn;
  TRAINKIT_CHECK(v == var::builtin_name, value_error, var::name,
                 "'" << v << "' is not one of " << var::builtin_name << ", onednn, auto");
  return var::builtin;
}
inline cpu_gemm_route parse_cpu_gemm_route(const char* value) { return parse_route<cpu_gemm_route>(value); }
inline cpu_conv_route parse_cpu_conv_route(const char* value) { return parse_route<cpu_conv_route>(value); }

/// The route in force: its variable read once, at the first use; set_route changes it.
template <class Route>
std::atomic<Route>& route_state() {
  static std::atomic<Route> route{parse_route<Route>(std::getenv(route_variable<Route>::name))};
  return route;
}

}  // namespace detail

/// The route the CPU GEMMs take now.
inline cpu_gemm_route get_cpu_gemm_route() {
  return detail::route_state<cpu_gemm_route>().load(std::memory_order_relaxed);
}
/// Overrides TRAINKIT_CPU_GEMM for the rest of the process (tests, benchmarks).
inline void set_cpu_gemm_route(cpu_gemm_route r) {
  detail::route_state<cpu_gemm_route>().store(r, std::memory_order_relaxed);
}

/// The route the CPU convolutions, poolings and batch norms take now.
inline cpu_conv_route get_cpu_conv_route() {
  return detail::route_state<cpu_conv_route>().load(std::memory_order_relaxed);
}
/// Overrides TRAINKIT_CPU_CONV for the rest of the process (tests, benchmarks). Without oneDNN,
/// onednn is stored but the built-in kernels run.
inline void set_cpu_conv_route(cpu_conv_route r) {
  detail::route_state<cpu_conv_route>().store(r, std::memory_order_relaxed);
}

}  // namespace trainkit::backend
