// tests/nn/test_init.cpp - initialisers: fans and gains as torch computes them, bounds and moments
// of each distribution, layers' default initialisation, and seed reproducibility.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <vector>

#include "optim/matchers.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using tk_test::what_contains;

namespace {

template <class T>
double max_abs(const tensor<T>& t) {
  double m = 0;
  for (auto v : t.to_vector()) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}
template <class T>
double mean_of(const tensor<T>& t) {
  const auto v = t.to_vector();
  double s = 0;
  for (auto x : v) s += static_cast<double>(x);
  return s / static_cast<double>(v.size());
}
template <class T>
double std_of(const tensor<T>& t) {
  const auto v = t.to_vector();
  const double m = mean_of(t);
  double s = 0;
  for (auto x : v) s += (static_cast<double>(x) - m) * (static_cast<double>(x) - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

}  // namespace

TEST_CASE("fans and gains are torch's", "[nn][init]") {
  CHECK(nn::init::calculate_fans({5, 3}).fan_in == 3);
  CHECK(nn::init::calculate_fans({5, 3}).fan_out == 5);
  CHECK(nn::init::calculate_fans({8, 4, 3, 2}).fan_in == 24);
  CHECK(nn::init::calculate_fans({8, 4, 3, 2}).fan_out == 48);
  CHECK_THROWS_MATCHES(nn::init::calculate_fans({5}), value_error,
                       what_contains({"at least 2 dimensions", "[5]"}));
  using nn::init::nonlinearity;
  CHECK(nn::init::calculate_gain(nonlinearity::linear) == 1.0);
  CHECK(nn::init::calculate_gain(nonlinearity::sigmoid) == 1.0);
  CHECK(nn::init::calculate_gain(nonlinearity::tanh) == Approx(5.0 / 3.0));
  CHECK(nn::init::calculate_gain(nonlinearity::relu) == Approx(std::sqrt(2.0)));
  CHECK(nn::init::calculate_gain(nonlinearity::leaky_relu) == Approx(std::sqrt(2.0 / (1 + 0.01 * 0.01))));
  CHECK(nn::init::calculate_gain(nonlinearity::leaky_relu, std::sqrt(5.0)) == Approx(std::sqrt(1.0 / 3.0)));
  CHECK(nn::init::calculate_gain(nonlinearity::selu) == 0.75);
}

TEST_CASE("distributions: bounds and moments", "[nn][init]") {
  generator g(7);
  SECTION("uniform_") {
    auto t = nn::init::uniform_(tensor<float>::empty({100, 100}), -0.5, 2.0, g);
    const auto v = t.to_vector();
    CHECK(*std::min_element(v.begin(), v.end()) >= -0.5f);
    CHECK(*std::max_element(v.begin(), v.end()) < 2.0f);
    CHECK(mean_of(t) == Approx(0.75).margin(0.02));
    CHECK_THROWS_AS(nn::init::uniform_(t, 1.0, 0.0, g), value_error);
  }
  SECTION("normal_") {
    auto t = nn::init::normal_(tensor<double>::empty({200, 100}), 1.5, 0.25, g);
    CHECK(mean_of(t) == Approx(1.5).margin(0.01));
    CHECK(std_of(t) == Approx(0.25).epsilon(0.02));
    CHECK_THROWS_AS(nn::init::normal_(t, 0.0, -1.0, g), value_error);
  }
  SECTION("kaiming_uniform_ with a = sqrt(5) is U(-1/sqrt(fan_in), 1/sqrt(fan_in))") {
    auto t = nn::init::kaiming_uniform_(tensor<float>::empty({64, 16, 3, 3}), std::sqrt(5.0),
                                        nn::init::fan_mode::fan_in, nn::init::nonlinearity::leaky_relu, g);
    const double bound = 1.0 / std::sqrt(16.0 * 9.0);
    CHECK(max_abs(t) <= bound);
    CHECK(max_abs(t) > 0.99 * bound);
    CHECK(std_of(t) == Approx(bound / std::sqrt(3.0)).epsilon(0.03));
  }
  SECTION("kaiming_uniform_ default (relu-like, fan_out)") {
    auto t = nn::init::kaiming_uniform_(tensor<float>::empty({50, 200}), 0.0, nn::init::fan_mode::fan_out,
                                        nn::init::nonlinearity::relu, g);
    const double bound = std::sqrt(2.0) * std::sqrt(3.0 / 50.0);
    CHECK(max_abs(t) <= bound);
    CHECK(max_abs(t) > 0.99 * bound);
  }
  SECTION("kaiming_normal_") {
    auto t = nn::init::kaiming_normal_(tensor<double>::empty({100, 400}), 0.0, nn::init::fan_mode::fan_in,
                                       nn::init::nonlinearity::relu, g);
    CHECK(std_of(t) == Approx(std::sqrt(2.0 / 400.0)).epsilon(0.02));
    CHECK(mean_of(t) == Approx(0.0).margin(0.002));
  }
  SECTION("xavier_uniform_ and xavier_normal_") {
    auto t = nn::init::xavier_uniform_(tensor<float>::empty({30, 70}), 2.0, g);
    const double bound = 2.0 * std::sqrt(6.0 / 100.0);
    CHECK(max_abs(t) <= bound);
    CHECK(max_abs(t) > 0.99 * bound);
    auto n = nn::init::xavier_normal_(tensor<double>::empty({300, 100}), 1.0, g);
    CHECK(std_of(n) == Approx(std::sqrt(2.0 / 400.0)).epsilon(0.02));
  }
  SECTION("constants") {
    auto t = tensor<float>::empty({3, 2});
    nn::init::ones_(t);
    CHECK(t.to_vector() == std::vector<float>(6, 1.0f));
    nn::init::zeros_(t);
    CHECK(t.to_vector() == std::vector<float>(6, 0.0f));
    nn::init::constant_(t, 0.5);
    CHECK(t.to_vector() == std::vector<float>(6, 0.5f));
  }
  SECTION("views and 16-bit types") {
    auto base = tensor<float>::zeros({4, 6});
    nn::init::uniform_(base.t(), 1.0, 2.0, g);  // a transposed (non-contiguous) view writes into base
    for (float v : base.to_vector()) CHECK((v >= 1.0f && v < 2.0f));
    auto h = nn::init::kaiming_uniform_(tensor<trainkit::half>::empty({8, 9}), std::sqrt(5.0),
                                        nn::init::fan_mode::fan_in, nn::init::nonlinearity::leaky_relu, g);
    CHECK(max_abs(h) <= 1.0 / 3.0 + 1e-3);
    CHECK(max_abs(h) > 0.2);
  }
}

TEST_CASE("a seed reproduces every initialiser and layer", "[nn][init]") {
  generator a(42), b(42), c(43);
  const auto ta = nn::init::kaiming_uniform_(tensor<float>::empty({5, 7}), 0.0, nn::init::fan_mode::fan_in,
                                             nn::init::nonlinearity::leaky_relu, a);
  const auto tb = nn::init::kaiming_uniform_(tensor<float>::empty({5, 7}), 0.0, nn::init::fan_mode::fan_in,
                                             nn::init::nonlinearity::leaky_relu, b);
  const auto tc = nn::init::kaiming_uniform_(tensor<float>::empty({5, 7}), 0.0, nn::init::fan_mode::fan_in,
                                             nn::init::nonlinearity::leaky_relu, c);
  CHECK(ta.to_vector() == tb.to_vector());
  CHECK(ta.to_vector() != tc.to_vector());

  generator g1(5), g2(5);
  nn::linear<float> l1(10, 4, true, g1), l2(10, 4, true, g2);
  CHECK(l1.weight().value().to_vector() == l2.weight().value().to_vector());
  CHECK(l1.bias().value().to_vector() == l2.bias().value().to_vector());
  nn::linear<float> l3(10, 4, true, g1);  // the stream moved on
  CHECK(l1.weight().value().to_vector() != l3.weight().value().to_vector());

  // The default generator reproduces after manual_seed.
  manual_seed(123);
  nn::conv2d<double> k1(3, 4, 3);
  manual_seed(123);
  nn::conv2d<double> k2(3, 4, 3);
  CHECK(k1.weight().value().to_vector() == k2.weight().value().to_vector());
  CHECK(k1.bias().value().to_vector() == k2.bias().value().to_vector());
}

TEST_CASE("layers are initialised as PyTorch's", "[nn][init]") {
  generator g(11);
  SECTION("linear: weight and bias in U(-1/sqrt(in), 1/sqrt(in))") {
    nn::linear<float> l(100, 64, true, g);
    CHECK(l.weight().sizes() == shape{64, 100});
    CHECK(l.bias().sizes() == shape{64});
    CHECK(max_abs(l.weight().value()) <= 0.1);
    CHECK(max_abs(l.weight().value()) > 0.099);
    CHECK(max_abs(l.bias().value()) <= 0.1);
    CHECK(max_abs(l.bias().value()) > 0.08);
    nn::linear<float> nb(3, 2, false, g);
    CHECK_FALSE(nb.bias().defined());
    CHECK(nb.parameters().size() == 1);
    CHECK_THROWS_AS(nn::linear<float>(0, 3), value_error);
  }
  SECTION("conv2d: bound 1/sqrt(in/groups * kh * kw)") {
    nn::conv2d<float> c(8, 16, {3, 5}, {.groups = 2}, g);
    CHECK(c.weight().sizes() == shape{16, 4, 3, 5});
    const double bound = 1.0 / std::sqrt(4.0 * 15.0);
    CHECK(max_abs(c.weight().value()) <= bound);
    CHECK(max_abs(c.weight().value()) > 0.99 * bound);
    CHECK(max_abs(c.bias().value()) <= bound);
    CHECK_FALSE(nn::conv2d<float>(2, 2, 1, {.bias = false}).bias().defined());
  }
  SECTION("norms: weight 1, bias 0, running mean 0, running var 1") {
    nn::batch_norm2d<float> bn(3);
    CHECK(bn.weight().value().to_vector() == std::vector<float>(3, 1.0f));
    CHECK(bn.bias().value().to_vector() == std::vector<float>(3, 0.0f));
    CHECK(bn.running_mean().to_vector() == std::vector<float>(3, 0.0f));
    CHECK(bn.running_var().to_vector() == std::vector<float>(3, 1.0f));
    CHECK(bn.num_batches_tracked().item() == 0.0f);
    nn::layer_norm<float> ln(shape{2, 3});
    CHECK(ln.weight().value().to_vector() == std::vector<float>(6, 1.0f));
    CHECK(ln.bias().value().to_vector() == std::vector<float>(6, 0.0f));
    CHECK(ln.weight().sizes() == shape{2, 3});
  }
  SECTION("embedding: N(0, 1)") {
    nn::embedding<double> e(500, 40, g);
    CHECK(mean_of(e.weight().value()) == Approx(0.0).margin(0.02));
    CHECK(std_of(e.weight().value()) == Approx(1.0).epsilon(0.02));
  }
}
