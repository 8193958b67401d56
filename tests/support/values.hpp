// Small helpers of the tests that compare float tensors value for value.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "trainkit/trainkit.hpp"

namespace trainkit::test {

/// A float tensor of sizes s, uniform in [-1, 1) from rng.
inline tensor<float> random_float(const shape& s, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(numel(s)));
  for (auto& x : v) x = u(rng);
  return tensor<float>::from_vector(v, s);
}

/// Same sizes and the same bits in every element (NaN payloads and signed zeros included).
inline bool bit_equal(const tensor<float>& a, const tensor<float>& b) {
  const auto x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  return a.sizes() == b.sizes() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace trainkit::test
