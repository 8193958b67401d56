// trainkit/amp/detail/scaler_core.hpp - what the loss scalers of amp/loss_scaler.hpp share: the
// scale and its state, the fused unscale-and-check over all gradients (one pass per device through
// backend::multi_tensor, per tensor elsewhere), the cross-rank found-inf reduction, and the hooks
// the optimizer steps are skipped through.
#pragma once

#include <cmath>       // std::isfinite
#include <cstdint>     // std::int64_t
#include <functional>  // std::function: the cross-rank found-inf reduction
#include <iterator>    // std::begin
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/amp/concepts.hpp"
#include "trainkit/amp/precision.hpp"
#include "trainkit/autograd/grad_mode.hpp"
#include "trainkit/autograd/ops/arithmetic.hpp"
#include "trainkit/autograd/var.hpp"
#include "trainkit/backend/multi_tensor.hpp"
#include "trainkit/config.hpp"
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/ops/reduce.hpp"

namespace trainkit::amp {

namespace detail {

/// Reducer: 1 when any element is inf or NaN (x - x is 0 exactly for finite x, NaN otherwise).
struct any_nonfinite {
  TRAINKIT_HD float init() const { return 0.0f; }
  template <class V>
  TRAINKIT_HD float step(float a, V v, index_t) const {
    using A = std::conditional_t<std::is_same_v<V, double>, double, float>;
    const A x = static_cast<A>(v);
    return x - x == A(0) ? a : 1.0f;
  }
  TRAINKIT_HD float merge(float a, float b) const { return a > b ? a : b; }
  template <class Out>
  TRAINKIT_HD Out finish(float a, index_t) const {
    return static_cast<Out>(a);
  }
};

/// One pass over a dense host gradient of float or double: whether it held an inf or a NaN, and
/// x *= inv as mul_ computes it (in the element type), in one pass: a check followed by a multiply
/// would read every gradient twice.
template <class T>
bool unscale_check_host(T* p, index_t n, float inv) {
  const T s = static_cast<T>(inv);
  int bad = 0;
#if TRAINKIT_HAS_OPENMP
#pragma omp simd reduction(| : bad)
#endif
  for (index_t i = 0; i < n; ++i) {
    const T x = p[i];
    bad |= (x - x != T(0)) ? 1 : 0;  // NaN for inf and NaN, 0 for every finite x
    p[i] = x * s;
  }
  return bad != 0;
}

/// True when g holds an inf or a NaN (one reduction on g's device).
template <class T, class D>
bool has_nonfinite(const tensor<T, D>& g) {
  if (g.numel() == 0) return false;
  const auto r = trainkit::detail::reduce_impl<float>(
      g, trainkit::detail::reduce_mask({}, g.dim(), "found_inf"), false, any_nonfinite{}, "found_inf");
  return r.item() != 0.0f;
}

/// Unscales the gradients of params (all of one device) in one multi-tensor pass with one
/// device found-inf flag, read once (backend::multi_tensor<D>, e.g. CUDA's
/// _amp_foreach_non_finite_check_and_unscale_). Returns whether a gradient held an inf/NaN.
/// Only for a device with a fused model and dense gradients (unscale_impl checks).
template <class Params>
bool fused_unscale(const Params& params, float inv) {
  using V = std::decay_t<decltype(*std::begin(params))>;
  using T = typename V::tensor_type::value_type;
  using D = typename V::tensor_type::device_type;
  if constexpr (backend::multi_tensor<D>::fused) {
    auto g = backend::gradient_list<T>(params);
    auto found = tensor<float, D>::zeros({});
    backend::multi_tensor<D>::unscale(g.data.data(), g.numel.data(), g.size(), inv, found.data());
    return found.item() != 0.0f;  // the one read of the step's decision
  } else {
    (void)params, (void)inv;
    return false;
  }
}

/// Whether fused_unscale can take params: a fused device model and dense gradients.
template <class Params>
bool can_fuse_unscale(const Params& params) {
  using V = std::decay_t<decltype(*std::begin(params))>;
  if constexpr (!backend::multi_tensor<typename V::tensor_type::device_type>::fused) {
    (void)params;
    return false;
  } else {
    for (const auto& p : params)
      if (p.defined() && p.grad().defined() && !p.grad().is_contiguous()) return false;
    return true;
  }
}

/// The parameter list of what a scaler unscales: o.params() for an optimizer, o itself for a
/// range of vars (a std::vector<var>).
template <class O>
decltype(auto) params_of(const O& o) {
  if constexpr (requires { o.params(); })
    return o.params();
  else
    return (o);
}

/// Which per-step entry o belongs to: its first parameter. An optimizer and the list of its
/// parameters are the same key, so unscale(opt.params()) followed by step(opt) unscales once.
template <class O>
const void* step_key(const O& o) {
  for (const auto& p : params_of(o))
    if (p.defined()) return static_cast<const void*>(p.get());
  return nullptr;
}

/// What static and dynamic scaling share: the per-step bookkeeping of GradScaler (one entry per
/// optimizer: ready -> unscaled -> stepped), the found-inf check and its cross-rank reduction.
class scaler_core {
 public:
  /// Multiplies the loss by the scale (backward then yields scaled gradients).
  template <class T, class D>
  autograd::var<T, D> scale(const autograd::var<T, D>& loss) const {
    return autograd::mul(loss, scale_);
  }
  /// Divides o's gradients by the scale in place; returns whether one holds an inf/NaN (after the
  /// cross-rank reduction, if one is set). At most once per optimizer per step: a second call,
  /// or one after step(), is a usage_error. o: an optimizer (anything with params()) or a
  /// std::vector<var>; an optimizer and its parameter list count as the same (keyed by the
  /// first parameter), so unscale(opt.params()) then step(opt) unscales once.
  template <class O>
  bool unscale(const O& o) {
    return unscale_impl(o, scale_);
  }
  /// Unscales o if not done yet, then o.step() unless an inf/NaN was found. Returns whether it
  /// stepped. A second step() before update() is a usage_error.
  template <class O>
  bool step(O& o) {
    return step_impl(o, scale_);
  }
  double get_scale() const noexcept { return scale_; }

  /// Makes found-inf a collective: reducer(local) must return the OR over all ranks (so every
  /// rank skips the same steps). It is called once per unscale() - explicit or from step() - on
  /// every rank, so all ranks must unscale the same optimizers in the same order.
  void set_found_inf_reducer(std::function<bool(bool)> reducer) { reducer_ = std::move(reducer); }

  /// Whether an inf/NaN was found in the step in progress, or else in the last finished step.
  bool found_inf() const noexcept {
    if (entries_.empty()) return last_found_inf_;
    for (const auto& e : entries_)
      if (e.found_inf) return true;
    return false;
  }
  /// Steps skipped since construction (a monitor counter).
  std::int64_t skipped_steps() const noexcept { return skipped_; }

 protected:
  scaler_core(double scale, const char* op) : scale_(scale) { check_scale(scale, op); }

  enum class stage { unscaled, stepped };
  struct entry {
    const void* key;
    stage st;
    bool found_inf;
  };

  entry* find(const void* key) {
    for (auto& e : entries_)
      if (e.key == key) return &e;
    return nullptr;
  }

  /// Checks every gradient of o for inf/NaN, reduces the flag across ranks, then multiplies the
  /// gradients by the fp32 reciprocal of scale (computed in double, as GradScaler).
  template <class O>
  bool unscale_impl(const O& o, double scale) {
    const void* key = step_key(o);
    if (const entry* e = find(key)) {
      TRAINKIT_CHECK(e->st != stage::unscaled, usage_error, "unscale",
                     "unscale() has already been called on this optimizer since the last update()");
      TRAINKIT_CHECK(false, usage_error, "unscale", "unscale() is being called after step()");
    }
    autograd::no_grad guard;
    const auto& params = params_of(o);
    const float inv = static_cast<float>(1.0 / scale);
    bool found = false;
    if (can_fuse_unscale(params)) {
      // One pass over all gradients, one flag on the device, one read (CUDA).
      found = fused_unscale(params, inv);
      if (reducer_) found = reducer_(found);
    } else {
      using G = std::remove_cvref_t<decltype(params.begin()->grad())>;
      using T = typename G::value_type;
      using D = typename G::device_type;
      // On the host, dense float/double gradients take one fused pass each (the rest: two).
      constexpr bool host_fused = std::is_same_v<D, cpu> && (std::is_same_v<T, float> || std::is_same_v<T, double>);
      for (const auto& p : params) {
        if (!p.defined() || !p.grad().defined()) continue;
        if constexpr (host_fused) {
          if (auto g = p.grad(); g.is_contiguous()) {
            found = detail::unscale_check_host(g.data(), g.numel(), inv) || found;
            continue;
          }
        }
        found = found || has_nonfinite(p.grad());
      }
      if (reducer_) found = reducer_(found);
      for (const auto& p : params) {
        if (!p.defined() || !p.grad().defined()) continue;
        auto g = p.grad();
        if (host_fused && g.is_contiguous()) continue;  // unscaled above
        mul_(g, static_cast<double>(inv));
      }
    }
    entries_.push_back({key, stage::unscaled, found});
    return found;
  }

  template <class O>
  bool step_impl(O& o, double scale) {
    const void* key = step_key(o);
    entry* e = find(key);
    TRAINKIT_CHECK(e == nullptr || e->st != stage::stepped, usage_error, "step",
                   "step() has already been called since the last update()");
    if (e == nullptr) {
      unscale_impl(o, scale);
      e = &entries_.back();
    }
    e->st = stage::stepped;
    if (e->found_inf) {
      ++skipped_;
      return false;
    }
    o.step();
    return true;
  }

  /// Ends the step: returns whether any optimizer saw an inf/NaN and forgets the per-step state.
  bool end_step(const char* op) {
    TRAINKIT_CHECK(!entries_.empty(), usage_error, op,
                   "no inf checks were recorded before update(): call step() (or unscale()) first");
    const bool found = found_inf();
    entries_.clear();
    last_found_inf_ = found;
    return found;
  }

  static void check_scale(double s, const char* op) {
    TRAINKIT_CHECK(s > 0.0 && std::isfinite(s), value_error, op,
                   "the scale must be finite and > 0, got " << s);
  }

  double scale_;
  std::vector<entry> entries_;
  std::function<bool(bool)> reducer_;
  bool last_found_inf_ = false;
  std::int64_t skipped_ = 0;
};

}  // namespace detail

}  // namespace trainkit::amp
