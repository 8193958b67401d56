// trainkit/train/evaluate.hpp - classification accuracy of a model on held-out data, on whatever
// device the model lives on.
//
//   double acc = train::accuracy(*model, test.images, test.labels);                 // tensors
//   double acc = train::accuracy(*model, test_x, test_y, amp::module_forward<P>{});  // under P
//   test_loader.set_epoch(0);
//   double acc = train::accuracy(*model, test_loader);                              // a data_loader
//   auto r = train::evaluate(*model, test_loader, [](const auto& logits, const auto& y) {
//     return autograd::cross_entropy(logits, y); });
//   std::printf("test loss %.4f  accuracy %.2f%%\n", r.mean_loss(), 100 * r.accuracy());
//
// The model runs without recording a graph and in eval mode (dropout off, batch norm on its
// running statistics); its previous mode is restored afterwards, also when the forward throws.
// Predictions are compared with the labels and counted on the model's device: one number comes
// back to the host per call, not a vector per batch.
//
// A language model (train::token_model) is evaluated the same way on int64 token ids [B, T] with
// next-token labels [B, T]: accuracy and mean loss are then per token.
#pragma once

#include <concepts>  // std::convertible_to
#include <cstdint>   // std::int64_t
#include <limits>    // quiet_NaN
#include <type_traits>
#include <utility>   // std::forward
#include <vector>

#include "trainkit/autograd/grad_mode.hpp"  // no_grad
#include "trainkit/autograd/ops/shape.hpp"  // reshape: per-token logits flattened
#include "trainkit/autograd/var.hpp"        // var
#include "trainkit/config.hpp"              // TRAINKIT_HD
#include "trainkit/core/error.hpp"          // shape_error, TRAINKIT_CHECK
#include "trainkit/core/functors.hpp"       // functors::add
#include "trainkit/core/shape.hpp"          // index_t, to_string
#include "trainkit/core/tensor.hpp"         // tensor
#include "trainkit/ops/elementwise.hpp"     // map, apply_
#include "trainkit/ops/reduce.hpp"          // argmax, sum

namespace trainkit::train {

/// The plain forward: the model's own operator(). Any callable forward(model, var) -> logits var
/// can take its place, e.g. amp::module_forward<P> for linear and conv layers in P's compute type.
struct plain_forward {
  template <class Model, class X>
  auto operator()(Model& m, const X& x) const {
    if constexpr (requires { m(x); })
      return m(x);
    else
      return m.forward(x);  // a token model whose operator() is the base class's (var) one
  }
};

/// Correctly classified samples (tokens, for per-token labels) out of those seen.
struct eval_counts {
  std::int64_t correct = 0;
  std::int64_t total = 0;
  /// correct / total (0 for no samples).
  double accuracy() const noexcept { return total ? double(correct) / double(total) : 0.0; }
};

/// Accuracy and mean loss over the samples seen.
struct eval_result : eval_counts {
  double loss_sum = 0.0;  ///< sum over the batches of (mean loss of the batch) x (its labels)
  /// The mean loss per sample - per token for per-token labels (NaN for none).
  double mean_loss() const noexcept {
    return total ? loss_sum / double(total) : std::numeric_limits<double>::quiet_NaN();
  }
};

/// A range of labelled batches: iterating it yields objects with .x (inputs [B, ...]) and .y
/// (class indices [B], int64) - data::data_loader, data::batch_iterator, a vector of data::batch.
template <class R>
concept labelled_batch_range = requires(R& r) {
  { r.begin() != r.end() } -> std::convertible_to<bool>;
  { (*r.begin()).x.size(0) } -> std::convertible_to<index_t>;
  (*r.begin()).y;
};

namespace detail {

/// 1 where the two values are equal, else 0 (summed, it counts the matches).
struct equal_one {
  template <class A>
  TRAINKIT_HD A operator()(A a, A b) const {
    return a == b ? A(1) : A(0);
  }
};

/// Inputs [N, ...] with labels [N] (one class per sample) or [N, T, ...] (one per token), else a
/// shape_error.
template <class X, class Dx, class Dy>
void check_labels(const tensor<X, Dx>& x, const tensor<std::int64_t, Dy>& y) {
  TRAINKIT_CHECK(x.dim() >= 1 && y.dim() >= 1 && y.size(0) == x.size(0), shape_error, "train::accuracy",
                 "expected inputs [N, ...] and labels [N] or [N, T, ...]; got inputs "
                     << to_string(x.sizes()) << ", labels " << to_string(y.sizes()));
}

/// Eval mode and no graph for the lifetime of the object, then the model's previous mode.
template <class Model>
class eval_scope {
 public:
  explicit eval_scope(Model& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  eval_scope(const eval_scope&) = delete;
  eval_scope& operator=(const eval_scope&) = delete;
  ~eval_scope() { m_.train(was_training_); }

 private:
  Model& m_;
  bool was_training_;
  autograd::no_grad no_grad_;
};

/// One batch scored: the logits [M, classes] and the labels [M], both on the model's device (M:
/// the batch's samples, or its tokens for labels [B, T, ...]).
template <class D>
struct scored_batch {
  autograd::var<float, D> logits;
  tensor<std::int64_t, D> labels;
};

/// Runs the model on a batch - float inputs as a var, int64 token ids as they are (a
/// train::token_model) - and adds to `correct` (a one-element tensor on the model's device) how
/// many of its predictions are as `y` says: one per sample for labels [B] and logits [B, classes],
/// one per token for labels [B, T, ...] and logits [B, T, ..., classes]. Returns what it scored,
/// flattened to [M, classes] and [M], for a loss.
template <class Model, class Forward, class X, class Dx, class Dy>
scored_batch<typename Model::device_type> score_batch(Model& model, Forward& forward, const tensor<X, Dx>& x,
                                                      const tensor<std::int64_t, Dy>& y,
                                                      tensor<std::int64_t, typename Model::device_type>& correct) {
  using D = typename Model::device_type;
  static_assert(std::is_same_v<X, float> || std::is_same_v<X, std::int64_t>,
                "train::evaluate: inputs are float (a var) or int64 token ids");
  check_labels(x, y);
  autograd::var<float, D> logits;
  if constexpr (std::is_same_v<X, std::int64_t>)
    logits = forward(model, x.template to<D>().contiguous());
  else
    logits = forward(model, autograd::var<float, D>(x.template to<D>().contiguous()));
  bool ok = logits.dim() == y.dim() + 1;
  for (std::size_t i = 0; ok && i < y.dim(); ++i) ok = logits.size(index_t(i)) == y.size(index_t(i));
  TRAINKIT_CHECK(ok, shape_error, "train::accuracy",
                 "expected logits " << to_string(y.sizes()).substr(0, to_string(y.sizes()).size() - 1)
                                    << ", classes] for labels " << to_string(y.sizes()) << ", got "
                                    << to_string(logits.sizes()));
  auto labels = y.template to<D>().contiguous();
  if (y.dim() > 1) {
    logits = autograd::reshape(logits, {y.numel(), logits.size(-1)});
    labels = labels.reshape({y.numel()});
  }
  const auto pred = argmax(logits.value(), 1);                  // [M] class indices
  const auto hits = map(equal_one{}, pred, labels);             // [M] 1 where right
  apply_(functors::add{}, correct, sum(hits));                  // stays on the device
  return {std::move(logits), std::move(labels)};
}

}  // namespace detail

/// Counts the rows of x [N, ...] that the model classifies as y [N] says, `batch` rows at a time,
/// in eval mode without a graph (the previous mode is restored). x and y may be on the host or
/// on the model's device; each batch goes to the model's device.
/// \tparam Model an nn::module (device_type, is_training(), eval(), train(bool)) that forward runs
/// \tparam Forward forward(model, var) -> logits [B, classes]
template <class Model, class Forward = plain_forward, class X, class Dx, class Dy>
eval_counts count_correct(Model& model, const tensor<X, Dx>& x, const tensor<std::int64_t, Dy>& y,
                          Forward forward = {}, index_t batch = 1000) {
  TRAINKIT_CHECK(batch >= 1, value_error, "train::accuracy", "batch must be >= 1, got " << batch);
  detail::check_labels(x, y);
  detail::eval_scope<Model> scope(model);
  auto correct = tensor<std::int64_t, typename Model::device_type>::zeros({});
  for (index_t i = 0; i < x.size(0); i += batch) {
    const index_t end = i + batch < x.size(0) ? i + batch : x.size(0);
    detail::score_batch(model, forward, x.slice(0, i, end), y.slice(0, i, end), correct);
  }
  return {correct.item(), y.numel()};  // the one read-back (waits for the device)
}

/// Counts over every batch of a range (a data_loader: call set_epoch first, a finished pass
/// yields nothing), in eval mode without a graph (the previous mode is restored).
template <class Model, labelled_batch_range Batches, class Forward = plain_forward>
eval_counts count_correct(Model& model, Batches&& batches, Forward forward = {}) {
  detail::eval_scope<Model> scope(model);
  auto correct = tensor<std::int64_t, typename Model::device_type>::zeros({});
  std::int64_t total = 0;
  for (auto&& b : batches) {
    detail::score_batch(model, forward, b.x, b.y, correct);
    total += b.y.numel();
  }
  return {correct.item(), total};
}

/// Share of the rows of x [N, ...] classified as y [N] says (count_correct(...).accuracy()).
template <class Model, class Forward = plain_forward, class X, class Dx, class Dy>
double accuracy(Model& model, const tensor<X, Dx>& x, const tensor<std::int64_t, Dy>& y,
                Forward forward = {}, index_t batch = 1000) {
  return count_correct(model, x, y, std::move(forward), batch).accuracy();
}

/// Share of the samples of a range of batches classified as their labels say.
template <class Model, labelled_batch_range Batches, class Forward = plain_forward>
double accuracy(Model& model, Batches&& batches, Forward forward = {}) {
  return count_correct(model, std::forward<Batches>(batches), std::move(forward)).accuracy();
}

namespace detail {
/// acc + v * k: a batch's mean loss weighted by its samples, accumulated on the device.
struct add_weighted {
  float k;
  template <class A>
  TRAINKIT_HD A operator()(A acc, A v) const {
    return acc + v * A(k);
  }
};
}  // namespace detail

/// Accuracy and mean loss of the model over every batch of a range (a data_loader: call set_epoch
/// first), in eval mode without a graph (the previous mode is restored), under `forward` (e.g.
/// amp::module_forward<P>: the precision policy the model trains with). loss(logits, labels) is a
/// mean over the batch, as autograd::cross_entropy; the result weighs each batch by its labels,
/// so mean_loss() is the mean per sample - per token for labels [B, T] (a language model's nats per
/// token), where logits and labels reach loss flattened to [B T, classes] and [B T]. Two numbers
/// come back to the host per call.
/// \tparam Loss loss(var<float, D> logits [M, classes], tensor<int64, D> labels [M]) -> scalar var
template <class Model, labelled_batch_range Batches, class Loss, class Forward = plain_forward>
eval_result evaluate(Model& model, Batches&& batches, Loss loss, Forward forward = {}) {
  using D = typename Model::device_type;
  detail::eval_scope<Model> scope(model);
  auto correct = tensor<std::int64_t, D>::zeros({});
  auto loss_sum = tensor<float, D>::zeros({});
  std::int64_t total = 0;
  for (auto&& b : batches) {
    const auto scored = detail::score_batch(model, forward, b.x, b.y, correct);
    const auto l = loss(scored.logits, scored.labels).value();
    TRAINKIT_CHECK(l.numel() == 1, shape_error, "train::evaluate",
                   "the loss must be one number (a mean over the batch), got sizes " << to_string(l.sizes()));
    apply_(detail::add_weighted{static_cast<float>(b.y.numel())}, loss_sum, l.reshape({}));
    total += b.y.numel();
  }
  eval_result r;
  r.correct = correct.item();
  r.total = total;
  r.loss_sum = static_cast<double>(loss_sum.item());
  return r;
}

/// evaluate() over x [N, ...] and y [N] on the host or the model's device, `batch` rows at a time.
template <class Model, class Loss, class Forward = plain_forward, class X, class Dx, class Dy>
eval_result evaluate(Model& model, const tensor<X, Dx>& x, const tensor<std::int64_t, Dy>& y, Loss loss,
                     Forward forward = {}, index_t batch = 1000) {
  TRAINKIT_CHECK(batch >= 1, value_error, "train::evaluate", "batch must be >= 1, got " << batch);
  detail::check_labels(x, y);
  struct slice_batch {
    tensor<X, Dx> x;
    tensor<std::int64_t, Dy> y;
  };
  std::vector<slice_batch> batches;
  for (index_t i = 0; i < x.size(0); i += batch) {
    const index_t end = i + batch < x.size(0) ? i + batch : x.size(0);
    batches.push_back({x.slice(0, i, end), y.slice(0, i, end)});
  }
  return evaluate(model, batches, std::move(loss), std::move(forward));
}

}  // namespace trainkit::train
