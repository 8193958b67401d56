// trainkit/optim/fused.hpp - one pass over a parameter, its gradient and its optimizer buffers.
//
// An optimizer's update is one TRAINKIT_HD functor called per element with references to the
// parameter, the gradient and each buffer (f(p, g, buf...)); it reads and writes them all in one
// pass. The loop is the device's strided elementwise loop, so a CUDA backend runs the same functor
// as a kernel and the CPU tests check the math both use.
#pragma once

#include <array>    // std::array
#include <utility>  // std::move

#include "trainkit/backend/elementwise.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit::optim::detail {

template <class T, class D>
bool check_buffer_sizes(const tensor<T, D>& buf, const tensor<T, D>& param) {
  TRAINKIT_CHECK(buf.sizes() == param.sizes(), shape_error, "optimizer step",
                 "state buffer of sizes " << to_string(buf.sizes()) << " for a parameter of sizes "
                                          << to_string(param.sizes()));
  return true;
}

/// Calls f(param[i], grad[i], bufs[i]...) for every element i (references, any strides). All
/// operands must have param's sizes; grad must not alias param or a buffer.
template <class F, class T, class D, class... B>
void fused_update(const F& f, tensor<T, D>& param, const tensor<T, D>& grad, B&... bufs) {
  TRAINKIT_CHECK(grad.sizes() == param.sizes(), shape_error, "optimizer step",
                 "gradient of sizes " << to_string(grad.sizes()) << " for a parameter of sizes "
                                      << to_string(param.sizes()));
  ((void)check_buffer_sizes(bufs, param), ...);
  std::array<shape, 2 + sizeof...(B)> strides{param.strides(), grad.strides(), bufs.strides()...};
  backend::elementwise<D>::for_each(param.sizes(), std::move(strides), f, param.data(), grad.data(),
                                    bufs.data()...);
}

}  // namespace trainkit::optim::detail
