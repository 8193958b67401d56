// trainkit/backend/cpu/onednn_batch_norm.hpp - norm<cpu>'s batch norm passes through oneDNN
// primitives (training and inference forward, backward), float and bfloat16 activations; the
// running statistics stay trainkit's. The route: backend/cpu/onednn_route.hpp (TRAINKIT_CPU_CONV).
#pragma once

#include "trainkit/backend/cpu/onednn_context.hpp"  // TRAINKIT_HAS_ONEDNN, the engine, the primitive cache
#include "trainkit/core/dtype.hpp"  // dtype_name
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"

#if TRAINKIT_HAS_ONEDNN
#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>
#endif

#if TRAINKIT_HAS_ONEDNN

namespace trainkit::backend {

namespace detail {

/// Whether a batch norm of X activations with W parameters goes to oneDNN now. A bf16 scope's
/// batch norm (bfloat16 activations, float parameters) takes oneDNN only on the onednn route: under
/// the automatic one the built-in kernel runs, which is faster than oneDNN's on plain nchw bf16
/// (benchmarks/README.md, "CPU routes").
template <class X, class W>
bool use_onednn_bnorm() {
  if constexpr (std::is_same_v<X, W>)
    return use_onednn_cnn<X>();
  else
    return onednn_cnn_type<X> && get_cpu_conv_route() == cpu_conv_route::onednn;
}

/// x viewed as [n, c, 1, s] (plain); scale and shift always given (1 and 0 without weight / bias).
template <class T>
void onednn_bnorm_create(onednn_cnn_entry& e, onednn_cnn_op op, index_t n, index_t c, index_t s, double eps) {
  using tag = dnnl::memory::format_tag;
  auto& eng = onednn_context::get().engine();
  const dnnl::memory::desc data({n, c, 1, s}, onednn_type<T>(), tag::nchw);
  const dnnl::memory::desc stat({c}, dnnl::memory::data_type::f32, tag::x);
  const bool global = op == onednn_cnn_op::bnorm_forward_inference || op == onednn_cnn_op::bnorm_backward_global_stats;
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  if (global) flags = flags | dnnl::normalization_flags::use_global_stats;
  const auto attr = onednn_user_scratchpad();
  e.inputs = {{DNNL_ARG_SRC, data}};
  if (op == onednn_cnn_op::bnorm_forward_training || op == onednn_cnn_op::bnorm_forward_inference) {
    const dnnl::batch_normalization_forward::primitive_desc pd(
        dnnl::batch_normalization_forward::desc(global ? dnnl::prop_kind::forward_inference
                                                       : dnnl::prop_kind::forward_training,
                                                data, float(eps), flags),
        attr, eng);
    e.output = {DNNL_ARG_DST, data};
    e.direct = {{DNNL_ARG_SCALE, stat}, {DNNL_ARG_SHIFT, stat}, {DNNL_ARG_MEAN, stat}, {DNNL_ARG_VARIANCE, stat}};
    onednn_finish_entry(e, pd);
    if (e.supported) e.primitive = dnnl::batch_normalization_forward(pd);
    return;
  }
  const dnnl::batch_normalization_forward::primitive_desc hint(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data, float(eps), flags), eng);
  const dnnl::batch_normalization_backward::primitive_desc pd(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, data, data, float(eps), flags), attr, eng,
      hint);
  e.inputs.push_back({DNNL_ARG_DIFF_DST, data});
  e.output = {DNNL_ARG_DIFF_SRC, data};
  e.direct = {{DNNL_ARG_MEAN, stat},
              {DNNL_ARG_VARIANCE, stat},
              {DNNL_ARG_SCALE, stat},
              {DNNL_ARG_SHIFT, stat},  // unread, but an argument of the primitive
              {DNNL_ARG_DIFF_SCALE, stat},
              {DNNL_ARG_DIFF_SHIFT, stat}};
  onednn_finish_entry(e, pd);
  if (e.supported) e.primitive = dnnl::batch_normalization_backward(pd);
}

template <class T>
std::shared_ptr<const onednn_cnn_entry> onednn_bnorm_entry(onednn_cnn_op op, index_t n, index_t c, index_t s, double eps) {
  index_t eps_bits = 0;
  static_assert(sizeof(eps_bits) == sizeof(eps));
  std::memcpy(&eps_bits, &eps, sizeof(eps));
  const onednn_cnn_key key{op, onednn_type<T>(), {n, c, s, eps_bits}};
  return onednn_cnn_cache::get().find(key, [&](onednn_cnn_entry& e) { onednn_bnorm_create<T>(e, op, n, c, s, eps); });
}

template <class T>
void onednn_affine_params(index_t c, const T* weight, const T* bias, std::vector<float>& scale, std::vector<float>& shift) {
  scale.resize(std::size_t(c));
  shift.resize(std::size_t(c));
  for (index_t ch = 0; ch < c; ++ch) {
    scale[std::size_t(ch)] = weight ? float(weight[ch]) : 1.0f;
    shift[std::size_t(ch)] = bias ? float(bias[ch]) : 0.0f;
  }
}

inline std::string onednn_bnorm_shapes(index_t n, index_t c, index_t s) {
  std::ostringstream o;
  o << "x viewed as [" << n << ", " << c << ", " << s << "]";
  return o.str();
}

}  // namespace detail

/// norm<cpu>'s batch norm passes through oneDNN (backend/norm.hpp has the contract): the
/// normalisation (biased variance) and its gradients are oneDNN's; the saved invstd and the
/// running statistics (unbiased variance, momentum) are computed here from oneDNN's fp32 mean and
/// variance. Each returns false, computing nothing, where oneDNN has no kernel for T or the shape
/// (or an empty batch).
template <class T, class W, class S>
bool onednn_batch_norm_train(const T* x, index_t n, index_t c, index_t s, const W* weight, const W* bias, double eps,
                             double momentum, W* running_mean, W* running_var, T* y, S* save_mean, S* save_invstd) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (n * s == 0 || c == 0) return false;
    try {
      auto entry = detail::onednn_bnorm_entry<T>(detail::onednn_cnn_op::bnorm_forward_training, n, c, s, eps);
      if (!entry->supported) return false;
      std::vector<float> scale, shift, mean(static_cast<std::size_t>(c)), var(static_cast<std::size_t>(c));
      detail::onednn_affine_params(c, weight, bias, scale, shift);
      detail::onednn_run(*entry, {x}, y, {scale.data(), shift.data(), mean.data(), var.data()});
      const double m = double(n * s);
      for (index_t ch = 0; ch < c; ++ch) {
        const double mu = mean[std::size_t(ch)], v = var[std::size_t(ch)];
        save_mean[ch] = S(mu);
        save_invstd[ch] = S(1.0 / std::sqrt(v + eps));
        if (running_mean) running_mean[ch] = W((1.0 - momentum) * double(running_mean[ch]) + momentum * mu);
        if (running_var) {
          const double unbiased = m > 1 ? v * m / (m - 1) : std::numeric_limits<double>::quiet_NaN();
          running_var[ch] = W((1.0 - momentum) * double(running_var[ch]) + momentum * unbiased);
        }
      }
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, "batch_norm (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_bnorm_shapes(n, c, s) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

template <class T, class W, class S>
bool onednn_batch_norm_eval(const T* x, index_t n, index_t c, index_t s, const W* weight, const W* bias,
                            const W* running_mean, const W* running_var, double eps, T* y, S* save_mean,
                            S* save_invstd) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (n * s == 0 || c == 0) return false;
    try {
      auto entry = detail::onednn_bnorm_entry<T>(detail::onednn_cnn_op::bnorm_forward_inference, n, c, s, eps);
      if (!entry->supported) return false;
      std::vector<float> scale, shift, mean(static_cast<std::size_t>(c)), var(static_cast<std::size_t>(c));
      detail::onednn_affine_params(c, weight, bias, scale, shift);
      for (index_t ch = 0; ch < c; ++ch) {
        mean[std::size_t(ch)] = float(running_mean[ch]);
        var[std::size_t(ch)] = float(running_var[ch]);
        save_mean[ch] = S(running_mean[ch]);
        save_invstd[ch] = S(1.0 / std::sqrt(double(running_var[ch]) + eps));
      }
      detail::onednn_run(*entry, {x}, y, {scale.data(), shift.data(), mean.data(), var.data()});
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, "batch_norm eval (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_bnorm_shapes(n, c, s) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

/// Needs dx (without it the built-in kernel's two sums are all there is to do). oneDNN wants the
/// variance and eps: it gets 1 / invstd^2 and eps = 0, the saved invstd being what the
/// gradient uses.
template <class T, class W, class S>
bool onednn_batch_norm_backward(const T* g, const T* x, index_t n, index_t c, index_t s, const W* weight,
                                const S* save_mean, const S* save_invstd, bool training, T* dx, W* dweight, W* dbias) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (!dx || n * s == 0 || c == 0) return false;
    try {
      auto entry = detail::onednn_bnorm_entry<T>(
          training ? detail::onednn_cnn_op::bnorm_backward : detail::onednn_cnn_op::bnorm_backward_global_stats, n, c, s,
          0.0);
      if (!entry->supported) return false;
      std::vector<float> scale, shift, mean(static_cast<std::size_t>(c)), var(static_cast<std::size_t>(c)), dscale(static_cast<std::size_t>(c)),
          dshift(static_cast<std::size_t>(c));
      detail::onednn_affine_params(c, weight, static_cast<const W*>(nullptr), scale, shift);
      for (index_t ch = 0; ch < c; ++ch) {
        const double is = double(save_invstd[ch]);
        mean[std::size_t(ch)] = float(save_mean[ch]);
        var[std::size_t(ch)] = float(1.0 / (is * is));
      }
      detail::onednn_run(*entry, {x, g}, dx, {mean.data(), var.data(), scale.data(), shift.data(), dscale.data(), dshift.data()});
      for (index_t ch = 0; ch < c; ++ch) {
        if (dweight) dweight[ch] = W(dscale[std::size_t(ch)]);
        if (dbias) dbias[ch] = W(dshift[std::size_t(ch)]);
      }
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, "batch_norm backward (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_bnorm_shapes(n, c, s) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

}  // namespace trainkit::backend

#endif  // TRAINKIT_HAS_ONEDNN
