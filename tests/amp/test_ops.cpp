// tests/amp/test_ops.cpp - the autocast ops under each precision policy: fp32 is the plain op
// (finite differences), mixed ops round to the compute type exactly where they should (forward
// result and gradient GEMMs), and agree with fp32 within the compute type's tolerance.
#include <catch2/catch.hpp>

#include "support/values.hpp"
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/gradcheck.hpp"
#include "trainkit/amp/amp.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/conv2d.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/sequential.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using fvar = autograd::var<float>;
using ftensor = tensor<float>;

namespace {

ftensor uniform_float(const shape& s, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  return tk_test::random_tensor<float>(s, rng, lo, hi);
}

/// t rounded to Compute and back (what the mixed ops' operands become).
template <class Compute>
ftensor rounded(const ftensor& t) {
  return cast<float>(cast<Compute>(t));
}

/// ||a - b|| / ||b||, in double.
double rel_error(const ftensor& a, const ftensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  const auto va = a.to_vector(), vb = b.to_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    num += (double(va[i]) - vb[i]) * (double(va[i]) - vb[i]);
    den += double(vb[i]) * vb[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

/// Every element is exactly representable in Compute.
template <class Compute>
bool representable(const ftensor& t) {
  const auto v = t.to_vector();
  for (float x : v)
    if (float(Compute(x)) != x) return false;
  return true;
}

using trainkit::test::values_equal;

template <class P>
constexpr double tolerance() {
  return std::is_same_v<typename P::compute_type, trainkit::bfloat16> ? 2e-2 : 3e-3;
}

}  // namespace

TEST_CASE("policies satisfy the concept and carry the autocast list", "[amp]") {
  STATIC_REQUIRE(amp::precision_policy<amp::fp32>);
  STATIC_REQUIRE(amp::precision_policy<amp::mixed_bf16>);
  STATIC_REQUIRE(amp::precision_policy<amp::mixed_fp16>);
  STATIC_REQUIRE_FALSE(amp::precision_policy<int>);
  STATIC_REQUIRE(std::is_same_v<amp::mixed_bf16::master_type, float>);
  STATIC_REQUIRE(amp::mixed_bf16::runs_in_compute_type(amp::autocast_op::linear));
  STATIC_REQUIRE(amp::mixed_fp16::runs_in_compute_type(amp::autocast_op::conv2d));
  STATIC_REQUIRE_FALSE(amp::mixed_bf16::runs_in_compute_type(amp::autocast_op::softmax));
  STATIC_REQUIRE_FALSE(amp::mixed_bf16::runs_in_compute_type(amp::autocast_op::cross_entropy));
  STATIC_REQUIRE_FALSE(amp::fp32::runs_in_compute_type(amp::autocast_op::linear));
  STATIC_REQUIRE(std::is_same_v<amp::default_scaler_t<amp::mixed_fp16>, amp::dynamic_scaling>);
  STATIC_REQUIRE(std::is_same_v<amp::default_scaler_t<amp::mixed_bf16>, amp::no_scaling>);
  STATIC_REQUIRE(std::is_same_v<amp::default_scaler_t<amp::fp32>, amp::no_scaling>);
}

TEST_CASE("parse_precision and visit_precision turn --precision into a policy type", "[amp]") {
  REQUIRE(amp::parse_precision("fp32") == amp::precision_kind::fp32);
  REQUIRE(amp::parse_precision("fp16") == amp::precision_kind::fp16);
  REQUIRE(amp::parse_precision("bf16") == amp::precision_kind::bf16);
  REQUIRE_THROWS_AS(amp::parse_precision("fp8"), value_error);
  REQUIRE_THROWS_WITH(amp::parse_precision("half"), Catch::Contains("half") && Catch::Contains("bf16"));
  for (auto k : {amp::precision_kind::fp32, amp::precision_kind::fp16, amp::precision_kind::bf16}) {
    const std::string name = amp::visit_precision(k, []<class P>(P) { return std::string(P::name); });
    REQUIRE(name == amp::to_string(k));
    REQUIRE(amp::parse_precision(name) == k);
  }
}

TEST_CASE("the fp32 policy is the plain op, and its gradients match finite differences", "[amp]") {
  std::mt19937 rng(3);
  SECTION("linear") {
    auto r = tk_test::gradcheck([](const auto& v) { return amp::linear<amp::fp32>(v[0], v[1], v[2]); },
                                {tk_test::random_tensor({4, 3}, rng), tk_test::random_tensor({5, 3}, rng),
                                 tk_test::random_tensor({5}, rng)});
    INFO(r.message);
    REQUIRE(r.ok);
  }
  SECTION("matmul, batched") {
    auto r =
        tk_test::gradcheck([](const auto& v) { return amp::matmul<amp::fp32>(v[0], v[1]); },
                           {tk_test::random_tensor({2, 3, 4}, rng), tk_test::random_tensor({4, 2}, rng)});
    INFO(r.message);
    REQUIRE(r.ok);
  }
  SECTION("bmm") {
    auto r =
        tk_test::gradcheck([](const auto& v) { return amp::bmm<amp::fp32>(v[0], v[1]); },
                           {tk_test::random_tensor({2, 3, 4}, rng), tk_test::random_tensor({2, 4, 2}, rng)});
    INFO(r.message);
    REQUIRE(r.ok);
  }
  SECTION("conv2d") {
    autograd::conv2d_options o;
    o.padding = {1, 1};
    o.stride = {2, 1};
    auto r =
        tk_test::gradcheck([o](const auto& v) { return amp::conv2d<amp::fp32>(v[0], v[1], v[2], o); },
                           {tk_test::random_tensor({2, 2, 5, 4}, rng),
                            tk_test::random_tensor({3, 2, 3, 3}, rng), tk_test::random_tensor({3}, rng)});
    INFO(r.message);
    REQUIRE(r.ok);
  }
  SECTION("same values as the plain ops") {
    fvar x(uniform_float({6, 8}, rng)), w(uniform_float({4, 8}, rng), true), b(uniform_float({4}, rng), true);
    REQUIRE(values_equal(amp::linear<amp::fp32>(x, w, b).value(), autograd::linear(x, w, b).value()));
  }
}

TEMPLATE_TEST_CASE("mixed linear rounds operands and result to the compute type", "[amp]", trainkit::bfloat16,
                   half) {
  using C = TestType;
  using P = amp::mixed<C>;
  std::mt19937 rng(11);
  const ftensor x = uniform_float({7, 33}, rng), w = uniform_float({5, 33}, rng), b = uniform_float({5}, rng);
  const ftensor g = uniform_float({7, 5}, rng);
  fvar xv(x, true), wv(w, true), bv(b, true);
  auto y = amp::linear<P>(xv, wv, bv);
  y.backward(g);

  // The reference: the plain fp32 op on the rounded operands (exact products, fp32 sums), rounded.
  fvar xr(rounded<C>(x), true), wr(rounded<C>(w), true), br(rounded<C>(b), true);
  auto yr = autograd::linear(xr, wr, br);
  yr.backward(rounded<C>(g));

  REQUIRE(representable<C>(y.value()));
  REQUIRE(values_equal(y.value(), rounded<C>(yr.value())));
  REQUIRE_FALSE(
      values_equal(y.value(), autograd::linear(fvar(x), fvar(w), fvar(b)).value()));  // rounding happened
  // Gradient GEMMs in the compute type as well: round_C(round_C(g) @ round_C(W)) etc.
  REQUIRE(values_equal(xv.grad(), rounded<C>(xr.grad())));
  REQUIRE(values_equal(wv.grad(), rounded<C>(wr.grad())));
  REQUIRE(values_equal(bv.grad(), rounded<C>(br.grad())));
}

TEMPLATE_TEST_CASE("mixed ops agree with fp32 within the compute type's tolerance", "[amp]", amp::mixed_bf16,
                   amp::mixed_fp16) {
  using P = TestType;
  const double tol = tolerance<P>();
  std::mt19937 rng(5);
  auto compare = [&](auto&& f, std::vector<ftensor> inputs, const shape& out_sizes) {
    const ftensor g = uniform_float(out_sizes, rng);
    std::vector<fvar> a, m;
    for (auto& t : inputs) {
      a.emplace_back(t, true);
      m.emplace_back(t.clone(), true);
    }
    auto ya = f(amp::fp32{}, a);
    auto ym = f(P{}, m);
    REQUIRE(ym.sizes() == out_sizes);
    CHECK(rel_error(ym.value(), ya.value()) < tol);
    ya.backward(g);
    ym.backward(g);
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("input " << i);
      CHECK(rel_error(m[i].grad(), a[i].grad()) < tol);
    }
  };
  SECTION("linear on a 3-D input") {
    compare([]<class Q>(Q, const std::vector<fvar>& v) { return amp::linear<Q>(v[0], v[1], v[2]); },
            {uniform_float({2, 6, 64}, rng), uniform_float({16, 64}, rng), uniform_float({16}, rng)},
            {2, 6, 16});
  }
  SECTION("linear without bias") {
    compare([]<class Q>(Q, const std::vector<fvar>& v) { return amp::linear<Q>(v[0], v[1]); },
            {uniform_float({9, 40}, rng), uniform_float({12, 40}, rng)}, {9, 12});
  }
  SECTION("matmul, broadcast batch") {
    compare([]<class Q>(Q, const std::vector<fvar>& v) { return amp::matmul<Q>(v[0], v[1]); },
            {uniform_float({3, 5, 32}, rng), uniform_float({32, 7}, rng)}, {3, 5, 7});
  }
  SECTION("matmul, vector @ matrix") {
    compare([]<class Q>(Q, const std::vector<fvar>& v) { return amp::matmul<Q>(v[0], v[1]); },
            {uniform_float({32}, rng), uniform_float({32, 7}, rng)}, {7});
  }
  SECTION("bmm") {
    compare([]<class Q>(Q, const std::vector<fvar>& v) { return amp::bmm<Q>(v[0], v[1]); },
            {uniform_float({4, 5, 32}, rng), uniform_float({4, 32, 3}, rng)}, {4, 5, 3});
  }
  SECTION("conv2d with padding, stride and groups") {
    autograd::conv2d_options o;
    o.padding = {1, 1};
    o.stride = {2, 2};
    o.groups = 2;
    compare([o]<class Q>(Q, const std::vector<fvar>& v) { return amp::conv2d<Q>(v[0], v[1], v[2], o); },
            {uniform_float({3, 4, 9, 8}, rng), uniform_float({6, 2, 3, 3}, rng), uniform_float({6}, rng)},
            {3, 6, 5, 4});
  }
  SECTION("conv2d unbatched") {
    compare([]<class Q>(Q, const std::vector<fvar>& v) { return amp::conv2d<Q>(v[0], v[1]); },
            {uniform_float({3, 6, 6}, rng), uniform_float({4, 3, 3, 3}, rng)}, {4, 4, 4});
  }
}

TEST_CASE("mixed conv2d equals the rounded fp32 convolution", "[amp]") {
  std::mt19937 rng(8);
  const ftensor x = uniform_float({2, 3, 6, 6}, rng), w = uniform_float({4, 3, 3, 3}, rng),
                b = uniform_float({4}, rng);
  auto y = amp::conv2d<amp::mixed_bf16>(fvar(x), fvar(w), fvar(b));
  auto yr = autograd::conv2d(fvar(rounded<trainkit::bfloat16>(x)), fvar(rounded<trainkit::bfloat16>(w)),
                             fvar(rounded<trainkit::bfloat16>(b)));
  REQUIRE(values_equal(y.value(), rounded<trainkit::bfloat16>(yr.value())));
}

TEST_CASE("fp16 results overflow to inf like a real fp16 GEMM (what loss scaling detects)", "[amp]") {
  fvar x(ftensor::full({1, 4}, 200.0f)), w(ftensor::full({1, 4}, 100.0f), true);
  auto y = amp::linear<amp::mixed_fp16>(x, w);  // 80000 > 65504
  REQUIRE(std::isinf(y.item()));
  auto yb = amp::linear<amp::mixed_bf16>(x, w);               // bf16 has fp32's range
  REQUIRE(yb.item() == float(trainkit::bfloat16(80000.0f)));  // finite, rounded to 8 bits: 79872
}

TEST_CASE("bad shapes are shape_errors naming the op and the sizes", "[amp]") {
  fvar x(ftensor::ones({2, 3})), w(ftensor::ones({4, 5}));
  REQUIRE_THROWS_AS(amp::linear<amp::mixed_bf16>(x, w), shape_error);
  REQUIRE_THROWS_WITH(amp::linear<amp::mixed_bf16>(x, w),
                      Catch::Contains("linear") && Catch::Contains("[2, 3]"));
  REQUIRE_THROWS_AS(amp::matmul<amp::mixed_bf16>(x, w), shape_error);
  REQUIRE_THROWS_AS(amp::bmm<amp::mixed_fp16>(x, w), shape_error);
  fvar img(ftensor::ones({1, 3, 4, 4})), k(ftensor::ones({2, 2, 3, 3}));
  REQUIRE_THROWS_AS(amp::conv2d<amp::mixed_bf16>(img, k), shape_error);
}

TEMPLATE_TEST_CASE("amp::forward runs an nn model under the policy", "[amp]", amp::fp32, amp::mixed_bf16,
                   amp::mixed_fp16) {
  using P = TestType;
  generator gen(42);
  auto conv = std::make_shared<nn::conv2d<>>(1, 4, 3, nn::conv2d_options{.padding = {1, 1}}, gen);
  auto fc = std::make_shared<nn::linear<>>(4 * 5 * 5, 3, true, gen);
  auto net = nn::make_sequential(conv, std::make_shared<nn::relu<>>(), std::make_shared<nn::flatten<>>(), fc);
  std::mt19937 rng(1);
  fvar x(uniform_float({2, 1, 5, 5}, rng));
  auto y = amp::forward<P>(*net, x);
  // The same model spelled out with the amp ops.
  auto h = amp::conv2d<P>(x, conv->weight(), conv->bias(), conv->op_options());
  auto ref = amp::linear<P>(autograd::flatten(autograd::relu(h), 1, -1), fc->weight(), fc->bias());
  REQUIRE(values_equal(y.value(), ref.value()));
  if constexpr (!P::is_mixed) REQUIRE(values_equal(y.value(), net->forward(x).value()));
  if constexpr (P::is_mixed) REQUIRE(representable<typename P::compute_type>(y.value()));
  autograd::sum(y).backward();
  REQUIRE(conv->weight().grad().defined());
  REQUIRE(fc->bias().grad().defined());
  // module_forward<P> is the same call as an object.
  REQUIRE(values_equal(amp::module_forward<P>{}(*net, x).value(), y.value()));
}

TEST_CASE("without a graph to record, mixed linear gives the same values", "[amp]") {
  std::mt19937 rng(21);
  fvar x(uniform_float({5, 12}, rng)), w(uniform_float({7, 12}, rng), true), b(uniform_float({7}, rng), true);
  const ftensor with_graph = amp::linear<amp::mixed_bf16>(x, w, b).value();
  ftensor without;
  {
    autograd::no_grad ng;
    without = amp::linear<amp::mixed_bf16>(x, w, b).value();
  }
  REQUIRE(values_equal(with_graph, without));
  fvar frozen(w.value());  // a weight that needs no gradient: the input is not saved either
  REQUIRE(values_equal(amp::linear<amp::mixed_bf16>(x, frozen, b).value(), with_graph));
}

TEST_CASE("a mixed MLP keeps fewer bytes for backward than the fp32 one", "[amp][memory]") {
  // 8 x (Linear(128, 128) + ReLU), batch 512: fp32 saves two fp32 activations per block (the
  // linear's input, the relu's input); fp16 saves the relu's input in fp16, and the linear's input
  // and weight as its GEMM took them (as torch's autocast does; on the CPU, whose GEMM widens fp16,
  // that is the rounded fp32 copies - a narrowing pass in forward and a widening one in backward
  // fewer than saving them in fp16 - and the weight's is a quarter of an activation here). bf16
  // passes its values between the ops in bf16: the relu's output is the next linear's saved input,
  // one bf16 activation per block, as torch.autocast's bf16 tensors (where the CPU multiplies bf16
  // natively; elsewhere bf16 is held like fp16).
  generator gen(3);
  nn::sequential<float> net;
  for (int i = 0; i < 8; ++i) {
    net.push_back(std::make_shared<nn::linear<float>>(128, 128, true, gen));
    net.push_back(std::make_shared<nn::relu<float>>());
  }
  std::mt19937 rng(4);
  const fvar x(uniform_float({512, 128}, rng));
  auto kept = [&](auto policy) {
    using P = decltype(policy);
    const std::size_t before = allocator<cpu>::stats().allocated;
    auto y = amp::forward<P>(net, x);
    return allocator<cpu>::stats().allocated - before;
  };
  const std::size_t f = kept(amp::fp32{}), b = kept(amp::mixed_bf16{}), h = kept(amp::mixed_fp16{});
  const double act = 512.0 * 128 * sizeof(float);
  WARN("bytes held for backward: fp32 " << f / act << " activations, bf16 " << b / act << ", fp16 "
                                        << h / act);
  REQUIRE(double(h) <= 0.95 * double(f));  // 15 of 16 here (the weights' rounded copies: 2 of them)
  if (backend::blas<cpu>::bf16_native())
    REQUIRE(double(b) <= 0.4 * double(f));  // 5.5 of 16 (a bf16 activation and a weight copy per block)
  else  // a CPU without bf16 arithmetic: bf16 values held in fp32, as fp16's
    REQUIRE(double(b) <= 0.95 * double(f));
}
