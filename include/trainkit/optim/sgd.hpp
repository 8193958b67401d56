// trainkit/optim/sgd.hpp - stochastic gradient descent with momentum, dampening, Nesterov and
// weight decay: torch.optim.SGD's update, step for step.
#pragma once

#include <cstddef>  // std::size_t
#include <cstdint>  // std::int64_t
#include <string>
#include <utility>  // std::move
#include <vector>

#include "trainkit/autograd/grad_mode.hpp"  // no_grad
#include "trainkit/autograd/var.hpp"
#include "trainkit/config.hpp"      // TRAINKIT_HD
#include "trainkit/core/dtype.hpp"  // compute_t
#include "trainkit/core/error.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/optim/fused.hpp"
#include "trainkit/optim/optimizer.hpp"

namespace trainkit::optim {

/// Hyper-parameters of sgd (torch.optim.SGD's, with its defaults).
struct sgd_options {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient as weight_decay * param
  bool nesterov = false;      // needs momentum > 0 and dampening == 0
  bool maximize = false;      // ascend instead of descend
};

namespace detail {
/// p -= lr * (g + wd * p), without momentum.
template <class T>
struct sgd_update {
  using C = compute_t<T>;
  C neg_lr, weight_decay;
  bool maximize;
  TRAINKIT_HD void operator()(T& p, const T& g) const {
    const C pv = static_cast<C>(p);
    C gv = static_cast<C>(g);
    if (maximize) gv = -gv;
    if (weight_decay != C(0)) gv = gv + weight_decay * pv;
    p = static_cast<T>(pv + neg_lr * gv);
  }
};
/// With momentum: buf = g on the first step, else momentum * buf + (1 - dampening) * g; then
/// p -= lr * (nesterov ? g + momentum * buf : buf).
template <class T>
struct sgd_momentum_update {
  using C = compute_t<T>;
  C neg_lr, weight_decay, momentum, one_minus_dampening;
  bool nesterov, maximize, first;
  TRAINKIT_HD void operator()(T& p, const T& g, T& buf) const {
    const C pv = static_cast<C>(p);
    C gv = static_cast<C>(g);
    if (maximize) gv = -gv;
    if (weight_decay != C(0)) gv = gv + weight_decay * pv;
    const C b = first ? gv : static_cast<C>(buf) * momentum + one_minus_dampening * gv;
    buf = static_cast<T>(b);
    const C bv = static_cast<C>(buf);  // torch reads the stored buffer back
    const C d = nesterov ? gv + momentum * bv : bv;
    p = static_cast<T>(pv + neg_lr * d);
  }
};
}  // namespace detail

/// SGD (torch.optim.SGD, one parameter group). Updates each parameter that has a gradient in one
/// fused pass; parameters whose gradient is undefined are skipped and their state is untouched.
///
///   optim::sgd opt(model.parameters(), {.lr = 0.1, .momentum = 0.9, .nesterov = true});
///
/// \tparam T element type of the parameters
/// \tparam Device device of the parameters
template <class T = float, class Device = cpu>
class sgd : public optimizer_base<T, Device> {
  using base = optimizer_base<T, Device>;

 public:
  using typename base::state_dict_type;
  using typename base::tensor_type;
  using typename base::var_type;
  using options = sgd_options;

  /// The buffers of one parameter: the momentum buffer, undefined until its first update with
  /// momentum (torch creates it lazily too).
  struct param_state {
    tensor_type momentum_buffer;
  };
  /// Everything that changes as training runs (a snapshot saves it; see also state_dict()).
  struct state {
    std::int64_t step = 0;  // calls of step()
    std::vector<param_state> params;
  };

  sgd(std::vector<var_type> params, options opts) : base(std::move(params), "sgd"), options_(opts) {
    validate(options_);
    state_.params.resize(this->params_.size());
  }
  explicit sgd(std::vector<var_type> params) : sgd(std::move(params), options{}) {}

  /// One update of every parameter that has a gradient.
  void step() {
    autograd::no_grad guard;
    const options& o = options_;
    const auto C = [](double v) { return static_cast<compute_t<T>>(v); };
    for (std::size_t i = 0; i < this->params_.size(); ++i) {
      var_type& p = this->params_[i];
      if (!p.has_grad()) continue;
      if (o.momentum != 0.0) {
        tensor_type& buf = state_.params[i].momentum_buffer;
        const bool first = !buf.defined();
        if (first) buf = tensor_type::empty(p.sizes());
        this->fused_step(p,
                         detail::sgd_momentum_update<T>{C(-o.lr), C(o.weight_decay), C(o.momentum),
                                                        C(1.0 - o.dampening), o.nesterov, o.maximize, first},
                         buf);
      } else {
        this->fused_step(p, detail::sgd_update<T>{C(-o.lr), C(o.weight_decay), o.maximize});
      }
    }
    ++state_.step;
  }

  double lr() const noexcept { return options_.lr; }
  void set_lr(double lr) {
    detail::check_lr(lr, "sgd::set_lr");
    options_.lr = lr;
  }
  const options& get_options() const noexcept { return options_; }
  void set_options(const options& o) {
    validate(o);
    options_ = o;
  }

  const state& get_state() const noexcept { return state_; }
  /// Replaces the state (a snapshot's); it must have one entry per parameter, buffers of the
  /// parameters' sizes.
  void set_state(state s) {
    TRAINKIT_CHECK(
        s.params.size() == this->params_.size(), value_error, "sgd::set_state",
        "state for " << s.params.size() << " parameters, the optimizer has " << this->params_.size());
    for (std::size_t i = 0; i < s.params.size(); ++i)
      if (s.params[i].momentum_buffer.defined())
        s.params[i].momentum_buffer = this->load_buffer(i, std::to_string(i) + ".momentum_buffer",
                                                        s.params[i].momentum_buffer, "sgd::set_state");
    state_ = std::move(s);
  }

  /// The state and hyper-parameters as named entries (see optimizer_state_dict). Tensors alias
  /// the optimizer's buffers.
  state_dict_type state_dict() const {
    state_dict_type sd;
    for (std::size_t i = 0; i < state_.params.size(); ++i)
      if (state_.params[i].momentum_buffer.defined())
        sd.tensors.emplace_back(std::to_string(i) + ".momentum_buffer", state_.params[i].momentum_buffer);
    sd.counters.emplace_back("step", state_.step);
    const options& o = options_;
    sd.scalars = {{"lr", o.lr},
                  {"momentum", o.momentum},
                  {"dampening", o.dampening},
                  {"weight_decay", o.weight_decay},
                  {"nesterov", o.nesterov ? 1.0 : 0.0},
                  {"maximize", o.maximize ? 1.0 : 0.0}};
    return sd;
  }

  /// Restores state_dict()'s output: hyper-parameters, counters and buffers (copied). Every
  /// entry is checked first; a failed load leaves the optimizer unchanged.
  void load_state_dict(const state_dict_type& sd) {
    constexpr const char* op = "sgd::load_state_dict";
    detail::check_scalar_names(sd.scalars,
                               {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"}, op);
    options o;
    o.lr = detail::find_scalar(sd.scalars, "lr", op);
    o.momentum = detail::find_scalar(sd.scalars, "momentum", op);
    o.dampening = detail::find_scalar(sd.scalars, "dampening", op);
    o.weight_decay = detail::find_scalar(sd.scalars, "weight_decay", op);
    o.nesterov = detail::find_scalar(sd.scalars, "nesterov", op) != 0.0;
    o.maximize = detail::find_scalar(sd.scalars, "maximize", op) != 0.0;
    validate(o);
    state s;
    s.params.resize(this->params_.size());
    bool have_step = false;
    for (const auto& [k, v] : sd.counters) {
      TRAINKIT_CHECK(k == "step", value_error, op, "unexpected counter '" << k << "' in the state dict");
      s.step = v;
      have_step = true;
    }
    TRAINKIT_CHECK(have_step, value_error, op, "the state dict has no 'step' counter");
    for (const auto& [k, t] : sd.tensors) {
      auto [i, name] = this->parse_key(k, op);
      TRAINKIT_CHECK(name == "momentum_buffer", value_error, op,
                     "unexpected key '" << k << "' in the state dict");
      TRAINKIT_CHECK(!s.params[i].momentum_buffer.defined(), value_error, op,
                     "key '" << k << "' appears twice");
      s.params[i].momentum_buffer = this->load_buffer(i, k, t, op);
    }
    options_ = o;
    state_ = std::move(s);
  }

 private:
  static void validate(const options& o) {
    detail::check_lr(o.lr, "sgd");
    TRAINKIT_CHECK(o.momentum >= 0.0, value_error, "sgd", "invalid momentum value: " << o.momentum);
    TRAINKIT_CHECK(o.weight_decay >= 0.0, value_error, "sgd",
                   "invalid weight_decay value: " << o.weight_decay);
    TRAINKIT_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), value_error, "sgd",
                   "nesterov momentum requires a momentum > 0 and zero dampening, got momentum = "
                       << o.momentum << ", dampening = " << o.dampening);
  }

  options options_;
  state state_;
};

template <class T, class D>
sgd(std::vector<autograd::var<T, D>>, sgd_options) -> sgd<T, D>;
template <class T, class D>
sgd(std::vector<autograd::var<T, D>>) -> sgd<T, D>;

}  // namespace trainkit::optim
