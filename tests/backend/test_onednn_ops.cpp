// tests/backend/test_onednn_ops.cpp - the CPU's oneDNN CNN kernels (backend/cpu/onednn_conv.hpp, onednn_pool.hpp, onednn_batch_norm.hpp):
// conv2d passes, pooling and batch norm against the built-in kernels (TRAINKIT_CPU_CONV=im2col)
// in fp32, conv2d gradients against finite differences through the autograd op, and bfloat16
// against fp32 within bfloat16's precision.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/cpu.hpp"
#include "support/gradcheck.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using bf16 = trainkit::bfloat16;

#if !TRAINKIT_HAS_ONEDNN

TEST_CASE("oneDNN CNN kernels: not built", "[onednn]") {
  // The built-in kernels run whatever the route says (their own tests cover them).
  backend::set_cpu_conv_route(backend::cpu_conv_route::onednn);
  auto y = autograd::conv2d(var<float>(tensor<float>::ones({1, 1, 3, 3})), var<float>(tensor<float>::ones({1, 1, 3, 3})));
  backend::set_cpu_conv_route(backend::cpu_conv_route::im2col);
  REQUIRE(y.value().to_vector() == std::vector<float>{9.0f});
  SUCCEED("built without oneDNN (TRAINKIT_ONEDNN=OFF or libdnnl absent): the im2col path is the only one");
}

#else

namespace {

using backend::conv2d_geometry;
using backend::cpu_conv_route;

/// Sets the CNN route for a scope.
struct route_scope {
  cpu_conv_route saved = backend::get_cpu_conv_route();
  explicit route_scope(cpu_conv_route r) { backend::set_cpu_conv_route(r); }
  ~route_scope() { backend::set_cpu_conv_route(saved); }
  route_scope(const route_scope&) = delete;
  route_scope& operator=(const route_scope&) = delete;
};

template <class T = float>
std::vector<T> random_values(index_t n, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = T(float(u(rng)));
  return v;
}

/// max |a - b| / max(max |b|, 1e-30): the norm-wise relative difference.
template <class A, class B>
double rel_diff(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    if (x != x || y != y) return INFINITY;
    d = std::max(d, std::abs(x - y));
    m = std::max(m, std::abs(y));
  }
  return d / std::max(m, 1e-30);
}

struct conv_case {
  index_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool bias;
};

conv2d_geometry geometry_of(const conv_case& k) {
  conv2d_geometry g;
  g.channels = k.c;
  g.height = k.h;
  g.width = k.w;
  g.kernel_h = k.kh;
  g.kernel_w = k.kw;
  g.stride_h = k.sh;
  g.stride_w = k.sw;
  g.pad_h = k.ph;
  g.pad_w = k.pw;
  g.dilation_h = k.dh;
  g.dilation_w = k.dw;
  g.out_h = (k.h + 2 * k.ph - k.dh * (k.kh - 1) - 1) / k.sh + 1;
  g.out_w = (k.w + 2 * k.pw - k.dw * (k.kw - 1) - 1) / k.sw + 1;
  return g;
}

// Odd sizes, stride 2, padding (symmetric and not), dilation, groups (and depthwise), 1x1,
// batch 1 and 5, and floor-mode shapes whose last rows are never read (negative right padding).
const std::vector<conv_case> conv_cases = {
    {1, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},    {5, 4, 11, 8, 6, 3, 2, 2, 2, 1, 0, 1, 1, 2, true},
    {5, 6, 10, 10, 6, 3, 3, 1, 1, 2, 2, 2, 2, 3, false}, {2, 1, 28, 28, 8, 5, 5, 2, 2, 2, 2, 1, 1, 1, true},
    {3, 8, 6, 6, 16, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},   {2, 3, 6, 6, 4, 3, 3, 2, 2, 0, 0, 1, 1, 1, false},
    {5, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, true},    {1, 5, 13, 7, 7, 3, 5, 2, 1, 1, 2, 2, 1, 1, true},
    {5, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, true}};

struct conv_outputs {
  std::vector<float> y, gx, gw;
};

/// The three passes of one case on the route in force, in T (inputs and outputs widened to float).
template <class T>
conv_outputs run_conv(const conv_case& k, const std::vector<float>& x, const std::vector<float>& w,
                      const std::vector<float>& b, const std::vector<float>& gy) {
  const auto g = geometry_of(k);
  auto narrow = [](const std::vector<float>& v) { return std::vector<T>(v.begin(), v.end()); };
  auto widen = [](const std::vector<T>& v) {
    std::vector<float> r(v.size());
    std::transform(v.begin(), v.end(), r.begin(), [](T e) { return float(e); });
    return r;
  };
  const auto xt = narrow(x), wt = narrow(w), bt = narrow(b), gyt = narrow(gy);
  std::vector<T> y(gy.size()), gx(x.size(), T(-7)), gw(w.size(), T(-7));
  using conv = backend::convolution<cpu>;
  conv::forward(g, k.groups, k.n, k.o, xt.data(), wt.data(), k.bias ? bt.data() : nullptr, y.data());
  conv::backward_input(g, k.groups, k.n, k.o, gyt.data(), wt.data(), gx.data());
  conv::backward_weight(g, k.groups, k.n, k.o, gyt.data(), xt.data(), gw.data());
  return {widen(y), widen(gx), widen(gw)};
}

std::string describe(const conv_case& k) {
  std::ostringstream s;
  s << "x [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "] w [" << k.o << ", " << k.c / k.groups << ", "
    << k.kh << ", " << k.kw << "] stride {" << k.sh << ", " << k.sw << "} pad {" << k.ph << ", " << k.pw
    << "} dilation {" << k.dh << ", " << k.dw << "} groups " << k.groups << (k.bias ? " bias" : "");
  return s.str();
}

}  // namespace

TEST_CASE("oneDNN conv2d passes match the im2col path in fp32", "[onednn][conv]") {
  std::mt19937 rng(11);
  for (const auto& k : conv_cases) {
    INFO(describe(k));
    const auto g = geometry_of(k);
    const auto x = random_values(k.n * k.c * k.h * k.w, rng), w = random_values(k.o * (k.c / k.groups) * k.kh * k.kw, rng),
               b = random_values(k.o, rng), gy = random_values(k.n * k.o * g.out_h * g.out_w, rng);
    for (int pass = 0; pass < 3; ++pass)  // a oneDNN kernel, not the fallback
      REQUIRE_FALSE(backend::onednn_conv2d_impl<float>(pass, g, k.groups, k.n, k.o, pass == 0 && k.bias).empty());
    conv_outputs ref, dnn;
    {
      route_scope r(cpu_conv_route::im2col);
      ref = run_conv<float>(k, x, w, b, gy);
    }
    {
      route_scope r(cpu_conv_route::onednn);
      dnn = run_conv<float>(k, x, w, b, gy);
    }
    CHECK(rel_diff(dnn.y, ref.y) <= 1e-5);
    CHECK(rel_diff(dnn.gx, ref.gx) <= 1e-5);
    CHECK(rel_diff(dnn.gw, ref.gw) <= 1e-5);
  }
}

TEST_CASE("oneDNN conv2d gradients match finite differences through the autograd op", "[onednn][conv][grad]") {
  route_scope r(cpu_conv_route::onednn);
  std::mt19937 rng(12);
  for (const auto& k : {conv_cases[1], conv_cases[2], conv_cases[5], conv_cases[7]}) {
    INFO(describe(k));
    const auto g = geometry_of(k);
    const shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c / k.groups, k.kh, k.kw}, ys{k.n, k.o, g.out_h, g.out_w};
    std::vector<std::vector<float>> in{random_values(numel(xs), rng), random_values(numel(ws), rng),
                                       random_values(k.o, rng)};
    const auto proj = tensor<float>::from_vector(random_values(numel(ys), rng, 0.5, 1.5), ys);
    const autograd::conv2d_options o{{k.sh, k.sw}, {k.ph, k.pw}, {k.dh, k.dw}, k.groups};
    auto loss = [&](const std::vector<std::vector<float>>& v) {  // L = sum(conv(x, w, b) * R), summed in double
      no_grad ng;
      const auto y = autograd::conv2d(var<float>(tensor<float>::from_vector(v[0], xs)),
                                      var<float>(tensor<float>::from_vector(v[1], ws)),
                                      var<float>(tensor<float>::from_vector(v[2], {k.o})), o)
                         .value()
                         .to_vector();
      const auto p = proj.to_vector();
      double s = 0;
      for (std::size_t i = 0; i < y.size(); ++i) s += double(y[i]) * double(p[i]);
      return s;
    };
    var<float> xv(tensor<float>::from_vector(in[0], xs), true), wv(tensor<float>::from_vector(in[1], ws), true),
        bv(tensor<float>::from_vector(in[2], {k.o}), true);
    autograd::conv2d(xv, wv, bv, o).backward(proj);
    const std::vector<std::vector<float>> grads{xv.grad().to_vector(), wv.grad().to_vector(), bv.grad().to_vector()};
    // L is linear in each element, so a central difference with a large step is exact but for
    // the fp32 rounding of the outputs.
    const double h = 0.5;
    for (std::size_t i = 0; i < in.size(); ++i) {
      for (std::size_t e = 0; e < in[i].size(); ++e) {
        const float x0 = in[i][e];
        in[i][e] = x0 + float(h);
        const double up = loss(in);
        in[i][e] = x0 - float(h);
        const double down = loss(in);
        in[i][e] = x0;
        const double num = (up - down) / (2 * h), ana = grads[i][e];
        INFO("input " << i << " element " << e << ": analytic " << ana << ", numerical " << num);
        REQUIRE(std::abs(num - ana) <= 1e-3 + 1e-3 * std::abs(num));
      }
    }
  }
}

TEST_CASE("oneDNN conv2d in bfloat16 matches fp32 within bfloat16 precision", "[onednn][conv][bf16]") {
  TRAINKIT_SKIP_UNLESS(backend::onednn_supports<bf16>(), "oneDNN has no bf16 kernels on this CPU");
  route_scope r(cpu_conv_route::onednn);
  std::mt19937 rng(13);
  auto to_bf16 = [](std::vector<float> v) {  // inputs both runs read exactly
    for (auto& e : v) e = float(bf16(e));
    return v;
  };
  for (const auto& k : conv_cases) {
    INFO(describe(k));
    const auto g = geometry_of(k);
    for (int pass = 0; pass < 3; ++pass)
      REQUIRE_FALSE(backend::onednn_conv2d_impl<bf16>(pass, g, k.groups, k.n, k.o, pass == 0 && k.bias).empty());
    const auto x = to_bf16(random_values(k.n * k.c * k.h * k.w, rng)),
               w = to_bf16(random_values(k.o * (k.c / k.groups) * k.kh * k.kw, rng)), b = to_bf16(random_values(k.o, rng)),
               gy = to_bf16(random_values(k.n * k.o * g.out_h * g.out_w, rng));
    const auto f = run_conv<float>(k, x, w, b, gy);
    const auto h = run_conv<bf16>(k, x, w, b, gy);
    // fp32 accumulation, one rounding to bfloat16 (relative 2^-9) per output.
    CHECK(rel_diff(h.y, f.y) <= 1.0 / 256);
    CHECK(rel_diff(h.gx, f.gx) <= 1.0 / 256);
    CHECK(rel_diff(h.gw, f.gw) <= 1.0 / 256);
  }
}

namespace {

struct pool_case {
  index_t planes, h, w, kh, kw, sh, sw, ph, pw;
};

backend::pool2d_geometry pool_geometry_of(const pool_case& k) {
  backend::pool2d_geometry g;
  g.height = k.h;
  g.width = k.w;
  g.kernel_h = k.kh;
  g.kernel_w = k.kw;
  g.stride_h = k.sh;
  g.stride_w = k.sw;
  g.pad_h = k.ph;
  g.pad_w = k.pw;
  g.out_h = (k.h + 2 * k.ph - k.kh) / k.sh + 1;
  g.out_w = (k.w + 2 * k.pw - k.kw) / k.sw + 1;
  return g;
}

// The CNN's 2x2/2 poolings (28 -> 14 -> 7 -> 3: the last column and row never read), padded and
// overlapping windows, a window over the whole padded plane.
const std::vector<pool_case> pool_cases = {{15, 28, 28, 2, 2, 2, 2, 0, 0}, {15, 7, 7, 2, 2, 2, 2, 0, 0},
                                           {4, 9, 11, 3, 3, 2, 2, 1, 1},   {2, 8, 8, 3, 2, 1, 2, 1, 0},
                                           {1, 5, 5, 5, 5, 1, 1, 2, 2},    {64, 14, 14, 3, 3, 2, 2, 1, 1}};

struct pool_outputs {
  std::vector<float> max_y, max_gx, avg_y, avg_gx;
  std::vector<std::int64_t> argmax;
};

template <class T>
pool_outputs run_pool(const pool_case& k, const std::vector<float>& x, const std::vector<float>& gy) {
  const auto g = pool_geometry_of(k);
  const std::vector<T> xt(x.begin(), x.end()), gyt(gy.begin(), gy.end());
  std::vector<T> y(gy.size()), gx(x.size(), T(-7)), ay(gy.size()), agx(x.size(), T(-7));
  std::vector<std::int64_t> idx(gy.size());
  using pool = backend::pool<cpu>;
  pool::max_forward(g, k.planes, xt.data(), y.data(), idx.data());
  pool::max_backward(g, k.planes, gyt.data(), idx.data(), gx.data());
  pool::avg_forward(g, k.planes, xt.data(), ay.data());
  pool::avg_backward(g, k.planes, gyt.data(), agx.data());
  auto widen = [](const std::vector<T>& v) { return std::vector<float>(v.begin(), v.end()); };
  return {widen(y), widen(gx), widen(ay), widen(agx), idx};
}

std::string describe(const pool_case& k) {
  std::ostringstream s;
  s << k.planes << " planes " << k.h << "x" << k.w << " kernel {" << k.kh << ", " << k.kw << "} stride {" << k.sh
    << ", " << k.sw << "} pad {" << k.ph << ", " << k.pw << "}";
  return s.str();
}

}  // namespace

TEST_CASE("oneDNN pooling matches the built-in kernels in fp32", "[onednn][pool]") {
  std::mt19937 rng(21);
  for (const auto& k : pool_cases) {
    INFO(describe(k));
    const auto g = pool_geometry_of(k);
    for (auto op : {backend::detail::onednn_cnn_op::max_pool_forward, backend::detail::onednn_cnn_op::avg_pool_forward,
                    backend::detail::onednn_cnn_op::avg_pool_backward})
      REQUIRE(backend::detail::onednn_pool_entry<float>(op, g, k.planes)->supported);
    const auto x = random_values(k.planes * k.h * k.w, rng), gy = random_values(k.planes * g.out_h * g.out_w, rng);
    pool_outputs ref, dnn;
    {
      route_scope r(cpu_conv_route::im2col);
      ref = run_pool<float>(k, x, gy);
    }
    {
      route_scope r(cpu_conv_route::onednn);
      dnn = run_pool<float>(k, x, gy);
    }
    CHECK(dnn.max_y == ref.max_y);
    CHECK(dnn.argmax == ref.argmax);
    CHECK(dnn.max_gx == ref.max_gx);
    CHECK(rel_diff(dnn.avg_y, ref.avg_y) <= 1e-5);
    CHECK(rel_diff(dnn.avg_gx, ref.avg_gx) <= 1e-5);
  }
}

TEST_CASE("max pooling keeps its NaN and -inf semantics on the oneDNN route", "[onednn][pool]") {
  route_scope r(cpu_conv_route::onednn);
  const auto g = pool_geometry_of({1, 2, 4, 2, 2, 2, 2, 0, 0});
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x{1, nan, -inf, -inf, 5, 2, -inf, -inf};
  std::vector<float> y(2);
  std::vector<std::int64_t> idx(2);
  backend::pool<cpu>::max_forward(g, 1, x.data(), y.data(), idx.data());
  CHECK(std::isnan(y[0]));  // a NaN wins
  CHECK(idx[0] == 1);
  CHECK(y[1] == -inf);  // all -inf: -inf, the first position
  CHECK(idx[1] == 2);
}

TEST_CASE("oneDNN pooling in bfloat16 matches fp32 within bfloat16 precision", "[onednn][pool][bf16]") {
  TRAINKIT_SKIP_UNLESS(backend::onednn_supports<bf16>(), "oneDNN has no bf16 kernels on this CPU");
  route_scope r(cpu_conv_route::onednn);
  std::mt19937 rng(22);
  for (const auto& k : pool_cases) {
    INFO(describe(k));
    const auto g = pool_geometry_of(k);
    REQUIRE(backend::detail::onednn_pool_entry<bf16>(backend::detail::onednn_cnn_op::avg_pool_forward, g, k.planes)
                ->supported);
    auto x = random_values(k.planes * k.h * k.w, rng), gy = random_values(k.planes * g.out_h * g.out_w, rng);
    for (auto& e : x) e = float(bf16(e));
    for (auto& e : gy) e = float(bf16(e));
    const auto f = run_pool<float>(k, x, gy);
    const auto h = run_pool<bf16>(k, x, gy);
    CHECK(h.max_y == f.max_y);  // a selection: exact
    CHECK(h.argmax == f.argmax);
    CHECK(rel_diff(h.avg_y, f.avg_y) <= 1.0 / 256);
    CHECK(rel_diff(h.avg_gx, f.avg_gx) <= 1.0 / 256);
  }
}

namespace {

struct bn_outputs {
  std::vector<float> y, mean, invstd, rmean, rvar, dx, dw, db;
};

/// Forward (training or eval) then backward, on the route in force, in T.
template <class T>
bn_outputs run_bn(bool training, index_t n, index_t c, index_t s, const std::vector<float>& x,
                  const std::vector<float>& w, const std::vector<float>& b, const std::vector<float>& gy, bool affine) {
  using S = accumulate_t<T>;
  auto narrow = [](const std::vector<float>& v) { return std::vector<T>(v.begin(), v.end()); };
  auto widen = [](const auto& v) { return std::vector<float>(v.begin(), v.end()); };
  const auto xt = narrow(x), wt = narrow(w), bt = narrow(b), gyt = narrow(gy);
  const auto cs = static_cast<std::size_t>(c);
  std::vector<T> y(x.size()), rm(cs, T(0.25f)), rv(cs, T(2.0f)), dx(x.size()), dw(cs), db(cs);
  std::vector<S> mean(cs), invstd(cs);
  using norm = backend::norm<cpu>;
  const T* wp = affine ? wt.data() : nullptr;
  const T* bp = affine ? bt.data() : nullptr;
  if (training)
    norm::batch_norm_train(xt.data(), n, c, s, wp, bp, 1e-5, 0.1, rm.data(), rv.data(), y.data(), mean.data(),
                           invstd.data());
  else
    norm::batch_norm_eval(xt.data(), n, c, s, wp, bp, rm.data(), rv.data(), 1e-5, y.data(), mean.data(), invstd.data());
  norm::batch_norm_backward(gyt.data(), xt.data(), n, c, s, wp, mean.data(), invstd.data(), training, dx.data(),
                            affine ? dw.data() : nullptr, affine ? db.data() : nullptr);
  return {widen(y), widen(mean), widen(invstd), widen(rm), widen(rv), widen(dx), widen(dw), widen(db)};
}

}  // namespace

TEST_CASE("oneDNN batch norm matches the built-in kernels in fp32", "[onednn][norm]") {
  std::mt19937 rng(31);
  struct bn_case {
    index_t n, c, s;
  };
  for (const auto& k : {bn_case{5, 3, 49}, bn_case{1, 4, 9}, bn_case{5, 8, 1}, bn_case{4, 32, 196}, bn_case{2, 17, 13}})
    for (bool training : {true, false})
      for (bool affine : {true, false}) {
        INFO("x [" << k.n << ", " << k.c << ", " << k.s << "] training " << training << " affine " << affine);
        for (auto op : {backend::detail::onednn_cnn_op::bnorm_forward_training,
                        backend::detail::onednn_cnn_op::bnorm_forward_inference,
                        backend::detail::onednn_cnn_op::bnorm_backward,
                        backend::detail::onednn_cnn_op::bnorm_backward_global_stats})
          REQUIRE(backend::detail::onednn_bnorm_entry<float>(op, k.n, k.c, k.s, op <= backend::detail::onednn_cnn_op::bnorm_forward_inference ? 1e-5 : 0.0)->supported);
        // An offset mean, as after a ReLU.
        const auto x = random_values(k.n * k.c * k.s, rng, 0.5, 3.0), gy = random_values(k.n * k.c * k.s, rng),
                   w = random_values(k.c, rng, 0.5, 1.5), b = random_values(k.c, rng);
        bn_outputs ref, dnn;
        {
          route_scope r(cpu_conv_route::im2col);
          ref = run_bn<float>(training, k.n, k.c, k.s, x, w, b, gy, affine);
        }
        {
          route_scope r(cpu_conv_route::onednn);
          dnn = run_bn<float>(training, k.n, k.c, k.s, x, w, b, gy, affine);
        }
        CHECK(rel_diff(dnn.y, ref.y) <= 1e-5);
        CHECK(rel_diff(dnn.mean, ref.mean) <= 1e-5);
        CHECK(rel_diff(dnn.invstd, ref.invstd) <= 1e-5);
        CHECK(rel_diff(dnn.rmean, ref.rmean) <= 1e-5);
        CHECK(rel_diff(dnn.rvar, ref.rvar) <= 1e-5);
        CHECK(rel_diff(dnn.dx, ref.dx) <= 1e-5);
        CHECK(rel_diff(dnn.dw, ref.dw) <= 1e-5);
        CHECK(rel_diff(dnn.db, ref.db) <= 1e-5);
      }
}

TEST_CASE("oneDNN batch norm in bfloat16 matches fp32 within bfloat16 precision", "[onednn][norm][bf16]") {
  TRAINKIT_SKIP_UNLESS(backend::onednn_supports<bf16>(), "oneDNN has no bf16 kernels on this CPU");
  route_scope r(cpu_conv_route::onednn);
  std::mt19937 rng(32);
  for (bool training : {true, false}) {
    INFO("training " << training);
    REQUIRE(backend::detail::onednn_bnorm_entry<bf16>(backend::detail::onednn_cnn_op::bnorm_forward_training, 4, 32,
                                                      196, 1e-5)
                ->supported);
    auto x = random_values(4 * 32 * 196, rng, 0.5, 3.0), gy = random_values(4 * 32 * 196, rng),
         w = random_values(32, rng, 0.5, 1.5), b = random_values(32, rng);
    for (auto* v : {&x, &gy, &w, &b})
      for (auto& e : *v) e = float(bf16(e));
    const auto f = run_bn<float>(training, 4, 32, 196, x, w, b, gy, true);
    const auto h = run_bn<bf16>(training, 4, 32, 196, x, w, b, gy, true);
    CHECK(rel_diff(h.y, f.y) <= 1.0 / 128);  // y = (x - mean) * invstd: up to 2^-8 relative around the mean
    CHECK(rel_diff(h.mean, f.mean) <= 1e-5);  // fp32 statistics of the same values
    CHECK(rel_diff(h.invstd, f.invstd) <= 1e-5);
    CHECK(rel_diff(h.dx, f.dx) <= 1.0 / 128);
    CHECK(rel_diff(h.dw, f.dw) <= 1.0 / 256);
    CHECK(rel_diff(h.db, f.db) <= 1.0 / 256);
  }
}

#endif  // TRAINKIT_HAS_ONEDNN
