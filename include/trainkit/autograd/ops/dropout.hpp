// trainkit/autograd/ops/dropout.hpp - inverted dropout with a mask from the Philox stream.
#pragma once

#include <array>
#include <string_view>

#include "trainkit/autograd/function.hpp"
#include "trainkit/backend/dropout.hpp"
#include "trainkit/ops/elementwise.hpp"
#include "trainkit/core/generator.hpp"

namespace trainkit::autograd {

namespace ops {
/// Saves the scaled mask (0 or 1 / (1 - p)); the gradient is g * mask.
template <class T, class D>
struct dropout {
  static constexpr std::string_view name = "dropout";
  tensor<T, D> mask;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& g, const std::vector<bool>&) const { return {g * mask}; }
};
}  // namespace ops

/// The mask dropout(x, p, true, gen) multiplies by: element i (row-major) keeps its value, scaled
/// by 1 / (1 - p), when bernoulli_at(seed, offset, i, 1 - p) holds, where offset =
/// gen.reserve(x.numel()) (so the call advances gen by ceil(numel / 4) Philox blocks).
template <class T, class D>
tensor<T, D> dropout_mask(const shape& sizes, double p, generator& gen) {
  auto mask = tensor<T, D>::empty(sizes);
  const index_t n = mask.numel();
  const std::uint64_t seed = gen.seed(), offset = gen.reserve(std::uint64_t(n));
  backend::dropout<D>::mask(seed, offset, n, float(1.0 - p), 1.0 / (1.0 - p), mask.data());
  return mask;
}

/// Inverted dropout: in training, zeroes each element with probability p and scales the rest by
/// 1 / (1 - p), so evaluation needs no rescaling. p = 0 or !training returns x itself; p = 1
/// returns zeros (and draws nothing). The mask comes from gen (see dropout_mask), so the same
/// generator state gives the same mask on every device - what gradient checkpointing replays.
template <class T, class D>
var<T, D> dropout(const var<T, D>& x, double p, bool training, generator& gen = default_generator()) {
  TRAINKIT_CHECK(p >= 0.0 && p <= 1.0, value_error, "dropout",
                 "probability must be in [0, 1], got " << p << " (input sizes " << to_string(x.sizes()) << ")");
  if (!training || p == 0.0) return x;
  tensor<T, D> mask = p == 1.0 ? tensor<T, D>::zeros(x.sizes()) : dropout_mask<T, D>(x.sizes(), p, gen);
  auto out = x.value() * mask;
  return record(ops::dropout<T, D>{std::move(mask)}, std::move(out), x);
}

}  // namespace trainkit::autograd
