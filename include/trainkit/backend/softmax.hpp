// trainkit/backend/softmax.hpp - softmax and log_softmax as one fused pass family per device
// (max-subtracted forward, backward from the saved output), so autograd's softmax op stays
// device-generic.
#pragma once

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// Per-device softmax kernels on dense buffers; T is the element type (16-bit floats compute in
/// float and accumulate in accumulate_t<T>). x is viewed as [outer, dim, inner] and the softmax
/// runs over the middle dim. A model provides:
///   forward(x, outer, dim, inner, log, y)       y = softmax(x), or log_softmax(x) when log
///   backward(y, g, outer, dim, inner, log, dx)  from the saved output y
template <class Device>
struct softmax {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::softmax has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
