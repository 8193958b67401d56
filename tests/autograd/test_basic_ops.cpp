// tests/autograd/test_basic_ops.cpp - finite-difference checks of the basic autograd ops
// (arithmetic, pointwise, matmul, reductions, shape ops) with broadcasting, non-contiguous
// inputs and size-1 dims.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "support/gradcheck.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using namespace trainkit::autograd;
using tk_test::dtensor;
using tk_test::dvar;
using tk_test::layout;

namespace {

const layout all_layouts[] = {layout::contiguous, layout::strided, layout::transposed};

/// Random values in [lo, hi) with |x| >= gap, so kinks (relu at 0) stay out of reach of h.
dtensor away_from_zero(const shape& s, std::mt19937& rng, double lo, double hi, double gap = 1e-3) {
  auto t = tk_test::random_tensor(s, rng, lo, hi);
  for (index_t i = 0; i < t.numel(); ++i)
    if (std::abs(t.data()[i]) < gap) t.data()[i] = gap * 2;
  return t;
}

}  // namespace

TEST_CASE("binary arithmetic ops: gradients with broadcasting and non-contiguous inputs", "[autograd][grad]") {
  std::mt19937 rng(101);
  struct op {
    const char* name;
    std::function<dvar(const dvar&, const dvar&)> f;
    double lo_b;  // lower bound of the right operand (div and pow need it away from 0)
  };
  const std::vector<op> ops = {
      {"add", [](const dvar& a, const dvar& b) { return a + b; }, -1.0},
      {"add alpha", [](const dvar& a, const dvar& b) { return add(a, b, -2.5); }, -1.0},
      {"sub", [](const dvar& a, const dvar& b) { return a - b; }, -1.0},
      {"mul", [](const dvar& a, const dvar& b) { return a * b; }, -1.0},
      {"div", [](const dvar& a, const dvar& b) { return a / b; }, 0.5},
      {"pow", [](const dvar& a, const dvar& b) { return pow(exp(a), b); }, -1.0},  // exp keeps the base > 0
  };
  const std::vector<std::pair<shape, shape>> shapes = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}},       {{3, 1}, {1, 4}}, {{2, 1, 3}, {4, 1}},
      {{1}, {2, 3}},    {{}, {2, 3}},        {{2, 3}, {}},     {{1, 1}, {1, 1}},
  };
  for (const auto& o : ops)
    for (const auto& [sa, sb] : shapes)
      for (layout l : all_layouts) {
        INFO(o.name << " " << to_string(sa) << " with " << to_string(sb) << " layout " << tk_test::to_string(l));
        const auto a = tk_test::with_layout(tk_test::random_tensor(sa, rng), l);
        const auto b = tk_test::with_layout(tk_test::random_tensor(sb, rng, o.lo_b, o.lo_b + 1.5), l);
        TK_REQUIRE_GRADCHECK([&o](const auto& v) { return o.f(v[0], v[1]); }, {a, b});
        // Only one side requires grad.
        TK_REQUIRE_GRADCHECK([&o](const auto& v) { return o.f(v[0], v[1]); }, {a, b}, {}, {false, true});
        TK_REQUIRE_GRADCHECK([&o](const auto& v) { return o.f(v[0], v[1]); }, {a, b}, {}, {true, false});
      }
}

TEST_CASE("arithmetic with scalars and negation: gradients", "[autograd][grad]") {
  std::mt19937 rng(102);
  const std::vector<std::pair<const char*, std::function<dvar(const dvar&)>>> ops = {
      {"neg", [](const dvar& a) { return -a; }},
      {"x + s", [](const dvar& a) { return a + 1.5; }},
      {"s + x", [](const dvar& a) { return 1.5 + a; }},
      {"x - s", [](const dvar& a) { return a - 0.5; }},
      {"s - x", [](const dvar& a) { return 2.0 - a; }},
      {"x * s", [](const dvar& a) { return a * 3.0; }},
      {"s * x", [](const dvar& a) { return -2.0 * a; }},
      {"x / s", [](const dvar& a) { return a / 4.0; }},
      {"s / x", [](const dvar& a) { return 2.0 / a; }},
      {"pow 2", [](const dvar& a) { return pow(a, 2.0); }},
      {"pow 3", [](const dvar& a) { return pow(a, 3.0); }},
      {"pow -1.5", [](const dvar& a) { return pow(a, -1.5); }},
      {"pow 0.5", [](const dvar& a) { return pow(a, 0.5); }},
  };
  for (const auto& [name, f] : ops)
    for (shape s : {shape{3, 4}, shape{1, 5}, shape{}, shape{2, 1, 3}})
      for (layout l : all_layouts) {
        INFO(name << " " << to_string(s) << " layout " << tk_test::to_string(l));
        const auto x = tk_test::with_layout(tk_test::random_tensor(s, rng, 0.5, 2.0), l);  // > 0 for pow/div
        TK_REQUIRE_GRADCHECK([&f](const auto& v) { return f(v[0]); }, {x});
      }
}

TEST_CASE("pointwise functions: gradients", "[autograd][grad]") {
  std::mt19937 rng(103);
  struct op {
    const char* name;
    std::function<dvar(const dvar&)> f;
    double lo, hi;
  };
  const std::vector<op> ops = {
      {"exp", [](const dvar& a) { return exp(a); }, -2, 2},
      {"log", [](const dvar& a) { return log(a); }, 0.2, 3},
      {"sqrt", [](const dvar& a) { return sqrt(a); }, 0.2, 3},
      {"tanh", [](const dvar& a) { return tanh(a); }, -3, 3},
      {"sigmoid", [](const dvar& a) { return sigmoid(a); }, -6, 6},
      {"relu", [](const dvar& a) { return relu(a); }, -2, 2},
      {"gelu", [](const dvar& a) { return gelu(a); }, -3, 3},
  };
  for (const auto& o : ops)
    for (shape s : {shape{4, 3}, shape{1}, shape{}, shape{2, 1, 4}})
      for (layout l : all_layouts) {
        INFO(o.name << " " << to_string(s) << " layout " << tk_test::to_string(l));
        const auto x = tk_test::with_layout(away_from_zero(s, rng, o.lo, o.hi), l);
        TK_REQUIRE_GRADCHECK([&o](const auto& v) { return o.f(v[0]); }, {x});
      }
  // Large inputs of sigmoid stay finite in both directions.
  auto big = dtensor::from_vector({-800.0, 800.0}, {2});
  const auto y = sigmoid(dvar(big)).value();
  REQUIRE(y.at({0}) == 0.0);
  REQUIRE(y.at({1}) == 1.0);
}

TEST_CASE("matmul: gradients for vectors, matrices and broadcast batches", "[autograd][grad][matmul]") {
  std::mt19937 rng(104);
  const std::vector<std::pair<shape, shape>> shapes = {
      {{4}, {4}},                // dot product
      {{3, 4}, {4}},             // matrix-vector
      {{4}, {4, 2}},             // vector-matrix
      {{3, 4}, {4, 2}},          // 2-D
      {{1, 4}, {4, 1}},          // size-1 dims
      {{2, 3, 4}, {4, 5}},       // batched @ 2-D (folded rows)
      {{2, 3, 4}, {2, 4, 5}},    // batched
      {{2, 1, 3, 4}, {3, 4, 2}}, // broadcast batch dims
      {{3, 4}, {2, 4, 2}},       // 2-D @ batched
      {{4}, {2, 4, 3}},          // vector @ batched
      {{2, 3, 4}, {4}},          // batched @ vector
      {{1, 3, 4}, {5, 4, 2}},    // batch of 1 broadcast
  };
  for (const auto& [sa, sb] : shapes)
    for (layout l : all_layouts) {
      INFO(to_string(sa) << " @ " << to_string(sb) << " layout " << tk_test::to_string(l));
      const auto a = tk_test::with_layout(tk_test::random_tensor(sa, rng), l);
      const auto b = tk_test::with_layout(tk_test::random_tensor(sb, rng), l);
      TK_REQUIRE_GRADCHECK([](const auto& v) { return matmul(v[0], v[1]); }, {a, b});
      TK_REQUIRE_GRADCHECK([](const auto& v) { return matmul(v[0], v[1]); }, {a, b}, {}, {false, true});
    }
}

TEST_CASE("sum and mean: gradients over dims, keepdim, all", "[autograd][grad]") {
  std::mt19937 rng(105);
  struct red {
    std::vector<index_t> dims;
    bool keep;
  };
  const std::vector<red> cases = {{{}, false}, {{0}, false}, {{1}, true}, {{-1}, false}, {{0, 2}, true}, {{0, 1, 2}, false}};
  for (const auto& c : cases)
    for (layout l : all_layouts)
      for (shape s : {shape{2, 3, 4}, shape{1, 3, 1}}) {
        INFO("dims " << to_string(c.dims) << " keepdim " << c.keep << " x " << to_string(s) << " layout "
                     << tk_test::to_string(l));
        const auto x = tk_test::with_layout(tk_test::random_tensor(s, rng), l);
        const auto dims = c.dims;
        const bool keep = c.keep;
        TK_REQUIRE_GRADCHECK([=](const auto& v) { return sum(v[0], dims, keep); }, {x});
        TK_REQUIRE_GRADCHECK([=](const auto& v) { return mean(v[0], dims, keep); }, {x});
      }
  TK_REQUIRE_GRADCHECK([](const auto& v) { return sum(v[0]); }, {dtensor::scalar(2.0)});
}

TEST_CASE("shape ops: gradients of views and copies", "[autograd][grad]") {
  std::mt19937 rng(106);
  const std::vector<std::pair<const char*, std::function<dvar(const dvar&)>>> ops = {
      {"reshape", [](const dvar& a) { return reshape(a, {4, -1}); }},
      {"reshape to 1-D", [](const dvar& a) { return reshape(a, {-1}); }},
      {"flatten", [](const dvar& a) { return flatten(a, 1); }},
      {"unsqueeze", [](const dvar& a) { return unsqueeze(a, 1); }},
      {"squeeze", [](const dvar& a) { return squeeze(unsqueeze(a, -1), -1); }},
      {"transpose", [](const dvar& a) { return transpose(a, 0, 2); }},
      {"transpose neg", [](const dvar& a) { return transpose(a, -1, -2); }},
      {"permute", [](const dvar& a) { return permute(a, {2, 0, 1}); }},
      {"slice", [](const dvar& a) { return slice(a, 1, 1, 3); }},
      {"slice step", [](const dvar& a) { return slice(a, 2, 0, 4, 2); }},
      {"slice negative", [](const dvar& a) { return slice(a, -1, -3, -1); }},
      {"slice clamped", [](const dvar& a) { return slice(a, 0, -10, 10); }},
      {"expand", [](const dvar& a) { return expand(slice(a, 1, 0, 1), {3, 2, 3, 4}); }},
      {"contiguous", [](const dvar& a) { return contiguous(transpose(a, 0, 1)); }},
      {"twice through", [](const dvar& a) { return slice(a, 1, 0, 2) * slice(a, 1, 1, 3); }},  // overlapping uses
  };
  for (const auto& [name, f] : ops)
    for (layout l : all_layouts) {
      INFO(name << " layout " << tk_test::to_string(l));
      const auto x = tk_test::with_layout(tk_test::random_tensor({2, 3, 4}, rng), l);
      TK_REQUIRE_GRADCHECK([&f](const auto& v) { return f(v[0]); }, {x});
    }
  // expand of size-1 dims and new leading dims.
  TK_REQUIRE_GRADCHECK([](const auto& v) { return expand(v[0], {2, 3, 4}); }, {tk_test::random_tensor({3, 1}, rng)});
  TK_REQUIRE_GRADCHECK([](const auto& v) { return expand(v[0], {5, -1}); }, {tk_test::random_tensor({1, 2}, rng)});
  TK_REQUIRE_GRADCHECK([](const auto& v) { return view(v[0], {3, 2}); }, {tk_test::random_tensor({2, 3}, rng)});
}

TEST_CASE("concat: gradients along every dim, mixed layouts, one input twice", "[autograd][grad]") {
  std::mt19937 rng(107);
  for (index_t d : {index_t(0), index_t(1), index_t(-1)}) {
    shape sa{2, 3, 2}, sb{2, 3, 2};
    sb[std::size_t(d < 0 ? d + 3 : d)] = 1;
    INFO("dim " << d);
    const auto a = tk_test::with_layout(tk_test::random_tensor(sa, rng), layout::transposed);
    const auto b = tk_test::with_layout(tk_test::random_tensor(sb, rng), layout::strided);
    const auto c = tk_test::random_tensor(sa, rng);
    TK_REQUIRE_GRADCHECK([d](const auto& v) { return concat(std::vector<dvar>{v[0], v[1], v[2]}, d); }, {a, b, c});
    TK_REQUIRE_GRADCHECK([d](const auto& v) { return concat(std::vector<dvar>{v[0], v[1], v[0]}, d); }, {a, b});
    TK_REQUIRE_GRADCHECK([d](const auto& v) { return concat(std::vector<dvar>{v[0], v[1]}, d); }, {a, b}, {},
                         {false, true});
  }
}

TEST_CASE("a composite expression: a small MLP with a softmax head", "[autograd][grad]") {
  std::mt19937 rng(108);
  const auto x = tk_test::random_tensor({4, 3}, rng), w1 = tk_test::random_tensor({3, 5}, rng),
             b1 = tk_test::random_tensor({5}, rng), w2 = tk_test::random_tensor({5, 2}, rng);
  TK_REQUIRE_GRADCHECK(
      [](const auto& v) {
        auto h = tanh(matmul(v[0], v[1]) + v[2]);
        auto z = matmul(h, v[3]);
        auto e = exp(z);
        return log(sum(e, {1}, true)) - z;  // -log softmax
      },
      {x, w1, b1, w2});
}
