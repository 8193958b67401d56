// trainkit/amp/concepts.hpp - the two policy axes of mixed-precision training: the precision
// policy (which type the GEMMs run in) and the loss scaler (how small gradients survive fp16).
#pragma once

#include <concepts>  // std::same_as, std::convertible_to
#include <string_view>
#include <vector>

#include "trainkit/amp/autocast_list.hpp"
#include "trainkit/autograd/var.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::amp {

/// A precision policy: a small tag type, chosen at compile time (amp::linear<P>(...)).
/// A model provides:
///   P::compute_type                 the element type GEMM operands are rounded to (float for fp32);
///   P::master_type                  the type of parameters, gradients and the graph (float);
///   P::is_mixed                     true when compute_type is narrower than master_type;
///   P::name                         "fp32", "fp16", "bf16" (what --precision takes);
///   P::runs_in_compute_type(op)     constexpr: whether autocast_op op runs in compute_type.
/// Models: fp32, mixed<half>, mixed<bfloat16> (amp/precision.hpp).
template <class P>
concept precision_policy = requires {
  typename P::compute_type;
  typename P::master_type;
  { P::is_mixed } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<std::string_view>;
  { P::runs_in_compute_type(autocast_op::linear) } -> std::same_as<bool>;
}
&&floating_element<typename P::compute_type>&& floating_element<typename P::master_type>;

namespace detail {
/// The least a loss scaler may ask of what it unscales and steps: an optimizer with params().
struct scaled_optimizer_archetype {
  const std::vector<autograd::var<float>>& params() const { return params_; }
  void step() {}
  void zero_grad() {}
  double lr() const { return 0.0; }
  void set_lr(double) {}
  std::vector<autograd::var<float>> params_;
};
}  // namespace detail

/// A loss scaler multiplies the loss before backward so that small fp16 gradients do not flush
/// to zero, and divides the gradients again before the optimizer sees them.
/// A model provides:
///   s.scale(loss) -> var           the loss times the current scale (the var backward runs from);
///   s.unscale(opt) -> bool         divides opt's gradients by the scale in place and returns
///                                  whether any is inf/NaN (at most once per step);
///   s.step(opt) -> bool            unscales if not done yet, then calls opt.step() unless an
///                                  inf/NaN was found; returns whether it stepped;
///   s.update()                     ends the step (adjusts the scale of dynamic scalers);
///   s.get_scale() -> double        the current scale;
///   S::state, s.get_state(), s.set_state(st)   what a snapshot saves.
/// Models: no_scaling, static_scaling, dynamic_scaling (amp/loss_scaler.hpp).
template <class S>
concept loss_scaler = requires(S& s, const S& cs, const autograd::var<float>& loss,
                               detail::scaled_optimizer_archetype& o) {
  { cs.scale(loss) } -> std::same_as<autograd::var<float>>;
  { s.unscale(o) } -> std::same_as<bool>;
  { s.step(o) } -> std::same_as<bool>;
  s.update();
  { cs.get_scale() } -> std::convertible_to<double>;
  typename S::state;
  { cs.get_state() } -> std::convertible_to<typename S::state>;
  s.set_state(cs.get_state());
};

}  // namespace trainkit::amp
