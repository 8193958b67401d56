// tests/autograd/test_nn_norm.cpp - batch_norm and layer_norm: forward against naive loops,
// running-statistics updates, backward against finite differences, bad inputs.
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

namespace {

struct channel_stats {
  std::vector<double> mean, var_biased, var_unbiased;
};

/// Per-channel statistics of x [N, C, *] by plain loops.
channel_stats naive_stats(const dtensor& x) {
  const index_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  const auto v = x.contiguous().to_vector();
  channel_stats st;
  for (index_t ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < s; ++j) sum += v[std::size_t((i * c + ch) * s + j)];
    const double m = sum / double(n * s);
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < s; ++j) sq += std::pow(v[std::size_t((i * c + ch) * s + j)] - m, 2);
    st.mean.push_back(m);
    st.var_biased.push_back(sq / double(n * s));
    st.var_unbiased.push_back(sq / double(n * s - 1));
  }
  return st;
}

dtensor naive_batch_norm(const dtensor& x, const std::vector<double>& mean, const std::vector<double>& var,
                         const dtensor& w, const dtensor& b, double eps) {
  const index_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  auto v = x.contiguous().to_vector();
  for (index_t i = 0; i < n; ++i)
    for (index_t ch = 0; ch < c; ++ch)
      for (index_t j = 0; j < s; ++j) {
        double& e = v[std::size_t((i * c + ch) * s + j)];
        e = (e - mean[std::size_t(ch)]) / std::sqrt(var[std::size_t(ch)] + eps);
        if (w.defined()) e *= w.at({ch});
        if (b.defined()) e += b.at({ch});
      }
  return dtensor::from_vector(v, x.sizes());
}

dtensor naive_layer_norm(const dtensor& x, index_t cols, const dtensor& w, const dtensor& b, double eps) {
  auto v = x.contiguous().to_vector();
  const auto wv = w.defined() ? w.contiguous().to_vector() : std::vector<double>();
  const auto bv = b.defined() ? b.contiguous().to_vector() : std::vector<double>();
  for (std::size_t r = 0; r < v.size() / std::size_t(cols); ++r) {
    double m = 0, q = 0;
    for (index_t j = 0; j < cols; ++j) m += v[r * std::size_t(cols) + std::size_t(j)];
    m /= double(cols);
    for (index_t j = 0; j < cols; ++j) q += std::pow(v[r * std::size_t(cols) + std::size_t(j)] - m, 2);
    q /= double(cols);
    for (index_t j = 0; j < cols; ++j) {
      double& e = v[r * std::size_t(cols) + std::size_t(j)];
      e = (e - m) / std::sqrt(q + eps);
      if (w.defined()) e *= wv[std::size_t(j)];
      if (b.defined()) e += bv[std::size_t(j)];
    }
  }
  return dtensor::from_vector(v, x.sizes());
}

}  // namespace

TEST_CASE("batch_norm training normalises with batch statistics and updates the running ones", "[nn][norm]") {
  std::mt19937 rng(11);
  for (shape xs : {shape{6, 3}, shape{4, 2, 5, 3}, shape{2, 3, 7}, shape{3, 1, 2, 2}}) {
    INFO("x " << to_string(xs));
    const index_t c = xs[1];
    const auto x = tk_test::random_tensor(xs, rng, -2, 3), w = tk_test::random_tensor({c}, rng),
               b = tk_test::random_tensor({c}, rng);
    auto rm = tk_test::random_tensor({c}, rng), rv = tk_test::random_tensor({c}, rng, 0.5, 2.0);
    const auto rm0 = rm.clone(), rv0 = rv.clone();
    const auto st = naive_stats(x);
    auto y = batch_norm(dvar(x), dvar(w), dvar(b), rm, rv, true, 0.3, 1e-3);
    TK_REQUIRE_CLOSE(y.value(), naive_batch_norm(x, st.mean, st.var_biased, w, b, 1e-3), 1e-10);
    for (index_t ch = 0; ch < c; ++ch) {
      REQUIRE(rm.at({ch}) == Approx(0.7 * rm0.at({ch}) + 0.3 * st.mean[std::size_t(ch)]).epsilon(1e-12));
      REQUIRE(rv.at({ch}) == Approx(0.7 * rv0.at({ch}) + 0.3 * st.var_unbiased[std::size_t(ch)]).epsilon(1e-12));
    }
    // affine = false
    auto y2 = batch_norm(dvar(x), dvar(), dvar(), rm, rv, true);
    TK_REQUIRE_CLOSE(y2.value(), naive_batch_norm(x, st.mean, st.var_biased, dtensor(), dtensor(), 1e-5), 1e-10);
  }
}

TEST_CASE("batch_norm eval uses the running statistics and leaves them alone", "[nn][norm]") {
  std::mt19937 rng(12);
  const auto x = tk_test::random_tensor({5, 3, 4}, rng), w = tk_test::random_tensor({3}, rng),
             b = tk_test::random_tensor({3}, rng);
  auto rm = tk_test::random_tensor({3}, rng), rv = tk_test::random_tensor({3}, rng, 0.5, 2.0);
  const auto rm0 = rm.clone(), rv0 = rv.clone();
  auto y = batch_norm(dvar(x), dvar(w), dvar(b), rm, rv, false);
  TK_REQUIRE_CLOSE(y.value(), naive_batch_norm(x, rm0.to_vector(), rv0.to_vector(), w, b, 1e-5), 1e-12);
  TK_REQUIRE_CLOSE(rm, rm0, 0.0);
  TK_REQUIRE_CLOSE(rv, rv0, 0.0);
  // No running statistics: batch statistics even in eval (track_running_stats=False).
  dtensor none_m, none_v;
  const auto st = naive_stats(x);
  TK_REQUIRE_CLOSE(batch_norm(dvar(x), dvar(w), dvar(b), none_m, none_v, false).value(),
                   naive_batch_norm(x, st.mean, st.var_biased, w, b, 1e-5), 1e-10);
}

TEST_CASE("batch_norm running statistics can be strided views", "[nn][norm]") {
  std::mt19937 rng(13);
  const auto x = tk_test::random_tensor({4, 3}, rng);
  auto big_m = dtensor::zeros({6}), big_v = dtensor::ones({6});
  auto rm = big_m.slice(0, 0, 6, 2), rv = big_v.slice(0, 0, 6, 2);
  batch_norm(dvar(x), dvar(), dvar(), rm, rv, true, 1.0);
  const auto st = naive_stats(x);
  for (index_t ch = 0; ch < 3; ++ch) {
    REQUIRE(big_m.at({2 * ch}) == Approx(st.mean[std::size_t(ch)]));
    REQUIRE(big_v.at({2 * ch}) == Approx(st.var_unbiased[std::size_t(ch)]));
    REQUIRE(big_m.at({2 * ch + 1}) == 0.0);
  }
}

TEST_CASE("batch_norm backward matches finite differences", "[nn][norm][grad]") {
  std::mt19937 rng(14);
  for (bool training : {true, false}) {
    for (shape xs : {shape{5, 3}, shape{3, 2, 3, 2}, shape{2, 1, 4}}) {
      for (layout l : {layout::contiguous, layout::transposed}) {
        INFO("training " << training << " x " << to_string(xs) << " layout " << tk_test::to_string(l));
        const index_t c = xs[1];
        const auto x = tk_test::with_layout(tk_test::random_tensor(xs, rng), l);
        const auto w = tk_test::random_tensor({c}, rng), b = tk_test::random_tensor({c}, rng);
        const auto rm = tk_test::random_tensor({c}, rng), rv = tk_test::random_tensor({c}, rng, 0.5, 2.0);
        // Fresh running statistics on every evaluation: the finite differences must see the same function.
        auto f = [=](const std::vector<dvar>& v) {
          auto m = rm.clone(), s = rv.clone();
          return batch_norm(v[0], v[1], v[2], m, s, training, 0.1, 1e-3);
        };
        TK_REQUIRE_GRADCHECK(f, {x, w, b});
        auto f2 = [=](const std::vector<dvar>& v) {
          auto m = rm.clone(), s = rv.clone();
          return batch_norm(v[0], dvar(), dvar(), m, s, training);
        };
        TK_REQUIRE_GRADCHECK(f2, {x});
      }
    }
  }
}

TEST_CASE("batch_norm works in float on a large input", "[nn][norm]") {
  std::mt19937 rng(15);
  const auto x = tk_test::random_tensor<float>({16, 8, 30, 30}, rng, 5.0, 7.0);
  auto rm = tensor<float>::zeros({8}), rv = tensor<float>::ones({8});
  var<float> xv(x, true);
  auto y = batch_norm(xv, var<float>(), var<float>(), rm, rv, true);
  // Normalised per channel: mean 0, variance 1 (float statistics accumulate in double).
  const auto m = mean(y.value(), {0, 2, 3});
  const auto sq = mean(y.value() * y.value(), {0, 2, 3});
  for (index_t ch = 0; ch < 8; ++ch) {
    REQUIRE(std::abs(m.at({ch})) < 1e-4);
    REQUIRE(sq.at({ch}) == Approx(1.0).epsilon(1e-3));
  }
  y.backward(tensor<float>::ones(y.sizes()));
  // The gradient of sum(normalised x) is zero.
  REQUIRE(amax(abs(xv.grad())).item() < 1e-4);
}

TEST_CASE("batch_norm rejects bad inputs", "[nn][norm][errors]") {
  dtensor rm = dtensor::zeros({3}), rv = dtensor::ones({3});
  REQUIRE_THROWS_AS(batch_norm(dvar(dtensor::zeros({4})), dvar(), dvar(), rm, rv, true), shape_error);
  REQUIRE_THROWS_WITH(batch_norm(dvar(dtensor::zeros({4})), dvar(), dvar(), rm, rv, true),
                      Catch::Contains("batch_norm") && Catch::Contains("[4]"));
  REQUIRE_THROWS_AS(batch_norm(dvar(dtensor::zeros({4, 2})), dvar(), dvar(), rm, rv, true), shape_error);
  REQUIRE_THROWS_WITH(batch_norm(dvar(dtensor::zeros({4, 2})), dvar(), dvar(), rm, rv, true),
                      Catch::Contains("running_mean of sizes [3]") && Catch::Contains("[4, 2]"));
  REQUIRE_THROWS_WITH(batch_norm(dvar(dtensor::zeros({4, 3})), dvar(dtensor::ones({2})), dvar(), rm, rv, true),
                      Catch::Contains("weight of sizes [2]"));
  REQUIRE_THROWS_AS(batch_norm(dvar(dtensor::zeros({1, 3})), dvar(), dvar(), rm, rv, true), value_error);
  REQUIRE_THROWS_WITH(batch_norm(dvar(dtensor::zeros({1, 3})), dvar(), dvar(), rm, rv, true),
                      Catch::Contains("more than 1 value per channel") && Catch::Contains("[1, 3]"));
  REQUIRE_NOTHROW(batch_norm(dvar(dtensor::zeros({1, 3})), dvar(), dvar(), rm, rv, false));
}

TEST_CASE("layer_norm forward matches a naive loop", "[nn][norm]") {
  std::mt19937 rng(16);
  struct cfg {
    shape x, ns;
  };
  for (const auto& c : {cfg{{4, 5}, {5}}, cfg{{2, 3, 4}, {3, 4}}, cfg{{3, 1}, {1}}, cfg{{2, 2, 6}, {6}}}) {
    INFO("x " << to_string(c.x) << " normalized " << to_string(c.ns));
    const auto x = tk_test::random_tensor(c.x, rng, -3, 2), w = tk_test::random_tensor(c.ns, rng),
               b = tk_test::random_tensor(c.ns, rng);
    TK_REQUIRE_CLOSE(layer_norm(dvar(x), c.ns, dvar(w), dvar(b)).value(), naive_layer_norm(x, numel(c.ns), w, b, 1e-5),
                     1e-10);
    TK_REQUIRE_CLOSE(layer_norm(dvar(x), c.ns).value(), naive_layer_norm(x, numel(c.ns), dtensor(), dtensor(), 1e-5),
                     1e-10);
  }
}

TEST_CASE("layer_norm backward matches finite differences", "[nn][norm][grad]") {
  std::mt19937 rng(17);
  struct cfg {
    shape x, ns;
  };
  for (const auto& c : {cfg{{4, 5}, {5}}, cfg{{2, 3, 4}, {3, 4}}, cfg{{3, 2}, {2}}, cfg{{1, 1, 3}, {3}}}) {
    for (layout l : {layout::contiguous, layout::strided, layout::transposed}) {
      INFO("x " << to_string(c.x) << " layout " << tk_test::to_string(l));
      const auto x = tk_test::with_layout(tk_test::random_tensor(c.x, rng), l);
      const auto w = tk_test::random_tensor(c.ns, rng), b = tk_test::random_tensor(c.ns, rng);
      const shape ns = c.ns;
      TK_REQUIRE_GRADCHECK([ns](const auto& v) { return layer_norm(v[0], ns, v[1], v[2], 1e-3); }, {x, w, b});
      TK_REQUIRE_GRADCHECK([ns](const auto& v) { return layer_norm(v[0], ns); }, {x});
      TK_REQUIRE_GRADCHECK([ns](const auto& v) { return layer_norm(v[0], ns, v[1]); }, {x, w}, {}, {false, true});
    }
  }
  // Many rows: the weight/bias gradients are summed by several threads.
  const auto x = tk_test::random_tensor({300, 4}, rng);
  const auto w = tk_test::random_tensor({4}, rng), b = tk_test::random_tensor({4}, rng);
  TK_REQUIRE_GRADCHECK([](const auto& v) { return layer_norm(v[0], {4}, v[1], v[2]); }, {x, w, b}, {},
                       {false, true, true});
}

TEST_CASE("layer_norm rejects bad shapes", "[nn][norm][errors]") {
  dvar x(dtensor::zeros({2, 3, 4}));
  REQUIRE_THROWS_AS(layer_norm(x, {3}), shape_error);
  REQUIRE_THROWS_WITH(layer_norm(x, {3}), Catch::Contains("layer_norm") && Catch::Contains("[3]") &&
                                              Catch::Contains("[2, 3, 4]"));
  REQUIRE_THROWS_AS(layer_norm(x, {4}, dvar(dtensor::ones({3}))), shape_error);
  REQUIRE_THROWS_WITH(layer_norm(x, {4}, dvar(dtensor::ones({3}))), Catch::Contains("weight of sizes [3]"));
  REQUIRE_THROWS_WITH(layer_norm(x, {3, 4}, {}, dvar(dtensor::ones({4}))), Catch::Contains("bias of sizes [4]"));
  REQUIRE_THROWS_WITH(layer_norm(x, {1, 2, 3, 4}), Catch::Contains("[1, 2, 3, 4]"));
}
