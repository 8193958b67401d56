// tests/autograd/test_gelu.cpp - GELU in float on the CPU (backend::gelu<cpu>: AVX2 + FMA lanes with
// PyTorch's erf approximation where the CPU has them, std::erf elsewhere and in the tail) against
// the exact erf form in double: values and gradients over a range, the tail of a buffer that is not
// a multiple of 8, buffers split over threads, infinities and NaN, and a non-contiguous input.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "trainkit/trainkit.hpp"

using namespace trainkit;
namespace ag = trainkit::autograd;

namespace gelu_test {

double gelu_exact(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_grad_exact(double x) {
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

TEST_CASE("gelu in float: within 1e-6 (relative above 1) of the erf form, forward and backward", "[autograd][gelu]") {
  for (index_t n : {index_t(1), index_t(7), index_t(1003), index_t(100003)}) {
    INFO("n = " << n);
    std::vector<float> xs(static_cast<std::size_t>(n)), gs(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      xs[std::size_t(i)] = float(-12.0 + 24.0 * double(i) / double(std::max<index_t>(n - 1, 1)));
      gs[std::size_t(i)] = float(0.5 + 0.001 * double(i % 1000));
    }
    ag::var<float> x(tensor<float>::from_vector(xs, {n}), true);
    const ag::var<float> y = ag::gelu(x);
    y.backward(tensor<float>::from_vector(gs, {n}));
    const auto yv = y.value().to_vector(), dx = x.grad().to_vector();
    double worst = 0, worst_grad = 0;
    for (index_t i = 0; i < n; ++i) {
      const double xi = xs[std::size_t(i)], scale = std::max(1.0, std::abs(xi));
      worst = std::max(worst, std::abs(yv[std::size_t(i)] - gelu_exact(xi)) / scale);
      worst_grad = std::max(worst_grad, std::abs(dx[std::size_t(i)] - gs[std::size_t(i)] * gelu_grad_exact(xi)) / scale);
    }
    CHECK(worst < 1e-6);
    CHECK(worst_grad < 1e-6);
  }
}

TEST_CASE("gelu in float: infinities, NaN and a strided input", "[autograd][gelu]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> xs{-inf, inf, std::nanf(""), 0.0f, -0.0f, 30.0f, -30.0f, 1.0f, -1.0f};
  ag::var<float> x(tensor<float>::from_vector(xs, {index_t(xs.size())}), true);
  const auto y = ag::gelu(x).value().to_vector();
  CHECK(std::isnan(y[0]));  // x Phi(x) = -inf * 0, as the erf form in float gives
  CHECK(y[1] == inf);
  CHECK(std::isnan(y[2]));
  CHECK(y[3] == 0.0f);
  CHECK(y[5] == 30.0f);
  CHECK(y[6] == 0.0f);
  CHECK(std::abs(y[7] - float(gelu_exact(1.0))) < 1e-6f);
  // A transposed view gives the values of its dense copy.
  auto m = tensor<float>::from_vector({-2, -1, 0, 1, 2, 3}, {2, 3});
  const auto t = ag::gelu(ag::var<float>(m.transpose(0, 1))).value();
  CHECK(t.to_vector() == ag::gelu(ag::var<float>(m.transpose(0, 1).contiguous())).value().to_vector());
}

}  // namespace gelu_test
