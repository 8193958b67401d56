// trainkit/backend/gelu.hpp - GELU (the exact, erf form) and its gradient over dense float
// buffers, for a device that has a kernel faster than the generic elementwise loop with the
// functors (functors::gelu, functors::gelu_backward: std::erf per element).
#pragma once

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// A model provides, for dense float buffers of n elements:
///   forward(n, x, y)          y = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2
///   backward(n, g, x, dx)     dx = g (Phi(x) + x phi(x))
/// Models: cpu (AVX2 + FMA lanes with PyTorch's erf approximation where the CPU has them).
template <class Device>
struct gelu {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::gelu has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
