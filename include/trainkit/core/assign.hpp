// trainkit/core/assign.hpp - the store functors every elementwise op is made of: out = F(in...),
// dst = F(dst, in...) and the element-type cast, each computing in compute_t. They live in core
// (not ops) because the CUDA elementwise kernel recognises them to skip loading an output it only
// writes (backend/cuda/elementwise.cuh), and the backend may not include ops.
#pragma once

#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"  // compute_t

namespace trainkit::detail {

/// out = F(in...) computed in the compute type of each element.
template <class F, class Out, class... In>
struct assign_fn {
  F f;
  TRAINKIT_HD void operator()(Out& o, const In&... in) const {
    o = static_cast<Out>(f(static_cast<compute_t<In>>(in)...));
  }
};
/// dst = F(dst, in...): the in-place form.
template <class F, class T, class... In>
struct update_fn {
  F f;
  TRAINKIT_HD void operator()(T& d, const In&... in) const {
    d = static_cast<T>(f(static_cast<compute_t<T>>(d), static_cast<compute_t<In>>(in)...));
  }
};
template <class To, class From>
struct cast_fn {
  TRAINKIT_HD void operator()(To& o, const From& i) const {
    if constexpr (std::is_same_v<To, From>) {
      o = i;
    } else if constexpr (std::is_arithmetic_v<To> && !std::is_arithmetic_v<From>) {
      o = static_cast<To>(static_cast<float>(i));
    } else {
      o = static_cast<To>(i);
    }
  }
};

}  // namespace trainkit::detail
