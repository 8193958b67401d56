// trainkit/backend/gather.hpp - indexed row copies (embedding lookups and their gradients) and
// one-hot targets (the class-index side of the losses).
#pragma once

#include <cstdint>

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// Per-device indexed kernels. Indices are validated by the caller. A model provides
///   `template <class T>` static void gather_rows(const T* table, index_t cols, const std::int64_t* idx,
///       index_t n, T* out);            out[i, :] = table[idx[i], :]  (rows of `cols` dense elements)
///   `template <class T>` static void scatter_add_rows(const T* src, index_t cols, const std::int64_t* idx,
///       index_t n, T* table);          table[idx[i], :] += src[i, :]  (repeated indices accumulate)
///   `template <class T>` static void one_hot(const std::int64_t* target, index_t n, index_t classes,
///       index_t inner, double on, double off, std::int64_t ignore_index, T* out);
///     out viewed as [n, classes, inner]: out[i, c, j] = c == target[i * inner + j] ? on : off,
///     and 0 for the whole (i, :, j) column when the target equals ignore_index.
template <class Device>
struct gather {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::gather has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
