// trainkit/optim/schedule_cyclic.hpp - cyclical learning rates (Smith, 2017), with
// torch.optim.lr_scheduler.CyclicLR's formula and modes.
#pragma once

#include <cmath>     // std::floor, std::pow
#include <cstdint>   // std::int64_t
#include <optional>  // step_size_down defaults to step_size_up

#include "trainkit/core/error.hpp"
#include "trainkit/optim/schedule.hpp"

namespace trainkit::optim {

/// How the amplitude of each cycle changes.
///   triangular   constant amplitude;
///   triangular2  halved every cycle: scale 1 / 2^(cycle - 1);
///   exp_range    scale gamma^k with k the step (not the cycle).
enum class cyclic_mode { triangular, triangular2, exp_range };

/// Options of cyclic_lr (torch's defaults). The range depends on the optimizer: base 1e-3 and
/// max 0.1 are Smith's ranges for SGD with momentum; for Adam/AdamW take about a tenth of the rate
/// that trains well constant (e.g. base 1e-4, max 1e-3): SGD's range makes AdamW diverge. Find the range with an LR range test (rising rate, watch the loss).
struct cyclic_lr_options {
  double base_lr = 1e-3;
  double max_lr = 0.1;
  std::int64_t step_size_up = 2000;                 // steps from base_lr up to max_lr
  std::optional<std::int64_t> step_size_down = {};  // steps back down; step_size_up when unset
  cyclic_mode mode = cyclic_mode::triangular;
  double gamma = 1.0;  // exp_range's factor per step
};

/// lr_at(k) = base_lr + (max_lr - base_lr) * h(k) * scale, with h the triangular wave rising over
/// step_size_up steps and falling over step_size_down, computed exactly as CyclicLR.get_lr.
/// CyclicLR's momentum cycling (cycle_momentum) is not done here: this sets the rate only, so
/// compare with torch's cycle_momentum=False.
class cyclic_lr : public schedule_base<cyclic_lr> {
 public:
  explicit cyclic_lr(const cyclic_lr_options& o) : o_(o) {
    const std::int64_t down = o.step_size_down.value_or(o.step_size_up);
    TRAINKIT_CHECK(o.step_size_up >= 1 && down >= 1, value_error, "cyclic_lr",
                   "step_size_up and step_size_down must be >= 1, got " << o.step_size_up << " and " << down);
    TRAINKIT_CHECK(o.base_lr >= 0.0 && o.max_lr >= 0.0, value_error, "cyclic_lr",
                   "base_lr and max_lr must be >= 0, got " << o.base_lr << " and " << o.max_lr);
    TRAINKIT_CHECK(o.gamma > 0.0, value_error, "cyclic_lr", "gamma must be > 0, got " << o.gamma);
    total_size_ = static_cast<double>(o.step_size_up) + static_cast<double>(down);
    step_ratio_ = static_cast<double>(o.step_size_up) / total_size_;
  }
  double lr_at(std::int64_t k) const {
    TRAINKIT_CHECK(k >= 0, value_error, "cyclic_lr::lr_at", "step must be >= 0, got " << k);
    const double e = static_cast<double>(k);
    const double cycle = std::floor(1.0 + e / total_size_);
    const double x = 1.0 + e / total_size_ - cycle;
    const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1.0) / (step_ratio_ - 1.0);
    const double base_height = (o_.max_lr - o_.base_lr) * scale_factor;
    switch (o_.mode) {
      case cyclic_mode::triangular:
        return o_.base_lr + base_height * 1.0;
      case cyclic_mode::triangular2:
        return o_.base_lr + base_height * (1.0 / std::pow(2.0, cycle - 1.0));
      case cyclic_mode::exp_range:
        return o_.base_lr + base_height * std::pow(o_.gamma, e);
    }
    return o_.base_lr;
  }
  const cyclic_lr_options& options() const noexcept { return o_; }

 private:
  cyclic_lr_options o_;
  double total_size_ = 1.0;
  double step_ratio_ = 0.5;
};

static_assert(lr_schedule<cyclic_lr>);

}  // namespace trainkit::optim
