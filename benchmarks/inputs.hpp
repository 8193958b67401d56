// benchmarks/inputs.hpp - the fixed, seeded inputs the training-step benchmarks feed their models.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "trainkit/core/tensor.hpp"

namespace bench {

/// Standard-normal values of the given shape, the same for the same seed.
inline trainkit::tensor<float> random_input(trainkit::shape s, unsigned seed = 7) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(static_cast<std::size_t>(trainkit::numel(s)));
  for (auto& x : v) x = nd(rng);
  return trainkit::tensor<float>::from_vector(v, s);
}

/// n class indices in [0, 10), spread over the classes.
inline trainkit::tensor<std::int64_t> random_labels(trainkit::index_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (trainkit::index_t i = 0; i < n; ++i) v[std::size_t(i)] = (i * 7) % 10;
  return trainkit::tensor<std::int64_t>::from_vector(v);
}

}  // namespace bench
