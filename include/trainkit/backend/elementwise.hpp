// trainkit/backend/elementwise.hpp - the strided N-ary loop every elementwise op runs on.
#pragma once

#include <array>
#include <cstddef>

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// Per-device strided loop. A model provides
///   template <class F, class... P> static void for_each(const shape& sizes,
///       const std::array<shape, sizeof...(P)>& strides, F f, P*... ptrs);
/// which calls f(ptrs[0][off0], ptrs[1][off1], ...) (references) once per index of `sizes`,
/// where off_k is the dot product of the index with strides[k]. Operands may alias only when
/// they are the same element (in-place ops); the order of calls is unspecified.
template <class Device>
struct elementwise {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::elementwise has no model for this device: include its backend header");
};

namespace detail {
/// Merges adjacent dimensions that every operand walks with the same step, and drops size-1
/// dimensions, so that dense tensors become one long run.
template <std::size_t N>
inline void coalesce(shape& sizes, std::array<shape, N>& strides) {
  shape ns;
  std::array<shape, N> nst;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;
    bool merge = !ns.empty();
    if (merge)
      for (std::size_t k = 0; k < N; ++k)
        if (nst[k].back() != strides[k][i] * sizes[i]) merge = false;
    if (merge) {
      ns.back() *= sizes[i];
      for (std::size_t k = 0; k < N; ++k) nst[k].back() = strides[k][i];
    } else {
      ns.push_back(sizes[i]);
      for (std::size_t k = 0; k < N; ++k) nst[k].push_back(strides[k][i]);
    }
  }
  if (ns.empty()) {
    ns.push_back(1);
    for (std::size_t k = 0; k < N; ++k) nst[k].push_back(0);
  }
  sizes = std::move(ns);
  strides = std::move(nst);
}
}  // namespace detail

}  // namespace trainkit::backend
