// trainkit/optim/concepts.hpp - what the training loop asks of an optimizer and of a learning-rate
// schedule. Write your own model of either and it plugs into the same loop.
#pragma once

#include <concepts>  // std::convertible_to
#include <cstdint>   // std::int64_t

namespace trainkit::optim {

/// An optimizer updates its parameters in place from their gradients.
/// A model provides:
///   o.step()        one update from the current gradients (parameters without one are skipped);
///   o.zero_grad()   drops (or zeroes) the gradients of its parameters;
///   o.lr()          the current learning rate, as a double;
///   o.set_lr(lr)    sets it (learning-rate schedules drive it through this).
/// Models: sgd, adam, adamw.
template <class O>
concept optimizer = requires(O& o, const O& co, double lr) {
  o.step();
  o.zero_grad();
  { co.lr() } -> std::convertible_to<double>;
  o.set_lr(lr);
};

namespace detail {
/// The least an optimizer provides; lr_schedule is checked against it, so a schedule that only
/// uses the optimizer concept works with every optimizer.
struct optimizer_archetype {
  void step() {}
  void zero_grad() {}
  double lr() const { return 0.0; }
  void set_lr(double) {}
};
static_assert(optimizer<optimizer_archetype>);
}  // namespace detail

/// A learning-rate schedule: a pure function of the step number plus a step counter.
/// A model provides:
///   s.lr_at(k)        the learning rate for optimizer step k (k = 0 is the first step);
///   s.step(opt)       advances the counter by one and sets opt's learning rate to lr_at(counter);
///   S::state, s.get_state(), s.set_state(st)   the counter, for snapshots (resume is exact).
/// Models: step_lr, warmup_cosine_lr, cyclic_lr.
template <class S>
concept lr_schedule = requires(S& s, const S& cs, std::int64_t k, detail::optimizer_archetype& o) {
  { cs.lr_at(k) } -> std::convertible_to<double>;
  s.step(o);
  typename S::state;
  { cs.get_state() } -> std::convertible_to<typename S::state>;
  s.set_state(cs.get_state());
};

}  // namespace trainkit::optim
