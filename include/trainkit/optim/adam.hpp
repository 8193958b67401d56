// trainkit/optim/adam.hpp - Adam (Kingma & Ba, 2015) with L2 weight decay, and AdamW (Loshchilov &
// Hutter, 2019) with decoupled weight decay: torch.optim.Adam's and AdamW's update, step for step.
#pragma once

#include <cmath>    // std::pow, std::sqrt
#include <optional>  // a group's weight decay
#include <cstddef>  // std::size_t
#include <cstdint>  // std::int64_t
#include <string>
#include <type_traits>  // std::is_same_v
#include <utility>  // std::move
#include <vector>

#include "trainkit/autograd/grad_mode.hpp"  // no_grad
#include "trainkit/autograd/var.hpp"
#include "trainkit/backend/cpu/vector_math.hpp"  // TRAINKIT_CPU_VECTOR_MATH: AVX2 lanes of the update
#include "trainkit/config.hpp"            // TRAINKIT_HD
#include "trainkit/core/dtype.hpp"        // compute_t
#include "trainkit/ops/elementwise.hpp"  // fill_
#include "trainkit/core/error.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/optim/fused.hpp"
#include "trainkit/optim/optimizer.hpp"

namespace trainkit::optim {

/// Hyper-parameters of adam (torch.optim.Adam's, with its defaults). weight_decay is L2: it is
/// added to the gradient before the moments, so it is scaled by the adaptive step.
struct adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;   // divide by the running maximum of the second moment
  bool maximize = false;  // ascend instead of descend
};

/// Hyper-parameters of adamw (torch.optim.AdamW's, with its defaults). weight_decay is
/// decoupled: the parameter shrinks by lr * weight_decay before the Adam step.
struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

namespace detail {
/// One Adam step of one element: torch's _single_tensor_adam, operation for operation.
template <class T>
struct adam_update {
  using C = compute_t<T>;
  C decay;         // 1 - lr * weight_decay (decoupled), else 1
  C weight_decay;  // L2 coefficient (coupled), else 0
  C one_minus_beta1, beta2, one_minus_beta2;
  C neg_step_size;  // -lr / (1 - beta1^t)
  C bc2_sqrt;       // sqrt(1 - beta2^t)
  C eps;
  bool decoupled, maximize;

  TRAINKIT_HD C moments(C& pv, const T& g, T& m, T& v) const {
    C gv = static_cast<C>(g);
    if (maximize) gv = -gv;
    if (decoupled)
      pv = pv * decay;
    else if (weight_decay != C(0))
      gv = gv + weight_decay * pv;
    // exp_avg.lerp_(grad, 1 - beta1), with torch's two-sided lerp formula
    const C mv = static_cast<C>(m);
    const C w = one_minus_beta1;
    const C mn = (w < C(0.5) && w > C(-0.5)) ? mv + w * (gv - mv) : gv - (gv - mv) * (C(1) - w);
    m = static_cast<T>(mn);
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value = 1 - beta2)
    const C vn = static_cast<C>(v) * beta2 + one_minus_beta2 * gv * gv;
    v = static_cast<T>(vn);
    return static_cast<C>(v);
  }
  TRAINKIT_HD void finish(T& p, C pv, const T& m, C vmax) const {
    using std::sqrt;
    const C denom = sqrt(vmax) / bc2_sqrt + eps;
    p = static_cast<T>(pv + neg_step_size * (static_cast<C>(m) / denom));
  }
  TRAINKIT_HD void operator()(T& p, const T& g, T& m, T& v) const {
    C pv = static_cast<C>(p);
    const C vn = moments(pv, g, m, v);
    finish(p, pv, m, vn);
  }
  /// amsgrad: vmax = max(vmax, v) divides instead of v.
  TRAINKIT_HD void operator()(T& p, const T& g, T& m, T& v, T& vmax) const {
    C pv = static_cast<C>(p);
    const C vn = moments(pv, g, m, v);
    const C old = static_cast<C>(vmax);
    const C mx = (old > vn || old != old) ? old : vn;
    vmax = static_cast<T>(mx);
    finish(p, pv, m, static_cast<C>(vmax));
  }
#if TRAINKIT_CPU_VECTOR_MATH
  // Eight float elements at once on the host's AVX2 lanes (the elementwise loop takes these where
  // they exist): the operations above, in their order and unfused, so the bits are the scalar
  // ones. The compiler cannot vectorise the scalar form: std::sqrt may set errno, a call that
  // stays in the loop unless the program is built with -fno-math-errno.
  [[gnu::target("avx2")]] void lanes8(float* p, const float* g, float* m, float* v) const
    requires std::is_same_v<T, float>
  {
    __m256 pv;
    const __m256 vn = moments8(p, g, m, v, pv);
    finish8(p, pv, m, vn);
  }
  [[gnu::target("avx2")]] void lanes8(float* p, const float* g, float* m, float* v, float* vmax) const
    requires std::is_same_v<T, float>
  {
    __m256 pv;
    const __m256 vn = moments8(p, g, m, v, pv);
    const __m256 old = _mm256_loadu_ps(vmax);
    // old > vn, or old is NaN: old; else vn
    const __m256 keep = _mm256_or_ps(_mm256_cmp_ps(old, vn, _CMP_GT_OQ), _mm256_cmp_ps(old, old, _CMP_UNORD_Q));
    const __m256 mx = _mm256_blendv_ps(vn, old, keep);
    _mm256_storeu_ps(vmax, mx);
    finish8(p, pv, m, mx);
  }

 private:
  [[gnu::target("avx2")]] __m256 moments8(const float* p, const float* g, float* m, float* v, __m256& pv) const
    requires std::is_same_v<T, float>
  {
    pv = _mm256_loadu_ps(p);
    __m256 gv = _mm256_loadu_ps(g);
    if (maximize) gv = _mm256_xor_ps(gv, _mm256_set1_ps(-0.0f));
    if (decoupled)
      pv = _mm256_mul_ps(pv, _mm256_set1_ps(decay));
    else if (weight_decay != C(0))
      gv = _mm256_add_ps(gv, _mm256_mul_ps(_mm256_set1_ps(weight_decay), pv));
    const __m256 mv = _mm256_loadu_ps(m), w = _mm256_set1_ps(one_minus_beta1), d = _mm256_sub_ps(gv, mv);
    const __m256 mn = (one_minus_beta1 < C(0.5) && one_minus_beta1 > C(-0.5))
                          ? _mm256_add_ps(mv, _mm256_mul_ps(w, d))
                          : _mm256_sub_ps(gv, _mm256_mul_ps(d, _mm256_set1_ps(C(1) - one_minus_beta1)));
    _mm256_storeu_ps(m, mn);
    const __m256 vn = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v), _mm256_set1_ps(beta2)),
                                    _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(one_minus_beta2), gv), gv));
    _mm256_storeu_ps(v, vn);
    return vn;
  }
  [[gnu::target("avx2")]] void finish8(float* p, __m256 pv, const float* m, __m256 vmax) const
    requires std::is_same_v<T, float>
  {
    const __m256 denom =
        _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vmax), _mm256_set1_ps(bc2_sqrt)), _mm256_set1_ps(eps));
    _mm256_storeu_ps(
        p, _mm256_add_ps(pv, _mm256_mul_ps(_mm256_set1_ps(neg_step_size), _mm256_div_ps(_mm256_loadu_ps(m), denom))));
  }
#endif
};

/// The state and step shared by adam and adamw; Options is adam_options or adamw_options.
template <class T, class Device, class Options, bool Decoupled>
class adam_family : public optimizer_base<T, Device> {
  using base = optimizer_base<T, Device>;

 public:
  using typename base::state_dict_type;
  using typename base::tensor_type;
  using typename base::var_type;
  using options = Options;

  /// The buffers of one parameter, created at its first update (as torch does): exp_avg and
  /// exp_avg_sq (and max_exp_avg_sq with amsgrad), and the number of updates it has received.
  struct param_state {
    std::int64_t step = 0;
    tensor_type exp_avg;
    tensor_type exp_avg_sq;
    tensor_type max_exp_avg_sq;
  };
  /// Everything that changes as training runs.
  struct state {
    std::int64_t step = 0;  // calls of step()
    std::vector<param_state> params;
  };

  /// One update of every parameter that has a gradient.
  void step() {
    autograd::no_grad guard;
    const Options& o = options_;
    const auto C = [](double v) { return static_cast<compute_t<T>>(v); };
    for (std::size_t i = 0; i < this->params_.size(); ++i) {
      var_type& p = this->params_[i];
      if (!p.has_grad()) continue;
      param_state& st = state_.params[i];
      if (!st.exp_avg.defined()) {
        st.exp_avg = tensor_type::zeros(p.sizes());
        st.exp_avg_sq = tensor_type::zeros(p.sizes());
      }
      if (o.amsgrad && !st.max_exp_avg_sq.defined()) st.max_exp_avg_sq = tensor_type::zeros(p.sizes());
      ++st.step;
      // The scalars in double, as torch computes them in Python floats.
      const double t = static_cast<double>(st.step);
      const double bc1 = 1.0 - std::pow(o.beta1, t);
      const double bc2 = 1.0 - std::pow(o.beta2, t);
      const double step_size = o.lr / bc1;
      const double bc2_sqrt = std::pow(bc2, 0.5);
      const double wd = decay_.empty() || !decay_[i] ? o.weight_decay : *decay_[i];  // the group's, if any
      const bool decay = wd != 0.0;
      const adam_update<T> f{C(Decoupled && decay ? 1.0 - o.lr * wd : 1.0),
                             C(!Decoupled ? wd : 0.0),
                             C(1.0 - o.beta1),
                             C(o.beta2),
                             C(1.0 - o.beta2),
                             C(-step_size),
                             C(bc2_sqrt),
                             C(o.eps),
                             Decoupled && decay,
                             o.maximize};
      if (o.amsgrad)
        this->fused_step(p, f, st.exp_avg, st.exp_avg_sq, st.max_exp_avg_sq);
      else
        this->fused_step(p, f, st.exp_avg, st.exp_avg_sq);
    }
    ++state_.step;
  }

  double lr() const noexcept { return options_.lr; }
  void set_lr(double lr) {
    check_lr(lr, name());
    options_.lr = lr;
  }
  const Options& get_options() const noexcept { return options_; }
  void set_options(const Options& o) {
    validate(o);
    options_ = o;
  }

  const state& get_state() const noexcept { return state_; }
  /// Replaces the state (a snapshot's): one entry per parameter, buffers of the parameters' sizes.
  void set_state(state s) {
    TRAINKIT_CHECK(
        s.params.size() == this->params_.size(), value_error, name(),
        "state for " << s.params.size() << " parameters, the optimizer has " << this->params_.size());
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      auto& ps = s.params[i];
      const std::string k = std::to_string(i);
      TRAINKIT_CHECK(ps.exp_avg.defined() == ps.exp_avg_sq.defined(), value_error, name(),
                     "parameter " << i << " has only one of exp_avg and exp_avg_sq");
      if (ps.exp_avg.defined()) ps.exp_avg = this->load_buffer(i, k + ".exp_avg", ps.exp_avg, name());
      if (ps.exp_avg_sq.defined())
        ps.exp_avg_sq = this->load_buffer(i, k + ".exp_avg_sq", ps.exp_avg_sq, name());
      if (ps.max_exp_avg_sq.defined())
        ps.max_exp_avg_sq = this->load_buffer(i, k + ".max_exp_avg_sq", ps.max_exp_avg_sq, name());
    }
    state_ = std::move(s);
  }

  /// The state and hyper-parameters as named entries (see optimizer_state_dict). Tensors alias
  /// the optimizer's buffers.
  state_dict_type state_dict() const {
    state_dict_type sd;
    sd.counters.emplace_back("step", state_.step);
    for (std::size_t i = 0; i < state_.params.size(); ++i) {
      const param_state& ps = state_.params[i];
      const std::string k = std::to_string(i);
      if (ps.step != 0 || ps.exp_avg.defined()) sd.counters.emplace_back(k + ".step", ps.step);
      if (ps.exp_avg.defined()) sd.tensors.emplace_back(k + ".exp_avg", ps.exp_avg);
      if (ps.exp_avg_sq.defined()) sd.tensors.emplace_back(k + ".exp_avg_sq", ps.exp_avg_sq);
      if (ps.max_exp_avg_sq.defined()) sd.tensors.emplace_back(k + ".max_exp_avg_sq", ps.max_exp_avg_sq);
    }
    const Options& o = options_;
    sd.scalars = {{"lr", o.lr},
                  {"beta1", o.beta1},
                  {"beta2", o.beta2},
                  {"eps", o.eps},
                  {"weight_decay", o.weight_decay},
                  {"amsgrad", o.amsgrad ? 1.0 : 0.0},
                  {"maximize", o.maximize ? 1.0 : 0.0}};
    return sd;
  }

  /// Restores state_dict()'s output (buffers copied). Every entry is checked first; a failed load
  /// leaves the optimizer unchanged.
  void load_state_dict(const state_dict_type& sd) {
    const char* op = name();
    check_scalar_names(sd.scalars, {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize"},
                       op);
    Options o;
    o.lr = find_scalar(sd.scalars, "lr", op);
    o.beta1 = find_scalar(sd.scalars, "beta1", op);
    o.beta2 = find_scalar(sd.scalars, "beta2", op);
    o.eps = find_scalar(sd.scalars, "eps", op);
    o.weight_decay = find_scalar(sd.scalars, "weight_decay", op);
    o.amsgrad = find_scalar(sd.scalars, "amsgrad", op) != 0.0;
    o.maximize = find_scalar(sd.scalars, "maximize", op) != 0.0;
    validate(o);
    state s;
    s.params.resize(this->params_.size());
    bool have_step = false;
    for (const auto& [k, v] : sd.counters) {
      if (k == "step") {
        s.step = v;
        have_step = true;
        continue;
      }
      auto [i, n] = this->parse_key(k, op);
      TRAINKIT_CHECK(n == "step", value_error, op, "unexpected counter '" << k << "' in the state dict");
      TRAINKIT_CHECK(v >= 0, value_error, op, "counter '" << k << "' is negative: " << v);
      s.params[i].step = v;
    }
    TRAINKIT_CHECK(have_step, value_error, op, "the state dict has no 'step' counter");
    for (const auto& [k, t] : sd.tensors) {
      auto [i, n] = this->parse_key(k, op);
      tensor_type* dst = n == "exp_avg"          ? &s.params[i].exp_avg
                         : n == "exp_avg_sq"     ? &s.params[i].exp_avg_sq
                         : n == "max_exp_avg_sq" ? &s.params[i].max_exp_avg_sq
                                                 : nullptr;
      TRAINKIT_CHECK(dst != nullptr, value_error, op, "unexpected key '" << k << "' in the state dict");
      TRAINKIT_CHECK(!dst->defined(), value_error, op, "key '" << k << "' appears twice");
      *dst = this->load_buffer(i, k, t, op);
    }
    for (std::size_t i = 0; i < s.params.size(); ++i)
      TRAINKIT_CHECK(s.params[i].exp_avg.defined() == s.params[i].exp_avg_sq.defined(), value_error, op,
                     "parameter " << i << " has only one of exp_avg and exp_avg_sq");
    options_ = o;
    state_ = std::move(s);
  }

 protected:
  adam_family(std::vector<var_type> params, const Options& opts)
      : base(std::move(params), name()), options_(opts) {
    validate(options_);
    state_.params.resize(this->params_.size());
  }
  adam_family(const std::vector<param_group<T, Device>>& groups, const Options& opts)
      : adam_family(flatten(groups), opts) {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto& wd = groups[g].weight_decay;
      TRAINKIT_CHECK(!wd || *wd >= 0.0, value_error, name(), "invalid weight_decay value in group " << g << ": " << *wd);
      for (std::size_t k = 0; k < groups[g].params.size(); ++k) decay_.push_back(wd);
    }
  }

 private:
  static std::vector<var_type> flatten(const std::vector<param_group<T, Device>>& groups) {
    std::vector<var_type> all;
    for (const auto& g : groups) all.insert(all.end(), g.params.begin(), g.params.end());
    return all;
  }
  static constexpr const char* name() { return Decoupled ? "adamw" : "adam"; }
  static void validate(const Options& o) {
    check_lr(o.lr, name());
    TRAINKIT_CHECK(o.eps >= 0.0, value_error, name(), "invalid epsilon value: " << o.eps);
    TRAINKIT_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, value_error, name(),
                   "invalid beta parameter at index 0: " << o.beta1 << " (must be in [0, 1))");
    TRAINKIT_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, value_error, name(),
                   "invalid beta parameter at index 1: " << o.beta2 << " (must be in [0, 1))");
    TRAINKIT_CHECK(o.weight_decay >= 0.0, value_error, name(),
                   "invalid weight_decay value: " << o.weight_decay);
  }

  Options options_;
  state state_;
  std::vector<std::optional<double>> decay_;  // per parameter, from its group
};
}  // namespace detail

/// Adam (torch.optim.Adam), L2 weight decay; parameter groups may have their own.
///
///   optim::adam opt(model.parameters(), {.lr = 3e-4, .beta2 = 0.99});
///
/// \tparam T element type of the parameters
/// \tparam Device device of the parameters
template <class T = float, class Device = cpu>
class adam : public detail::adam_family<T, Device, adam_options, false> {
  using family = detail::adam_family<T, Device, adam_options, false>;

 public:
  using typename family::var_type;
  explicit adam(std::vector<var_type> params, const adam_options& opts = {})
      : family(std::move(params), opts) {}
  /// Parameter groups with their own weight decay (their order is the parameters' order).
  explicit adam(const std::vector<param_group<T, Device>>& groups, const adam_options& opts = {})
      : family(groups, opts) {}
};

/// AdamW (torch.optim.AdamW), decoupled weight decay (default 0.01); parameter groups may have
/// their own weight decay.
///
///   optim::adamw opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
///
/// \tparam T element type of the parameters
/// \tparam Device device of the parameters
template <class T = float, class Device = cpu>
class adamw : public detail::adam_family<T, Device, adamw_options, true> {
  using family = detail::adam_family<T, Device, adamw_options, true>;

 public:
  using typename family::var_type;
  explicit adamw(std::vector<var_type> params, const adamw_options& opts = {})
      : family(std::move(params), opts) {}
  /// Parameter groups with their own weight decay (their order is the parameters' order):
  ///   optim::adamw opt(optim::decay_groups(model.named_parameters(), 0.1), {.lr = 3e-4});
  explicit adamw(const std::vector<param_group<T, Device>>& groups, const adamw_options& opts = {})
      : family(groups, opts) {}
};

template <class T, class D>
adam(std::vector<autograd::var<T, D>>, const adam_options& = {}) -> adam<T, D>;
template <class T, class D>
adamw(std::vector<autograd::var<T, D>>, const adamw_options& = {}) -> adamw<T, D>;
template <class T, class D>
adam(std::vector<param_group<T, D>>, const adam_options& = {}) -> adam<T, D>;
template <class T, class D>
adamw(std::vector<param_group<T, D>>, const adamw_options& = {}) -> adamw<T, D>;

}  // namespace trainkit::optim
