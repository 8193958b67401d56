// trainkit/optim/schedule_step_lr.hpp - step decay: the rate drops by gamma every step_size steps
// (torch.optim.lr_scheduler.StepLR).
#pragma once

#include <cmath>    // std::pow
#include <cstdint>  // std::int64_t

#include "trainkit/core/error.hpp"
#include "trainkit/optim/schedule.hpp"

namespace trainkit::optim {

/// Options of step_lr.
struct step_lr_options {
  double base_lr = 0.1;
  std::int64_t step_size = 1;  // steps between decays, >= 1
  double gamma = 0.1;          // factor of each decay
};

/// lr_at(k) = base_lr * gamma^floor(k / step_size), StepLR's closed form.
class step_lr : public schedule_base<step_lr> {
 public:
  explicit step_lr(const step_lr_options& o) : o_(o) {
    TRAINKIT_CHECK(o.step_size >= 1, value_error, "step_lr", "step_size must be >= 1, got " << o.step_size);
    TRAINKIT_CHECK(o.base_lr >= 0.0, value_error, "step_lr", "base_lr must be >= 0, got " << o.base_lr);
    TRAINKIT_CHECK(o.gamma >= 0.0, value_error, "step_lr", "gamma must be >= 0, got " << o.gamma);
  }
  double lr_at(std::int64_t k) const {
    TRAINKIT_CHECK(k >= 0, value_error, "step_lr::lr_at", "step must be >= 0, got " << k);
    return o_.base_lr * std::pow(o_.gamma, static_cast<double>(k / o_.step_size));
  }
  const step_lr_options& options() const noexcept { return o_; }

 private:
  step_lr_options o_;
};

static_assert(lr_schedule<step_lr>);

}  // namespace trainkit::optim
