// trainkit/train/train_step.hpp - train_step<Model, Optimizer, Precision, Scaler, Recompute,
// Parallel>: one training step assembled from one model per policy axis:
//
//   forward      amp::forward<Precision>(model, x), through Recompute for an nn::sequential or a
//                module that names its segments (checkpoint::segmented_module)
//   loss         the caller's function of the output
//   backward     scaler.scale(loss / K).backward() (K = accumulation_steps, default 1; the first
//                K - 1 micro-batches of a step inside parallel.no_sync(): no communication)
//   ---- the rest on every K-th call only: one optimizer step per K micro-batches ----
//   reduce       parallel.finish()                 (data_parallel: average over the ranks)
//   unscale      scaler.unscale(opt) -> found_inf  (skipped for no_scaling)
//   clip         clip_grad_norm_(params, max_grad_norm), when set and the gradients are finite
//   step         scaler.step(opt): opt.step() unless found_inf; scaler.update()
//   schedule     sched.step(opt), when attached, after a step that was taken
//   metrics      training_metrics.observe(...), when given: all K micro-batches' samples, mean loss
//
// Gradient accumulation (PyTorch's `loss / K` loop, DeepSpeed's gradient_accumulation_steps):
// each call is one micro-batch; the gradients of the K losses, each divided by K, add up to the
// gradient of the mean loss over the K micro-batches - the gradient of the K-times batch when the
// loss is a mean over equally sized micro-batches (with unequal sizes, each micro-batch weighs
// 1/K regardless). The gradients are zeroed when a step begins (its first micro-batch), so
// after a step they stay readable until the next call.
//
//   train::train_step step(*model, opt, {.accumulation_steps = 4});
//   for (auto& mb : micro_batches) {
//     auto r = step(mb.x, [&](const var<float>& out) { return autograd::cross_entropy(out, mb.y); });
//     if (r.accumulating) continue;   // 3 of 4 calls; the 4th stepped (or skipped on inf)
//   }
//
// Every axis has a model that does nothing - fp32, no_scaling, store_all, no_parallel - and with
// all four the step is the hand-written loop (benchmarks/train_step_overhead.cpp measures it):
//
//   train::train_step step(*model, opt);                          // fp32, no_scaling, store_all
//   for (auto& b : batches) {
//     auto r = step(b.x, [&](const var<float>& out) { return autograd::cross_entropy(out, b.y); });
//   }
//
//   // bf16 autocast, sqrt(n) recomputation, DDP with int8 compression, clipping at 1.0:
//   train::train_step<nn::sequential<float>, optim::adamw<float>, amp::mixed_bf16, amp::no_scaling,
//                     checkpoint::sqrt_segments, parallel::data_parallel<dist::mpi, compression::int8>>
//       step(*model, opt, ddp, {.max_grad_norm = 1.0});
//
// A policy that does not model its concept stops the build with a static_assert naming the
// concept (tests/compile_fail/).
#pragma once

#include <chrono>
#include <cmath>  // std::isfinite
#include <concepts>
#include <cstdint>     // std::int64_t, std::uint64_t: samples and bytes of a step
#include <functional>  // the attached schedule
#include <limits>
#include <string>
#include <type_traits>
#include <typeinfo>  // typeid: the model named in an error
#include <utility>

#include "trainkit/amp/concepts.hpp"
#include "trainkit/amp/loss_scaler.hpp"
#include "trainkit/amp/module_forward.hpp"
#include "trainkit/amp/precision.hpp"
#include "trainkit/autograd/ops/arithmetic.hpp"  // mul: a micro-batch's loss / K
#include "trainkit/autograd/var.hpp"
#include "trainkit/backend/multi_tensor.hpp"  // whether clipping runs on the device (one read at the end)
#include "trainkit/checkpoint/concepts.hpp"
#include "trainkit/checkpoint/policies.hpp"
#include "trainkit/checkpoint/sequential.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/monitor/training_metrics.hpp"
#include "trainkit/nn/sequential.hpp"
#include "trainkit/optim/clip_grad.hpp"
#include "trainkit/optim/concepts.hpp"
#include "trainkit/train/concepts.hpp"

namespace trainkit::train {

/// Settings of train_step that are not policies.
struct train_step_options {
  double max_grad_norm = 0.0;  ///< clip the total 2-norm of the gradients to this; 0: no clipping
  monitor::training_metrics* metrics = nullptr;  ///< report each optimizer step here (optional)
  /// Micro-batches (calls) per optimizer step, >= 1: each loss is divided by it and the gradients
  /// accumulate; reduction, unscaling, clipping and the step run on every accumulation_steps-th call.
  int accumulation_steps = 1;
  /// Read the loss (and the clipped gradient norm) on the host into step_result every call. On a
  /// GPU that read is the step's one host synchronisation; false leaves both on the device
  /// (train_step::last_loss(), last_grad_norm()) and step_result::loss and grad_norm NaN, so that
  /// only a scaler's found-inf decision waits for the device. Ignored (read) with metrics.
  bool read_loss = true;
};

/// What one call did: one micro-batch, and the optimizer step when it was the last of its step.
struct step_result {
  /// This micro-batch's loss, unscaled and not divided by accumulation_steps; NaN when not read
  /// (train_step_options::read_loss).
  double loss = 0.0;
  /// The optimizer stepped; false on accumulating calls, and when an inf/NaN gradient made the
  /// scaler skip the step (found_inf).
  bool stepped = true;
  bool accumulating = false;  ///< only accumulated gradients: not the last micro-batch of its step
  int micro_step = 0;         ///< this micro-batch's place in its step: 0 .. accumulation_steps - 1
  /// An inf/NaN gradient was found: always false without scaling, and on accumulating calls (the
  /// check runs once per step, on its last micro-batch).
  bool found_inf = false;
  /// Before clipping; NaN when not clipped or not read (read_loss).
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  double learning_rate = 0.0;  ///< the rate the step used (accumulating: the rate it will use)
  double loss_scale = 1.0;     ///< the scale this micro-batch's backward used
  double seconds = 0.0;        ///< wall time of this call
};

namespace detail {
/// The parallel policy as train_step holds it: an empty policy by value, anything else (a
/// data_parallel: not copyable, shared with the caller) by pointer.
template <class P, bool = std::is_empty_v<P>>
struct parallel_holder {
  P value{};
  parallel_holder() = default;
  explicit parallel_holder(P& p) : value(p) {}
  P& get() noexcept { return value; }
};
template <class P>
struct parallel_holder<P, false> {
  P* ptr = nullptr;
  explicit parallel_holder(P& p) : ptr(&p) {}
  P& get() noexcept { return *ptr; }
};
template <class M>
concept sequential_model =
    std::derived_from<M, nn::sequential<typename M::value_type, typename M::device_type>>;
}  // namespace detail

/// One training step from six policies (see the top of this file). Holds references to the model,
/// the optimizer and a non-empty parallel policy (they must outlive it); the scaler and the
/// recompute policy are values inside it (scaler() gives access, e.g. for snapshots).
/// \tparam Model a train::step_model (an nn::module; nn::sequential for recompute policies)
/// \tparam Optimizer an optim::optimizer with params() (sgd, adam, adamw)
/// \tparam Precision an amp::precision_policy (fp32, mixed<half>, mixed<bfloat16>)
/// \tparam Scaler an amp::loss_scaler (no_scaling, static_scaling, dynamic_scaling)
/// \tparam Recompute a checkpoint::recompute_policy (store_all, every_n, sqrt_segments)
/// \tparam Parallel a train::parallel_policy (no_parallel, parallel::data_parallel<...>)
template <class Model, class Optimizer, class Precision = amp::fp32,
          class Scaler = amp::default_scaler_t<Precision>, class Recompute = checkpoint::store_all,
          class Parallel = no_parallel>
class train_step {
  static_assert(step_model<Model>,
                "train_step: Model does not satisfy trainkit::train::step_model (an nn::module<T, Device>)");
  static_assert(
      optim::optimizer<Optimizer>,
      "train_step: Optimizer does not satisfy trainkit::optim::optimizer (step, zero_grad, lr, set_lr)");
  static_assert(step_optimizer<Optimizer>,
                "train_step: Optimizer does not satisfy trainkit::train::step_optimizer (params())");
  static_assert(
      amp::precision_policy<Precision>,
      "train_step: Precision does not satisfy trainkit::amp::precision_policy (fp32, mixed<half>, ...)");
  static_assert(
      amp::loss_scaler<Scaler>,
      "train_step: Scaler does not satisfy trainkit::amp::loss_scaler (scale, unscale, step, update, "
      "get_scale, get_state/set_state)");
  static_assert(
      checkpoint::recompute_policy<Recompute>,
      "train_step: Recompute does not satisfy trainkit::checkpoint::recompute_policy (segments(n), name)");
  static_assert(parallel_policy<Parallel>,
                "train_step: Parallel does not satisfy trainkit::train::parallel_policy (finish())");
  static_assert(
      std::same_as<Recompute, checkpoint::store_all> || detail::sequential_model<Model> ||
          checkpoint::segmented_module<Model>,
      "train_step: a recompute policy other than store_all needs an nn::sequential model or a module that names its segments (checkpoint::segmented_module; the policy "
      "splits its layers into segments)");

 public:
  using model_type = Model;
  using optimizer_type = Optimizer;
  using precision_type = Precision;
  using scaler_type = Scaler;
  using recompute_type = Recompute;
  using parallel_type = Parallel;
  using T = typename Model::value_type;
  using Device = typename Model::device_type;
  using var_type = autograd::var<T, Device>;
  using tensor_type = tensor<T, Device>;
  using index_tensor = tensor<std::int64_t, Device>;  ///< token ids
  using norm_tensor_type = tensor<backend::multi_tensor_acc_t<T>, Device>;

  /// Single process (an empty Parallel policy such as no_parallel).
  // (clang-format 14 mangles a requires-clause before a mem-initializer list)
  // clang-format off
  train_step(Model& model, Optimizer& opt, train_step_options o = train_step_options(),
             Scaler scaler = Scaler(), Recompute recompute = Recompute())
    requires std::is_empty_v<Parallel> && std::default_initializable<Parallel>
      : model_(&model), opt_(&opt), options_(o), scaler_(std::move(scaler)), recompute_(std::move(recompute)) {
    validate();
  }
  // clang-format on
  /// With a parallel policy (a data_parallel over the model's parameters), held by reference.
  train_step(Model& model, Optimizer& opt, Parallel& parallel, train_step_options o = train_step_options(),
             Scaler scaler = Scaler(), Recompute recompute = Recompute())
      : model_(&model),
        opt_(&opt),
        options_(o),
        scaler_(std::move(scaler)),
        recompute_(std::move(recompute)),
        parallel_(parallel) {
    validate();
    // Lossy compression may turn an inf on one rank into different values on the others; the
    // OR over the ranks keeps every rank skipping the same steps.
    if constexpr (!std::same_as<Scaler, amp::no_scaling> && requires(Parallel & p, Scaler & s) {
                    { p.found_inf(true) } -> std::convertible_to<bool>;
                    s.set_found_inf_reducer([](bool b) { return b; });
                  }) {
      scaler_.set_found_inf_reducer([p = &parallel](bool local) { return p->found_inf(local); });
    }
  }
  train_step(const train_step&) = delete;
  train_step& operator=(const train_step&) = delete;

  /// Attaches a learning-rate schedule: sched.step(opt) after every step that was taken (a
  /// skipped step does not advance it, so lr_at(k) stays the rate of the k-th update). sched must
  /// outlive this object.
  template <optim::lr_schedule S>
  train_step& attach_schedule(S& sched) {
    schedule_ = [s = &sched](Optimizer& o) { s->step(o); };
    return *this;
  }

  /// The model's output for x under the precision and recompute policies (the step's forward).
  /// Under a mixed policy, a forward in which no op ran in the compute type is a usage_error naming
  /// the model: mixed precision never degrades to fp32 without a word.
  var_type forward(const var_type& x) {
    const auto before = autograd::autocast_op_count();
    var_type y;
    if constexpr (std::same_as<Recompute, checkpoint::store_all>)
      y = amp::forward<Precision>(*model_, x);
    else
      y = checkpoint::apply_recompute(recompute_, *model_, x, amp::module_forward<Precision>{});
    check_mixed_ran(before);
    return y;
  }

  /// The output of a model of token ids (train::token_model: e.g. nn::embedding first) for
  /// tokens [B, T] (int64, on the host or the model's device; an id out of range is an index_error
  /// naming it, from the embedding). A recompute policy other than store_all needs the model to
  /// name its segments after embed(tokens) (checkpoint::segmented_token_module).
  var_type forward(const index_tensor& tokens)
    requires token_model<Model>
  {
    const auto before = autograd::autocast_op_count();
    const index_tensor t = tokens.template to<Device>();
    var_type y;
    if constexpr (std::same_as<Recompute, checkpoint::store_all>) {
      y = amp::forward<Precision>(*model_, t);
    } else {
      static_assert(checkpoint::segmented_token_module<Model>,
                    "train_step: a recompute policy other than store_all on token inputs needs a model with "
                    "embed(tokens) and segments() (checkpoint::segmented_token_module)");
      y = checkpoint::apply_recompute(recompute_, *model_, t, amp::module_forward<Precision>{});
    }
    check_mixed_ran(before);
    return y;
  }

  /// One micro-batch on input x - a whole step when accumulation_steps is 1; loss_fn(output) -> var
  /// is the loss (e.g. cross_entropy against labels).
  template <class LossFn>
  requires std::invocable<LossFn&, const var_type&> step_result operator()(const var_type& x,
                                                                           LossFn&& loss_fn) {
    return step(x, loss_fn);
  }
  /// One micro-batch of token ids [B, T] (a train::token_model; see forward(tokens)).
  template <class LossFn>
    requires std::invocable<LossFn&, const var_type&> && token_model<Model>
  step_result operator()(const index_tensor& tokens, LossFn&& loss_fn) {
    return step(tokens, loss_fn);
  }
  /// One step on a tensor input (wrapped as a leaf that needs no gradient).
  template <class LossFn>
  requires std::invocable<LossFn&, const var_type&> step_result operator()(const tensor_type& x,
                                                                           LossFn&& loss_fn) {
    return (*this)(var_type(x), std::forward<LossFn>(loss_fn));
  }

  Model& model() noexcept { return *model_; }
  Optimizer& optimizer() noexcept { return *opt_; }
  Scaler& scaler() noexcept { return scaler_; }
  const Scaler& scaler() const noexcept { return scaler_; }
  Recompute& recompute() noexcept { return recompute_; }
  Parallel& parallel() noexcept { return parallel_.get(); }
  const train_step_options& options() const noexcept { return options_; }

  /// Whether the next call begins an optimizer step (no micro-batch is accumulated). Snapshots
  /// (model, optimizer, scaler, schedule) must be taken here: the gradients accumulated so far
  /// and the count of micro-batches are in no state dict, so a snapshot taken mid-step would
  /// resume with a step of the wrong size.
  bool at_step_boundary() const noexcept { return micro_ == 0; }
  /// Micro-batches accumulated toward the next optimizer step: 0 .. accumulation_steps - 1.
  int micro_step() const noexcept { return micro_; }

  /// The last call's loss (unscaled, not divided by accumulation_steps) as a 0-d tensor on the
  /// model's device: reading it (item()) is the caller's choice when read_loss is false.
  const tensor_type& last_loss() const noexcept { return last_loss_; }
  /// The gradient norm before clipping of the last step as a 0-d tensor on the device; undefined
  /// when the last call did not clip, or when the norm was read into step_result::grad_norm on a
  /// device that does not clip on the device (the host).
  const norm_tensor_type& last_grad_norm() const noexcept { return last_grad_norm_; }

 private:
  /// One micro-batch on x (a var, or token ids) - the body of operator().
  template <class Input, class LossFn>
  step_result step(const Input& x, LossFn& loss_fn) {
    const auto t0 = std::chrono::steady_clock::now();
    const int k = options_.accumulation_steps;
    step_result r;
    r.micro_step = micro_;
    r.accumulating = micro_ + 1 < k;
    r.learning_rate = opt_->lr();
    r.loss_scale = scaler_.get_scale();
    if (micro_ == 0) {
      cycle_ = {};
      cycle_.comm_before = parallel_figures();
      opt_->zero_grad();
    }

    const var_type out = forward(x);
    const var_type loss = loss_fn(out);
    // Divided by K, the K gradients add up to the mean's; K = 1 multiplies by nothing, so a plain
    // step stays bit for bit the hand-written loop.
    const var_type share = k == 1 ? loss : autograd::mul(loss, 1.0 / k);
    if (r.accumulating)
      backward_without_sync(share);
    else
      scaler_.scale(share).backward();
    last_loss_ = loss.value();
    last_grad_norm_ = norm_tensor_type();
    const bool read = options_.read_loss || options_.metrics != nullptr;
    // A device that clips without reading the norm (CUDA) reads loss and norm together at the end.
    const bool read_at_end = read && !r.accumulating && device_clip && options_.max_grad_norm > 0.0;
    r.loss = read && !read_at_end ? static_cast<double>(loss.item()) : std::numeric_limits<double>::quiet_NaN();
    cycle_.samples += x.dim() > 0 ? x.size(0) : 1;
    // Counted once backward is through: a micro-batch whose forward or backward threw can be retried.
    micro_ = r.accumulating ? micro_ + 1 : 0;
    if (r.accumulating) {
      cycle_.loss_sum += r.loss;
      r.stepped = false;
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      cycle_.seconds += r.seconds;
      return r;
    }

    parallel_.get().finish();
    if constexpr (!std::same_as<Scaler, amp::no_scaling>) r.found_inf = scaler_.unscale(*opt_);
    if (options_.max_grad_norm > 0.0 && !r.found_inf) {
      if (device_clip)
        last_grad_norm_ = optim::clip_grad_norm_tensor_(opt_->params(), options_.max_grad_norm);
      else if (read)
        r.grad_norm = optim::clip_grad_norm_(opt_->params(), options_.max_grad_norm);
      else
        last_grad_norm_ = optim::clip_grad_norm_tensor_(opt_->params(), options_.max_grad_norm);
    }
    if (read_at_end) read_loss_and_norm(r);
    cycle_.loss_sum += r.loss;
    r.stepped = scaler_.step(*opt_);
    scaler_.update();
    if (r.stepped && schedule_) schedule_(*opt_);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cycle_.seconds += r.seconds;

    if (options_.metrics != nullptr) {
      // One record per optimizer step: the time of its K calls (not what ran between them, such as
      // loading the next micro-batch), the samples of all K, the mean of their losses.
      const auto comm_after = parallel_figures();
      // Assigned field by field: nvcc's host pass rejects this designated initializer here.
      monitor::step_figures f;
      f.seconds = cycle_.seconds;
      f.samples = cycle_.samples;
      f.loss = cycle_.loss_sum / k;
      f.learning_rate = r.learning_rate;
      f.loss_scale = scaler_.get_scale();
      f.skipped = !r.stepped;
      f.communication_seconds = comm_after.first - cycle_.comm_before.first;
      f.bytes_sent = comm_after.second - cycle_.comm_before.second;
      f.grad_norm = r.grad_norm;  // NaN (not reported) without clipping
      options_.metrics->observe(f);
    }
    return r;
  }

  /// The mixed-precision check of forward (before: the autocast op count before it).
  void check_mixed_ran([[maybe_unused]] std::uint64_t before) const {
    if constexpr (Precision::is_mixed) {
      TRAINKIT_CHECK(autograd::autocast_op_count() != before, usage_error, "train_step",
                     "mixed precision " << Precision::name << " was requested, but no op of the model (" << model_name()
                                        << ") ran in " << Precision::name
                                        << ": its forward reached no linear, matmul or conv2d of trainkit::autograd "
                                           "(GEMMs on raw tensors stay fp32); train it with amp::fp32");
    }
  }

  std::string model_name() const {
    if constexpr (requires { model_->type_name(); })
      return std::string(model_->type_name());
    else
      return typeid(Model).name();
  }
  void validate() const {
    TRAINKIT_CHECK(options_.max_grad_norm >= 0.0 && std::isfinite(options_.max_grad_norm), value_error,
                   "train_step", "max_grad_norm must be finite and >= 0, got " << options_.max_grad_norm);
    TRAINKIT_CHECK(options_.accumulation_steps >= 1, value_error, "train_step",
                   "accumulation_steps must be >= 1, got " << options_.accumulation_steps);
  }
  /// Backward of a micro-batch that is not the last of its step: the gradients only accumulate.
  /// A policy with no_sync() (data_parallel) must not reduce them yet - nor count its buckets
  /// ready, which the last backward of the step does once; one without communicates in finish().
  void backward_without_sync(const var_type& loss) {
    if constexpr (parallel_policy_with_no_sync<Parallel>) {
      auto guard = parallel_.get().no_sync();
      scaler_.scale(loss).backward();
    } else {
      scaler_.scale(loss).backward();
    }
  }
  /// Whether clip_grad_norm_ runs as multi-tensor passes on the device without reading the norm.
  static constexpr bool device_clip = backend::multi_tensor<Device>::fused;

  /// Loss and gradient norm of the step in one copy to the host (one synchronisation).
  void read_loss_and_norm(step_result& r) const {
    if (!last_grad_norm_.defined()) {  // not clipped: found_inf
      r.loss = static_cast<double>(last_loss_.item());
      return;
    }
    auto both = tensor<double, Device>::empty({2});
    auto l = both.slice(0, 0, 1), n = both.slice(0, 1, 2);
    copy_(l, cast<double>(last_loss_));
    copy_(n, cast<double>(last_grad_norm_));
    const auto v = both.to_vector();
    r.loss = v[0];
    r.grad_norm = v[1];
  }

  /// (communication seconds, bytes sent) so far, for the per-step deltas; zeros without stats().
  std::pair<double, std::uint64_t> parallel_figures() {
    if constexpr (requires(Parallel & p) {
                    p.stats().comm_seconds;
                    p.stats().bytes_sent;
                  }) {
      if (options_.metrics == nullptr) return {0.0, 0};
      const auto s = parallel_.get().stats();
      return {static_cast<double>(s.comm_seconds), static_cast<std::uint64_t>(s.bytes_sent)};
    } else {
      return {0.0, 0};
    }
  }

  /// What the calls of the optimizer step in progress add up to (for its metrics record).
  struct cycle_figures {
    double seconds = 0.0;
    std::int64_t samples = 0;
    double loss_sum = 0.0;
    std::pair<double, std::uint64_t> comm_before{0.0, 0};
  };

  Model* model_;
  Optimizer* opt_;
  train_step_options options_;
  Scaler scaler_;
  Recompute recompute_;
  detail::parallel_holder<Parallel> parallel_;
  std::function<void(Optimizer&)> schedule_;
  int micro_ = 0;  // micro-batches of the step in progress done so far
  cycle_figures cycle_;
  tensor_type last_loss_;            // the last call's loss on the device
  norm_tensor_type last_grad_norm_;  // the last step's norm on the device (device clipping or !read_loss)
};

/// train_step with the precision chosen explicitly and the rest deduced:
///   auto step = train::make_train_step<amp::mixed_fp16>(*model, opt, {}, amp::dynamic_scaling{});
template <class Precision, class Model, class Optimizer, class Scaler = amp::default_scaler_t<Precision>,
          class Recompute = checkpoint::store_all>
train_step<Model, Optimizer, Precision, Scaler, Recompute> make_train_step(
    Model& model, Optimizer& opt, train_step_options o = train_step_options(), Scaler scaler = Scaler(),
    Recompute recompute = Recompute()) {
  return train_step<Model, Optimizer, Precision, Scaler, Recompute>(model, opt, o, std::move(scaler),
                                                                    std::move(recompute));
}

}  // namespace trainkit::train
