// trainkit/backend/im2col.hpp - 2-D convolution kernels: unfolding image patches into GEMM columns
// (and folding them back), and the whole convolution passes built on them.
#pragma once

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// Everything the unfold/fold kernels need to know about one 2-D convolution of a single image
/// [channels, height, width] (dense) with a kernel_h x kernel_w window.
struct conv2d_geometry {
  index_t channels = 0, height = 0, width = 0;
  index_t kernel_h = 1, kernel_w = 1;
  index_t stride_h = 1, stride_w = 1;
  index_t pad_h = 0, pad_w = 0;
  index_t dilation_h = 1, dilation_w = 1;
  index_t out_h = 0, out_w = 0;

  /// Rows of the column matrix: one per (channel, kernel row, kernel column).
  constexpr index_t col_rows() const noexcept { return channels * kernel_h * kernel_w; }
  /// Columns of the column matrix of one image: one per output pixel.
  constexpr index_t col_cols() const noexcept { return out_h * out_w; }
  constexpr index_t image_size() const noexcept { return channels * height * width; }
};

/// Per-device unfold (im2col) and fold (col2im). A model provides
///   `template <class T>` static void unfold(const conv2d_geometry& g, index_t batch, const T* x,
///       T* col, index_t ld, index_t image_stride);
///     for each image n of x (dense [batch, C, H, W]) writes its column matrix
///     [C*kh*kw, OH*OW] at col + n * image_stride with row stride ld; padding reads as zero.
///     (ld = OH*OW, image_stride = C*kh*kw*OH*OW: one matrix per image; ld = batch*OH*OW,
///     image_stride = OH*OW: one wide matrix whose columns are (image, pixel).)
///   `template <class T>` static void fold(const conv2d_geometry& g, index_t batch, const T* col,
///       index_t ld, index_t image_stride, T* x);
///     the adjoint: overwrites each image of x with the sum of the column entries that read it.
template <class Device>
struct im2col {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::im2col has no model for this device: include its backend header");
};

/// Per-device 2-D convolution passes (a CUDA model calls cuDNN; the host one is im2col + GEMM).
/// x is dense [batch, C, H, W], w dense [O, C/groups, kh, kw], y / gy dense [batch, O, OH, OW].
/// A model provides
///   `template <class T>` static void forward(const conv2d_geometry& g, index_t groups, index_t batch,
///       index_t out_channels, const T* x, const T* w, const T* bias /*optional*/, T* y);
///   `template <class T>` static void backward_input(const conv2d_geometry& g, index_t groups,
///       index_t batch, index_t out_channels, const T* gy, const T* w, T* gx);      gx overwritten
///   `template <class T>` static void backward_weight(const conv2d_geometry& g, index_t groups,
///       index_t batch, index_t out_channels, const T* gy, const T* x, T* gw);      gw overwritten
///   `template <class T>` static void backward_bias(index_t batch, index_t out_channels, index_t pixels,
///       const T* gy, T* gb);           gb[o] = sum of gy[n, o, :] over n (overwritten)
template <class Device>
struct convolution {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::convolution has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
