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

/// count floats uniform in [-1, 1) from a generator seeded with seed.
inline std::vector<float> random_floats(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) x = u(rng);
  return v;
}

/// Same sizes and the same bits in every element (NaN payloads and signed zeros included).
inline bool bit_equal(const tensor<float>& a, const tensor<float>& b) {
  const auto x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  return a.sizes() == b.sizes() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

/// Same sizes and equal values element by element (float ==: -0 equals +0, a NaN equals nothing).
inline bool values_equal(const tensor<float>& a, const tensor<float>& b) {
  return a.sizes() == b.sizes() && a.to_vector() == b.to_vector();
}

/// Every parameter of m, in order, as a vector of its values.
template <class Module>
std::vector<std::vector<float>> params_of(const Module& m) {
  std::vector<std::vector<float>> r;
  for (const auto& p : m.parameters()) r.push_back(p.value().to_vector());
  return r;
}

/// The batches' indices, one after the other.
inline std::vector<index_t> flat(const std::vector<std::vector<index_t>>& batches) {
  std::vector<index_t> v;
  for (const auto& b : batches) v.insert(v.end(), b.begin(), b.end());
  return v;
}

}  // namespace trainkit::test
