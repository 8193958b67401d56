// tests/cuda/support.cuh - what the CUDA tests share: seeded inputs made on the host, the same op
// run on cpu and cuda tensors, and comparisons that print the worst element.
//
//   auto x = cuda_test::random<float>({4, 5}, rng);
//   cuda_test::check_op<float>([](const auto& v) { return autograd::tanh(v[0]); }, {x}, 1e-5);
//
// check_op runs f on vars of the cpu inputs and of their cuda copies, compares the outputs, then
// backpropagates the same random upstream gradient on both and compares every input gradient.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "trainkit/cuda.cuh"

namespace cuda_test {

namespace tk = trainkit;
using tk::cpu;
using tk::cuda;
using tk::index_t;
using tk::shape;

template <class T>
tk::tensor<T> random(const shape& s, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(static_cast<std::size_t>(tk::numel(s)));
  for (auto& e : v) e = static_cast<T>(u(rng));
  return tk::tensor<T>::from_vector(v, s);
}

inline tk::tensor<std::int64_t> random_indices(const shape& s, std::int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<std::int64_t> u(0, n - 1);
  std::vector<std::int64_t> v(static_cast<std::size_t>(tk::numel(s)));
  for (auto& e : v) e = u(rng);
  return tk::tensor<std::int64_t>::from_vector(v, s);
}

template <class T, class D>
tk::tensor<T> host(const tk::tensor<T, D>& t) {
  if constexpr (std::is_same_v<D, cpu>)
    return t;
  else
    return t.template to<cpu>();
}

/// Empty string when every |a - b| <= atol + rtol * |b| (NaNs must match), else the worst element.
template <class T, class D1, class D2>
std::string compare(const tk::tensor<T, D1>& a_in, const tk::tensor<T, D2>& b_in, double rtol, double atol) {
  const auto a = host(a_in), b = host(b_in);
  std::ostringstream os;
  if (a.sizes() != b.sizes()) {
    os << "sizes differ: " << tk::to_string(a.sizes()) << " vs " << tk::to_string(b.sizes());
    return os.str();
  }
  const auto va = a.to_vector(), vb = b.to_vector();
  double worst = 0;
  std::size_t at = 0;
  bool bad = false;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double x = double(va[i]), y = double(vb[i]);
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) {
        os << "NaN mismatch at " << i << ": " << x << " vs " << y;
        return os.str();
      }
      continue;
    }
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) {
        os << "inf mismatch at " << i << ": " << x << " vs " << y;
        return os.str();
      }
      continue;
    }
    const double err = std::abs(x - y) - (atol + rtol * std::abs(y));
    if (err > 0 && (!bad || err > worst)) {
      bad = true;
      worst = err;
      at = i;
    }
  }
  if (!bad) return {};
  os << "element " << at << " of sizes " << tk::to_string(a.sizes()) << ": " << double(va[at]) << " vs "
     << double(vb[at]) << " (rtol " << rtol << ", atol " << atol << ")";
  return os.str();
}

/// Bit-for-bit equality (for results that must not depend on the device).
template <class T, class D1, class D2>
bool identical(const tk::tensor<T, D1>& a, const tk::tensor<T, D2>& b) {
  const auto va = host(a).to_vector(), vb = host(b).to_vector();
  if (va.size() != vb.size()) return false;
  for (std::size_t i = 0; i < va.size(); ++i)
    if (std::memcmp(&va[i], &vb[i], sizeof(T)) != 0) return false;
  return true;
}

/// CUDA_TEST_REQUIRE_CLOSE(a, b, rtol, atol): compare() must find nothing (arguments may hold commas).
#define CUDA_TEST_REQUIRE_CLOSE(...)                                   \
  do {                                                                 \
    const std::string cuda_test_msg_ = ::cuda_test::compare(__VA_ARGS__); \
    INFO(cuda_test_msg_);                                              \
    REQUIRE(cuda_test_msg_.empty());                                   \
  } while (0)

/// f(vars) on the cpu inputs and on their cuda copies: outputs and input gradients must agree.
template <class T, class F>
void check_op(F f, const std::vector<tk::tensor<T>>& inputs, double rtol, double atol = 0.0, std::uint32_t seed = 11) {
  std::vector<tk::var<T, cpu>> vc;
  std::vector<tk::var<T, cuda>> vg;
  for (const auto& x : inputs) {
    vc.emplace_back(x.clone(), true);
    vg.emplace_back(x.template to<cuda>(), true);
  }
  auto yc = f(vc);
  auto yg = f(vg);
  {
    INFO("forward");
    CUDA_TEST_REQUIRE_CLOSE(yg.value(), yc.value(), rtol, atol);
  }
  std::mt19937 rng(seed);
  const auto g = random<T>(yc.sizes(), rng);
  yc.backward(g);
  yg.backward(g.template to<cuda>());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    INFO("gradient of input " << i);
    REQUIRE(vc[i].grad().defined() == vg[i].grad().defined());
    if (vc[i].grad().defined()) CUDA_TEST_REQUIRE_CLOSE(vg[i].grad(), vc[i].grad(), rtol, atol);
  }
}

/// Restores the CUDA settings a test changed.
struct settings_guard {
  tk::gpu::settings_t saved = tk::gpu::settings();
  ~settings_guard() { tk::gpu::settings() = saved; }
};

}  // namespace cuda_test
