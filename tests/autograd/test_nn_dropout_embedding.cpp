// tests/autograd/test_nn_dropout_embedding.cpp - dropout (Philox stream, scale, gradient) and
// embedding (lookup, scatter-add gradient, bad indices).
#include <catch2/catch.hpp>

#include <random>

#include "support/gradcheck.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using namespace trainkit::autograd;
using tk_test::dtensor;
using tk_test::dvar;
using itensor = tensor<std::int64_t>;

TEST_CASE("dropout: the same generator state gives the same mask", "[nn][dropout]") {
  std::mt19937 rng(41);
  const auto x = tk_test::random_tensor<float>({7, 9}, rng);
  generator a(42), b(42), c(43);
  const auto ya = dropout(var<float>(x), 0.3, true, a).value();
  const auto yb = dropout(var<float>(x), 0.3, true, b).value();
  const auto yc = dropout(var<float>(x), 0.3, true, c).value();
  TK_REQUIRE_CLOSE(ya, yb, 0.0);
  REQUIRE(tk_test::max_abs_diff(ya, yc) > 0);
  // The next draw moves on: a second mask from the same generator differs.
  REQUIRE(tk_test::max_abs_diff(dropout(var<float>(x), 0.3, true, a).value(), ya) > 0);
  // get_state / set_state replays a mask (what gradient checkpointing relies on).
  generator g(7);
  const auto s = g.get_state();
  const auto m1 = dropout(var<float>(x), 0.5, true, g).value();
  g.set_state(s);
  TK_REQUIRE_CLOSE(dropout(var<float>(x), 0.5, true, g).value(), m1, 0.0);
}

TEST_CASE("dropout follows the documented stream rule and advances the generator", "[nn][dropout]") {
  std::mt19937 rng(42);
  const auto x = tk_test::random_tensor({5, 11}, rng, 1, 2);  // 55 elements: 14 blocks
  generator g(1234);
  g.reserve(8);  // start somewhere other than offset 0
  const auto seed = g.seed(), offset = g.offset();
  const auto y = dropout(dvar(x), 0.25, true, g).value();
  REQUIRE(g.offset() == offset + 14);
  const auto xv = x.to_vector(), yv = y.to_vector();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const bool keep = bernoulli_at(seed, offset, i, 0.75f);
    kept += keep;
    INFO("element " << i);
    REQUIRE(yv[i] == (keep ? xv[i] * (1.0 / 0.75) : 0.0));
  }
  REQUIRE(kept > 0);
  REQUIRE(kept < xv.size());
  // dropout_mask gives the same mask on its own.
  generator h(1234);
  h.reserve(8);
  const auto mask = dropout_mask<double, cpu>({5, 11}, 0.25, h);
  TK_REQUIRE_CLOSE(mask * x, y, 1e-15);
}

TEST_CASE("dropout keeps the mean and drops about p of the elements", "[nn][dropout]") {
  generator g(5);
  const index_t n = 200000;
  for (double p : {0.1, 0.5, 0.8}) {
    INFO("p " << p);
    const auto y = dropout(var<float>(tensor<float>::ones({n})), p, true, g).value();
    const auto v = y.to_vector();
    index_t zeros = 0, wrong = 0;
    const float scale = float(1.0 / (1.0 - p));
    for (float e : v) {
      if (e == 0.0f)
        ++zeros;
      else if (e != scale)
        ++wrong;
    }
    REQUIRE(wrong == 0);
    REQUIRE(double(zeros) / double(n) == Approx(p).margin(0.005));
    REQUIRE(mean(y).item() == Approx(1.0).margin(0.02));
  }
}

TEST_CASE("dropout gradient is the scaled mask", "[nn][dropout][grad]") {
  std::mt19937 rng(43);
  const auto x = tk_test::random_tensor({6, 8}, rng, 1, 2);
  generator g(9);
  dvar xv(x, true);
  auto y = dropout(xv, 0.4, true, g);
  const auto gout = tk_test::random_tensor({6, 8}, rng);
  y.backward(gout);
  // mask * scale = y / x; the gradient is g * mask * scale.
  TK_REQUIRE_CLOSE(xv.grad(), gout * (y.value() / x), 1e-12);
  // Finite differences with the generator reset before every evaluation (the same mask).
  TK_REQUIRE_GRADCHECK(
      [](const auto& v) {
        generator h(11);
        return dropout(v[0], 0.3, true, h);
      },
      {tk_test::with_layout(x, tk_test::layout::transposed)});
}

TEST_CASE("dropout on a non-contiguous input masks it in row-major order", "[nn][dropout]") {
  std::mt19937 rng(44);
  const auto x = tk_test::with_layout(tk_test::random_tensor<float>({4, 6}, rng), tk_test::layout::transposed);
  generator a(3), b(3);
  TK_REQUIRE_CLOSE(dropout(var<float>(x), 0.5, true, a).value(), dropout(var<float>(x.contiguous()), 0.5, true, b).value(),
                   0.0);
}

TEST_CASE("dropout edge cases: eval, p = 0, p = 1", "[nn][dropout]") {
  std::mt19937 rng(45);
  const auto x = tk_test::random_tensor({3, 4}, rng);
  generator g(1);
  dvar xv(x, true);
  REQUIRE(dropout(xv, 0.5, false, g).same(xv));
  REQUIRE(dropout(xv, 0.0, true, g).same(xv));
  REQUIRE(g.offset() == 0);  // nothing drawn
  auto y = dropout(xv, 1.0, true, g);
  TK_REQUIRE_CLOSE(y.value(), dtensor::zeros({3, 4}), 0.0);
  y.backward(dtensor::ones({3, 4}));
  TK_REQUIRE_CLOSE(xv.grad(), dtensor::zeros({3, 4}), 0.0);
  // Without an explicit generator the default one is used and advanced.
  const auto before = default_generator().offset();
  dropout(xv, 0.5, true);
  REQUIRE(default_generator().offset() == before + 3);
}

TEST_CASE("dropout rejects a probability outside [0, 1]", "[nn][dropout][errors]") {
  dvar x(dtensor::ones({2, 5}));
  REQUIRE_THROWS_AS(dropout(x, 1.5, true), value_error);
  REQUIRE_THROWS_WITH(dropout(x, -0.1, true),
                      Catch::Contains("dropout") && Catch::Contains("-0.1") && Catch::Contains("[2, 5]"));
}

TEST_CASE("embedding looks up rows", "[nn][embedding]") {
  std::mt19937 rng(46);
  const auto w = tk_test::random_tensor({5, 3}, rng);
  const auto idx = itensor::from_vector({4, 0, 4, 2, 1, 3}, {2, 3});
  auto y = embedding(idx, dvar(w)).value();
  REQUIRE(y.sizes() == shape{2, 3, 3});
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 3; ++j)
      for (index_t d = 0; d < 3; ++d) REQUIRE(y.at({i, j, d}) == w.at({idx.at({i, j}), d}));
  REQUIRE(embedding(itensor::scalar(2), dvar(w)).sizes() == shape{3});
  REQUIRE(embedding(itensor::zeros({0}), dvar(w)).sizes() == shape{0, 3});
  // Non-contiguous indices and weight.
  const auto wt = tk_test::with_layout(w, tk_test::layout::transposed);
  const auto it = tk_test::with_layout(idx, tk_test::layout::strided);
  TK_REQUIRE_CLOSE(embedding(it, dvar(wt)).value(), y, 0.0);
}

TEST_CASE("embedding backward scatter-adds repeated indices", "[nn][embedding][grad]") {
  std::mt19937 rng(47);
  const auto idx = itensor::from_vector({1, 3, 1, 1, 0, 3, 4}, {7});
  TK_REQUIRE_GRADCHECK([idx](const auto& v) { return embedding(idx, v[0]); }, {tk_test::random_tensor({6, 4}, rng)});
  const auto idx2 = itensor::from_vector({2, 2, 0, 1}, {2, 2});
  TK_REQUIRE_GRADCHECK([idx2](const auto& v) { return embedding(idx2, v[0]); },
                       {tk_test::with_layout(tk_test::random_tensor({3, 5}, rng), tk_test::layout::transposed)});
  // A large table: the column blocks are summed by several threads.
  const auto w = tk_test::random_tensor<float>({50, 200}, rng);
  const auto big = tk_test::random_indices({400}, 50, rng);
  var<float> wv(w, true);
  auto y = embedding(big, wv);
  const auto g = tk_test::random_tensor<float>({400, 200}, rng);
  y.backward(g);
  auto expect = tensor<double>::zeros({50, 200});
  for (index_t i = 0; i < 400; ++i)
    for (index_t d = 0; d < 200; ++d) expect.at({big.at({i}), d}) += double(g.at({i, d}));
  TK_REQUIRE_CLOSE(cast<double>(wv.grad()), expect, 1e-4);
}

TEST_CASE("embedding rejects bad indices and weights", "[nn][embedding][errors]") {
  dvar w(dtensor::zeros({10, 4}));
  const auto bad = itensor::from_vector({1, 2, 3, 12}, {2, 2});
  REQUIRE_THROWS_AS(embedding(bad, w), index_error);
  REQUIRE_THROWS_WITH(embedding(bad, w), Catch::Contains("embedding") && Catch::Contains("index 12") &&
                                             Catch::Contains("position [1, 1]") &&
                                             Catch::Contains("num_embeddings = 10"));
  REQUIRE_THROWS_AS(embedding(itensor::from_vector({-1}, {1}), w), index_error);
  REQUIRE_THROWS_AS(embedding(itensor::zeros({2}), dvar(dtensor::zeros({10}))), shape_error);
  REQUIRE_THROWS_WITH(embedding(itensor::zeros({2}), dvar(dtensor::zeros({10}))), Catch::Contains("[10]"));
}
