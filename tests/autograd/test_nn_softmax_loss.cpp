// tests/autograd/test_nn_softmax_loss.cpp - softmax, log_softmax, cross_entropy, nll_loss and
// mse_loss: forward against naive formulas and PyTorch values, backward against finite
// differences, label smoothing, ignore_index, bad inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "support/gradcheck.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using namespace trainkit::autograd;
using tk_test::dtensor;
using tk_test::dvar;
using tk_test::layout;
using itensor = tensor<std::int64_t>;

namespace {

/// Softmax along dim by the textbook formula on a contiguous copy.
dtensor naive_softmax(const dtensor& x, index_t dim, bool log) {
  const auto xm = x.transpose(dim, -1).contiguous();  // softmax dim last
  auto v = xm.to_vector();
  const index_t n = xm.size(-1);
  for (std::size_t r = 0; r < v.size() / std::size_t(n); ++r) {
    double mx = -INFINITY, s = 0;
    for (index_t j = 0; j < n; ++j) mx = std::max(mx, v[r * std::size_t(n) + std::size_t(j)]);
    for (index_t j = 0; j < n; ++j) s += std::exp(v[r * std::size_t(n) + std::size_t(j)] - mx);
    for (index_t j = 0; j < n; ++j) {
      double& e = v[r * std::size_t(n) + std::size_t(j)];
      e = log ? e - mx - std::log(s) : std::exp(e - mx) / s;
    }
  }
  return dtensor::from_vector(v, xm.sizes()).transpose(dim, -1).contiguous();
}

const dtensor torch_logits = dtensor::from_vector({0.5, -1.0, 2.0, 0.0, 1.5, 0.25, -0.5, 3.0, -2.0, 1.0, 0.5, 0.75}, {3, 4});
const itensor torch_target = itensor::from_vector({1, -100, 3}, {3});

}  // namespace

TEST_CASE("softmax and log_softmax match the formula along every dim", "[nn][softmax]") {
  std::mt19937 rng(31);
  for (shape xs : {shape{4, 5}, shape{2, 3, 4}, shape{3, 1, 2}, shape{6}, shape{300, 7}, shape{2, 3, 600}}) {
    const auto x = tk_test::random_tensor(xs, rng, -5, 5);
    for (index_t d = -index_t(xs.size()); d < index_t(xs.size()); ++d) {
      INFO("x " << to_string(xs) << " dim " << d);
      TK_REQUIRE_CLOSE(softmax(dvar(x), d).value(), naive_softmax(x, d, false), 1e-14);
      TK_REQUIRE_CLOSE(log_softmax(dvar(x), d).value(), naive_softmax(x, d, true), 1e-12);
    }
  }
}

TEST_CASE("softmax is stable for huge logits", "[nn][softmax]") {
  auto x = tensor<float>::from_vector({1000.f, 1001.f, 999.f, -1000.f}, {1, 4});
  auto y = softmax(var<float>(x), 1).value();
  auto ly = log_softmax(var<float>(x), 1).value();
  for (index_t j = 0; j < 4; ++j) {
    REQUIRE(std::isfinite(y.at({0, j})));
    REQUIRE(std::isfinite(ly.at({0, j})));
  }
  // logsumexp = 1001 + log(1 + e^-1 + e^-2) (the -1000 term underflows)
  REQUIRE(y.at({0, 1}) == Approx(1.0 / (1 + std::exp(-1.0) + std::exp(-2.0))));
  REQUIRE(ly.at({0, 3}) == Approx(-2001.0 - std::log(1 + std::exp(-1.0) + std::exp(-2.0))).epsilon(1e-6));
}

TEST_CASE("softmax and log_softmax backward match finite differences", "[nn][softmax][grad]") {
  std::mt19937 rng(32);
  for (shape xs : {shape{3, 4}, shape{2, 3, 2}, shape{1, 5}, shape{4, 1}}) {
    for (layout l : {layout::contiguous, layout::transposed}) {
      for (index_t d : {index_t(0), index_t(-1)}) {
        INFO("x " << to_string(xs) << " dim " << d << " layout " << tk_test::to_string(l));
        const auto x = tk_test::with_layout(tk_test::random_tensor(xs, rng, -2, 2), l);
        TK_REQUIRE_GRADCHECK([d](const auto& v) { return softmax(v[0], d); }, {x});
        TK_REQUIRE_GRADCHECK([d](const auto& v) { return log_softmax(v[0], d); }, {x});
      }
    }
  }
}

TEST_CASE("softmax rejects a bad dim", "[nn][softmax][errors]") {
  REQUIRE_THROWS_AS(softmax(dvar(dtensor::zeros({2, 3})), 2), index_error);
  REQUIRE_THROWS_WITH(softmax(dvar(dtensor::zeros({2, 3})), 2), Catch::Contains("softmax") && Catch::Contains("2"));
  REQUIRE_THROWS_WITH(log_softmax(dvar(dtensor::zeros({2, 3})), -3), Catch::Contains("log_softmax"));
}

TEST_CASE("cross_entropy matches PyTorch values (ignore_index, label smoothing, reductions)", "[nn][loss]") {
  struct expected {
    double eps;
    reduction r;
    std::vector<double> v;
  };
  const std::vector<expected> cases = {
      {0.0, reduction::mean, {2.241172503808807}},
      {0.0, reduction::sum, {4.482345007617614}},
      {0.0, reduction::none, {3.342349582389822, 0.0, 1.139995425227791}},
      {0.2, reduction::mean, {2.172422503808807}},
      {0.2, reduction::sum, {4.344845007617614}},
      {0.2, reduction::none, {3.0673495823898227, 0.0, 1.277495425227791}},
  };
  for (const auto& c : cases) {
    INFO("label_smoothing " << c.eps << " reduction " << int(c.r));
    auto l = cross_entropy(dvar(torch_logits), torch_target, {.label_smoothing = c.eps, .reduce = c.r});
    const auto v = l.value().to_vector();
    REQUIRE(v.size() == c.v.size());
    for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == Approx(c.v[i]).epsilon(1e-12));
  }
  // Gradient of the smoothed mean loss, also from PyTorch.
  dvar x(torch_logits.clone(), true);
  cross_entropy(x, torch_target, {.label_smoothing = 0.2}).backward();
  const std::vector<double> g = {0.05422235475748989,   -0.4073231032956256, 0.33004996144308724, 0.023050787095048614,
                                 0,                     0,                   0,                   0,
                                 -0.014777280214523772, 0.18032881570658393, 0.09953822204852808, -0.2650897575405883};
  TK_REQUIRE_CLOSE(x.grad(), dtensor::from_vector(g, {3, 4}), 1e-12);
  // Spatial targets [N, C, d] (PyTorch: 1.2051664166805316).
  std::vector<double> xs(12);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(double(i));
  auto l = cross_entropy(dvar(dtensor::from_vector(xs, {2, 3, 2})), itensor::from_vector({0, 2, 1, 0}, {2, 2}),
                         {.label_smoothing = 0.1});
  REQUIRE(l.item() == Approx(1.2051664166805316).epsilon(1e-12));
  // nll_loss on log_softmax equals cross_entropy (PyTorch: 4.482345007617614 summed).
  REQUIRE(nll_loss(log_softmax(dvar(torch_logits), 1), torch_target, {.reduce = reduction::sum}).item() ==
          Approx(4.482345007617614).epsilon(1e-12));
}

TEST_CASE("cross_entropy is (1 - eps) nll + eps mean(-log p) over counted samples", "[nn][loss]") {
  std::mt19937 rng(33);
  const auto x = tk_test::random_tensor({6, 5}, rng, -3, 3);
  const auto t = itensor::from_vector({0, 4, 2, 2, 3, 1}, {6});
  const auto lp = naive_softmax(x, 1, true);
  for (double eps : {0.0, 0.1, 1.0}) {
    double total = 0;
    for (index_t i = 0; i < 6; ++i) {
      double smooth = 0;
      for (index_t c = 0; c < 5; ++c) smooth -= lp.at({i, c}) / 5.0;
      total += (1 - eps) * -lp.at({i, t.at({i})}) + eps * smooth;
    }
    REQUIRE(cross_entropy(dvar(x), t, {.label_smoothing = eps}).item() == Approx(total / 6).epsilon(1e-12));
    REQUIRE(cross_entropy(dvar(x), t, {.label_smoothing = eps, .reduce = reduction::sum}).item() ==
            Approx(total).epsilon(1e-12));
  }
  // A custom ignore_index that is a valid class; every target ignored gives NaN for mean.
  const auto all_ignored = itensor::full({6}, 2);
  REQUIRE(std::isnan(cross_entropy(dvar(x), all_ignored, {.ignore_index = 2}).item()));
  REQUIRE(cross_entropy(dvar(x), all_ignored, {.reduce = reduction::sum, .ignore_index = 2}).item() == 0.0);
  // Unbatched [C] logits with a 0-d target.
  REQUIRE(cross_entropy(dvar(x.select(0, 1)), itensor::scalar(4)).item() == Approx(-lp.at({1, 4})).epsilon(1e-12));
}

TEST_CASE("cross_entropy stays finite with -inf logits of non-target classes", "[nn][loss]") {
  auto x = dtensor::from_vector({0.0, -INFINITY, 1.0}, {1, 3});
  dvar xv(x, true);
  auto l = cross_entropy(xv, itensor::from_vector({2}, {1}));
  REQUIRE(std::isfinite(l.item()));
  l.backward();
  REQUIRE(xv.grad().at({0, 1}) == 0.0);
}

TEST_CASE("cross_entropy and nll_loss backward match finite differences", "[nn][loss][grad]") {
  std::mt19937 rng(34);
  struct cfg {
    shape x;
    double eps;
    reduction r;
  };
  const std::vector<cfg> cases = {
      {{5, 4}, 0.0, reduction::mean}, {{5, 4}, 0.3, reduction::mean}, {{5, 4}, 0.1, reduction::sum},
      {{5, 4}, 0.2, reduction::none}, {{2, 3, 4}, 0.1, reduction::mean}, {{2, 3, 2, 2}, 0.0, reduction::none},
      {{1, 1}, 0.5, reduction::mean}, {{3}, 0.2, reduction::mean},
  };
  for (const auto& c : cases) {
    for (layout l : {layout::contiguous, layout::transposed}) {
      INFO("x " << to_string(c.x) << " eps " << c.eps << " reduction " << int(c.r) << " layout "
                << tk_test::to_string(l));
      shape ts = c.x;
      if (ts.size() == 1)
        ts.clear();
      else
        ts.erase(ts.begin() + 1);
      const index_t classes = c.x.size() == 1 ? c.x[0] : c.x[1];
      auto t = tk_test::random_indices(ts, classes, rng);
      if (t.numel() > 2) t.data()[1] = -100;  // one ignored sample
      const auto x = tk_test::with_layout(tk_test::random_tensor(c.x, rng, -2, 2), l);
      const cross_entropy_options o{.label_smoothing = c.eps, .reduce = c.r};
      TK_REQUIRE_GRADCHECK([=](const auto& v) { return cross_entropy(v[0], t, o); }, {x});
      const nll_loss_options no{.reduce = c.r};
      TK_REQUIRE_GRADCHECK([=](const auto& v) { return nll_loss(v[0], t, no); }, {x});
    }
  }
}

TEST_CASE("cross_entropy works in float on a realistic batch", "[nn][loss]") {
  std::mt19937 rng(35);
  const auto x = tk_test::random_tensor<float>({128, 10}, rng, -4, 4);
  const auto t = tk_test::random_indices({128}, 10, rng);
  var<float> xv(x, true);
  auto l = cross_entropy(xv, t);
  REQUIRE(l.item() == Approx(cross_entropy(dvar(cast<double>(x)), t).item()).epsilon(1e-5));
  l.backward();
  // Each row of the gradient sums to zero (softmax minus a distribution).
  REQUIRE(amax(abs(sum(xv.grad(), {1}))).item() < 1e-6);
}

TEST_CASE("losses reject bad targets and shapes", "[nn][loss][errors]") {
  dvar x(dtensor::zeros({3, 4}));
  const auto bad = itensor::from_vector({1, 4, 0}, {3});
  REQUIRE_THROWS_AS(cross_entropy(x, bad), value_error);
  REQUIRE_THROWS_WITH(cross_entropy(x, bad), Catch::Contains("cross_entropy") && Catch::Contains("target 4") &&
                                                 Catch::Contains("position [1]") && Catch::Contains("4 classes") &&
                                                 Catch::Contains("[3, 4]"));
  REQUIRE_THROWS_WITH(cross_entropy(x, itensor::from_vector({1, -1, 0}, {3})), Catch::Contains("target -1"));
  REQUIRE_THROWS_AS(cross_entropy(x, itensor::zeros({4})), shape_error);
  REQUIRE_THROWS_WITH(cross_entropy(x, itensor::zeros({4})),
                      Catch::Contains("target of sizes [4]") && Catch::Contains("logits of sizes [3, 4]"));
  REQUIRE_THROWS_AS(cross_entropy(x, itensor::zeros({3}), {.label_smoothing = 1.5}), value_error);
  REQUIRE_THROWS_AS(nll_loss(x, bad), value_error);
  REQUIRE_THROWS_WITH(nll_loss(x, bad), Catch::Contains("nll_loss") && Catch::Contains("log_probs of sizes [3, 4]"));
  REQUIRE_THROWS_AS(mse_loss(x, dvar(dtensor::zeros({4, 3}))), shape_error);
  REQUIRE_THROWS_WITH(mse_loss(x, dvar(dtensor::zeros({4, 3}))),
                      Catch::Contains("mse_loss") && Catch::Contains("[3, 4]") && Catch::Contains("[4, 3]"));
}

TEST_CASE("mse_loss forward and backward", "[nn][loss][grad]") {
  std::mt19937 rng(36);
  const auto a = tk_test::random_tensor({3, 4}, rng), b = tk_test::random_tensor({3, 4}, rng);
  const auto d = (a - b).to_vector();
  double s = 0;
  for (double e : d) s += e * e;
  REQUIRE(mse_loss(dvar(a), dvar(b)).item() == Approx(s / 12).epsilon(1e-12));
  REQUIRE(mse_loss(dvar(a), dvar(b), reduction::sum).item() == Approx(s).epsilon(1e-12));
  TK_REQUIRE_CLOSE(mse_loss(dvar(a), dvar(b), reduction::none).value(), square(a - b), 1e-15);
  for (reduction r : {reduction::mean, reduction::sum, reduction::none}) {
    for (layout l : {layout::contiguous, layout::transposed}) {
      INFO("reduction " << int(r) << " layout " << tk_test::to_string(l));
      TK_REQUIRE_GRADCHECK([r](const auto& v) { return mse_loss(v[0], v[1], r); },
                           {tk_test::with_layout(a, l), tk_test::with_layout(b, l)});
    }
  }
  TK_REQUIRE_GRADCHECK([](const auto& v) { return mse_loss(v[0], v[1]); }, {a, b}, {}, {true, false});
}
