// trainkit/autograd/ops/loss.hpp - cross entropy (fused with log_softmax), negative log
// likelihood and mean squared error, with PyTorch's reduction, ignore_index and label smoothing.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "trainkit/autograd/function.hpp"
#include "trainkit/autograd/ops/nn_detail.hpp"
#include "trainkit/autograd/ops/softmax.hpp"
#include "trainkit/backend/gather.hpp"
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/ops/reduce.hpp"

namespace trainkit::autograd {

/// How a loss folds its per-sample values: keep them, average them, or add them up.
enum class reduction { none, mean, sum };

/// Options of cross_entropy (torch.nn.functional.cross_entropy's, without class weights).
struct cross_entropy_options {
  double label_smoothing = 0.0;  ///< eps: the target is (1 - eps) one-hot + eps / classes uniform
  reduction reduce = reduction::mean;
  index_t ignore_index = -100;   ///< samples with this target add nothing (mean is over the others)
};

/// Options of nll_loss (torch.nn.functional.nll_loss's, without class weights).
struct nll_loss_options {
  reduction reduce = reduction::mean;
  index_t ignore_index = -100;
};

namespace functors {
/// -q * l, with 0 where q is 0 (so a -inf log-probability of a class with no target mass
/// contributes 0, not NaN).
struct weighted_nll {
  template <class A>
  TRAINKIT_HD A operator()(A q, A l) const {
    return q == A(0) ? A(0) : -q * l;
  }
};
/// e^l * w - q: the gradient of cross entropy w.r.t. the logits, from log-softmax l, the
/// target distribution q and the sample's weight w (1, or 0 when ignored).
struct softmax_minus_target {
  template <class A>
  TRAINKIT_HD A operator()(A l, A q, A w) const {
    using std::exp;
    return exp(l) * w - q;
  }
};
/// 1 for a class index that is counted, 0 for ignore_index (in place: d is discarded).
struct counted_target {
  std::int64_t ignore_index;
  template <class A, class I>
  TRAINKIT_HD A operator()(A, I t) const {
    return t == I(ignore_index) ? A(0) : A(1);
  }
};
/// 1 / c, and 0 for c = 0 (the gradient scale of a mean over no counted sample).
struct reciprocal_or_zero {
  template <class A>
  TRAINKIT_HD A operator()(A c) const {
    return c == A(0) ? A(0) : A(1) / c;
  }
};
}  // namespace functors

namespace detail {
/// What a class-index loss needs to know about its target after validation.
struct class_target_info {
  index_t n = 1, classes = 1, inner = 1;  // input viewed as [n, classes, inner]
  index_t count = 0;                      // targets that are not ignore_index (when on_host)
  shape out_sizes;                        // sizes of the per-sample loss (the target's)
  /// The values were checked and counted on the host; otherwise the device checks them in the
  /// kernel that reads them (check) and the count is a device tensor (count_targets).
  bool on_host = true;
  backend::index_check check;
};

/// Checks input [N, C, d...] (or [C]) against target [N, d...] (or []) with values in [0, C) or
/// ignore_index; `what` names the input in messages ("logits", "log_probs"). On a device that
/// checks indices in its kernels (CUDA), only the sizes are checked here: the values are checked
/// by one_hot (target_distribution with report) and a bad one raised at the next host read.
template <class T, class D>
class_target_info check_class_target(const tensor<T, D>& input, const tensor<std::int64_t, D>& target,
                                     index_t ignore_index, const char* op, const char* what) {
  class_target_info info;
  const shape& s = input.sizes();
  TRAINKIT_CHECK(!s.empty(), shape_error, op, what << " must be [N, C] or [N, C, d...] (or [C]), got sizes []");
  shape expect;
  if (s.size() == 1) {
    info.classes = s[0];
  } else {
    info.n = s[0];
    info.classes = s[1];
    expect.push_back(s[0]);
    for (std::size_t i = 2; i < s.size(); ++i) {
      expect.push_back(s[i]);
      info.inner *= s[i];
    }
  }
  TRAINKIT_CHECK(target.sizes() == expect, shape_error, op,
                 "target of sizes " << to_string(target.sizes()) << " does not match " << what << " of sizes "
                                    << to_string(s) << " (expected target sizes " << to_string(expect) << ")");
  info.out_sizes = expect;
  info.check = backend::index_check::classes(op, what, info.classes, ignore_index, expect, s);
  if (backend::gather<D>::checks_on_device && backend::index_check::fits(expect, s)) {
    info.on_host = false;
    return info;
  }
  // Validated on the host: a bad class index must be an exception naming it, not a wild read.
  const auto v = target.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == ignore_index) continue;
    if (v[i] < 0 || v[i] >= info.classes)
      backend::throw_bad_index(info.check.kind, op, what, info.classes, v[i], index_t(i), expect, s);
    ++info.count;
  }
  return info;
}

/// The number of targets that are not ignore_index, as a 0-d tensor on the target's device (no
/// host read); undefined when info.on_host (info.count has it).
template <class T, class D>
tensor<T, D> count_targets(const tensor<std::int64_t, D>& target, const class_target_info& info,
                           index_t ignore_index) {
  if (info.on_host) return {};
  auto w = tensor<T, D>::zeros(target.sizes());
  if (w.numel() > 0) apply_(functors::counted_target{ignore_index}, w, target);
  return trainkit::sum(w);
}

/// The target distribution q laid out like the input [n, classes, inner]: `on` at the target
/// class, `off` elsewhere, zeros for ignored samples. report: a device that checks indices
/// records a bad target (the forward pass; backward reads the same targets again).
template <class T, class D>
tensor<T, D> target_distribution(const tensor<std::int64_t, D>& target, const class_target_info& info, double on,
                                 double off, index_t ignore_index, const shape& sizes, bool report = false) {
  const tensor<std::int64_t, D> t = target.contiguous();
  auto q = tensor<T, D>::empty(sizes);
  if (q.numel() > 0)
    backend::gather<D>::one_hot(t.data(), info.n, info.classes, info.inner, on, off, ignore_index, q.data(),
                                report && !info.on_host ? &info.check : nullptr);
  return q;
}

/// Folds per-sample losses [n, inner] (as out_sizes) by the reduction; mean divides by count, or
/// by the device count (count_targets) when it is defined.
template <class T, class D>
tensor<T, D> reduce_loss(const tensor<T, D>& per_sample, reduction r, index_t count,
                         const tensor<T, D>& device_count = {}) {
  switch (r) {
    case reduction::none: return per_sample;
    case reduction::sum: return trainkit::sum(per_sample);
    case reduction::mean:
      if (device_count.defined()) return trainkit::sum(per_sample) / device_count;  // 0 / 0: NaN
      return count ? trainkit::sum(per_sample) * (1.0 / double(count))
                   : tensor<T, D>::full({}, T(std::numeric_limits<double>::quiet_NaN()));
  }
  return per_sample;
}

/// The output gradient g of a reduced loss broadcast back over [n, 1, inner] (scaled by
/// 1 / count for mean, 0 when nothing is counted).
template <class T, class D>
tensor<T, D> expand_loss_grad(const tensor<T, D>& g, reduction r, index_t count, const class_target_info& info,
                              std::size_t input_dim, const tensor<T, D>& device_count = {}) {
  if (r == reduction::none) {
    // [n, d...] -> [n, 1, d...] ([] -> [1] for an unbatched input).
    return input_dim == 1 ? g.reshape({1}) : g.unsqueeze(1);
  }
  (void)info;
  if (r == reduction::mean && device_count.defined()) return g * map(functors::reciprocal_or_zero{}, device_count);
  tensor<T, D> s = r == reduction::mean ? g * (count ? 1.0 / double(count) : 0.0) : g;
  return s;  // 0-d: broadcasts against anything
}
}  // namespace detail

namespace ops {
/// Saves log_softmax(logits) and the target; backward = (softmax - q) * g / count.
template <class T, class D>
struct cross_entropy {
  static constexpr std::string_view name = "cross_entropy";
  tensor<T, D> log_probs;
  tensor<std::int64_t, D> target;
  detail::class_target_info info;
  cross_entropy_options o;
  tensor<T, D> count;  // 0-d on the device when !info.on_host and the reduction is mean
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    const double eps = o.label_smoothing, c = double(info.classes);
    const auto q = detail::target_distribution<T>(target, info, 1.0 - eps + eps / c, eps / c, o.ignore_index,
                                                  log_probs.sizes());
    // w = sum_c q: 1 for a counted sample, 0 for an ignored one.
    const auto w = trainkit::sum(q, {log_probs.dim() == 1 ? index_t(0) : index_t(1)}, true);
    auto d = map(functors::softmax_minus_target{}, log_probs, q, w, "cross_entropy");
    return {d * detail::expand_loss_grad(g, o.reduce, info.count, info, log_probs.dim(), count)};
  }
};

/// Gradient w.r.t. the log-probabilities: -q * g / count.
template <class T, class D>
struct nll_loss {
  static constexpr std::string_view name = "nll_loss";
  tensor<std::int64_t, D> target;
  detail::class_target_info info;
  nll_loss_options o;
  shape input_sizes;
  tensor<T, D> count;  // as in cross_entropy
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    const auto q = detail::target_distribution<T>(target, info, -1.0, 0.0, o.ignore_index, input_sizes);
    return {q * detail::expand_loss_grad(g, o.reduce, info.count, info, input_sizes.size(), count)};
  }
};

template <class T, class D>
struct mse_loss {
  static constexpr std::string_view name = "mse_loss";
  tensor<T, D> diff;  // a - b
  reduction reduce = reduction::mean;
  std::array<tensor<T, D>, 2> backward(const tensor<T, D>& g, const std::vector<bool>& needs) const {
    const double scale = reduce == reduction::mean ? (diff.numel() ? 2.0 / double(diff.numel()) : 0.0) : 2.0;
    const auto ga = diff * g * scale;  // g is 0-d unless reduction::none
    std::array<tensor<T, D>, 2> r;
    if (needs[0]) r[0] = ga;
    if (needs[1]) r[1] = -ga;
    return r;
  }
};
}  // namespace ops

/// torch.nn.functional.cross_entropy with class-index targets: logits [N, C] or [N, C, d...]
/// (or unbatched [C] with a 0-d target), target int64 [N] / [N, d...] with values in [0, C) or
/// ignore_index. loss = (1 - eps) * nll + eps * mean over classes of -log p (PyTorch's label
/// smoothing); mean reduction averages over the samples that are not ignored. One log_softmax
/// in forward; backward is (softmax - smoothed one-hot) * g / count. A target out of range is a
/// value_error naming it and its position: at once on the host; on a device that checks
/// indices in its kernels (CUDA), at the next read of a value on the host (item(), to_vector(),
/// gpu::check_device_errors()).
template <class T, class D>
var<T, D> cross_entropy(const var<T, D>& logits, const tensor<std::int64_t, D>& target, cross_entropy_options o = {}) {
  TRAINKIT_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0, value_error, "cross_entropy",
                 "label_smoothing must be in [0, 1], got " << o.label_smoothing);
  const auto info = detail::check_class_target(logits.value(), target, o.ignore_index, "cross_entropy", "logits");
  const detail::softmax_layout l{info.n, info.classes, info.inner};
  auto lp = detail::softmax_forward<true>(logits.value(), l);
  const double eps = o.label_smoothing, c = double(info.classes);
  const auto q =
      detail::target_distribution<T>(target, info, 1.0 - eps + eps / c, eps / c, o.ignore_index, lp.sizes(), true);
  auto per_sample = trainkit::sum(map(functors::weighted_nll{}, q, lp, "cross_entropy"), {lp.dim() == 1 ? 0 : 1});
  const auto count =
      o.reduce == reduction::mean ? detail::count_targets<T>(target, info, o.ignore_index) : tensor<T, D>{};
  auto out = detail::reduce_loss(per_sample.view(info.out_sizes), o.reduce, info.count, count);
  return record(ops::cross_entropy<T, D>{std::move(lp), target.contiguous(), info, o, count}, std::move(out), logits);
}

/// torch.nn.functional.nll_loss: log_probs [N, C] or [N, C, d...] (or [C]), target as in
/// cross_entropy; loss = -log_probs[target], averaged over the samples that are not ignored.
template <class T, class D>
var<T, D> nll_loss(const var<T, D>& log_probs, const tensor<std::int64_t, D>& target, nll_loss_options o = {}) {
  const auto info = detail::check_class_target(log_probs.value(), target, o.ignore_index, "nll_loss", "log_probs");
  const auto q = detail::target_distribution<T>(target, info, 1.0, 0.0, o.ignore_index, log_probs.sizes(), true);
  auto per_sample =
      trainkit::sum(map(functors::weighted_nll{}, q, log_probs.value(), "nll_loss"), {log_probs.dim() == 1 ? 0 : 1});
  const auto count =
      o.reduce == reduction::mean ? detail::count_targets<T>(target, info, o.ignore_index) : tensor<T, D>{};
  auto out = detail::reduce_loss(per_sample.view(info.out_sizes), o.reduce, info.count, count);
  return record(ops::nll_loss<T, D>{target.contiguous(), info, o, log_probs.sizes(), count}, std::move(out),
                log_probs);
}

/// torch.nn.functional.mse_loss: (a - b)^2, summed, averaged over every element, or kept. The
/// sizes must match (no broadcasting: a silently broadcast target is a classic bug).
template <class T, class D>
var<T, D> mse_loss(const var<T, D>& a, const var<T, D>& b, reduction r = reduction::mean) {
  TRAINKIT_CHECK(a.sizes() == b.sizes(), shape_error, "mse_loss",
                 "input of sizes " << to_string(a.sizes()) << " and target of sizes " << to_string(b.sizes())
                                   << " differ");
  auto diff = a.value() - b.value();
  auto sq = square(diff);
  tensor<T, D> out = r == reduction::none  ? sq
                     : r == reduction::sum ? trainkit::sum(sq)
                                           : trainkit::mean(sq);
  return record(ops::mse_loss<T, D>{std::move(diff), r}, std::move(out), a, b);
}

}  // namespace trainkit::autograd
