// tests/autograd/test_nn_pool.cpp - max_pool2d and avg_pool2d: forward against naive loops,
// backward against finite differences, bad inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "support/gradcheck.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using namespace trainkit::autograd;
using tk_test::dtensor;
using tk_test::dvar;
using tk_test::layout;

namespace {

/// Direct pooling over every window: max ignores padding, average divides by kh * kw.
dtensor naive_pool(const dtensor& x, pool2d_options o, bool is_max) {
  const index_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const index_t kh = o.kernel[0], kw = o.kernel[1];
  const index_t sh = o.stride[0] ? o.stride[0] : kh, sw = o.stride[1] ? o.stride[1] : kw;
  const index_t ph = o.padding[0], pw = o.padding[1];
  const index_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  auto y = dtensor::zeros({n, c, oh, ow});
  for (index_t i = 0; i < n; ++i)
    for (index_t ch = 0; ch < c; ++ch)
      for (index_t p = 0; p < oh; ++p)
        for (index_t q = 0; q < ow; ++q) {
          double best = -INFINITY, sum = 0;
          for (index_t u = 0; u < kh; ++u)
            for (index_t v = 0; v < kw; ++v) {
              const index_t hi = p * sh - ph + u, wi = q * sw - pw + v;
              if (hi < 0 || hi >= h || wi < 0 || wi >= w) continue;
              best = std::max(best, x.at({i, ch, hi, wi}));
              sum += x.at({i, ch, hi, wi});
            }
          y.at({i, ch, p, q}) = is_max ? best : sum / double(kh * kw);
        }
  return y;
}

/// Values that are all distinct and well separated, so a max never sits on a tie (where the
/// finite difference of max is not defined).
dtensor distinct_values(const shape& s, std::mt19937& rng) {
  std::vector<double> v(std::size_t(numel(s)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * double(i) - 1.0;
  std::shuffle(v.begin(), v.end(), rng);
  return dtensor::from_vector(v, s);
}

const std::vector<pool2d_options> pool_cases = {
    {},                                                       // 2x2, stride 2
    {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}},  // same-size
    {.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 0}},
    {.kernel = {2, 3}, .stride = {3, 2}},
    {.kernel = {1, 1}},
};

}  // namespace

TEST_CASE("max_pool2d and avg_pool2d forward match naive loops", "[nn][pool]") {
  std::mt19937 rng(21);
  for (const auto& o : pool_cases) {
    for (shape xs : {shape{2, 3, 7, 6}, shape{1, 1, 4, 4}, shape{3, 2, 5, 9}}) {
      INFO("x " << to_string(xs) << " kernel " << o.kernel[0] << "x" << o.kernel[1] << " stride " << o.stride[0] << ","
                << o.stride[1] << " pad " << o.padding[0] << "," << o.padding[1]);
      const auto x = tk_test::random_tensor(xs, rng, -3, -1);  // negative: padding must not win a max
      TK_REQUIRE_CLOSE(max_pool2d(dvar(x), o).value(), naive_pool(x, o, true), 0.0);
      TK_REQUIRE_CLOSE(avg_pool2d(dvar(x), o).value(), naive_pool(x, o, false), 1e-14);
    }
  }
}

TEST_CASE("pooling takes unbatched [C, H, W] input", "[nn][pool]") {
  std::mt19937 rng(22);
  const auto x = tk_test::random_tensor({3, 6, 4}, rng);
  auto y = max_pool2d(dvar(x));
  REQUIRE(y.sizes() == shape{3, 3, 2});
  TK_REQUIRE_CLOSE(y.value(), naive_pool(x.unsqueeze(0), {}, true).squeeze(0), 0.0);
  REQUIRE(avg_pool2d(dvar(x)).sizes() == shape{3, 3, 2});
}

TEST_CASE("max_pool2d propagates NaN", "[nn][pool]") {
  auto x = dtensor::from_vector({1, std::numeric_limits<double>::quiet_NaN(), 3, 4}, {1, 1, 2, 2});
  REQUIRE(std::isnan(max_pool2d(dvar(x)).item()));
}

TEST_CASE("max_pool2d 2x2 windows: every pattern of ties, NaN and -inf picks PyTorch's element", "[nn][pool]") {
  // 4^4 windows over {1, 2, NaN, -inf}: the value is the max (NaN wins and sticks) and the gradient
  // goes to the first element in scan order that holds it - the rule of the general loop and of
  // PyTorch. The 2x2 stride-2 window has its own loop (backend/cpu/pool.hpp).
  const float nan = std::numeric_limits<float>::quiet_NaN(), ninf = -std::numeric_limits<float>::infinity();
  const float vals[4] = {1.0f, 2.0f, nan, ninf};
  const auto value = [&](int code, int k) { return vals[(code >> (2 * k)) & 3]; };  // k: scan order
  // One window per plane ([256, 1, 2, 2]: the scalar loop) and all in one row of windows
  // ([1, 1, 2, 512]: four at a time, then the tail).
  for (const bool one_row : {false, true}) {
    std::vector<float> x(1024);
    for (int code = 0; code < 256; ++code)
      for (int k = 0; k < 4; ++k) {
        const std::size_t at = one_row ? std::size_t((k >> 1) * 512 + 2 * code + (k & 1)) : std::size_t(4 * code + k);
        x[at] = value(code, k);
      }
    const shape xs = one_row ? shape{1, 1, 2, 512} : shape{256, 1, 2, 2};
    var<float> xv(tensor<float>::from_vector(x, xs), true);
    auto y = max_pool2d(xv);
    y.backward(tensor<float>::ones(y.sizes()));
    for (int code = 0; code < 256; ++code) {
      int at = 0;
      for (int k = 1; k < 4; ++k) {
        const float v = value(code, k), best = value(code, at);
        if (v > best || (std::isnan(v) && !std::isnan(best))) at = k;
      }
      INFO("window " << code << (one_row ? " in one row" : " in its own plane"));
      const float want = value(code, at), got = y.value().data()[code];
      REQUIRE((std::isnan(want) ? std::isnan(got) : got == want));
      for (int k = 0; k < 4; ++k) {
        const std::size_t pos = one_row ? std::size_t((k >> 1) * 512 + 2 * code + (k & 1)) : std::size_t(4 * code + k);
        REQUIRE(xv.grad().data()[pos] == (k == at ? 1.0f : 0.0f));
      }
    }
  }
  // Odd sizes: the last row and column are not in any window.
  std::mt19937 rng(26);
  const auto odd = tk_test::random_tensor({2, 3, 7, 5}, rng, -3, -1);
  TK_REQUIRE_CLOSE(max_pool2d(dvar(odd)).value(), naive_pool(odd, {}, true), 0.0);
}

TEST_CASE("max_pool2d backward routes the gradient to the argmax", "[nn][pool][grad]") {
  std::mt19937 rng(23);
  for (const auto& o : pool_cases) {
    for (layout l : {layout::contiguous, layout::transposed}) {
      INFO("kernel " << o.kernel[0] << "x" << o.kernel[1] << " layout " << tk_test::to_string(l));
      const auto x = tk_test::with_layout(distinct_values({2, 2, 5, 6}, rng), l);
      TK_REQUIRE_GRADCHECK([o](const auto& v) { return max_pool2d(v[0], o); }, {x});
    }
  }
  // Overlapping windows that share their max: the gradients add up.
  auto x = dtensor::from_vector({0, 0, 0, 0, 9, 0, 0, 0, 0}, {1, 1, 3, 3});
  dvar xv(x, true);
  auto y = max_pool2d(xv, {.kernel = {2, 2}, .stride = {1, 1}});
  y.backward(dtensor::ones(y.sizes()));
  REQUIRE(xv.grad().at({0, 0, 1, 1}) == 4.0);
}

TEST_CASE("avg_pool2d backward matches finite differences", "[nn][pool][grad]") {
  std::mt19937 rng(24);
  for (const auto& o : pool_cases) {
    for (layout l : {layout::contiguous, layout::strided}) {
      INFO("kernel " << o.kernel[0] << "x" << o.kernel[1] << " layout " << tk_test::to_string(l));
      const auto x = tk_test::with_layout(tk_test::random_tensor({2, 3, 5, 4}, rng), l);
      TK_REQUIRE_GRADCHECK([o](const auto& v) { return avg_pool2d(v[0], o); }, {x});
    }
  }
}

TEST_CASE("pooling works in float on a CNN-sized input", "[nn][pool]") {
  std::mt19937 rng(25);
  const auto x = tk_test::random_tensor<float>({16, 8, 28, 28}, rng);
  var<float> xv(x, true);
  auto y = max_pool2d(xv);
  TK_REQUIRE_CLOSE(cast<double>(y.value()), naive_pool(cast<double>(x), {}, true), 0.0);
  y.backward(tensor<float>::ones(y.sizes()));
  // Non-overlapping 2x2 windows: exactly one 1 per window.
  REQUIRE(sum(xv.grad()).item() == Approx(16 * 8 * 14 * 14));
}

TEST_CASE("pooling rejects bad inputs", "[nn][pool][errors]") {
  dvar x(dtensor::zeros({2, 3, 4, 4}));
  REQUIRE_THROWS_AS(max_pool2d(dvar(dtensor::zeros({4, 4}))), shape_error);
  REQUIRE_THROWS_WITH(max_pool2d(dvar(dtensor::zeros({4, 4}))), Catch::Contains("max_pool2d") && Catch::Contains("[4, 4]"));
  REQUIRE_THROWS_AS(avg_pool2d(x, {.kernel = {5, 5}}), shape_error);
  REQUIRE_THROWS_WITH(avg_pool2d(x, {.kernel = {5, 5}}),
                      Catch::Contains("avg_pool2d") && Catch::Contains("larger than the padded input (4, 4)") &&
                          Catch::Contains("[2, 3, 4, 4]"));
  REQUIRE_THROWS_AS(max_pool2d(x, {.kernel = {2, 2}, .padding = {2, 0}}), value_error);
  REQUIRE_THROWS_WITH(max_pool2d(x, {.kernel = {2, 2}, .padding = {2, 0}}), Catch::Contains("half the kernel"));
  REQUIRE_THROWS_AS(max_pool2d(x, {.kernel = {0, 2}}), value_error);
}

TEST_CASE("2x2 max pooling's vector loop and direct backward match the general rule on every row width",
          "[nn][pool]") {
  // backend::pool<cpu>'s 2x2 stride-2 kernels: four windows per vector step, a last step that
  // overlaps the one before when the row's width is not a multiple of 4, the indices widened from
  // 32-bit lanes, and a backward that writes each input once. Checked against the rule of the
  // general loop (the first of the window's maxima in scan order, NaN winning) for float and
  // bfloat16 on widths 2..21 and odd and even heights, with ties, NaN and -inf among the values.
  std::mt19937 rng(27);
  const float nan = std::numeric_limits<float>::quiet_NaN(), ninf = -std::numeric_limits<float>::infinity();
  const auto check = [&](auto tag, index_t planes, index_t h, index_t w) {
    using T = decltype(tag);
    INFO((std::is_same_v<T, float> ? "float" : "bfloat16") << " planes " << planes << " " << h << "x" << w);
    backend::pool2d_geometry g;
    g.height = h, g.width = w, g.kernel_h = g.kernel_w = 2, g.stride_h = g.stride_w = 2;
    g.out_h = h / 2, g.out_w = w / 2;
    std::uniform_int_distribution<int> pick(0, 9);
    std::vector<T> x(std::size_t(planes * h * w)), gy(std::size_t(planes * g.out_h * g.out_w));
    for (auto& v : x) {
      const int k = pick(rng);
      v = T(k == 0 ? nan : k == 1 ? ninf : float(k % 4) - 1.5f);  // many ties
    }
    for (auto& v : gy) {  // -0 and NaN among them: the gradient is 0 + gy, as the general scatter adds it
      const int k = pick(rng);
      v = T(k == 0 ? -0.0f : k == 1 ? nan : float(k) - 4.5f);
    }
    std::vector<T> y(gy.size()), gx(x.size(), T(-7.0f));
    std::vector<std::int64_t> idx(gy.size(), -1);
    backend::pool<cpu>::max_forward(g, planes, x.data(), y.data(), idx.data());
    backend::pool<cpu>::max_backward(g, planes, gy.data(), idx.data(), gx.data());
    std::vector<T> want_gx(x.size(), T(0.0f));
    for (index_t p = 0; p < planes; ++p)
      for (index_t oh = 0; oh < g.out_h; ++oh)
        for (index_t ow = 0; ow < g.out_w; ++ow) {
          const index_t o = (p * g.out_h + oh) * g.out_w + ow;
          index_t at = 2 * oh * w + 2 * ow;
          for (const index_t k : {2 * oh * w + 2 * ow + 1, (2 * oh + 1) * w + 2 * ow, (2 * oh + 1) * w + 2 * ow + 1}) {
            const float v = float(x[std::size_t(p * h * w + k)]), best = float(x[std::size_t(p * h * w + at)]);
            if (v > best || (std::isnan(v) && !std::isnan(best))) at = k;
          }
          INFO("window " << oh << "," << ow << " of plane " << p);
          REQUIRE(idx[std::size_t(o)] == at);
          const float want = float(x[std::size_t(p * h * w + at)]), got = float(y[std::size_t(o)]);
          REQUIRE((std::isnan(want) ? std::isnan(got) : got == want));
          want_gx[std::size_t(p * h * w + at)] = T(float(gy[std::size_t(o)]) + 0.0f);
        }
    for (std::size_t i = 0; i < x.size(); ++i) {
      INFO("input " << i);
      REQUIRE(std::memcmp(&gx[i], &want_gx[i], sizeof(T)) == 0);  // bit for bit: +0, the quiet NaN
    }
  };
  for (index_t w = 2; w <= 21; ++w)
    for (index_t h : {2, 3, 6}) {
      check(float{}, 3, h, w);
      check(trainkit::bfloat16{}, 3, h, w);
    }
  check(float{}, 40, 28, 28);  // the CNN's planes: parallel over planes
  check(trainkit::bfloat16{}, 40, 14, 14);
}
