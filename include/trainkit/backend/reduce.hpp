// trainkit/backend/reduce.hpp - the strided reduction every sum/mean/max/argmax runs on.
#pragma once

#include <vector>

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// A reduction's dims split into the kept ones (one output each: the outer loop) and the reduced
/// ones (folded: the inner loop), in order, with their strides. What every model starts from.
struct reduce_dims {
  shape kept_sizes, kept_in_strides, kept_out_strides;
  shape reduced_sizes, reduced_in_strides;
};

/// Splits sizes / strides by `reduced` (true: the dim is folded).
inline reduce_dims split_reduce_dims(const shape& sizes, const std::vector<bool>& reduced, const shape& in_strides,
                                     const shape& out_strides) {
  reduce_dims r;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (reduced[d]) {
      r.reduced_sizes.push_back(sizes[d]);
      r.reduced_in_strides.push_back(in_strides[d]);
    } else {
      r.kept_sizes.push_back(sizes[d]);
      r.kept_in_strides.push_back(in_strides[d]);
      r.kept_out_strides.push_back(out_strides[d]);
    }
  }
  return r;
}

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
