// trainkit/optim/schedule.hpp - what every learning-rate schedule shares: a step counter that a
// snapshot saves, and the two ways of handing the rate to an optimizer.
//
// A schedule is a pure function lr_at(k) of the optimizer step k (k = 0 is the first step) plus
// the counter k - or of the samples trained so far, when the loop advances it by each step's
// global batch (step(opt, samples)): the unit to use when the job may resume on another number of
// ranks. The loop is
//
//   sched.apply(opt);                      // lr_at(0) (or the resumed step's rate)
//   for (...) { ...backward...; opt.step(); sched.step(opt); }
//
// which gives torch's sequence: torch's scheduler sets lr_at(0) when it is built and each
// scheduler.step() after optimizer.step() moves to the next rate.
#pragma once

#include <cstdint>  // std::int64_t

#include "trainkit/core/error.hpp"
#include "trainkit/optim/concepts.hpp"

namespace trainkit::optim {

/// The counter of a schedule, for snapshots: the step whose rate is in effect.
struct schedule_state {
  std::int64_t step = 0;
  friend constexpr bool operator==(const schedule_state&, const schedule_state&) = default;
};

/// The counter and the optimizer hand-off shared by every schedule; Derived provides
/// `double lr_at(std::int64_t) const`.
/// \tparam Derived the schedule (CRTP)
template <class Derived>
class schedule_base {
 public:
  using state = schedule_state;

  /// Advances to the next step and sets its rate on opt.
  template <optimizer O>
  void step(O& opt) {
    step(opt, 1);
  }
  /// Advances the counter by `units` and sets the rate there. Counting samples (the global batch of
  /// each step: units = per-rank batch x ranks) makes the schedule a function of training
  /// progress: a job resumed on another number of ranks continues at the same rate for the same
  /// samples and ends where an uninterrupted run does (give warmup and total in samples too).
  template <optimizer O>
  void step(O& opt, std::int64_t units) {
    TRAINKIT_CHECK(units >= 0, value_error, "schedule::step", "cannot advance by " << units << " (< 0)");
    state_.step += units;
    opt.set_lr(current_lr());
  }
  /// Sets the rate of the current step on opt without advancing (start of training, resume).
  template <optimizer O>
  void apply(O& opt) const {
    opt.set_lr(current_lr());
  }

  std::int64_t current_step() const noexcept { return state_.step; }
  double current_lr() const { return static_cast<const Derived&>(*this).lr_at(state_.step); }

  const state& get_state() const noexcept { return state_; }
  void set_state(const state& s) {
    TRAINKIT_CHECK(s.step >= 0, value_error, "schedule::set_state", "the step must be >= 0, got " << s.step);
    state_ = s;
  }

 protected:
  schedule_base() = default;

 private:
  state state_;
};

}  // namespace trainkit::optim
