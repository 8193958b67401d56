// tests/autograd/test_nn_linear_conv.cpp - linear and conv2d: forward against naive loops,
// backward against finite differences, bad inputs.
#include <catch2/catch.hpp>

#include <random>

#include "support/gradcheck.hpp"
#include "trainkit/autograd/nn_ops.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using namespace trainkit::autograd;
using tk_test::dtensor;
using tk_test::dvar;
using tk_test::layout;

namespace {

/// Direct-sum convolution: the reference every im2col result is compared with.
template <class T>
tensor<T> naive_conv2d(const tensor<T>& x, const tensor<T>& w, const tensor<T>& b, conv2d_options o) {
  const index_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const index_t oc = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3), g = o.groups;
  const index_t ocg = oc / g;
  const index_t oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  const index_t ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  (void)c;
  auto y = tensor<T>::zeros({n, oc, oh, ow});
  for (index_t i = 0; i < n; ++i)
    for (index_t f = 0; f < oc; ++f)
      for (index_t p = 0; p < oh; ++p)
        for (index_t q = 0; q < ow; ++q) {
          double s = b.defined() ? double(b.at({f})) : 0.0;
          const index_t grp = f / ocg;
          for (index_t ci = 0; ci < cg; ++ci)
            for (index_t u = 0; u < kh; ++u)
              for (index_t v = 0; v < kw; ++v) {
                const index_t hi = p * o.stride[0] - o.padding[0] + u * o.dilation[0];
                const index_t wi = q * o.stride[1] - o.padding[1] + v * o.dilation[1];
                if (hi < 0 || hi >= h || wi < 0 || wi >= wd) continue;
                s += double(x.at({i, grp * cg + ci, hi, wi})) * double(w.at({f, ci, u, v}));
              }
          y.at({i, f, p, q}) = T(s);
        }
  return y;
}

dtensor naive_linear(const dtensor& x, const dtensor& w, const dtensor& b) {
  const auto x2 = x.reshape({-1, x.size(-1)});
  auto y = dtensor::zeros({x2.size(0), w.size(0)});
  for (index_t i = 0; i < x2.size(0); ++i)
    for (index_t o = 0; o < w.size(0); ++o) {
      double s = b.defined() ? b.at({o}) : 0.0;
      for (index_t k = 0; k < w.size(1); ++k) s += x2.at({i, k}) * w.at({o, k});
      y.at({i, o}) = s;
    }
  shape os(x.sizes().begin(), x.sizes().end() - 1);
  os.push_back(w.size(0));
  return y.view(os);
}

}  // namespace

TEST_CASE("linear forward matches a naive product, with and without bias", "[nn][linear]") {
  std::mt19937 rng(1);
  for (shape xs : {shape{5, 3}, shape{2, 4, 3}, shape{3}, shape{1, 3}, shape{0, 3}}) {
    const auto x = tk_test::random_tensor(xs, rng), w = tk_test::random_tensor({4, 3}, rng),
               b = tk_test::random_tensor({4}, rng);
    INFO("x " << to_string(xs));
    TK_REQUIRE_CLOSE(linear(dvar(x), dvar(w), dvar(b)).value(), naive_linear(x, w, b), 1e-12);
    TK_REQUIRE_CLOSE(linear(dvar(x), dvar(w)).value(), naive_linear(x, w, dtensor()), 1e-12);
  }
}

TEST_CASE("linear backward matches finite differences", "[nn][linear][grad]") {
  std::mt19937 rng(2);
  for (layout l : {layout::contiguous, layout::strided, layout::transposed}) {
    INFO("layout " << tk_test::to_string(l));
    const auto x = tk_test::with_layout(tk_test::random_tensor({4, 3}, rng), l);
    const auto w = tk_test::with_layout(tk_test::random_tensor({5, 3}, rng), l);
    const auto b = tk_test::with_layout(tk_test::random_tensor({5}, rng), l);
    TK_REQUIRE_GRADCHECK([](const auto& v) { return linear(v[0], v[1], v[2]); }, {x, w, b});
    TK_REQUIRE_GRADCHECK([](const auto& v) { return linear(v[0], v[1]); }, {x, w});
  }
  // Batched input, size-1 dims, a vector input, and inputs that need no gradient.
  TK_REQUIRE_GRADCHECK([](const auto& v) { return linear(v[0], v[1], v[2]); },
                       {tk_test::random_tensor({2, 1, 3}, rng), tk_test::random_tensor({1, 3}, rng),
                        tk_test::random_tensor({1}, rng)});
  TK_REQUIRE_GRADCHECK([](const auto& v) { return linear(v[0], v[1], v[2]); },
                       {tk_test::random_tensor({3}, rng), tk_test::random_tensor({2, 3}, rng),
                        tk_test::random_tensor({2}, rng)});
  TK_REQUIRE_GRADCHECK([](const auto& v) { return linear(v[0], v[1], v[2]); },
                       {tk_test::random_tensor({4, 3}, rng), tk_test::random_tensor({2, 3}, rng),
                        tk_test::random_tensor({2}, rng)},
                       {}, {false, true, false});
  TK_REQUIRE_GRADCHECK([](const auto& v) { return linear(v[0], v[1], v[2]); },
                       {tk_test::random_tensor({4, 3}, rng), tk_test::random_tensor({2, 3}, rng),
                        tk_test::random_tensor({2}, rng)},
                       {}, {true, false, false});
}

TEST_CASE("linear works in float", "[nn][linear]") {
  std::mt19937 rng(3);
  const auto x = tk_test::random_tensor<float>({6, 5}, rng), w = tk_test::random_tensor<float>({4, 5}, rng),
             b = tk_test::random_tensor<float>({4}, rng);
  var<float> xv(x, true), wv(w, true), bv(b, true);
  auto y = linear(xv, wv, bv);
  y.backward(tensor<float>::ones(y.sizes()));
  TK_REQUIRE_CLOSE(cast<double>(y.value()), naive_linear(cast<double>(x), cast<double>(w), cast<double>(b)), 1e-5);
  TK_REQUIRE_CLOSE(bv.grad(), tensor<float>::full({4}, 6.0f), 1e-5);
  TK_REQUIRE_CLOSE(wv.grad(), sum(x, {0}, true).expand({4, 5}).contiguous(), 1e-5);
}

TEST_CASE("linear on large shapes (GEMMs split over threads) matches the double computation", "[nn][linear]") {
  std::mt19937 rng(9);
  for (auto [rows, in, out] : {std::tuple<index_t, index_t, index_t>{300, 200, 100}, {64, 150, 700}, {513, 77, 129}}) {
    INFO(rows << " x " << in << " -> " << out);
    const auto x = tk_test::random_tensor<float>({rows, in}, rng), w = tk_test::random_tensor<float>({out, in}, rng),
               b = tk_test::random_tensor<float>({out}, rng);
    const auto g = tk_test::random_tensor<float>({rows, out}, rng);
    var<float> xf(x, true), wf(w, true), bf(b, true);
    auto y = linear(xf, wf, bf);
    y.backward(g);
    dvar xd(cast<double>(x), true), wd(cast<double>(w), true), bd(cast<double>(b), true);
    auto yd = linear(xd, wd, bd);
    yd.backward(cast<double>(g));
    TK_REQUIRE_CLOSE(cast<double>(y.value()), yd.value(), 1e-3);
    TK_REQUIRE_CLOSE(cast<double>(xf.grad()), xd.grad(), 1e-3);
    TK_REQUIRE_CLOSE(cast<double>(wf.grad()), wd.grad(), 1e-2);
  }
}

TEST_CASE("linear rejects mismatched shapes", "[nn][linear][errors]") {
  dvar x(dtensor::zeros({4, 3})), w(dtensor::zeros({5, 2})), b(dtensor::zeros({4}));
  REQUIRE_THROWS_AS(linear(x, w), shape_error);
  REQUIRE_THROWS_WITH(linear(x, w), Catch::Contains("linear") && Catch::Contains("[4, 3]") && Catch::Contains("[5, 2]"));
  dvar w2(dtensor::zeros({5, 3}));
  REQUIRE_THROWS_AS(linear(x, w2, b), shape_error);
  REQUIRE_THROWS_WITH(linear(x, w2, b), Catch::Contains("bias of sizes [4]") && Catch::Contains("[5, 3]"));
  REQUIRE_THROWS_WITH(linear(x, dvar(dtensor::zeros({3}))), Catch::Contains("weight must be 2-D"));
}

TEST_CASE("conv2d forward matches direct summation", "[nn][conv]") {
  std::mt19937 rng(4);
  struct cfg {
    shape x, w;
    conv2d_options o;
    bool bias;
  };
  const std::vector<cfg> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {}, true},
      {{1, 1, 5, 5}, {1, 1, 1, 1}, {}, false},
      {{2, 4, 8, 7}, {6, 2, 3, 2}, {.stride = {2, 1}, .padding = {1, 2}, .groups = 2}, true},
      {{3, 2, 9, 9}, {2, 2, 3, 3}, {.stride = {2, 3}, .padding = {2, 1}, .dilation = {2, 2}}, true},
      {{2, 6, 5, 5}, {6, 1, 3, 3}, {.padding = {1, 1}, .groups = 6}, false},  // depthwise
      {{1, 2, 3, 3}, {3, 2, 3, 3}, {}, true},                                   // output 1x1
      {{5, 2, 4, 4}, {3, 2, 2, 2}, {.stride = {2, 2}}, true},
  };
  for (const auto& c : cases) {
    INFO("x " << to_string(c.x) << " w " << to_string(c.w) << " groups " << c.o.groups);
    const auto x = tk_test::random_tensor(c.x, rng), w = tk_test::random_tensor(c.w, rng),
               b = tk_test::random_tensor({c.w[0]}, rng);
    const dtensor bb = c.bias ? b : dtensor();
    auto y = conv2d(dvar(x), dvar(w), c.bias ? dvar(b) : dvar(), c.o).value();
    TK_REQUIRE_CLOSE(y, naive_conv2d(x, w, bb, c.o), 1e-12);
  }
}

TEST_CASE("conv2d forward matches direct summation on batches larger than the thread count", "[nn][conv]") {
  std::mt19937 rng(5);
  // 37 images run one per thread (each thread reuses its column buffer); 1 image runs serially
  // with the unfold and GEMM parallel inside.
  for (index_t n : {index_t(37), index_t(1)}) {
    INFO("batch " << n);
    const auto x = tk_test::random_tensor<float>({n, 3, 24, 24}, rng), w = tk_test::random_tensor<float>({6, 1, 3, 3}, rng),
               b = tk_test::random_tensor<float>({6}, rng);
    const conv2d_options o{.padding = {1, 1}, .groups = 3};
    TK_REQUIRE_CLOSE(conv2d(var<float>(x), var<float>(w), var<float>(b), o).value(), naive_conv2d(x, w, b, o), 1e-4);
    // 1x1 stride-1 kernels skip the unfold.
    const auto w1 = tk_test::random_tensor<float>({4, 3, 1, 1}, rng);
    TK_REQUIRE_CLOSE(conv2d(var<float>(x), var<float>(w1)).value(), naive_conv2d(x, w1, tensor<float>(), {}), 1e-4);
  }
}

TEST_CASE("conv2d backward matches finite differences", "[nn][conv][grad]") {
  std::mt19937 rng(6);
  struct cfg {
    shape x, w;
    conv2d_options o;
  };
  const std::vector<cfg> cases = {
      {{2, 2, 5, 4}, {3, 2, 3, 3}, {.padding = {1, 1}}},
      {{1, 4, 6, 5}, {4, 2, 2, 3}, {.stride = {2, 1}, .padding = {1, 0}, .groups = 2}},
      {{2, 1, 7, 7}, {2, 1, 3, 3}, {.stride = {2, 2}, .padding = {2, 1}, .dilation = {2, 1}}},
      {{1, 3, 4, 4}, {3, 1, 3, 3}, {.padding = {1, 1}, .groups = 3}},
      {{3, 1, 1, 1}, {2, 1, 1, 1}, {}},
  };
  for (const auto& c : cases) {
    for (layout l : {layout::contiguous, layout::strided}) {
      INFO("x " << to_string(c.x) << " w " << to_string(c.w) << " layout " << tk_test::to_string(l));
      const auto x = tk_test::with_layout(tk_test::random_tensor(c.x, rng), l);
      const auto w = tk_test::with_layout(tk_test::random_tensor(c.w, rng), l);
      const auto b = tk_test::random_tensor({c.w[0]}, rng);
      const auto o = c.o;
      TK_REQUIRE_GRADCHECK([o](const auto& v) { return conv2d(v[0], v[1], v[2], o); }, {x, w, b});
      TK_REQUIRE_GRADCHECK([o](const auto& v) { return conv2d(v[0], v[1], dvar(), o); }, {x, w});
    }
  }
  // Only the weight needs a gradient (first layer of a network); unbatched input.
  TK_REQUIRE_GRADCHECK([](const auto& v) { return conv2d(v[0], v[1], v[2]); },
                       {tk_test::random_tensor({2, 1, 4, 4}, rng), tk_test::random_tensor({2, 1, 2, 2}, rng),
                        tk_test::random_tensor({2}, rng)},
                       {}, {false, true, true});
  TK_REQUIRE_GRADCHECK([](const auto& v) { return conv2d(v[0], v[1], v[2], {.padding = {1, 1}}); },
                       {tk_test::random_tensor({2, 4, 3}, rng), tk_test::random_tensor({3, 2, 3, 3}, rng),
                        tk_test::random_tensor({3}, rng)});
}

TEST_CASE("conv2d backward matches finite differences for 1x1 kernels and many images", "[nn][conv][grad]") {
  std::mt19937 rng(7);
  const auto x = tk_test::random_tensor({7, 4, 3, 3}, rng);
  const auto w = tk_test::random_tensor({2, 2, 1, 1}, rng), b = tk_test::random_tensor({2}, rng);
  TK_REQUIRE_GRADCHECK([](const auto& v) { return conv2d(v[0], v[1], v[2], {.groups = 2}); }, {x, w, b});
  TK_REQUIRE_GRADCHECK([](const auto& v) { return conv2d(v[0], v[1], v[2], {.stride = {2, 1}}); },
                       {x, tk_test::random_tensor({3, 4, 1, 1}, rng), tk_test::random_tensor({3}, rng)});
  // Enough work per call that the images are spread over threads.
  const auto xb = tk_test::random_tensor({8, 4, 12, 12}, rng);
  TK_REQUIRE_GRADCHECK([](const auto& v) { return conv2d(v[0], v[1], v[2], {.padding = {1, 1}}); },
                       {xb, tk_test::random_tensor({16, 4, 3, 3}, rng), tk_test::random_tensor({16}, rng)}, {},
                       {false, true, true});
}

TEST_CASE("conv2d in float on CNN-sized layers matches the double computation", "[nn][conv]") {
  std::mt19937 rng(8);
  const auto x = tk_test::random_tensor<float>({16, 8, 14, 14}, rng), w = tk_test::random_tensor<float>({16, 8, 3, 3}, rng),
             b = tk_test::random_tensor<float>({16}, rng);
  const auto g = tk_test::random_tensor<float>({16, 16, 14, 14}, rng);
  const conv2d_options o{.padding = {1, 1}};
  var<float> xf(x, true), wf(w, true), bf(b, true);
  conv2d(xf, wf, bf, o).backward(g);
  dvar xd(cast<double>(x), true), wd(cast<double>(w), true), bd(cast<double>(b), true);
  conv2d(xd, wd, bd, o).backward(cast<double>(g));
  TK_REQUIRE_CLOSE(cast<double>(xf.grad()), xd.grad(), 1e-3);
  TK_REQUIRE_CLOSE(cast<double>(wf.grad()), wd.grad(), 1e-2);  // sums of 3136 products
  TK_REQUIRE_CLOSE(cast<double>(bf.grad()), bd.grad(), 1e-3);
}

TEST_CASE("conv2d rejects bad shapes with clear messages", "[nn][conv][errors]") {
  dvar x(dtensor::zeros({2, 3, 5, 5}));
  REQUIRE_THROWS_AS(conv2d(x, dvar(dtensor::zeros({4, 3, 3, 3})), {}, {.groups = 2}), shape_error);
  REQUIRE_THROWS_WITH(conv2d(x, dvar(dtensor::zeros({4, 3, 3, 3})), {}, {.groups = 2}),
                      Catch::Contains("conv2d") && Catch::Contains("[2, 3, 5, 5]") &&
                          Catch::Contains("not divisible by groups = 2"));
  REQUIRE_THROWS_AS(conv2d(x, dvar(dtensor::zeros({4, 2, 3, 3}))), shape_error);
  REQUIRE_THROWS_WITH(conv2d(x, dvar(dtensor::zeros({4, 2, 3, 3}))),
                      Catch::Contains("[4, 2, 3, 3]") && Catch::Contains("expects 2 input channels"));
  REQUIRE_THROWS_AS(conv2d(x, dvar(dtensor::zeros({4, 3, 7, 3}))), shape_error);
  REQUIRE_THROWS_WITH(conv2d(x, dvar(dtensor::zeros({4, 3, 7, 3}))),
                      Catch::Contains("larger than the padded input (5, 5)") && Catch::Contains("[4, 3, 7, 3]"));
  REQUIRE_NOTHROW(conv2d(x, dvar(dtensor::zeros({4, 3, 7, 3})), {}, {.padding = {1, 0}}));
  REQUIRE_THROWS_AS(conv2d(dvar(dtensor::zeros({3, 5, 5, 1, 1})), dvar(dtensor::zeros({4, 3, 3, 3}))), shape_error);
  REQUIRE_THROWS_WITH(conv2d(x, dvar(dtensor::zeros({4, 3, 3, 3})), dvar(dtensor::zeros({3}))),
                      Catch::Contains("bias of sizes [3]"));
  REQUIRE_THROWS_AS(conv2d(x, dvar(dtensor::zeros({4, 3, 3, 3})), {}, {.stride = {0, 1}}), value_error);
  REQUIRE_THROWS_WITH(conv2d(x, dvar(dtensor::zeros({4, 3, 3, 3})), {}, {.stride = {0, 1}}),
                      Catch::Contains("stride {0, 1}"));
}
