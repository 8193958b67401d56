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
#include "trainkit/amp/detail/scaler_core.hpp"
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
