// trainkit/nn/dropout.hpp - inverted dropout (torch.nn.Dropout): in training, zeroes each element
// with probability p and scales the rest by 1 / (1 - p); in eval, the identity.
#pragma once

#include "trainkit/autograd/ops/dropout.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// Dropout layer. Masks are drawn from gen (the default generator unless given), which must
/// outlive the layer; gradient checkpointing replays them by restoring gen's state.
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class dropout : public module<T, Device> {
 public:
  using typename module<T, Device>::var_type;

  explicit dropout(double p = 0.5, generator& gen = default_generator()) : p_(p), gen_(&gen) {
    TRAINKIT_CHECK(p >= 0.0 && p <= 1.0, value_error, "dropout", "probability must be in [0, 1], got " << p);
  }
  std::string_view type_name() const override { return "dropout"; }
  var_type forward(const var_type& x) override {
    return autograd::dropout(x, p_, this->is_training(), *gen_);
  }

  double p() const noexcept { return p_; }
  generator& rng() const noexcept { return *gen_; }

 private:
  double p_;
  generator* gen_;
};

}  // namespace trainkit::nn
