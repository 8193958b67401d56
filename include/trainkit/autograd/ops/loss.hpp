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
}  // namespace functors

namespace detail {
/// What a class-index loss needs to know about its target after validation.
struct class_target_info {
  index_t n = 1, classes = 1, inner = 1;  // input viewed as [n, classes, inner]
  index_t count = 0;                      // targets that are not ignore_index
  shape out_sizes;                        // sizes of the per-sample loss (the target's)
};

/// Checks input [N, C, d...] (or [C]) against target [N, d...] (or []) with values in [0, C) or
/// ignore_index; `what` names the input in messages ("logits", "log_probs").
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
  // Validated on the host: a bad class index must be an exception naming it, not a wild read.
  const auto v = target.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == ignore_index) continue;
    TRAINKIT_CHECK(v[i] >= 0 && v[i] < info.classes, value_error, op,
                   "target " << v[i] << " at position " << to_string(unravel_index(expect, index_t(i)))
                             << " is out of range for " << info.classes << " classes (" << what << " of sizes "
                             << to_string(s) << ")");
    ++info.count;
  }
  return info;
}

/// The target distribution q laid out like the input [n, classes, inner]: `on` at the target
/// class, `off` elsewhere, zeros for ignored samples.
template <class T, class D>
tensor<T, D> target_distribution(const tensor<std::int64_t, D>& target, const class_target_info& info, double on,
                                 double off, index_t ignore_index, const shape& sizes) {
  const tensor<std::int64_t, D> t = target.contiguous();
  auto q = tensor<T, D>::empty(sizes);
  if (q.numel() > 0)
    backend::gather<D>::one_hot(t.data(), info.n, info.classes, info.inner, on, off, ignore_index, q.data());
  return q;
}

/// Folds per-sample losses [n, inner] (as out_sizes) by the reduction; mean divides by count.
template <class T, class D>
tensor<T, D> reduce_loss(const tensor<T, D>& per_sample, reduction r, index_t count) {
  switch (r) {
    case reduction::none: return per_sample;
    case reduction::sum: return trainkit::sum(per_sample);
    case reduction::mean:
      return count ? trainkit::sum(per_sample) * (1.0 / double(count))
                   : tensor<T, D>::full({}, T(std::numeric_limits<double>::quiet_NaN()));
  }
  return per_sample;
}

/// The output gradient g of a reduced loss broadcast back over [n, 1, inner] (scaled by
/// 1 / count for mean).
template <class T, class D>
tensor<T, D> expand_loss_grad(const tensor<T, D>& g, reduction r, index_t count, const class_target_info& info,
                              std::size_t input_dim) {
  if (r == reduction::none) {
    // [n, d...] -> [n, 1, d...] ([] -> [1] for an unbatched input).
    return input_dim == 1 ? g.reshape({1}) : g.unsqueeze(1);
  }
  (void)info;
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
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    const double eps = o.label_smoothing, c = double(info.classes);
    const auto q = detail::target_distribution<T>(target, info, 1.0 - eps + eps / c, eps / c, o.ignore_index,
                                                  log_probs.sizes());
    // w = sum_c q: 1 for a counted sample, 0 for an ignored one.
    const auto w = trainkit::sum(q, {log_probs.dim() == 1 ? index_t(0) : index_t(1)}, true);
    auto d = map(functors::softmax_minus_target{}, log_probs, q, w, "cross_entropy");
    return {d * detail::expand_loss_grad(g, o.reduce, info.count, info, log_probs.dim())};
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
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const {
    const auto q = detail::target_distribution<T>(target, info, -1.0, 0.0, o.ignore_index, input_sizes);
    return {q * detail::expand_loss_grad(g, o.reduce, info.count, info, input_sizes.size())};
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
/// in forward; backward is (softmax - smoothed one-hot) * g / count.
template <class T, class D>
var<T, D> cross_entropy(const var<T, D>& logits, const tensor<std::int64_t, D>& target, cross_entropy_options o = {}) {
  TRAINKIT_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0, value_error, "cross_entropy",
                 "label_smoothing must be in [0, 1], got " << o.label_smoothing);
  const auto info = detail::check_class_target(logits.value(), target, o.ignore_index, "cross_entropy", "logits");
  const detail::softmax_layout l{info.n, info.classes, info.inner};
  auto lp = detail::softmax_forward<true>(logits.value(), l);
  const double eps = o.label_smoothing, c = double(info.classes);
  const auto q = detail::target_distribution<T>(target, info, 1.0 - eps + eps / c, eps / c, o.ignore_index, lp.sizes());
  auto per_sample = trainkit::sum(map(functors::weighted_nll{}, q, lp, "cross_entropy"), {lp.dim() == 1 ? 0 : 1});
  auto out = detail::reduce_loss(per_sample.view(info.out_sizes), o.reduce, info.count);
  return record(ops::cross_entropy<T, D>{std::move(lp), target.contiguous(), info, o}, std::move(out), logits);
}

/// torch.nn.functional.nll_loss: log_probs [N, C] or [N, C, d...] (or [C]), target as in
/// cross_entropy; loss = -log_probs[target], averaged over the samples that are not ignored.
template <class T, class D>
var<T, D> nll_loss(const var<T, D>& log_probs, const tensor<std::int64_t, D>& target, nll_loss_options o = {}) {
  const auto info = detail::check_class_target(log_probs.value(), target, o.ignore_index, "nll_loss", "log_probs");
  const auto q = detail::target_distribution<T>(target, info, 1.0, 0.0, o.ignore_index, log_probs.sizes());
  auto per_sample =
      trainkit::sum(map(functors::weighted_nll{}, q, log_probs.value(), "nll_loss"), {log_probs.dim() == 1 ? 0 : 1});
  auto out = detail::reduce_loss(per_sample.view(info.out_sizes), o.reduce, info.count);
  return record(ops::nll_loss<T, D>{target.contiguous(), info, o, log_probs.sizes()}, std::move(out), log_probs);
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
