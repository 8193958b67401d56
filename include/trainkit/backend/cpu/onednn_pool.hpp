// trainkit/backend/cpu/onednn_pool.hpp - pool<cpu>'s passes through oneDNN primitives: max
// pooling forward (with the argmax trainkit's backward scatters by), average pooling forward and
// backward, float and bfloat16. The route: backend/cpu/onednn_route.hpp (TRAINKIT_CPU_CONV).
#pragma once

#include "trainkit/backend/cpu/onednn_context.hpp"  // TRAINKIT_HAS_ONEDNN, the engine, the primitive cache
#include "trainkit/backend/pool.hpp"  // pool2d_geometry
#include "trainkit/core/dtype.hpp"     // dtype_name
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"

#if TRAINKIT_HAS_ONEDNN
#include <cmath>
#include <cstdint>
#include <cstring>  // std::memcpy
#include <limits>
#include <sstream>
#include <string>
#endif

#if TRAINKIT_HAS_ONEDNN

namespace trainkit::backend {

namespace detail {

inline onednn_cnn_key onednn_pool_key(onednn_cnn_op op, dnnl::memory::data_type type, const pool2d_geometry& g,
                                      index_t planes) {
  return {op,
          type,
          {planes, g.height, g.width, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.out_h, g.out_w}};
}

/// The planes are the channels of one image [1, planes, H, W] (plain NCHW: a blocked layout
/// would cost two reorders on a memory-bound op).
template <class T>
void onednn_pool_create(onednn_cnn_entry& e, onednn_cnn_op op, const pool2d_geometry& g, index_t planes) {
  using dims = dnnl::memory::dims;
  using tag = dnnl::memory::format_tag;
  auto& eng = onednn_context::get().engine();
  const auto type = onednn_type<T>();
  const dnnl::memory::desc src({1, planes, g.height, g.width}, type, tag::nchw),
      dst({1, planes, g.out_h, g.out_w}, type, tag::nchw);
  const dims strides{g.stride_h, g.stride_w}, kernel{g.kernel_h, g.kernel_w}, pad_l{g.pad_h, g.pad_w};
  const dims pad_r{onednn_pad_r(g.height, g.out_h, g.kernel_h, g.stride_h, g.pad_h, 1),
                   onednn_pad_r(g.width, g.out_w, g.kernel_w, g.stride_w, g.pad_w, 1)};
  // count_include_pad = true: the divisor is always kernel_h * kernel_w.
  const auto algo = op == onednn_cnn_op::max_pool_forward ? dnnl::algorithm::pooling_max
                                                          : dnnl::algorithm::pooling_avg_include_padding;
  const auto attr = onednn_user_scratchpad();
  const dnnl::pooling_forward::desc fwd(op == onednn_cnn_op::avg_pool_forward ? dnnl::prop_kind::forward_inference
                                                                              : dnnl::prop_kind::forward_training,
                                        algo, src, dst, strides, kernel, pad_l, pad_r);
  if (op == onednn_cnn_op::avg_pool_backward) {
    const dnnl::pooling_forward::primitive_desc hint(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, algo, src, dst, strides, kernel, pad_l, pad_r),
        eng);
    const dnnl::pooling_backward::primitive_desc pd(
        dnnl::pooling_backward::desc(algo, src, dst, strides, kernel, pad_l, pad_r), attr, eng, hint);
    e.inputs = {{DNNL_ARG_DIFF_DST, dst}};
    e.output = {DNNL_ARG_DIFF_SRC, src};
    onednn_finish_entry(e, pd);
    if (e.supported) e.primitive = dnnl::pooling_backward(pd);
    return;
  }
  const dnnl::pooling_forward::primitive_desc pd(fwd, attr, eng);
  e.inputs = {{DNNL_ARG_SRC, src}};
  e.output = {DNNL_ARG_DST, dst};
  if (op == onednn_cnn_op::max_pool_forward) {
    // The workspace holds, per output, the window position kh * kernel_w + kw of the winner, in
    // dst's (plain) layout: u8, or s32 for windows over 255 elements.
    const auto ws = pd.workspace_desc();
    const auto wt = ws.data_type();
    const std::size_t elem = wt == dnnl::memory::data_type::u8 ? 1 : wt == dnnl::memory::data_type::s32 ? 4 : 0;
    if (elem == 0 || ws.get_size() != std::size_t(planes * g.out_h * g.out_w) * elem) return;  // unknown: unsupported
    e.direct = {{DNNL_ARG_WORKSPACE, ws}};
  }
  onednn_finish_entry(e, pd);
  if (e.supported) e.primitive = dnnl::pooling_forward(pd);
}

inline std::string onednn_pool_shapes(const pool2d_geometry& g, index_t planes) {
  std::ostringstream s;
  s << planes << " planes of " << g.height << "x" << g.width << ", kernel {" << g.kernel_h << ", " << g.kernel_w
    << "}, stride {" << g.stride_h << ", " << g.stride_w << "}, padding {" << g.pad_h << ", " << g.pad_w << "}";
  return s.str();
}

template <class T>
std::shared_ptr<const onednn_cnn_entry> onednn_pool_entry(onednn_cnn_op op, const pool2d_geometry& g, index_t planes) {
  const auto key = onednn_pool_key(op, onednn_type<T>(), g, planes);
  return onednn_cnn_cache::get().find(key, [&](onednn_cnn_entry& e) { onednn_pool_create<T>(e, op, g, planes); });
}

/// Whether every element is finite (oneDNN's max pooling skips NaN and starts from the lowest
/// finite value; the built-in kernel, as PyTorch, lets a NaN win and returns -inf for -inf windows).
template <class T>
bool all_finite(const T* x, index_t n) {
  int bad = 0;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for simd reduction(| : bad) schedule(static) if (n >= (1 << 16))
#endif
  for (index_t i = 0; i < n; ++i) {
    const float v = float(x[i]);
    bad |= int(!(v - v == 0.0f));
  }
  return bad == 0;
}

}  // namespace detail

/// pool<cpu>'s passes through oneDNN (backend/pool.hpp has the contract); each returns false,
/// computing nothing, where oneDNN has no kernel for T or the shape. Max pooling backward stays
/// the built-in scatter of gy by argmax (what oneDNN's backward does with its workspace).
template <class T>
bool onednn_max_pool2d_forward(const pool2d_geometry& g, index_t planes, const T* x, T* y, std::int64_t* argmax) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (planes == 0 || !detail::all_finite(x, planes * g.height * g.width)) return false;
    try {
      auto entry = detail::onednn_pool_entry<T>(detail::onednn_cnn_op::max_pool_forward, g, planes);
      if (!entry->supported) return false;
      const auto& ws_md = entry->direct.front().second;
      detail::onednn_buffer ws;
      void* wp = ws.get(ws_md.get_size());
      detail::onednn_run(*entry, {x}, y, {wp});
      const bool u8 = ws_md.data_type() == dnnl::memory::data_type::u8;
      const index_t per = g.out_h * g.out_w;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (planes * per >= 32768)
#endif
      for (index_t p = 0; p < planes; ++p)
        for (index_t oh = 0; oh < g.out_h; ++oh)
          for (index_t ow = 0; ow < g.out_w; ++ow) {
            const index_t i = p * per + oh * g.out_w + ow;
            const index_t k = u8 ? index_t(static_cast<const std::uint8_t*>(wp)[i]) : index_t(static_cast<const std::int32_t*>(wp)[i]);
            argmax[i] = (oh * g.stride_h - g.pad_h + k / g.kernel_w) * g.width + (ow * g.stride_w - g.pad_w + k % g.kernel_w);
          }
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, "max_pool2d (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_pool_shapes(g, planes) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

template <class T>
bool onednn_avg_pool2d(bool backward, const pool2d_geometry& g, index_t planes, const T* in, T* out) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (planes == 0) return false;
    try {
      auto entry = detail::onednn_pool_entry<T>(
          backward ? detail::onednn_cnn_op::avg_pool_backward : detail::onednn_cnn_op::avg_pool_forward, g, planes);
      if (!entry->supported) return false;
      detail::onednn_run(*entry, {in}, out, {});
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, backward ? "avg_pool2d backward (oneDNN)" : "avg_pool2d (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_pool_shapes(g, planes) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

}  // namespace trainkit::backend

#endif  // TRAINKIT_HAS_ONEDNN
