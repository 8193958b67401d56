// trainkit/backend/norm.hpp - the normalisation kernels: batch norm and layer norm (softmax is its
// own family: backend/softmax.hpp). Each is one fused pass family per device (as cuDNN and
// PyTorch's native kernels are), so the autograd ops stay device-generic and a backend replaces
// whole kernels, not pieces.
#pragma once

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// Per-device normalisation kernels on dense buffers. T is the element type; S ("stat") is the
/// type of saved per-channel / per-row statistics (accumulate_t<T>: float for 16-bit floats).
/// Pointers documented as optional may be null. A model provides:
///
/// Batch norm, x viewed as [n, c, s] (s = product of the spatial sizes), statistics per channel:
///   batch_norm_train(x, n, c, s, weight*, bias*, eps, momentum, running_mean*, running_var*,
///                    y, save_mean, save_invstd)
///     y = (x - mean) * invstd * weight + bias with the biased batch variance; saves mean and
///     invstd = 1 / sqrt(var + eps); when running_mean/var are given, updates them in place:
///     r = (1 - momentum) * r + momentum * stat, with the unbiased variance (PyTorch semantics).
///   batch_norm_eval(x, n, c, s, weight*, bias*, running_mean, running_var, eps, y, save_mean,
///                   save_invstd)
///     the same with the running statistics (copied into save_mean / save_invstd).
///   batch_norm_backward(g, x, n, c, s, weight*, save_mean, save_invstd, training,
///                       dx*, dweight*, dbias*)
///     training: the statistics depend on x (full gradient); eval: they are constants.
///
/// Layer norm, x viewed as [rows, cols], statistics per row, weight/bias of length cols:
///   layer_norm_forward(x, rows, cols, weight*, bias*, eps, y, save_mean, save_rstd)
///   layer_norm_backward(g, x, rows, cols, weight*, save_mean, save_rstd, dx*, dweight*, dbias*)

template <class Device>
struct norm {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::norm has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
