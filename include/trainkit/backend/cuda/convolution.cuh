// trainkit/backend/cuda/convolution.cuh - convolution<cuda> through cuDNN (forward, backward data,
// backward filter) and im2col<cuda> (unfold/fold as our own kernels).
//
// Each shape gets a plan: the descriptors plus, per pass, the algorithm chosen once - the first
// one of cuDNN's heuristic (or, with settings().cudnn_benchmark, of its timed search) whose
// workspace fits settings().cudnn_workspace_limit, that is deterministic when
// settings().deterministic asks for it, and that does not use TF32 for fp32 data unless
// settings().allow_tf32. Plans are cached per thread and device; the key holds every setting,
// so changing one picks again. Workspaces come from the caching allocator on the current stream.
#pragma once

#include <cudnn.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>

#include "trainkit/backend/cuda/allocator.cuh"
#include "trainkit/backend/cuda/cudnn.cuh"
#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/reduce.cuh"
#include "trainkit/backend/cuda/settings.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/im2col.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/reducers.hpp"  // reducers::sum

namespace trainkit::backend {

namespace gpu::detail {

struct conv_key {
  cudnnDataType_t type;
  index_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool tf32, deterministic, benchmark;
  std::size_t limit;
  bool operator==(const conv_key&) const = default;
};
struct conv_key_hash {
  std::size_t operator()(const conv_key& k) const noexcept {
    std::size_t h = std::size_t(k.type) + 0x9e3779b97f4a7c15ull;
    for (index_t v : {k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, k.sh, k.sw, k.ph, k.pw, k.dh, k.dw, k.groups,
                      index_t(k.tf32), index_t(k.deterministic), index_t(k.benchmark), index_t(k.limit)})
      h = (h ^ std::hash<index_t>{}(v)) * 1099511628211ull;
    return h;
  }
};

template <class Algo>
struct chosen_algo {
  bool ready = false;
  Algo algo{};
  std::size_t workspace = 0;
};

struct conv_plan {
  tensor_desc x, y, bias;
  filter_desc w;
  conv_desc fwd_desc, data_desc, filter_desc_;
  chosen_algo<cudnnConvolutionFwdAlgo_t> fwd;
  chosen_algo<cudnnConvolutionBwdDataAlgo_t> data;
  chosen_algo<cudnnConvolutionBwdFilterAlgo_t> filter;
  std::string context;  // shapes, for error messages
};

inline std::string conv_context(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                                const char* type) {
  std::ostringstream os;
  os << "conv2d (" << type << ") input [" << batch << ", " << g.channels << ", " << g.height << ", " << g.width
     << "], weight [" << out_channels << ", " << g.channels / groups << ", " << g.kernel_h << ", " << g.kernel_w
     << "], stride (" << g.stride_h << ", " << g.stride_w << "), padding (" << g.pad_h << ", " << g.pad_w
     << "), dilation (" << g.dilation_h << ", " << g.dilation_w << "), groups " << groups;
  return os.str();
}

inline int to_int(index_t v, const std::string& context) {
  TRAINKIT_CHECK(v >= 0 && v <= index_t(std::numeric_limits<int>::max()), shape_error, "convolution<cuda>",
                 "size " << v << " does not fit cuDNN's int descriptors; " << context);
  return int(v);
}

/// Picks the first acceptable entry of cuDNN's perf list (ordered by expected or measured time).
/// Without TF32, an fp32 algorithm must run in CUDNN_FMA_MATH (plain fp32): entries that need
/// tensor-core math are skipped, the others run with FMA math forced.
template <class Perf>
int pick(const Perf* perf, int count, bool fp32, cudnnMathType_t& math, std::size_t& workspace) {
  const auto& s = settings();
  const bool strict_fp32 = fp32 && !s.allow_tf32;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > s.cudnn_workspace_limit) continue;
    if (s.deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (strict_fp32 && (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    math = strict_fp32 ? CUDNN_FMA_MATH : p.mathType;
    workspace = p.memory;
    return i;
  }
  return -1;
}


}  // namespace gpu::detail

/// 2-D convolution passes through cuDNN (contract in backend/im2col.hpp), NCHW, asynchronous on
/// the current stream.
template <>
struct convolution<cuda> {
  template <class T>
  static void forward(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels, const T* x,
                      const T* w, const T* bias, T* y) {
    namespace d = gpu::detail;
    d::conv_plan& p = plan<T>(g, groups, batch, out_channels);
    cudnnHandle_t h = d::cudnn();
    if (!p.fwd.ready) {
      constexpr int max_algos = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
      cudnnConvolutionFwdAlgoPerf_t perf[max_algos];
      int count = 0;
      bool searched = false;
      if (gpu::settings().cudnn_benchmark) {
        searched = with_search_workspace([&](void* ws, std::size_t bytes) {
          gpu::check(cudnnFindConvolutionForwardAlgorithmEx(h, p.x.d, x, p.w.d, w, p.fwd_desc.d, p.y.d, y, max_algos,
                                                            &count, perf, ws, bytes),
                     "cudnnFindConvolutionForwardAlgorithmEx", p.context);
        });
      }
      if (!searched)
        gpu::check(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x.d, p.w.d, p.fwd_desc.d, p.y.d, max_algos, &count, perf),
                   "cudnnGetConvolutionForwardAlgorithm_v7", p.context);
      select(p.fwd, p.fwd_desc, perf, count, std::is_same_v<T, float>, p.context, "forward");
    }
    using S = d::cudnn_scale_t<T>;
    const S one = 1, zero = 0;
    d::scratch<> ws(p.fwd.workspace);
    gpu::check(cudnnConvolutionForward(h, &one, p.x.d, x, p.w.d, w, p.fwd_desc.d, p.fwd.algo, ws.p, ws.bytes, &zero,
                                       p.y.d, y),
               "cudnnConvolutionForward", p.context);
    if (bias) gpu::check(cudnnAddTensor(h, &one, p.bias.d, bias, &one, p.y.d, y), "cudnnAddTensor (bias)", p.context);
  }

  template <class T>
  static void backward_input(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                             const T* gy, const T* w, T* gx) {
    namespace d = gpu::detail;
    d::conv_plan& p = plan<T>(g, groups, batch, out_channels);
    cudnnHandle_t h = d::cudnn();
    if (!p.data.ready) {
      constexpr int max_algos = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
      cudnnConvolutionBwdDataAlgoPerf_t perf[max_algos];
      int count = 0;
      bool searched = false;
      if (gpu::settings().cudnn_benchmark) {
        searched = with_search_workspace([&](void* ws, std::size_t bytes) {
          gpu::check(cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w.d, w, p.y.d, gy, p.data_desc.d, p.x.d, gx,
                                                                 max_algos, &count, perf, ws, bytes),
                     "cudnnFindConvolutionBackwardDataAlgorithmEx", p.context);
        });
      }
      if (!searched)
        gpu::check(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w.d, p.y.d, p.data_desc.d, p.x.d, max_algos, &count,
                                                               perf),
                   "cudnnGetConvolutionBackwardDataAlgorithm_v7", p.context);
      select(p.data, p.data_desc, perf, count, std::is_same_v<T, float>, p.context, "backward data");
    }
    using S = d::cudnn_scale_t<T>;
    const S one = 1, zero = 0;
    d::scratch<> ws(p.data.workspace);
    gpu::check(cudnnConvolutionBackwardData(h, &one, p.w.d, w, p.y.d, gy, p.data_desc.d, p.data.algo, ws.p, ws.bytes,
                                            &zero, p.x.d, gx),
               "cudnnConvolutionBackwardData", p.context);
  }

  template <class T>
  static void backward_weight(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                              const T* gy, const T* x, T* gw) {
    namespace d = gpu::detail;
    d::conv_plan& p = plan<T>(g, groups, batch, out_channels);
    cudnnHandle_t h = d::cudnn();
    if (!p.filter.ready) {
      constexpr int max_algos = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
      cudnnConvolutionBwdFilterAlgoPerf_t perf[max_algos];
      int count = 0;
      bool searched = false;
      if (gpu::settings().cudnn_benchmark) {
        searched = with_search_workspace([&](void* ws, std::size_t bytes) {
          gpu::check(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.x.d, x, p.y.d, gy, p.filter_desc_.d, p.w.d, gw,
                                                                   max_algos, &count, perf, ws, bytes),
                     "cudnnFindConvolutionBackwardFilterAlgorithmEx", p.context);
        });
      }
      if (!searched)
        gpu::check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x.d, p.y.d, p.filter_desc_.d, p.w.d, max_algos,
                                                                 &count, perf),
                   "cudnnGetConvolutionBackwardFilterAlgorithm_v7", p.context);
      select(p.filter, p.filter_desc_, perf, count, std::is_same_v<T, float>, p.context, "backward filter");
    }
    using S = d::cudnn_scale_t<T>;
    const S one = 1, zero = 0;
    d::scratch<> ws(p.filter.workspace);
    gpu::check(cudnnConvolutionBackwardFilter(h, &one, p.x.d, x, p.y.d, gy, p.filter_desc_.d, p.filter.algo, ws.p,
                                              ws.bytes, &zero, p.w.d, gw),
               "cudnnConvolutionBackwardFilter", p.context);
  }

  /// gb[o] = sum of gy[n, o, :] over n: a reduction over dims {0, 2} of gy viewed as [batch, O,
  /// pixels], accumulated in double as on the host.
  template <class T>
  static void backward_bias(index_t batch, index_t out_channels, index_t pixels, const T* gy, T* gb) {
    if (out_channels == 0) return;
    reduce<cuda>::run({batch, out_channels, pixels}, {true, false, true}, gy, {out_channels * pixels, pixels, 1}, gb,
                      {0, 1, 0}, reducers::sum<double>{});
  }

  /// Forgets every cached plan of this thread (the next call of each shape chooses again).
  static void clear_plans() { plans().clear(); }

 private:
  using plan_map = std::unordered_map<gpu::detail::conv_key, std::unique_ptr<gpu::detail::conv_plan>,
                                      gpu::detail::conv_key_hash>;
  static plan_map& plans() {
    thread_local std::unordered_map<int, plan_map> per_device;
    return per_device[gpu::current_device()];
  }

  template <class T>
  static gpu::detail::conv_plan& plan(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels) {
    namespace d = gpu::detail;
    const auto& s = gpu::settings();
    const cudnnDataType_t type = d::cudnn_data_type<T>();
    const d::conv_key key{type,       batch,      g.channels, g.height,   g.width,      out_channels,
                          g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h,      g.pad_w,
                          g.dilation_h, g.dilation_w, groups, s.allow_tf32, s.deterministic, s.cudnn_benchmark,
                          s.cudnn_workspace_limit};
    auto& slot = plans()[key];
    if (slot) return *slot;
    auto p = std::make_unique<d::conv_plan>();
    p->context = d::conv_context(g, groups, batch, out_channels, dtype_name<T>().data());
    const std::string& c = p->context;
    const int n = d::to_int(batch, c), ch = d::to_int(g.channels, c), hh = d::to_int(g.height, c),
              ww = d::to_int(g.width, c), o = d::to_int(out_channels, c), oh = d::to_int(g.out_h, c),
              ow = d::to_int(g.out_w, c);
    gpu::check(cudnnSetTensor4dDescriptor(p->x.d, CUDNN_TENSOR_NCHW, type, n, ch, hh, ww), "cudnnSetTensor4dDescriptor", c);
    gpu::check(cudnnSetTensor4dDescriptor(p->y.d, CUDNN_TENSOR_NCHW, type, n, o, oh, ow), "cudnnSetTensor4dDescriptor", c);
    gpu::check(cudnnSetTensor4dDescriptor(p->bias.d, CUDNN_TENSOR_NCHW, type, 1, o, 1, 1), "cudnnSetTensor4dDescriptor",
               c);
    gpu::check(cudnnSetFilter4dDescriptor(p->w.d, type, CUDNN_TENSOR_NCHW, o, d::to_int(g.channels / groups, c),
                                          d::to_int(g.kernel_h, c), d::to_int(g.kernel_w, c)),
               "cudnnSetFilter4dDescriptor", c);
    const cudnnDataType_t compute = std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    const cudnnMathType_t math = std::is_same_v<T, float>    ? (s.allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)
                                 : std::is_same_v<T, double> ? CUDNN_DEFAULT_MATH
                                                             : CUDNN_TENSOR_OP_MATH;
    for (cudnnConvolutionDescriptor_t cd : {p->fwd_desc.d, p->data_desc.d, p->filter_desc_.d}) {
      gpu::check(cudnnSetConvolution2dDescriptor(cd, d::to_int(g.pad_h, c), d::to_int(g.pad_w, c),
                                                 d::to_int(g.stride_h, c), d::to_int(g.stride_w, c),
                                                 d::to_int(g.dilation_h, c), d::to_int(g.dilation_w, c),
                                                 CUDNN_CROSS_CORRELATION, compute),
                 "cudnnSetConvolution2dDescriptor", c);
      gpu::check(cudnnSetConvolutionGroupCount(cd, d::to_int(groups, c)), "cudnnSetConvolutionGroupCount", c);
      gpu::check(cudnnSetConvolutionMathType(cd, math), "cudnnSetConvolutionMathType", c);
    }
    slot = std::move(p);
    return *slot;
  }

  template <class Algo, class Perf>
  static void select(gpu::detail::chosen_algo<Algo>& out, gpu::detail::conv_desc& desc, const Perf* perf, int count,
                     bool fp32, const std::string& context, const char* pass) {
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
    std::size_t ws = 0;
    const int i = gpu::detail::pick(perf, count, fp32, math, ws);
    const auto& s = gpu::settings();
    TRAINKIT_CHECK(i >= 0, runtime_failure, "convolution<cuda>",
                   "cuDNN offers no " << pass << " algorithm within the workspace limit of " << s.cudnn_workspace_limit
                                      << " bytes" << (s.deterministic ? " that is deterministic" : "")
                                      << (fp32 && !s.allow_tf32 ? " without TF32" : "") << " (" << count
                                      << " candidates); " << context);
    gpu::check(cudnnSetConvolutionMathType(desc.d, math), "cudnnSetConvolutionMathType", context);
    out.algo = perf[i].algo;
    out.workspace = ws;
    out.ready = true;
  }

  /// Runs a timed algorithm search with a workspace of up to the limit; false when that much
  /// memory is not available (the caller then takes the heuristic).
  template <class F>
  static bool with_search_workspace(F&& search) {
    std::size_t bytes = gpu::settings().cudnn_workspace_limit;
    for (; bytes >= (std::size_t(1) << 20); bytes /= 4) {
      try {
        gpu::detail::scratch<> ws(bytes);
        search(ws.p, ws.bytes);
        return true;
      } catch (const runtime_failure& e) {
        if (std::string(e.what()).find("out of memory") == std::string::npos) throw;
      }
    }
    return false;
  }
};

namespace gpu::detail {

template <class T>
__global__ void __launch_bounds__(block_threads) unfold_kernel(conv2d_geometry g, index_t batch, const T* x, T* col,
                                                               index_t ld, index_t image_stride, index_t total) {
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= total) return;
  // i over (n, c, ki, kj, oh, ow), ow fastest: consecutive threads write consecutive columns.
  index_t q = i;
  const index_t ow = divmod(q, g.out_w), oh = divmod(q, g.out_h), kj = divmod(q, g.kernel_w),
                ki = divmod(q, g.kernel_h), c = divmod(q, g.channels), n = q;
  const index_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h, iw = ow * g.stride_w - g.pad_w + kj * g.dilation_w;
  const index_t row = (c * g.kernel_h + ki) * g.kernel_w + kj;
  T v = T(0.0f);
  if (ih >= 0 && ih < g.height && iw >= 0 && iw < g.width) v = x[((n * g.channels + c) * g.height + ih) * g.width + iw];
  col[n * image_stride + row * ld + oh * g.out_w + ow] = v;
}

template <class T>
__global__ void __launch_bounds__(block_threads) fold_kernel(conv2d_geometry g, index_t batch, const T* col, index_t ld,
                                                             index_t image_stride, T* x, index_t total) {
  using C = compute_t<T>;
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= total) return;
  // Gather, not scatter: each input element sums the column entries that read it, in (ki, kj)
  // order as the host does, so the result is deterministic and needs no atomics.
  index_t q = i;
  const index_t iw = divmod(q, g.width), ih = divmod(q, g.height), c = divmod(q, g.channels), n = q;
  C acc = C(0);
  const T* base = col + n * image_stride;
  for (index_t ki = 0; ki < g.kernel_h; ++ki) {
    const index_t th = ih + g.pad_h - ki * g.dilation_h;
    if (th < 0 || th % g.stride_h != 0) continue;
    const index_t oh = th / g.stride_h;
    if (oh >= g.out_h) continue;
    for (index_t kj = 0; kj < g.kernel_w; ++kj) {
      const index_t tw = iw + g.pad_w - kj * g.dilation_w;
      if (tw < 0 || tw % g.stride_w != 0) continue;
      const index_t ow = tw / g.stride_w;
      if (ow >= g.out_w) continue;
      const index_t row = (c * g.kernel_h + ki) * g.kernel_w + kj;
      acc = C(acc + C(base[row * ld + oh * g.out_w + ow]));
    }
  }
  x[i] = T(acc);
}

}  // namespace gpu::detail

/// Unfold/fold on the GPU (contract in backend/im2col.hpp): one thread per written element.
template <>
struct im2col<cuda> {
  template <class T>
  static void unfold(const conv2d_geometry& g, index_t batch, const T* x, T* col, index_t ld, index_t image_stride) {
    namespace d = gpu::detail;
    const index_t total = batch * g.col_rows() * g.col_cols();
    if (total == 0) return;
    d::unfold_kernel<T><<<d::grid_for(total, d::block_threads), d::block_threads, 0, gpu::current_stream()>>>(
        g, batch, x, col, ld, image_stride, total);
    gpu::check_launch("unfold_kernel");
  }

  template <class T>
  static void fold(const conv2d_geometry& g, index_t batch, const T* col, index_t ld, index_t image_stride, T* x) {
    namespace d = gpu::detail;
    const index_t total = batch * g.image_size();
    if (total == 0) return;
    d::fold_kernel<T><<<d::grid_for(total, d::block_threads), d::block_threads, 0, gpu::current_stream()>>>(
        g, batch, col, ld, image_stride, x, total);
    gpu::check_launch("fold_kernel");
  }
};

}  // namespace trainkit::backend
