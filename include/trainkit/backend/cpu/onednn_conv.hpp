// trainkit/backend/cpu/onednn_conv.hpp - convolution<cpu>'s passes through oneDNN primitives:
// conv2d forward, backward-data and backward-weights, float and bfloat16 (fp32 accumulation);
// double and half keep the built-in im2col kernels, as does anything oneDNN would only run on its
// reference implementation. The route between them: backend/cpu/onednn_route.hpp (TRAINKIT_CPU_CONV).
#pragma once

#include "trainkit/backend/cpu/onednn_context.hpp"  // TRAINKIT_HAS_ONEDNN, the engine, the primitive cache
#include "trainkit/backend/im2col.hpp"  // conv2d_geometry
#include "trainkit/core/dtype.hpp"       // dtype_name
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"

#if TRAINKIT_HAS_ONEDNN
#include <sstream>
#include <string>
#endif

#if TRAINKIT_HAS_ONEDNN

namespace trainkit::backend {

namespace detail {

inline onednn_cnn_key onednn_conv_key(onednn_cnn_op op, dnnl::memory::data_type type, const conv2d_geometry& g,
                                      index_t groups, index_t batch, index_t out_channels, bool bias) {
  return {op,
          type,
          {batch, g.channels, g.height, g.width, out_channels, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h,
           g.pad_w, g.dilation_h, g.dilation_w, groups, index_t(bias), 0}};
}

/// Creates the primitive of one convolution pass (key.op) into e. T: the element type.
template <class T>
void onednn_conv_create(onednn_cnn_entry& e, const onednn_cnn_key& key, const conv2d_geometry& g, index_t groups,
                        index_t batch, index_t out_channels, bool bias) {
  using dims = dnnl::memory::dims;
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  auto& eng = onednn_context::get().engine();
  const dt type = onednn_type<T>();
  const dims src_dims{batch, g.channels, g.height, g.width}, dst_dims{batch, out_channels, g.out_h, g.out_w};
  const dims w_dims = groups == 1 ? dims{out_channels, g.channels, g.kernel_h, g.kernel_w}
                                  : dims{groups, out_channels / groups, g.channels / groups, g.kernel_h, g.kernel_w};
  const tag w_tag = groups == 1 ? tag::oihw : tag::goihw;
  const dims strides{g.stride_h, g.stride_w}, dilates{g.dilation_h - 1, g.dilation_w - 1}, pad_l{g.pad_h, g.pad_w};
  const dims pad_r{onednn_pad_r(g.height, g.out_h, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h),
                   onednn_pad_r(g.width, g.out_w, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w)};
  const dnnl::memory::desc src_any(src_dims, type, tag::any), w_any(w_dims, type, tag::any),
      dst_any(dst_dims, type, tag::any), bias_md(dims{out_channels}, type, tag::x);
  const dnnl::memory::desc src_user(src_dims, type, tag::nchw), w_user(w_dims, type, w_tag),
      dst_user(dst_dims, type, tag::nchw);
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto attr = onednn_user_scratchpad();
  // The forward descriptor, also the hint of the backward ones (with the bias the forward call has).
  auto fwd_desc = [&](bool with_bias) {
    return with_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any, w_any, bias_md,
                                                       dst_any, strides, dilates, pad_l, pad_r)
                     : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any, w_any, dst_any,
                                                       strides, dilates, pad_l, pad_r);
  };
  switch (key.op) {
    case onednn_cnn_op::conv_forward: {
      const dnnl::convolution_forward::primitive_desc pd(fwd_desc(bias), attr, eng);
      e.inputs = {{DNNL_ARG_SRC, src_user}, {DNNL_ARG_WEIGHTS, w_user}};
      e.output = {DNNL_ARG_DST, dst_user};
      if (bias) e.direct = {{DNNL_ARG_BIAS, bias_md}};
      onednn_finish_entry(e, pd);
      if (e.supported) e.primitive = dnnl::convolution_forward(pd);
      break;
    }
    case onednn_cnn_op::conv_backward_data: {
      const dnnl::convolution_forward::primitive_desc hint(fwd_desc(false), eng);
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(algo, src_any, w_any, dst_any, strides, dilates, pad_l, pad_r), attr,
          eng, hint);
      e.inputs = {{DNNL_ARG_DIFF_DST, dst_user}, {DNNL_ARG_WEIGHTS, w_user}};
      e.output = {DNNL_ARG_DIFF_SRC, src_user};
      onednn_finish_entry(e, pd);
      if (e.supported) e.primitive = dnnl::convolution_backward_data(pd);
      break;
    }
    case onednn_cnn_op::conv_backward_weights: {
      const dnnl::convolution_forward::primitive_desc hint(fwd_desc(false), eng);
      // 16-bit inputs: the weight gradient is summed over the batch and kept in fp32, rounded to T
      // once by the reorder out.
      const dnnl::memory::desc gw_any(w_dims, dt::f32, tag::any);
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(algo, src_any, gw_any, dst_any, strides, dilates, pad_l, pad_r),
          attr, eng, hint);
      e.inputs = {{DNNL_ARG_SRC, src_user}, {DNNL_ARG_DIFF_DST, dst_user}};
      e.output = {DNNL_ARG_DIFF_WEIGHTS, w_user};
      onednn_finish_entry(e, pd);
      if (e.supported) e.primitive = dnnl::convolution_backward_weights(pd);
      break;
    }
    default: break;
  }
}

inline std::string onednn_conv_shapes(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels) {
  std::ostringstream s;
  s << "input [" << batch << ", " << g.channels << ", " << g.height << ", " << g.width << "], weight [" << out_channels
    << ", " << g.channels / groups << ", " << g.kernel_h << ", " << g.kernel_w << "], stride {" << g.stride_h << ", "
    << g.stride_w << "}, padding {" << g.pad_h << ", " << g.pad_w << "}, dilation {" << g.dilation_h << ", "
    << g.dilation_w << "}, groups " << groups;
  return s.str();
}

/// One convolution pass through oneDNN; false (nothing computed) where oneDNN has no kernel for
/// it. a, b: the pass's inputs in e.inputs order; out: its output (overwritten).
template <class T>
bool onednn_conv_pass(onednn_cnn_op op, const char* what, const conv2d_geometry& g, index_t groups, index_t batch,
                      index_t out_channels, const T* a, const T* b, const T* bias, T* out) {
  if constexpr (!onednn_cnn_type<T>) {
    return false;
  } else {
    const auto key = onednn_conv_key(op, onednn_type<T>(), g, groups, batch, out_channels, bias != nullptr);
    try {
      auto entry = onednn_cnn_cache::get().find(key, [&](onednn_cnn_entry& e) {
        onednn_conv_create<T>(e, key, g, groups, batch, out_channels, bias != nullptr);
      });
      if (!entry->supported) return false;
      if (bias) onednn_run(*entry, {a, b}, out, {const_cast<T*>(bias)});
      else onednn_run(*entry, {a, b}, out, {});
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, what,
                     dtype_name<T>() << " " << onednn_conv_shapes(g, groups, batch, out_channels) << ": " << e.what()
                                     << " (status " << int(e.status) << ")");
    }
    return true;
  }
}

}  // namespace detail

/// convolution<cpu>'s passes through oneDNN (backend/im2col.hpp has the contract); each returns
/// false, computing nothing, where oneDNN has no kernel for T or the shape.
template <class T>
bool onednn_conv2d_forward(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels, const T* x,
                           const T* w, const T* bias, T* y) {
  return detail::onednn_conv_pass<T>(detail::onednn_cnn_op::conv_forward, "conv2d forward (oneDNN)", g, groups, batch,
                                     out_channels, x, w, bias, y);
}
template <class T>
bool onednn_conv2d_backward_input(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                                  const T* gy, const T* w, T* gx) {
  return detail::onednn_conv_pass<T>(detail::onednn_cnn_op::conv_backward_data, "conv2d backward input (oneDNN)", g,
                                     groups, batch, out_channels, gy, w, static_cast<const T*>(nullptr), gx);
}
template <class T>
bool onednn_conv2d_backward_weight(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                                   const T* gy, const T* x, T* gw) {
  return detail::onednn_conv_pass<T>(detail::onednn_cnn_op::conv_backward_weights, "conv2d backward weight (oneDNN)",
                                     g, groups, batch, out_channels, x, gy, static_cast<const T*>(nullptr), gw);
}

/// The oneDNN implementation a convolution pass runs on ("" where none): tests, benchmarks.
template <class T>
std::string onednn_conv2d_impl(int pass, const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                               bool bias = false) {
  const auto op = detail::onednn_cnn_op(pass);
  const auto key = detail::onednn_conv_key(op, detail::onednn_type<T>(), g, groups, batch, out_channels, bias);
  auto entry = detail::onednn_cnn_cache::get().find(key, [&](detail::onednn_cnn_entry& e) {
    detail::onednn_conv_create<T>(e, key, g, groups, batch, out_channels, bias);
  });
  return entry->supported ? entry->impl : std::string();
}

}  // namespace trainkit::backend

#else  // no oneDNN: no pass runs there (convolution<cpu> takes its built-in kernels)

namespace trainkit::backend {
template <class T>
bool onednn_conv2d_forward(const conv2d_geometry&, index_t, index_t, index_t, const T*, const T*, const T*, T*) {
  return false;
}
template <class T>
bool onednn_conv2d_backward_input(const conv2d_geometry&, index_t, index_t, index_t, const T*, const T*, T*) {
  return false;
}
template <class T>
bool onednn_conv2d_backward_weight(const conv2d_geometry&, index_t, index_t, index_t, const T*, const T*, T*) {
  return false;
}
}  // namespace trainkit::backend

#endif  // TRAINKIT_HAS_ONEDNN
