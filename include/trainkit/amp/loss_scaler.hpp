// trainkit/amp/loss_scaler.hpp - loss scaling: no_scaling, static_scaling, dynamic_scaling (with
// torch.cuda.amp.GradScaler's semantics and defaults), and the default scaler of each policy.
//
// The loop, with gradient clipping and accumulation over micro-batches:
//
//   amp::dynamic_scaling scaler;                       // init 2^16, growth 2, backoff 0.5, 2000
//   for (auto& micro : micro_batches) scaler.scale(loss_of(micro)).backward();
//   scaler.unscale(opt);                               // gradients are true gradients from here
//   optim::clip_grad_norm_(opt.params(), 1.0);
//   bool stepped = scaler.step(opt);                   // skipped when a gradient is inf/NaN
//   scaler.update();                                   // backoff on inf, growth after 2000 clean steps
//   opt.zero_grad();
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
/// x *= inv as mul_ computes it (in the element type). Two passes before (the check, then the
/// multiply), each reading every gradient: a tenth of an fp16 MLP step.
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

/// No loss scaling (fp32 and bf16, whose range is fp32's): scale() and unscale() change nothing,
/// no inf check is made and step() always steps - GradScaler(enabled=False).
struct no_scaling {
  struct state {
    friend constexpr bool operator==(const state&, const state&) = default;
  };
  template <class T, class D>
  autograd::var<T, D> scale(const autograd::var<T, D>& loss) const {
    return loss;
  }
  template <class O>
  bool unscale(const O&) {
    return false;
  }
  template <class O>
  bool step(O& o) {
    o.step();
    return true;
  }
  void update() {}
  double get_scale() const noexcept { return 1.0; }
  bool found_inf() const noexcept { return false; }
  std::int64_t skipped_steps() const noexcept { return 0; }
  void set_found_inf_reducer(std::function<bool(bool)>) {}
  state get_state() const noexcept { return {}; }
  void set_state(const state&) noexcept {}
};

/// A fixed scale: the loss is multiplied by it, gradients divided by it, and a step whose
/// gradients hold an inf/NaN is skipped (the scale never changes).
class static_scaling : public detail::scaler_core {
 public:
  struct state {
    double scale = 1.0;
    friend constexpr bool operator==(const state&, const state&) = default;
  };

  explicit static_scaling(double scale) : scaler_core(scale, "static_scaling") {}

  /// Ends the step (usage_error if nothing was unscaled or stepped since the last update()).
  void update() { end_step("static_scaling::update"); }

  state get_state() const noexcept { return {scale_}; }
  void set_state(const state& s) {
    check_scale(s.scale, "static_scaling::set_state");
    scale_ = s.scale;
  }
};

/// Hyper-parameters of dynamic_scaling: GradScaler's, with its defaults.
struct dynamic_scaling_options {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // applied after growth_interval steps without inf/NaN
  double backoff_factor = 0.5;  // applied on every step with an inf/NaN
  std::int64_t growth_interval = 2000;
};

/// Dynamic loss scaling, torch.cuda.amp.GradScaler step for step: a step whose gradients hold an
/// inf/NaN is skipped and the scale multiplied by backoff_factor; after growth_interval
/// consecutive clean steps the scale is multiplied by growth_factor (if that stays finite).
/// Snapshots need both get_state() (scale and growth tracker - resuming without them is a known
/// way to lose a run) and options().
class dynamic_scaling : public detail::scaler_core {
 public:
  /// What changes during training.
  struct state {
    double scale = 65536.0;
    std::int64_t growth_tracker = 0;  // clean steps since the last change of the scale
    friend constexpr bool operator==(const state&, const state&) = default;
  };
  using options_type = dynamic_scaling_options;

  explicit dynamic_scaling(const dynamic_scaling_options& o = {})
      : scaler_core(o.init_scale, "dynamic_scaling"), o_(o) {
    TRAINKIT_CHECK(o.growth_factor > 1.0 && std::isfinite(o.growth_factor), value_error, "dynamic_scaling",
                   "growth_factor must be > 1, got " << o.growth_factor);
    TRAINKIT_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, value_error, "dynamic_scaling",
                   "backoff_factor must be in (0, 1), got " << o.backoff_factor);
    TRAINKIT_CHECK(o.growth_interval >= 1, value_error, "dynamic_scaling",
                   "growth_interval must be >= 1, got " << o.growth_interval);
  }

  /// Ends the step: on inf/NaN scale *= backoff_factor and the tracker restarts; otherwise the
  /// tracker counts one more clean step and, reaching growth_interval, scale *= growth_factor.
  void update() {
    if (end_step("dynamic_scaling::update")) {
      scale_ *= o_.backoff_factor;
      tracker_ = 0;
      return;
    }
    if (++tracker_ == o_.growth_interval) {
      const double grown = scale_ * o_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      tracker_ = 0;
    }
  }
  /// Ends the step and sets the scale to new_scale (GradScaler.update(new_scale)).
  void update(double new_scale) {
    check_scale(new_scale, "dynamic_scaling::update");
    end_step("dynamic_scaling::update");
    scale_ = new_scale;
  }

  std::int64_t growth_tracker() const noexcept { return tracker_; }
  const dynamic_scaling_options& options() const noexcept { return o_; }
  state get_state() const noexcept { return {scale_, tracker_}; }
  void set_state(const state& s) {
    check_scale(s.scale, "dynamic_scaling::set_state");
    TRAINKIT_CHECK(s.growth_tracker >= 0 && s.growth_tracker < o_.growth_interval, value_error,
                   "dynamic_scaling::set_state",
                   "growth_tracker must be in [0, growth_interval = " << o_.growth_interval << "), got "
                                                                      << s.growth_tracker);
    scale_ = s.scale;
    tracker_ = s.growth_tracker;
  }

 private:
  dynamic_scaling_options o_;
  std::int64_t tracker_ = 0;
};

static_assert(loss_scaler<no_scaling>);
static_assert(loss_scaler<static_scaling>);
static_assert(loss_scaler<dynamic_scaling>);

/// The scaler each policy needs: fp16's narrow range needs dynamic scaling; fp32 and bf16 (fp32's
/// exponent range) need none.
template <precision_policy P>
struct default_scaler {
  using type = no_scaling;
};
template <>
struct default_scaler<mixed<half>> {
  using type = dynamic_scaling;
};
template <precision_policy P>
using default_scaler_t = typename default_scaler<P>::type;

}  // namespace trainkit::amp
