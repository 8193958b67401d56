// tests/optim/problem.hpp - the fixed problem of tests/reference/optim_reference.py, which made the
// expected numbers: four parameters, five steps, gradients g = 0.5 p + cos(0.3 i + 0.7 k + j) in
// double; p2 never has a gradient and p3 has none at step 2.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "trainkit/trainkit.hpp"

namespace optim_test {

using trainkit::index_t;
using trainkit::tensor;
using trainkit::autograd::var;

inline constexpr int steps = 5;

/// Per-type comparison: |a - b| <= atol + rtol |b|.
template <class T>
struct tolerance;
template <>
struct tolerance<double> {
  static constexpr double atol = 1e-13, rtol = 1e-11;
};
template <>
struct tolerance<float> {
  static constexpr double atol = 2e-6, rtol = 1e-4;
};

template <class T>
void check_close(const tensor<T>& got, const std::vector<double>& want, const std::string& what) {
  INFO(what);
  REQUIRE(static_cast<std::size_t>(got.numel()) == want.size());
  const auto g = got.to_vector();
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": got " << static_cast<double>(g[i]) << ", want " << want[i]);
    CHECK(std::abs(static_cast<double>(g[i]) - want[i]) <=
          tolerance<T>::atol + tolerance<T>::rtol * std::abs(want[i]));
  }
}

template <class T>
struct problem {
  std::vector<var<T>> params;

  problem() {
    std::vector<T> v0, v1;
    for (int i = 0; i < 6; ++i) v0.push_back(static_cast<T>(-0.25 + 0.1 * i));
    for (int i = 0; i < 4; ++i) v1.push_back(static_cast<T>(1.0 - 0.3 * i));
    params.emplace_back(tensor<T>::from_vector(v0, {2, 3}), true);
    params.emplace_back(tensor<T>::from_vector(v1, {4}), true);
    params.emplace_back(tensor<T>::from_vector({T(0.5), T(-0.5), T(2.0)}, {3}), true);
    params.emplace_back(tensor<T>::from_vector({T(-1.0), T(3.0)}, {2}), true);
  }

  void set_grads(int k) {
    for (std::size_t j = 0; j < params.size(); ++j) {
      auto& p = params[j];
      p.zero_grad();
      if (j == 2 || (j == 3 && k == 2)) continue;
      const auto pv = p.value().to_vector();
      std::vector<T> g(pv.size());
      for (std::size_t i = 0; i < pv.size(); ++i)
        g[i] = static_cast<T>(0.5 * static_cast<double>(pv[i]) +
                              std::cos(0.3 * double(i) + 0.7 * k + double(j)));
      p.set_grad(tensor<T>::from_vector(g, p.sizes()));
    }
  }

  /// Runs `steps` steps (or [from, to)), changing the rate before step lr_change_step.
  template <class O>
  void run(O& opt, int lr_change_step = -1, double new_lr = 0.0, int from = 0, int to = steps) {
    for (int k = from; k < to; ++k) {
      if (k == lr_change_step) opt.set_lr(new_lr);
      set_grads(k);
      opt.step();
    }
  }

  /// p2 never had a gradient: it must be exactly where it started.
  void check_p2_untouched() const {
    const auto v = params[2].value().to_vector();
    CHECK(v[0] == T(0.5));
    CHECK(v[1] == T(-0.5));
    CHECK(v[2] == T(2.0));
  }
};

}  // namespace optim_test
