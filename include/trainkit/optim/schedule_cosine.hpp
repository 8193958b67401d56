// trainkit/optim/schedule_cosine.hpp - linear warmup then cosine decay to a floor, the schedule of
// most transformer recipes (transformers' get_cosine_with_min_lr_schedule_with_warmup; with no
// warmup it is torch's CosineAnnealingLR up to total_steps).
#pragma once

#include <algorithm>  // std::min
#include <cmath>      // std::cos
#include <cstdint>    // std::int64_t
#include <numbers>    // std::numbers::pi

#include "trainkit/core/error.hpp"
#include "trainkit/optim/schedule.hpp"

namespace trainkit::optim {

/// Options of warmup_cosine_lr.
struct warmup_cosine_options {
  double base_lr = 1e-3;          // the peak, reached at the end of the warmup
  std::int64_t warmup_steps = 0;  // linear ramp from 0
  std::int64_t total_steps = 1;   // the step at which the rate reaches min_lr; > warmup_steps
  double min_lr = 0.0;            // the floor, kept after total_steps
};

/// lr_at(k) =
///   base_lr * k / warmup_steps                                     for k < warmup_steps,
///   min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2,  p = (k - warmup) / (total - warmup)
///                                                                  for warmup_steps <= k <= total,
///   min_lr                                                         after total_steps.
class warmup_cosine_lr : public schedule_base<warmup_cosine_lr> {
 public:
  explicit warmup_cosine_lr(const warmup_cosine_options& o) : o_(o) {
    TRAINKIT_CHECK(o.warmup_steps >= 0, value_error, "warmup_cosine_lr",
                   "warmup_steps must be >= 0, got " << o.warmup_steps);
    TRAINKIT_CHECK(
        o.total_steps > o.warmup_steps, value_error, "warmup_cosine_lr",
        "total_steps (" << o.total_steps << ") must exceed warmup_steps (" << o.warmup_steps << ")");
    TRAINKIT_CHECK(o.min_lr >= 0.0 && o.min_lr <= o.base_lr, value_error, "warmup_cosine_lr",
                   "need 0 <= min_lr <= base_lr, got min_lr = " << o.min_lr << ", base_lr = " << o.base_lr);
  }
  double lr_at(std::int64_t k) const {
    TRAINKIT_CHECK(k >= 0, value_error, "warmup_cosine_lr::lr_at", "step must be >= 0, got " << k);
    if (k < o_.warmup_steps)
      return o_.base_lr * static_cast<double>(k) / static_cast<double>(o_.warmup_steps);
    if (k >= o_.total_steps) return o_.min_lr;
    const double p =
        static_cast<double>(k - o_.warmup_steps) / static_cast<double>(o_.total_steps - o_.warmup_steps);
    return o_.min_lr + (o_.base_lr - o_.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  }
  const warmup_cosine_options& options() const noexcept { return o_; }

 private:
  warmup_cosine_options o_;
};

static_assert(lr_schedule<warmup_cosine_lr>);

}  // namespace trainkit::optim
