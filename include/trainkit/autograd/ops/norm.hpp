// trainkit/autograd/ops/norm.hpp - batch norm and layer norm (fused kernels, backend/norm.hpp).
#pragma once

#include <string_view>
#include <vector>

#include "trainkit/autograd/function.hpp"
#include "trainkit/autograd/saved.hpp"
#include "trainkit/autograd/ops/nn_detail.hpp"
#include "trainkit/backend/norm.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

namespace ops {
/// batch_norm's node. X is how the input is saved: saved_tensor<T, D> (the dense input, in 16 bits
/// when it holds 16-bit values), or tensor<bfloat16, D> for a var held in bfloat16 (CPU: the
/// result of the op before, kept as it is - no copy); the latter also takes a bf16 gradient and
/// writes the input's gradient in bf16. Statistics and parameter gradients in float/double.
template <class T, class D, class X = saved_tensor<T, D>>
struct batch_norm {
  static constexpr std::string_view name = "batch_norm";
  using stat_t = accumulate_t<T>;
  X xs;
  tensor<T, D> weight;  // undefined when affine = false
  tensor<stat_t, D> save_mean, save_invstd;
  shape x_sizes;
  index_t n = 0, c = 0, s = 0;
  bool training = true;
  int w_slot = -1, b_slot = -1;

  /// Whether X can be a float input kept in bf16 (the CPU's widened bf16 route).
  static constexpr bool may_keep_bf16 =
      std::is_same_v<X, saved_tensor<T, D>> && std::is_same_v<D, cpu> && std::is_same_v<T, float>;

  std::vector<tensor<T, D>> backward(const tensor<T, D>& grad, const std::vector<bool>& needs) const {
    auto f = run(grad.contiguous(), needs);
    std::vector<tensor<T, D>> r(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) r[i] = std::move(f[i].full);
    return r;
  }
  std::vector<grad_flow<T, D>> backward_flow(const grad_flow<T, D>& g, const std::vector<bool>& needs) const
    requires(std::is_same_v<X, tensor<bfloat16, D>> || may_keep_bf16)
  {
    if constexpr (std::is_same_v<X, tensor<bfloat16, D>>)
      return g.is_narrow() ? run(g.bf16.contiguous(), needs) : run(g.full.contiguous(), needs);
    else
      return run(g.widened().contiguous(), needs);
  }

 private:
  template <class G>
  std::vector<grad_flow<T, D>> run(const tensor<G, D>& g, const std::vector<bool>& needs) const {
    if constexpr (std::is_same_v<X, tensor<bfloat16, D>>) {
      return run(g, needs, xs);
    } else {
      // An input kept in bf16 holds bf16 values: the kernel reads the copy as it is (widening it
      // was a pass over every value) and rounds the input's gradient to bf16 as it writes it, as
      // PyTorch's batch norm returns a bf16 gradient for a bf16 input - tagged, so the GEMM before
      // does not round it again.
      if constexpr (may_keep_bf16)
        if (xs.bf16().defined()) return run(g, needs, xs.bf16(), true);
      return run(g, needs, xs.get());
    }
  }
  template <class G, class XT>
  std::vector<grad_flow<T, D>> run(const tensor<G, D>& g, const std::vector<bool>& needs, const XT& x,
                                   bool round_dx = false) const {
    std::vector<grad_flow<T, D>> r(needs.size());
    tensor<G, D> dx;
    tensor<T, D> dw, db;
    if (needs[0]) dx = tensor<G, D>::empty(x.sizes());
    if (w_slot >= 0 && needs[std::size_t(w_slot)]) dw = tensor<T, D>::empty({c});
    if (b_slot >= 0 && needs[std::size_t(b_slot)]) db = tensor<T, D>::empty({c});
    auto kernel = [&](auto... round) {
      backend::norm<D>::batch_norm_backward(g.data(), x.data(), n, c, s,
                                            ::trainkit::autograd::detail::data_or_null(weight), save_mean.data(),
                                            save_invstd.data(), training, dx.defined() ? dx.data() : nullptr,
                                            dw.defined() ? dw.data() : nullptr, db.defined() ? db.data() : nullptr,
                                            round...);
    };
    if constexpr (may_keep_bf16)
      kernel(round_dx);
    else
      kernel();
    if (dx.defined()) {
      if constexpr (std::is_same_v<G, bfloat16>)
        r[0] = grad_flow<T, D>::narrow(dx.view(x_sizes));
      else
        r[0] = grad_flow<T, D>(dx.view(x_sizes));
      r[0].bf16_values = round_dx;
    }
    if (dw.defined()) r[std::size_t(w_slot)] = grad_flow<T, D>(std::move(dw));
    if (db.defined()) r[std::size_t(b_slot)] = grad_flow<T, D>(std::move(db));
    return r;
  }
};

template <class T, class D>
struct layer_norm {
  static constexpr std::string_view name = "layer_norm";
  using stat_t = accumulate_t<T>;
  tensor<T, D> x, weight;
  tensor<stat_t, D> save_mean, save_rstd;
  shape x_sizes, w_sizes;
  index_t rows = 0, cols = 0;
  int w_slot = -1, b_slot = -1;

  std::vector<tensor<T, D>> backward(const tensor<T, D>& grad, const std::vector<bool>& needs) const {
    std::vector<tensor<T, D>> r(needs.size());
    const tensor<T, D> g = grad.contiguous();
    if (needs[0]) r[0] = tensor<T, D>::empty(x.sizes());
    if (w_slot >= 0 && needs[std::size_t(w_slot)]) r[std::size_t(w_slot)] = tensor<T, D>::empty(w_sizes);
    if (b_slot >= 0 && needs[std::size_t(b_slot)]) r[std::size_t(b_slot)] = tensor<T, D>::empty(w_sizes);
    auto ptr = [&](int slot) { return slot >= 0 && r[std::size_t(slot)].defined() ? r[std::size_t(slot)].data() : nullptr; };
    backend::norm<D>::layer_norm_backward(g.data(), x.data(), rows, cols, ::trainkit::autograd::detail::data_or_null(weight),
                                          save_mean.data(), save_rstd.data(), needs[0] ? r[0].data() : nullptr,
                                          ptr(w_slot), ptr(b_slot));
    if (needs[0]) r[0] = r[0].view(x_sizes);
    return r;
  }
};
}  // namespace ops

/// torch.nn.functional.batch_norm over x [N, C] or [N, C, *], per channel C.
/// training: normalises with the batch statistics (biased variance) and, when running_mean /
/// running_var are defined, updates them in place with `momentum` (unbiased variance, as
/// PyTorch does); eval: normalises with the running statistics (batch statistics when they are
/// undefined, like track_running_stats=False). weight/bias may be undefined (affine=false).
template <class T, class D>
var<T, D> batch_norm(const var<T, D>& x, const var<T, D>& weight, const var<T, D>& bias, tensor<T, D>& running_mean,
                     tensor<T, D>& running_var, bool training, double momentum = 0.1, double eps = 1e-5) {
  using stat_t = accumulate_t<T>;
  TRAINKIT_CHECK(x.dim() >= 2, shape_error, "batch_norm",
                 "input must be [N, C] or [N, C, *], got sizes " << to_string(x.sizes()));
  const index_t n = x.size(0), c = x.size(1), s = c && n ? x.numel() / (n * c) : 0;
  auto check_c = [&](const shape& sz, const char* what) {
    TRAINKIT_CHECK(sz.size() == 1 && sz[0] == c, shape_error, "batch_norm",
                   what << " of sizes " << to_string(sz) << " does not match the " << c
                        << " channels of the input of sizes " << to_string(x.sizes()));
  };
  if (weight.defined()) check_c(weight.sizes(), "weight");
  if (bias.defined()) check_c(bias.sizes(), "bias");
  TRAINKIT_CHECK(running_mean.defined() == running_var.defined(), usage_error, "batch_norm",
                 "running_mean and running_var must both be defined or both undefined");
  if (running_mean.defined()) {
    check_c(running_mean.sizes(), "running_mean");
    check_c(running_var.sizes(), "running_var");
  }
  TRAINKIT_CHECK(eps > 0 || eps == 0, value_error, "batch_norm", "eps must be >= 0, got " << eps);
  const bool use_batch = training || !running_mean.defined();
  if (use_batch)
    TRAINKIT_CHECK(n * s > 1, value_error, "batch_norm",
                   "expected more than 1 value per channel when training, got input sizes " << to_string(x.sizes()));

  const tensor<T, D> wv = weight.defined() ? weight.value().contiguous() : tensor<T, D>();
  const tensor<T, D> bv = bias.defined() ? bias.value().contiguous() : tensor<T, D>();
  auto save_mean = tensor<stat_t, D>::empty({c}), save_invstd = tensor<stat_t, D>::empty({c});
  // A training kernel run as kernel(running_mean*, running_var*): it updates the running
  // statistics in place, so it gets dense buffers, copied back when the caller's tensors are views.
  auto with_running = [&](auto kernel) {
    tensor<T, D> rm, rv;
    if (training && running_mean.defined()) {
      rm = running_mean.contiguous();
      rv = running_var.contiguous();
    }
    kernel(rm.defined() ? rm.data() : nullptr, rv.defined() ? rv.data() : nullptr);
    if (rm.defined() && !rm.shares_storage_with(running_mean)) copy_(running_mean, rm);
    if (rv.defined() && !rv.shares_storage_with(running_var)) copy_(running_var, rv);
  };
  // y for a dense input xv of X elements (T, or bfloat16 with float parameters).
  auto normalise = [&]<class X>(const tensor<X, D>& xv) {
    auto y = tensor<X, D>::empty(xv.sizes());
    if (use_batch) {
      with_running([&](T* rm, T* rv) {
        backend::norm<D>::batch_norm_train(xv.data(), n, c, s, detail::data_or_null(wv), detail::data_or_null(bv),
                                           eps, momentum, rm, rv, y.data(), save_mean.data(), save_invstd.data());
      });
    } else {
      const tensor<T, D> rm = running_mean.contiguous(), rv = running_var.contiguous();
      backend::norm<D>::batch_norm_eval(xv.data(), n, c, s, detail::data_or_null(wv), detail::data_or_null(bv),
                                        rm.data(), rv.data(), eps, y.data(), save_mean.data(), save_invstd.data());
    }
    return y;
  };
  detail::optional_inputs<T, D> in;
  in.add(x);
  const int ws = in.add(weight), bs = in.add(bias);
  if constexpr (std::is_same_v<D, cpu> && std::is_same_v<T, float>) {
    // Held in bfloat16 (the convolution before it ran in a bf16 scope): read and written in bf16,
    // as PyTorch's batch norm takes and returns a bf16 tensor.
    if (x.holds_bf16()) {
      const tensor<bfloat16, D> xb = x.value_bf16().contiguous();
      auto y = normalise(xb);
      return record_bf16(ops::batch_norm<T, D, tensor<bfloat16, D>>{xb, wv, save_mean, save_invstd, x.sizes(), n, c,
                                                                    s, use_batch, ws, bs},
                         std::move(y), in.list);
    }
    // bf16 values held in float (the CPU's widened bf16 route), in training with backward to come:
    // one kernel rounds x as it reads it (a convolution's deferred rounding), writes the bf16 copy
    // backward saves and rounds y as it writes it (norm<cpu>::batch_norm_train_bf16_values).
    if (x.precision() == value_precision::bfloat16 && use_batch && is_grad_enabled() &&
        backend::norm<D>::fuses_bf16_rounding()) {
      const tensor<T, D> xv =
          (x.rounding_deferred() == value_precision::bfloat16 ? x.value_unrounded() : x.value()).contiguous();
      auto keep = tensor<bfloat16, D>::empty(xv.sizes());
      auto y = tensor<T, D>::empty(xv.sizes());
      with_running([&](T* rm, T* rv) {
        backend::norm<D>::batch_norm_train_bf16_values(xv.data(), n, c, s, detail::data_or_null(wv),
                                                       detail::data_or_null(bv), eps, momentum, rm, rv, y.data(),
                                                       keep.data(), save_mean.data(), save_invstd.data());
      });
      ops::batch_norm<T, D> op{saved_tensor<T, D>::of_16bit(std::move(keep)), wv, save_mean, save_invstd, x.sizes(),
                               n, c, s, use_batch, ws, bs};
      auto out = record(std::move(op), std::move(y), in.list);
      out.set_precision(value_precision::bfloat16);
      return out;
    }
  }
  const tensor<T, D> xv = x.value().contiguous();
  auto y = normalise(xv);
  // 16-bit input values (a precision scope's convolution): the output is rounded to them, as
  // PyTorch's batch norm returns a bf16/fp16 tensor for one, and the input is saved in 16 bits.
  const value_precision p = x.precision();
  y = round_to_precision(std::move(y), p);
  ops::batch_norm<T, D> op{saved_tensor<T, D>::narrowed(xv, p), wv, save_mean, save_invstd, x.sizes(), n, c, s,
                           use_batch, ws, bs};
  auto out = record(std::move(op), std::move(y), in.list);
  out.set_precision(p);
  return out;
}

/// torch.nn.functional.layer_norm: normalises over the trailing dims given by normalized_shape
/// (biased variance), then scales by weight and shifts by bias (each of sizes normalized_shape,
/// or undefined).
template <class T, class D>
var<T, D> layer_norm(const var<T, D>& x, const shape& normalized_shape, const var<T, D>& weight = {},
                     const var<T, D>& bias = {}, double eps = 1e-5) {
  using stat_t = accumulate_t<T>;
  const shape& xs = x.sizes();
  bool ok = !normalized_shape.empty() && normalized_shape.size() <= xs.size();
  for (std::size_t i = 0; ok && i < normalized_shape.size(); ++i)
    ok = xs[xs.size() - normalized_shape.size() + i] == normalized_shape[i];
  TRAINKIT_CHECK(ok, shape_error, "layer_norm",
                 "normalized_shape " << to_string(normalized_shape) << " is not the trailing sizes of the input of sizes "
                                     << to_string(xs));
  if (weight.defined())
    TRAINKIT_CHECK(weight.sizes() == normalized_shape, shape_error, "layer_norm",
                   "weight of sizes " << to_string(weight.sizes()) << " does not match normalized_shape "
                                      << to_string(normalized_shape));
  if (bias.defined())
    TRAINKIT_CHECK(bias.sizes() == normalized_shape, shape_error, "layer_norm",
                   "bias of sizes " << to_string(bias.sizes()) << " does not match normalized_shape "
                                    << to_string(normalized_shape));
  const index_t cols = numel(normalized_shape), rows = cols ? x.numel() / cols : 0;
  const tensor<T, D> xv = x.value().contiguous();
  const tensor<T, D> wv = weight.defined() ? weight.value().contiguous() : tensor<T, D>();
  const tensor<T, D> bv = bias.defined() ? bias.value().contiguous() : tensor<T, D>();
  auto y = tensor<T, D>::empty(xs);
  auto save_mean = tensor<stat_t, D>::empty({rows}), save_rstd = tensor<stat_t, D>::empty({rows});
  backend::norm<D>::layer_norm_forward(xv.data(), rows, cols, detail::data_or_null(wv), detail::data_or_null(bv), eps,
                                       y.data(), save_mean.data(), save_rstd.data());
  detail::optional_inputs<T, D> in;
  in.add(x);
  const int ws = in.add(weight), bs = in.add(bias);
  ops::layer_norm<T, D> op{xv, wv, save_mean, save_rstd, xs, normalized_shape, rows, cols, ws, bs};
  return record(std::move(op), std::move(y), in.list);
}

}  // namespace trainkit::autograd
