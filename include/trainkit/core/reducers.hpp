// trainkit/core/reducers.hpp - the fold of every reduction (sum, mean, max/min, argmax/argmin),
// written once as TRAINKIT_HD structs that the CPU and CUDA models of backend::reduce both run
// (contract: init / step / merge / finish, see backend/reduce.hpp).
#pragma once

#include <limits>

#include "trainkit/config.hpp"
#include "trainkit/core/shape.hpp"  // index_t

namespace trainkit {

namespace reducers {
/// Sum in Acc (float for 16-bit floats, double for double).
template <class Acc>
struct sum {
  TRAINKIT_HD Acc init() const { return Acc(0); }
  template <class C>
  TRAINKIT_HD Acc step(Acc a, C v, index_t) const {
    return a + static_cast<Acc>(v);
  }
  TRAINKIT_HD Acc merge(Acc a, Acc b) const { return a + b; }
  template <class Out>
  TRAINKIT_HD Out finish(Acc a, index_t) const {
    return static_cast<Out>(a);
  }
};
template <class Acc>
struct mean : sum<Acc> {
  template <class Out>
  TRAINKIT_HD Out finish(Acc a, index_t n) const {
    return static_cast<Out>(n ? a / static_cast<Acc>(n) : std::numeric_limits<Acc>::quiet_NaN());
  }
};
/// Running max with the index of its first occurrence; NaN wins (as in PyTorch).
template <class Acc>
struct arg_extreme {
  bool want_max;
  struct state {
    Acc v;
    index_t k;
  };
  TRAINKIT_HD state init() const { return {want_max ? -std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::infinity(), -1}; }
  template <class C>
  TRAINKIT_HD state step(state a, C c, index_t k) const {
    const Acc v = static_cast<Acc>(c);
    if (a.k < 0 || v != v || (a.v == a.v && (want_max ? v > a.v : v < a.v))) return {v, k};
    return a;
  }
  TRAINKIT_HD state merge(state a, state b) const {
    if (a.k < 0) return b;
    if (b.k < 0) return a;
    if (a.v != a.v) return a;
    if (b.v != b.v || (want_max ? b.v > a.v : b.v < a.v)) return b;
    return a;
  }
};
/// Running max (want_max) or min of the values alone: one compare and one select per element, no
/// index to carry. NaN wins, as in PyTorch; between equal values (+0 and -0) the first stays.
template <class Acc>
struct extreme_value {
  bool want_max;
  TRAINKIT_HD Acc init() const {
    if constexpr (std::numeric_limits<Acc>::has_infinity)
      return want_max ? -std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::infinity();
    else
      return want_max ? std::numeric_limits<Acc>::lowest() : std::numeric_limits<Acc>::max();
  }
  TRAINKIT_HD Acc merge(Acc a, Acc b) const {
    const bool take = a == a && (b != b || (want_max ? b > a : b < a));  // the first NaN stays
    return take ? b : a;
  }
  template <class C>
  TRAINKIT_HD Acc step(Acc a, C c, index_t) const {
    return merge(a, static_cast<Acc>(c));
  }
  template <class Out>
  TRAINKIT_HD Out finish(Acc a, index_t) const {
    return static_cast<Out>(a);
  }
};
template <class Acc>
struct extreme_index : arg_extreme<Acc> {
  template <class Out>
  TRAINKIT_HD Out finish(typename arg_extreme<Acc>::state a, index_t) const {
    return static_cast<Out>(a.k);
  }
};
}  // namespace reducers

}  // namespace trainkit
