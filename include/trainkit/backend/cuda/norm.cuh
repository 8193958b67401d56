// trainkit/backend/cuda/norm.cuh - norm<cuda>: batch norm (cuDNN, or our kernels) and layer norm on
// the GPU (contract in backend/norm.hpp); softmax is backend/cuda/softmax.cuh.
//
// Batch norm: with float or double data, affine parameters and settings().cudnn_batch_norm, the
// training passes are cuDNN's (CUDNN_BATCHNORM_SPATIAL, same statistics: biased variance to
// normalise, unbiased for the running estimate). Otherwise our kernels: per-channel statistics in
// double, shifted by the channel's first value as on the host, folded in contiguous splits of the
// channel by a grid of blocks (x: splits, y: channels, striding over any number of channels) and
// merged in split order; then one pass applies scale and shift. An empty batch (n * s = 0) folds
// nothing and reads no input: mean 0, variance 0 and zero gradients, as on the host.
// Layer norm: a warp (short rows) or a block (long rows) per row. Every reduction has a fixed
// order: results repeat.
#pragma once

#include <cudnn.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include "trainkit/backend/cuda/allocator.cuh"
#include "trainkit/backend/cuda/block_reduce.cuh"
#include "trainkit/backend/cuda/cudnn.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/settings.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/norm.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

namespace gpu::detail {

// ---- batch norm: statistics ------------------------------------------------------------------

struct bn_shape {
  index_t n, c, s, m;  // m = n * s elements per channel
  index_t chunk;       // elements of a channel per split
  int splits;          // 0 for an empty batch (m = 0)
};

__device__ __forceinline__ index_t bn_offset(const bn_shape& b, index_t ch, index_t t) {
  index_t q = t;
  const index_t j = divmod(q, b.s);
  return (q * b.c + ch) * b.s + j;
}

/// Partial sums of d = x - x[first of channel] and d^2 over one split of each of its channels.
/// Launched only for a non-empty batch (b.m > 0).
template <class T>
__global__ void __launch_bounds__(block_threads) bn_stats_kernel(bn_shape b, const T* x, double* partial) {
  __shared__ double smem[2][block_threads / 32];
  const index_t split = blockIdx.x;
  const index_t t0 = split * b.chunk, t1 = t0 + b.chunk < b.m ? t0 + b.chunk : b.m;
  for (index_t ch = blockIdx.y; ch < b.c; ch += gridDim.y) {
    const double k = double(x[ch * b.s]);
    double sum = 0, sq = 0;
    for (index_t t = t0 + threadIdx.x; t < t1; t += block_threads) {
      const double d = double(x[bn_offset(b, ch, t)]) - k;
      sum += d;
      sq += d * d;
    }
    sum = group_allreduce<block_threads>(sum, sum_op{}, smem[0]);
    sq = group_allreduce<block_threads>(sq, sum_op{}, smem[1]);
    if (threadIdx.x == 0) {
      partial[2 * (split * b.c + ch)] = sum;
      partial[2 * (split * b.c + ch) + 1] = sq;
    }
  }
}

/// Per channel: merge the splits, save mean and invstd, update the running statistics, and
/// leave the affine map y = x * scale + shift in coef[2ch], coef[2ch + 1].
template <class T, class S>
__global__ void bn_finish_kernel(bn_shape b, const T* x, const double* partial, const T* weight, const T* bias,
                                 double eps, double momentum, T* running_mean, T* running_var, S* save_mean,
                                 S* save_invstd, double* coef) {
  const index_t ch = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= b.c) return;
  double sum = 0, sq = 0;
  for (int s = 0; s < b.splits; ++s) {
    sum += partial[2 * (s * b.c + ch)];
    sq += partial[2 * (s * b.c + ch) + 1];
  }
  const double m = double(b.m);
  const double k = b.m ? double(x[ch * b.s]) : 0.0;
  const double dm = b.m ? sum / m : 0.0, mean = k + dm;
  sq = sq - m * dm * dm;
  if (sq < 0) sq = 0;
  const double var = b.m ? sq / m : 0.0;
  const double invstd = 1.0 / ::sqrt(var + eps);
  save_mean[ch] = S(mean);
  save_invstd[ch] = S(invstd);
  if (running_mean) running_mean[ch] = T((1.0 - momentum) * double(running_mean[ch]) + momentum * mean);
  if (running_var) {
    const double unbiased = b.m > 1 ? sq / (m - 1) : __longlong_as_double(0x7ff8000000000000ll);
    running_var[ch] = T((1.0 - momentum) * double(running_var[ch]) + momentum * unbiased);
  }
  const double scale = invstd * (weight ? double(weight[ch]) : 1.0);
  coef[2 * ch] = scale;
  coef[2 * ch + 1] = (bias ? double(bias[ch]) : 0.0) - mean * scale;
}

template <class T, class S>
__global__ void bn_eval_coef_kernel(index_t c, const T* weight, const T* bias, const T* running_mean,
                                    const T* running_var, double eps, S* save_mean, S* save_invstd, double* coef) {
  const index_t ch = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  save_mean[ch] = S(running_mean[ch]);
  save_invstd[ch] = S(1.0 / ::sqrt(double(running_var[ch]) + eps));
  // The host computes the affine map from the saved (S-rounded) statistics; so do we.
  const double mean = double(save_mean[ch]), invstd = double(save_invstd[ch]);
  const double scale = invstd * (weight ? double(weight[ch]) : 1.0);
  coef[2 * ch] = scale;
  coef[2 * ch + 1] = (bias ? double(bias[ch]) : 0.0) - mean * scale;
}

/// Channel of element i of an input viewed as [n, c, s]; 32-bit divisions when i, s and c fit.
__device__ __forceinline__ index_t bn_channel(index_t i, index_t c, index_t s) {
  (void)divmod(i, s);
  return divmod(i, c);
}

/// y = x * coef[2 ch] + coef[2 ch + 1] over an input viewed as [n, c, s].
template <class T>
__global__ void __launch_bounds__(block_threads) bn_affine_kernel(index_t total, index_t c, index_t s, const T* x,
                                                                  const double* coef, T* y) {
  using C = compute_t<T>;
  index_t i = index_t(blockIdx.x) * (block_threads * 4) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < 4; ++u, i += block_threads) {
    if (i >= total) return;
    const index_t ch = bn_channel(i, c, s);
    y[i] = T(C(x[i]) * C(coef[2 * ch]) + C(coef[2 * ch + 1]));
  }
}

// ---- batch norm: backward --------------------------------------------------------------------

/// Partial sums of g and g * (x - mean) over one split of each of its channels (b.m > 0).
template <class T, class S>
__global__ void __launch_bounds__(block_threads) bn_grad_stats_kernel(bn_shape b, const T* g, const T* x,
                                                                      const S* save_mean, double* partial) {
  __shared__ double smem[2][block_threads / 32];
  const index_t split = blockIdx.x;
  const index_t t0 = split * b.chunk, t1 = t0 + b.chunk < b.m ? t0 + b.chunk : b.m;
  for (index_t ch = blockIdx.y; ch < b.c; ch += gridDim.y) {
    const double mean = double(save_mean[ch]);
    double sg = 0, sgx = 0;
    for (index_t t = t0 + threadIdx.x; t < t1; t += block_threads) {
      const index_t off = bn_offset(b, ch, t);
      const double gv = double(g[off]);
      sg += gv;
      sgx += gv * (double(x[off]) - mean);
    }
    sg = group_allreduce<block_threads>(sg, sum_op{}, smem[0]);
    sgx = group_allreduce<block_threads>(sgx, sum_op{}, smem[1]);
    if (threadIdx.x == 0) {
      partial[2 * (split * b.c + ch)] = sg;
      partial[2 * (split * b.c + ch) + 1] = sgx;
    }
  }
}

template <class T, class S>
__global__ void bn_grad_finish_kernel(bn_shape b, const double* partial, const T* weight, const S* save_mean,
                                      const S* save_invstd, bool training, T* dweight, T* dbias, double* coef) {
  const index_t ch = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= b.c) return;
  double sum_g = 0, sum_gx = 0;
  for (int s = 0; s < b.splits; ++s) {
    sum_g += partial[2 * (s * b.c + ch)];
    sum_gx += partial[2 * (s * b.c + ch) + 1];
  }
  const double mean = double(save_mean[ch]), invstd = double(save_invstd[ch]);
  if (dbias) dbias[ch] = T(sum_g);
  if (dweight) dweight[ch] = T(sum_gx * invstd);
  const double a = (weight ? double(weight[ch]) : 1.0) * invstd;
  double bb = 0, k = 0;
  if (training && b.m > 0) {
    bb = -a * invstd * invstd * sum_gx / double(b.m);
    k = -a * sum_g / double(b.m) - bb * mean;
  }
  coef[3 * ch] = a;
  coef[3 * ch + 1] = bb;
  coef[3 * ch + 2] = k;
}

template <class T>
__global__ void __launch_bounds__(block_threads) bn_dx_kernel(index_t total, index_t c, index_t s, const T* g,
                                                              const T* x, const double* coef, T* dx) {
  using C = compute_t<T>;
  index_t i = index_t(blockIdx.x) * (block_threads * 4) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < 4; ++u, i += block_threads) {
    if (i >= total) return;
    const index_t ch = bn_channel(i, c, s);
    dx[i] = T(C(coef[3 * ch]) * C(g[i]) + C(coef[3 * ch + 1]) * C(x[i]) + C(coef[3 * ch + 2]));
  }
}

// ---- layer norm ------------------------------------------------------------------------------

template <int G, class T, class S>
__global__ void __launch_bounds__(block_threads) ln_forward_kernel(const T* x, index_t rows, index_t cols,
                                                                   const T* weight, const T* bias, double eps, T* y,
                                                                   S* save_mean, S* save_rstd) {
  using C = compute_t<T>;
  __shared__ double smem[block_threads / 32];
  constexpr int groups = block_threads / G;
  const index_t r = index_t(blockIdx.x) * groups + int(threadIdx.x) / G;
  const int lane = int(threadIdx.x) % G;
  const bool active = r < rows;
  const T* p = x + (active ? r : 0) * cols;
  double sum = 0;
  if (active)
    for (index_t j = lane; j < cols; j += G) sum += double(p[j]);
  sum = group_allreduce<G>(sum, sum_op{}, smem);
  const double mean = cols ? sum / double(cols) : 0.0;
  double sq = 0;
  if (active)
    for (index_t j = lane; j < cols; j += G) {
      const double d = double(p[j]) - mean;
      sq += d * d;
    }
  sq = group_allreduce<G>(sq, sum_op{}, smem);
  if (!active) return;
  const double rstd = 1.0 / ::sqrt((cols ? sq / double(cols) : 0.0) + eps);
  if (lane == 0) {
    save_mean[r] = S(mean);
    save_rstd[r] = S(rstd);
  }
  const C cm = C(mean), cr = C(rstd);
  T* q = y + r * cols;
  for (index_t j = lane; j < cols; j += G) {
    C v = (C(p[j]) - cm) * cr;
    if (weight) v *= C(weight[j]);
    if (bias) v += C(bias[j]);
    q[j] = T(v);
  }
}

template <int G, class T, class S>
__global__ void __launch_bounds__(block_threads) ln_backward_dx_kernel(const T* g, const T* x, index_t rows,
                                                                       index_t cols, const T* weight,
                                                                       const S* save_mean, const S* save_rstd, T* dx) {
  using C = compute_t<T>;
  __shared__ double smem[block_threads / 32];
  constexpr int groups = block_threads / G;
  const index_t r = index_t(blockIdx.x) * groups + int(threadIdx.x) / G;
  const int lane = int(threadIdx.x) % G;
  const bool active = r < rows;
  const index_t rr = active ? r : 0;
  const T* gp = g + rr * cols;
  const T* xp = x + rr * cols;
  const double mean = double(save_mean[rr]), rstd = double(save_rstd[rr]);
  double m1 = 0, m2 = 0;
  if (active)
    for (index_t j = lane; j < cols; j += G) {
      const double dh = double(gp[j]) * (weight ? double(weight[j]) : 1.0);
      m1 += dh;
      m2 += dh * (double(xp[j]) - mean) * rstd;
    }
  m1 = group_allreduce<G>(m1, sum_op{}, smem);
  m2 = group_allreduce<G>(m2, sum_op{}, smem);
  if (!active) return;
  m1 /= double(cols);
  m2 /= double(cols);
  const C cm = C(mean), cr = C(rstd), c1 = C(m1), c2 = C(m2);
  T* dp = dx + r * cols;
  for (index_t j = lane; j < cols; j += G) {
    const C dh = C(gp[j]) * (weight ? C(weight[j]) : C(1));
    const C xh = (C(xp[j]) - cm) * cr;
    dp[j] = T(cr * (dh - c1 - xh * c2));
  }
}

/// Column sums over a split of the rows: w[j] += g * xhat, b[j] += g (doubles).
template <class T, class S>
__global__ void __launch_bounds__(block_threads) ln_param_grad_kernel(const T* g, const T* x, index_t rows,
                                                                      index_t cols, const S* save_mean,
                                                                      const S* save_rstd, index_t chunk,
                                                                      double* partial_w, double* partial_b) {
  const index_t j = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (j >= cols) return;
  const index_t r0 = index_t(blockIdx.y) * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  double w = 0, b = 0;
  for (index_t r = r0; r < r1; ++r) {
    const double gv = double(g[r * cols + j]);
    if (partial_w) w += gv * (double(x[r * cols + j]) - double(save_mean[r])) * double(save_rstd[r]);
    b += gv;
  }
  if (partial_w) partial_w[index_t(blockIdx.y) * cols + j] = w;
  if (partial_b) partial_b[index_t(blockIdx.y) * cols + j] = b;
}

template <class T>
__global__ void ln_param_finish_kernel(index_t cols, int splits, const double* partial_w, const double* partial_b,
                                       T* dweight, T* dbias) {
  const index_t j = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  double w = 0, b = 0;
  for (int s = 0; s < splits; ++s) {
    if (partial_w) w += partial_w[index_t(s) * cols + j];
    if (partial_b) b += partial_b[index_t(s) * cols + j];
  }
  if (dweight) dweight[j] = T(w);
  if (dbias) dbias[j] = T(b);
}

/// Splits of a channel (or of the rows) so that about 8 blocks per multiprocessor run.
inline int splits_for(index_t groups, index_t work_per_group, index_t min_per_split) {
  const index_t target = index_t(current_device_info().multiprocessors) * 8;
  if (groups >= target) return 1;
  const index_t want = (target + groups - 1) / groups;
  const index_t most = std::max<index_t>(1, work_per_group / std::max<index_t>(min_per_split, 1));
  return int(std::clamp<index_t>(std::min(want, most), 1, 65535));
}

template <class T>
inline constexpr bool cudnn_bn_type = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// The cuDNN descriptors of a batch-norm input viewed as [n, c, s, 1] and of its per-channel tensors.
struct bn_descs {
  tensor_desc x, param;
  template <class T>
  bn_descs(index_t n, index_t c, index_t s, T*) {
    const cudnnDataType_t t = cudnn_data_type<T>();
    check(cudnnSetTensor4dDescriptor(x.d, CUDNN_TENSOR_NCHW, t, int(n), int(c), int(s), 1),
          "cudnnSetTensor4dDescriptor (batch norm)");
    check(cudnnDeriveBNTensorDescriptor(param.d, x.d, CUDNN_BATCHNORM_SPATIAL), "cudnnDeriveBNTensorDescriptor");
  }
};

inline bool fits_int(index_t v) { return v >= 0 && v <= index_t(0x7fffffff); }

/// The statistics passes' grid: x the splits, y the channels (the kernels stride over the rest).
inline dim3 bn_grid(const bn_shape& b) {
  return dim3(unsigned(b.splits), unsigned(std::min<index_t>(b.c, 65535)));
}

/// Splits of each channel for the statistics passes; none for an empty batch.
inline bn_shape make_bn_shape(index_t n, index_t c, index_t s) {
  bn_shape b{n, c, s, n * s, 0, 0};
  if (b.m == 0) return b;
  b.splits = splits_for(c, b.m, 4 * block_threads);
  b.chunk = (b.m + b.splits - 1) / b.splits;
  return b;
}

}  // namespace gpu::detail

template <>
struct norm<cuda> {
  // ---- batch norm ------------------------------------------------------------------------------
  template <class T, class S>
  static void batch_norm_train(const T* x, index_t n, index_t c, index_t s, const T* weight, const T* bias,
                               double eps, double momentum, T* running_mean, T* running_var, T* y, S* save_mean,
                               S* save_invstd) {
    namespace d = gpu::detail;
    if (c == 0) return;
    const cudaStream_t st = gpu::current_stream();
    if (use_cudnn<T, S>(n, c, s, weight, bias, eps)) {
      const d::bn_descs desc(n, c, s, static_cast<T*>(nullptr));
      using A = d::cudnn_scale_t<T>;
      const A one = 1, zero = 0;
      gpu::check(cudnnBatchNormalizationForwardTraining(d::cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, desc.x.d, x,
                                                        desc.x.d, y, desc.param.d, weight, bias, momentum,
                                                        running_mean, running_var, eps, save_mean, save_invstd),
                 "cudnnBatchNormalizationForwardTraining", context(n, c, s));
      return;
    }
    const d::bn_shape b = d::make_bn_shape(n, c, s);
    d::scratch<double> partial(std::size_t(2 * b.splits * c)), coef(std::size_t(2 * c));
    if (b.splits > 0) {
      d::bn_stats_kernel<T><<<d::bn_grid(b), d::block_threads, 0, st>>>(b, x, partial.p);
      gpu::check_launch("bn_stats_kernel", context(n, c, s));
    }
    d::bn_finish_kernel<T, S><<<d::grid_for(c, 128), 128, 0, st>>>(b, x, partial.p, weight, bias, eps, momentum,
                                                                   running_mean, running_var, save_mean, save_invstd,
                                                                   coef.p);
    gpu::check_launch("bn_finish_kernel", context(n, c, s));
    affine(x, n, c, s, coef.p, y);
  }

  template <class T, class S>
  static void batch_norm_eval(const T* x, index_t n, index_t c, index_t s, const T* weight, const T* bias,
                              const T* running_mean, const T* running_var, double eps, T* y, S* save_mean,
                              S* save_invstd) {
    namespace d = gpu::detail;
    if (c == 0) return;
    d::scratch<double> coef(std::size_t(2 * c));
    d::bn_eval_coef_kernel<T, S><<<d::grid_for(c, 128), 128, 0, gpu::current_stream()>>>(
        c, weight, bias, running_mean, running_var, eps, save_mean, save_invstd, coef.p);
    gpu::check_launch("bn_eval_coef_kernel", context(n, c, s));
    affine(x, n, c, s, coef.p, y);
  }

  template <class T, class S>
  static void batch_norm_backward(const T* g, const T* x, index_t n, index_t c, index_t s, const T* weight,
                                  const S* save_mean, const S* save_invstd, bool training, T* dx, T* dweight,
                                  T* dbias) {
    namespace d = gpu::detail;
    if (c == 0) return;
    const cudaStream_t st = gpu::current_stream();
    if (training && use_cudnn<T, S>(n, c, s, weight, weight, 1e-5)) {
      // cuDNN writes all three gradients: give it scratch for the ones nobody asked for.
      d::scratch<T> tmp_dx(dx ? 0 : std::size_t(n * c * s)), tmp_dw(dweight ? 0 : std::size_t(c)),
          tmp_db(dbias ? 0 : std::size_t(c));
      const d::bn_descs desc(n, c, s, static_cast<T*>(nullptr));
      using A = d::cudnn_scale_t<T>;
      const A one = 1, zero = 0;
      gpu::check(cudnnBatchNormalizationBackward(d::cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero,
                                                 desc.x.d, x, desc.x.d, g, desc.x.d, dx ? dx : tmp_dx.p, desc.param.d,
                                                 weight, dweight ? dweight : tmp_dw.p, dbias ? dbias : tmp_db.p, 1e-5,
                                                 save_mean, save_invstd),
                 "cudnnBatchNormalizationBackward", context(n, c, s));
      return;
    }
    const d::bn_shape b = d::make_bn_shape(n, c, s);
    d::scratch<double> partial(std::size_t(2 * b.splits * c)), coef(std::size_t(3 * c));
    if (b.splits > 0) {
      d::bn_grad_stats_kernel<T, S><<<d::bn_grid(b), d::block_threads, 0, st>>>(b, g, x, save_mean, partial.p);
      gpu::check_launch("bn_grad_stats_kernel", context(n, c, s));
    }
    d::bn_grad_finish_kernel<T, S><<<d::grid_for(c, 128), 128, 0, st>>>(b, partial.p, weight, save_mean, save_invstd,
                                                                        training, dweight, dbias, coef.p);
    gpu::check_launch("bn_grad_finish_kernel", context(n, c, s));
    const index_t total = n * c * s;
    if (dx && total > 0) {
      d::bn_dx_kernel<T><<<d::grid_for(total, d::block_threads * 4), d::block_threads, 0, st>>>(total, c, s, g, x,
                                                                                              coef.p, dx);
      gpu::check_launch("bn_dx_kernel", context(n, c, s));
    }
  }

  // ---- layer norm ------------------------------------------------------------------------------
  template <class T, class S>
  static void layer_norm_forward(const T* x, index_t rows, index_t cols, const T* weight, const T* bias, double eps,
                                 T* y, S* save_mean, S* save_rstd) {
    namespace d = gpu::detail;
    if (rows == 0) return;
    const cudaStream_t st = gpu::current_stream();
    if (cols >= 1024)
      d::ln_forward_kernel<d::block_threads, T, S><<<d::grid_for(rows, 1), d::block_threads, 0, st>>>(
          x, rows, cols, weight, bias, eps, y, save_mean, save_rstd);
    else
      d::ln_forward_kernel<32, T, S><<<d::grid_for(rows, d::block_threads / 32), d::block_threads, 0, st>>>(
          x, rows, cols, weight, bias, eps, y, save_mean, save_rstd);
    gpu::check_launch("ln_forward_kernel");
  }

  template <class T, class S>
  static void layer_norm_backward(const T* g, const T* x, index_t rows, index_t cols, const T* weight,
                                  const S* save_mean, const S* save_rstd, T* dx, T* dweight, T* dbias) {
    namespace d = gpu::detail;
    if (rows == 0 || cols == 0) {
      return;
    }
    const cudaStream_t st = gpu::current_stream();
    if (dx) {
      if (cols >= 1024)
        d::ln_backward_dx_kernel<d::block_threads, T, S><<<d::grid_for(rows, 1), d::block_threads, 0, st>>>(
            g, x, rows, cols, weight, save_mean, save_rstd, dx);
      else
        d::ln_backward_dx_kernel<32, T, S><<<d::grid_for(rows, d::block_threads / 32), d::block_threads, 0, st>>>(
            g, x, rows, cols, weight, save_mean, save_rstd, dx);
      gpu::check_launch("ln_backward_dx_kernel");
    }
    if (!dweight && !dbias) return;
    const index_t col_blocks = (cols + d::block_threads - 1) / d::block_threads;
    const int splits = d::splits_for(col_blocks, rows, 64);
    const index_t chunk = (rows + splits - 1) / splits;
    d::scratch<double> pw(dweight ? std::size_t(splits * cols) : 0), pb(dbias ? std::size_t(splits * cols) : 0);
    d::ln_param_grad_kernel<T, S><<<dim3(unsigned(col_blocks), unsigned(splits)), d::block_threads, 0, st>>>(
        g, x, rows, cols, save_mean, save_rstd, chunk, pw.p, pb.p);
    gpu::check_launch("ln_param_grad_kernel");
    d::ln_param_finish_kernel<T><<<d::grid_for(cols, d::block_threads), d::block_threads, 0, st>>>(
        cols, splits, pw.p, pb.p, dweight, dbias);
    gpu::check_launch("ln_param_finish_kernel");
  }

  static std::string context(index_t n, index_t c, index_t s) {
    std::ostringstream os;
    os << "batch_norm over an input viewed as [" << n << ", " << c << ", " << s << "]";
    return os.str();
  }

  template <class T, class S>
  static bool use_cudnn(index_t n, index_t c, index_t s, const T* weight, const T* bias, double eps) {
    namespace d = gpu::detail;
    if constexpr (!d::cudnn_bn_type<T> || !std::is_same_v<S, d::cudnn_scale_t<T>>) {
      return false;
    } else {
      return gpu::settings().cudnn_batch_norm && weight != nullptr && bias != nullptr && eps >= CUDNN_BN_MIN_EPSILON &&
             n * s > 1 && d::fits_int(n) && d::fits_int(c) && d::fits_int(s);
    }
  }

  template <class T>
  static void affine(const T* x, index_t n, index_t c, index_t s, const double* coef, T* y) {
    namespace d = gpu::detail;
    const index_t total = n * c * s;
    if (total == 0) return;
    d::bn_affine_kernel<T><<<d::grid_for(total, d::block_threads * 4), d::block_threads, 0, gpu::current_stream()>>>(
        total, c, s, x, coef, y);
    gpu::check_launch("bn_affine_kernel", context(n, c, s));
  }
};

}  // namespace trainkit::backend
