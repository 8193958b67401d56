// trainkit/backend/pool.hpp - 2-D max and average pooling kernels.
#pragma once

#include <cstdint>

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// One pooling window applied to planes of height x width (dense, one plane per (image, channel)).
struct pool2d_geometry {
  index_t height = 0, width = 0;
  index_t kernel_h = 1, kernel_w = 1;
  index_t stride_h = 1, stride_w = 1;
  index_t pad_h = 0, pad_w = 0;
  index_t out_h = 0, out_w = 0;
};

/// Per-device pooling over `planes` dense planes. A model provides
///   `template <class T>` static void max_forward(const pool2d_geometry& g, index_t planes, const T* x,
///       T* y, std::int64_t* argmax);
///     y = the largest value of each window (padding never wins; the first NaN does);
///     argmax = its index h * width + w within the plane.
///   `template <class T>` static void max_backward(const pool2d_geometry& g, index_t planes, const T* gy,
///       const std::int64_t* argmax, T* gx);   overwrites gx with the scatter-add of gy
///   `template <class T>` static void avg_forward(const pool2d_geometry& g, index_t planes, const T* x, T* y);
///   `template <class T>` static void avg_backward(const pool2d_geometry& g, index_t planes, const T* gy, T* gx);
///     average over the window including padding (divisor kernel_h * kernel_w, PyTorch's
///     count_include_pad=true); gx is overwritten.
template <class Device>
struct pool {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::pool has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
