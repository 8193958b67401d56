// tests/ops/ops_util.hpp - tensors the ops tests start from.
#pragma once

#include <random>
#include <vector>

#include "trainkit/trainkit.hpp"

namespace trainkit_test::ops {

using trainkit::numel;
using trainkit::shape;
using trainkit::tensor;

/// 0, 1, 2, ... in a tensor of sizes s.
inline tensor<double> iota(shape s) {
  std::vector<double> v(static_cast<std::size_t>(numel(s)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(i);
  return tensor<double>::from_vector(v, s);
}
/// Standard normal floats from seed.
inline tensor<float> random_f(shape s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(static_cast<std::size_t>(numel(s)));
  for (auto& x : v) x = nd(rng);
  return tensor<float>::from_vector(v, s);
}

}  // namespace trainkit_test::ops
