// tests/dist/rank_gradients.hpp - a rank's made-up gradient and the exact mean over the ranks, for
// the allreduce tests on thread_group (tests/dist/) and under mpirun (tests/mpi/).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "trainkit/core/shape.hpp"

namespace trainkit_test {

/// n unit-normal values, seeded by the rank.
inline std::vector<float> grad_of(int rank, trainkit::index_t n) {
  std::mt19937 gen(static_cast<unsigned>(rank) + 11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

/// The mean of grad_of(r, n) over r < w, in double.
inline std::vector<double> exact_mean(int w, trainkit::index_t n) {
  std::vector<double> m(static_cast<std::size_t>(n), 0.0);
  for (int r = 0; r < w; ++r) {
    const auto g = grad_of(r, n);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] += g[i] / w;
  }
  return m;
}

/// max |got - want|.
inline double max_error(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0;
  for (std::size_t i = 0; i < want.size(); ++i) e = std::max(e, std::fabs(got[i] - want[i]));
  return e;
}

}  // namespace trainkit_test
