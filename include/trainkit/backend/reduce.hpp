// trainkit/backend/reduce.hpp - the strided reduction every sum/mean/max/argmax runs on.
#pragma once

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// Per-device reduction. A model provides
///   template <class R, class In, class Out>
///   static void run(const shape& sizes, const std::vector<bool>& reduced,
///                   const In* in, const shape& in_strides, Out* out, const shape& out_strides, R r);
/// `sizes` are the input sizes; out_strides are 0 on reduced dims. For each output element it
/// folds the reduced elements: a = r.init(); a = r.step(a, value, k) with k the element's linear
/// index within the reduced sub-space (row-major over the reduced dims); partial results may be
/// combined with r.merge(a, b) (b holding later k); the output is r.finish(a, count).
template <class Device>
struct reduce {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::reduce has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
