// trainkit/backend/dropout.hpp - the dropout mask, drawn from the Philox stream.
#pragma once

#include <cstdint>

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// Per-device dropout mask. A model provides
///   `template <class T>` static void mask(std::uint64_t seed, std::uint64_t offset, index_t n,
///       float keep, double scale, T* out);
///     out[i] = bernoulli_at(seed, offset, i, keep) ? scale : 0  (core/generator.hpp's stream
///     rule, so every device draws the same mask from the same generator state).
template <class Device>
struct dropout {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::dropout has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
