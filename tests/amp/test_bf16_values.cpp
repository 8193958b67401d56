// Values held in bf16 between ops (var::value_bf16, grad_flow): a bf16 scope's convolution,
// batch norm, relu, max pooling, reshape, residual add and linear pass bf16 tensors on, forward and
// backward, with the numbers the fp32-held (value_precision-tagged) path gives (GELU of bf16 values
// rounds in its own pass); and the vector kernels behind them agree bit for bit with the scalar rules.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "support/cpu.hpp"
#include "support/values.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using fvar = autograd::var<float>;
using ftensor = tensor<float>;
using bf16 = trainkit::bfloat16;  // (oneDNN's headers declare a bfloat16 of their own)

namespace {

using test::bit_equal;
using test::random_float;
ftensor rounded(const ftensor& t) { return cast<float>(cast<bf16>(t)); }

// A small CNN with a residual add, run two ways in a bf16 scope: as it is (every op after the first
// convolution passes bf16-held values and gradients on), and with each op's result turned into a
// plain fp32 var tagged as bf16 values (the way values passed before they could be held in bf16:
// a differentiable multiply by one, which makes the T copy).
struct chain {
  nn::conv2d<> c1, c2;
  nn::batch_norm2d<> bn1, bn2;
  nn::linear<> head;
  bool tagged = false;
  bool recompute = false;  // the second block under checkpoint::checkpoint (its bf16-held input needs a gradient)
  std::vector<bool> held;  // for each op's result: held in bf16
  explicit chain(generator& gen)
      : c1(2, 4, 3, nn::conv2d_options{.padding = {1, 1}}, gen),
        c2(4, 4, 3, nn::conv2d_options{.padding = {1, 1}}, gen),
        bn1(4),
        bn2(4),
        head(4 * 4 * 4, 3, true, gen) {}
  fvar t(const fvar& v) {
    held.push_back(v.holds_bf16());
    if (!tagged) return v;
    auto r = autograd::mul(v, fvar(ftensor::ones(v.sizes())));
    r.set_precision(autograd::value_precision::bfloat16);
    return r;
  }
  fvar operator()(const fvar& x) {
    held.clear();
    auto h = t(autograd::relu(t(bn1.forward(t(c1.forward(x))))));
    auto block = [this](const fvar& v) { return t(autograd::relu(t(bn2.forward(t(c2.forward(v)))))); };
    auto r = recompute ? checkpoint::checkpoint(block, h) : block(h);
    auto s = t(autograd::add(h, r));  // residual: two bf16 values
    auto p = t(autograd::max_pool2d(s, autograd::pool2d_options{.kernel = {2, 2}, .stride = {2, 2}}));
    return head.forward(t(autograd::flatten(p, 1)));
  }
  std::vector<fvar> parameters() {
    std::vector<fvar> out;
    for (auto* m : std::initializer_list<nn::module<float>*>{&c1, &c2, &bn1, &bn2, &head})
      for (auto& p : m->parameters()) out.push_back(p);
    return out;
  }
};

}  // namespace

TEST_CASE("the vector float -> bf16 roundings equal bf16(float) bit for bit", "[amp][bf16]") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> v;
  for (int i = 0; i < (1 << 20); ++i) {
    const std::uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, sizeof f);
    v.push_back(f);
  }
  // Ties, the carry into infinity, denormals, NaNs (quiet and signalling, both signs), infinities.
  for (std::uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f7f8000u, 0x00000001u, 0x00008000u, 0x80018000u,
                          0x7f800001u, 0xff800001u, 0x7fc00000u, 0xffffffffu, 0x7f800000u, 0xff800000u, 0u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    v.push_back(f);
  }
  const auto t = ftensor::from_vector(v, {index_t(v.size())});
  const auto b = cast<bf16>(t).to_vector();  // the bulk path
  std::size_t bad = 0;
  for (std::size_t i = 0; i < v.size(); ++i) bad += b[i].bits() != bf16(v[i]).bits();
  REQUIRE(bad == 0);
  // float -> bf16 -> float in one pass (the bf16 values a CPU without bf16 arithmetic holds in fp32)
  const auto r = map(functors::round_to<bf16>{}, t).to_vector();
  for (std::size_t i = 0; i < v.size(); ++i)
    bad += std::bit_cast<std::uint32_t>(r[i]) != std::bit_cast<std::uint32_t>(static_cast<float>(bf16(v[i])));
  REQUIRE(bad == 0);
  // the scalar rule in 32-bit lanes (functors::round_to<bf16> on a float, inside fused loops)
  for (std::size_t i = 0; i < v.size(); ++i)
    bad += std::bit_cast<std::uint32_t>(trainkit::detail::round_to_bfloat16_value(v[i])) !=
           std::bit_cast<std::uint32_t>(static_cast<float>(bf16(v[i])));
  REQUIRE(bad == 0);
}

TEST_CASE("relu on bf16 bits agrees with relu on their floats for all 65536 patterns", "[amp][bf16]") {
  std::vector<bf16> x(65536), g(65536, bf16(1.5f));
  for (std::uint32_t i = 0; i < 65536; ++i) x[i] = bf16::from_bits(std::uint16_t(i));
  for (std::uint32_t i = 0; i < 65536; ++i) {
    bf16 y, dx;
    autograd::ops::relu_bfloat16{}(y, x[i]);
    autograd::ops::relu_backward_bfloat16{}(dx, g[i], x[i]);
    const float f = float(x[i]);
    const float want = f > 0.0f ? f : 0.0f;
    INFO("bits 0x" << std::hex << i);
    if (std::isnan(f))
      REQUIRE(y.bits() == 0);
    else
      REQUIRE(float(y) == want);
    REQUIRE(float(dx) == (f > 0.0f ? 1.5f : 0.0f));
  }
}

namespace {
struct chain_run {
  ftensor out, running_mean;
  std::vector<ftensor> grads;  // x, then every parameter
  std::vector<bool> held;
};
chain_run run_chain(bool tagged, bool recompute = false) {
  std::mt19937 rng(6);
  const ftensor x0 = random_float({4, 2, 8, 8}, rng);
  const ftensor target = random_float({4, 3}, rng);
  generator gen(5);
  chain net(gen);  // the same weights every time
  net.tagged = tagged;
  net.recompute = recompute;
  fvar x(x0, true);
  fvar out;
  {
    amp::autocast<amp::mixed_bf16> scope;
    out = net(x);
  }
  autograd::mse_loss(out, fvar(target)).backward();
  chain_run r{out.value().clone(), net.bn1.running_mean().clone(), {x.grad()}, net.held};
  for (auto& p : net.parameters()) r.grads.push_back(p.grad());
  return r;
}
double max_abs(const ftensor& t) {
  double m = 0;
  for (float v : t.to_vector()) m = std::max(m, double(std::fabs(v)));
  return m;
}
}  // namespace

TEST_CASE("relu on half values with its half copy, and its gradient from it, agree with the scalar rule",
          "[amp][fp16]") {
  // Every half bit pattern as a float input (8 at a time on F16C where the CPU has it, the tail and
  // other CPUs element by element), plus floats that are no half values (rounded on saving).
  std::vector<float> xs;
  for (std::uint32_t i = 0; i < 65536; ++i) xs.push_back(float(half::from_bits(std::uint16_t(i))));
  for (float f : {1.0001f, -3.3e-9f, 70000.0f, -1e-30f, 0.3f}) xs.push_back(f);
  const auto x = ftensor::from_vector(xs, {index_t(xs.size())});
  auto y = ftensor::empty(x.sizes());
  auto saved = tensor<half>::empty(x.sizes());
  backend::elementwise<cpu>::for_each(x.sizes(), {y.strides(), saved.strides(), x.strides()},
                                      functors::relu_keeping_half{}, y.data(), saved.data(), x.data());
  const auto g = ftensor::full(x.sizes(), 2.5f);
  auto dx = ftensor::empty(x.sizes());
  trainkit::detail::launch(trainkit::detail::assign_fn<functors::relu_backward, float, float, half>{{}}, dx, g, saved);
  const auto yv = y.to_vector(), dv = dx.to_vector();
  const auto sv = saved.to_vector();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    INFO("x = " << xs[i]);
    const float want = xs[i] > 0.0f ? xs[i] : 0.0f;
    REQUIRE(std::memcmp(&yv[i], &want, sizeof want) == 0);
    REQUIRE(sv[i].bits() == half(xs[i]).bits());
    REQUIRE(dv[i] == (float(half(xs[i])) > 0.0f ? 2.5f : 0.0f));
  }
}

TEST_CASE("a bf16 scope passes bf16 values between ops, forward and backward, with the same numbers",
          "[amp][bf16]") {
  const auto a = run_chain(false), b = run_chain(true);
  // Where bf16 GEMMs run natively (oneDNN on a CPU with bf16 arithmetic) results stay bf16;
  // elsewhere they are bf16 values held in fp32.
  for (std::size_t i = 0; i < a.held.size(); ++i) {
    INFO("op result " << i);
    REQUIRE(a.held[i] == backend::blas<cpu>::bf16_native());
  }
  REQUIRE(bit_equal(a.out, b.out));
  REQUIRE(bit_equal(a.running_mean, b.running_mean));
  REQUIRE(a.grads.size() == b.grads.size());
  // x, c1 (w, b), c2 (w, b), bn1 (w, b), bn2 (w, b), head (w, b): the same numbers bit for bit
  // (batch norm sums bf16-held and float-held planes with one loop: norm<cpu>::compute_row).
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    INFO("gradient " << i);
    REQUIRE(a.grads[i].defined());
    REQUIRE(bit_equal(a.grads[i], b.grads[i]));
  }
  REQUIRE(bit_equal(a.grads[0], rounded(a.grads[0])));  // the input's gradient: bf16 values
}

TEST_CASE("a checkpointed segment whose input is held in bf16 recomputes the same gradients", "[amp][bf16]") {
  const auto a = run_chain(false), b = run_chain(false, true);
  REQUIRE(bit_equal(a.out, b.out));
  REQUIRE(bit_equal(a.running_mean, b.running_mean));
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    INFO("gradient " << i);
    REQUIRE(bit_equal(a.grads[i], b.grads[i]));
  }
}

#if TRAINKIT_HAS_ONEDNN
TEST_CASE("on the onednn route a bf16 scope's batch norm runs oneDNN's bf16 kernels, within bf16 rounding",
          "[amp][bf16][onednn]") {
  TRAINKIT_SKIP_UNLESS(backend::blas<cpu>::bf16_native(), "oneDNN's bf16 batch norm: bf16 values are held in fp32 here");
  const auto builtin = run_chain(false);
  backend::set_cpu_conv_route(backend::cpu_conv_route::onednn);
  const auto onednn = run_chain(false);
  backend::set_cpu_conv_route(backend::cpu_conv_route::automatic);
  for (bool h : onednn.held) REQUIRE(h);
  // oneDNN sums the statistics in its own order: a bf16 rounding may land one ulp apart, and the
  // layers after carry it on - within a few bf16 ulps of each tensor's largest value.
  auto close = [](const ftensor& x, const ftensor& y) {
    const auto u = x.to_vector(), v = y.to_vector();
    const double tol = 4.0 * std::ldexp(max_abs(y), -8);
    for (std::size_t k = 0; k < u.size(); ++k)
      if (std::fabs(double(u[k]) - double(v[k])) > tol) return false;
    return true;
  };
  REQUIRE(close(onednn.out, builtin.out));
  for (std::size_t i = 0; i < builtin.grads.size(); ++i) {
    INFO("gradient " << i);
    REQUIRE(close(onednn.grads[i], builtin.grads[i]));
  }
}
#endif

// ---- the CPU's widened bf16 route: roundings done on the way -----------------------------------

TEST_CASE("relu with its bf16 copy rounds its input on the way, in bulk as element by element", "[amp][bf16]") {
  std::mt19937 rng(12);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> v;
  for (int i = 0; i < (1 << 16); ++i) v.push_back(std::bit_cast<float>(bits(rng)));
  for (std::uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00008000u, 0x80018000u, 0x7f800001u, 0xff800001u,
                          0x7fc00000u, 0xffffffffu, 0x7f800000u, 0xff800000u, 0u, 0x80000000u, 0x80008000u})
    v.push_back(std::bit_cast<float>(u));
  const index_t n = index_t(v.size());
  std::vector<float> y(v.size());
  std::vector<bf16> saved(v.size());
  const shape st{1};
  backend::elementwise<cpu>::for_each({n}, {st, st, st}, functors::relu_keeping_bfloat16{}, y.data(), saved.data(),
                                      v.data());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const bf16 s(v[i]);
    const float r = float(s), want = r > 0.0f ? r : 0.0f;
    bad += saved[i].bits() != s.bits() || std::bit_cast<std::uint32_t>(y[i]) != std::bit_cast<std::uint32_t>(want);
  }
  REQUIRE(bad == 0);
}

TEST_CASE("batch norm on float-held bf16 values gives round, batch norm, round bit for bit, in one kernel",
          "[amp][bf16]") {
  std::mt19937 rng(13);
  // Planes of odd and vector-multiple lengths; values off the bf16 grid (a deferred rounding),
  // ties, a large offset (the shifted sums) and a channel of one repeated value.
  for (const index_t s : {index_t(37), index_t(64)}) {
    const index_t n = 3, c = 5, m = n * c * s;
    const std::size_t cs = std::size_t(c);
    std::vector<float> x(std::size_t(m), 0.0f);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (index_t i = 0; i < m; ++i) {
      const index_t ch = (i / s) % c;
      x[std::size_t(i)] = ch == 4 ? 0.75f : nd(rng) * (ch == 2 ? 0.01f : 1.0f) + (ch == 1 ? 300.0f : 0.0f);
    }
    x[3] = std::bit_cast<float>(0x3f808000u);  // a tie
    std::vector<float> w(cs), b(cs);
    for (index_t ch = 0; ch < c; ++ch) {
      w[std::size_t(ch)] = 0.5f + 0.25f * float(ch);
      b[std::size_t(ch)] = 0.125f * float(ch) - 0.3f;
    }
    // The reference: round x, the float kernel, round y.
    std::vector<float> xr(x.size()), y_ref(x.size()), rm_ref(cs, 0.5f), rv_ref(cs, 2.0f);
    for (std::size_t i = 0; i < x.size(); ++i) xr[i] = float(bf16(x[i]));
    std::vector<float> mean_ref(cs), inv_ref(cs);
    backend::norm<cpu>::batch_norm_train(xr.data(), n, c, s, w.data(), b.data(), 1e-5, 0.1, rm_ref.data(),
                                         rv_ref.data(), y_ref.data(), mean_ref.data(), inv_ref.data());
    for (float& f : y_ref) f = float(bf16(f));

    std::vector<float> y(x.size()), rm(cs, 0.5f), rv(cs, 2.0f), mean(cs),
        inv(cs);
    std::vector<bf16> keep(x.size());
    backend::norm<cpu>::batch_norm_train_bf16_values(x.data(), n, c, s, w.data(), b.data(), 1e-5, 0.1, rm.data(),
                                                     rv.data(), y.data(), keep.data(), mean.data(), inv.data());
    INFO("plane length " << s);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      bad += std::bit_cast<std::uint32_t>(y[i]) != std::bit_cast<std::uint32_t>(y_ref[i]) ||
             keep[i].bits() != bf16(x[i]).bits();
    REQUIRE(bad == 0);
    REQUIRE(mean == mean_ref);
    REQUIRE(inv == inv_ref);
    REQUIRE(rm == rm_ref);
    REQUIRE(rv == rv_ref);
  }
}

TEST_CASE("batch norm's gradient from a bf16-kept input, rounded as written, is the float kernel's rounded",
          "[amp][bf16]") {
  std::mt19937 rng(15);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const index_t s : {index_t(29), index_t(64)}) {
    const index_t n = 3, c = 4, m = n * c * s;
    const std::size_t cs = std::size_t(c), ms = std::size_t(m);
    std::vector<float> g(ms), xf(ms), w(cs), mean(cs), inv(cs);
    std::vector<bf16> xb(ms);
    for (std::size_t i = 0; i < g.size(); ++i) {
      g[i] = nd(rng);
      xb[i] = bf16(nd(rng) + 2.0f);
      xf[i] = float(xb[i]);
    }
    for (std::size_t ch = 0; ch < cs; ++ch) {
      w[ch] = 0.75f + 0.5f * float(ch);
      mean[ch] = 2.0f + 0.01f * float(ch);
      inv[ch] = 1.0f / (1.0f + 0.1f * float(ch));
    }
    for (const bool training : {true, false}) {
      INFO("plane length " << s << (training ? ", training" : ", eval"));
      std::vector<float> dx_ref(g.size()), dw_ref(cs), db_ref(cs), dx(g.size()), dw(cs), db(cs);
      backend::norm<cpu>::batch_norm_backward(g.data(), xf.data(), n, c, s, w.data(), mean.data(), inv.data(), training,
                                              dx_ref.data(), dw_ref.data(), db_ref.data());
      for (float& f : dx_ref) f = float(bf16(f));
      backend::norm<cpu>::batch_norm_backward(g.data(), xb.data(), n, c, s, w.data(), mean.data(), inv.data(), training,
                                              dx.data(), dw.data(), db.data(), true);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < g.size(); ++i)
        bad += std::bit_cast<std::uint32_t>(dx[i]) != std::bit_cast<std::uint32_t>(dx_ref[i]);
      REQUIRE(bad == 0);
      REQUIRE(dw == dw_ref);
      REQUIRE(db == db_ref);
    }
  }
}

TEST_CASE("on the widened route a GEMM result defers its rounding to its reader, with the same numbers",
          "[amp][bf16]") {
  TRAINKIT_SKIP_UNLESS(!backend::blas<cpu>::bf16_native(),
                       "bf16 GEMMs run natively here: their results are held in bf16, nothing is deferred");
  std::mt19937 rng(14);
  const ftensor x0 = random_float({6, 40}, rng), target = random_float({6, 5}, rng);
  generator gen(3);
  nn::linear<> l1(40, 24, true, gen), l2(24, 5, true, gen);
  // materialise: read each GEMM result's value before relu sees it (the rounding in its own pass).
  auto run = [&](bool materialise) {
    for (auto* m : {&l1, &l2}) m->zero_grad();
    fvar x(x0, true), h, out;
    {
      amp::autocast<amp::mixed_bf16> scope;
      h = l1.forward(x);
      CHECK(h.rounding_deferred() == autograd::value_precision::bfloat16);
      CHECK(h.precision() == autograd::value_precision::bfloat16);
      if (materialise) {
        const ftensor unrounded = h.value_unrounded().clone();
        REQUIRE(bit_equal(h.value(), rounded(unrounded)));  // value() rounds, once
        CHECK(h.rounding_deferred() == autograd::value_precision::full);
      }
      out = l2.forward(autograd::relu(h));
    }
    autograd::mse_loss(out, fvar(target)).backward();
    std::vector<ftensor> r{out.value().clone(), x.grad().clone()};
    for (auto* m : {&l1, &l2})
      for (auto& p : m->parameters()) r.push_back(p.grad().clone());
    return r;
  };
  const auto a = run(false), b = run(true);
  REQUIRE(bit_equal(a[0], rounded(a[0])));  // the output: bf16 values
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    REQUIRE(bit_equal(a[i], b[i]));
  }
}

TEST_CASE("GELU of bf16 values rounds its result and gradient in its own pass, with the separate passes' numbers",
          "[amp][bf16][gelu]") {
  // linear -> gelu -> linear under bf16 autocast, two ways: as it runs (GELU of the first GEMM's
  // result, whose rounding was deferred on the widened route: rounded in GELU's pass; its output and
  // its input's gradient rounded there too), and spelled out in separate ops - the input rounded,
  // GELU in fp32 on an untagged copy, its output rounded. The second linear would have rounded GELU's
  // output and the first one its gradient, so both give the same bits.
  std::mt19937 rng(15);
  const ftensor x0 = random_float({64, 40}, rng) * 3.0f, target = random_float({64, 5}, rng);
  generator gen(4);
  nn::linear<> l1(40, 300, true, gen), l2(300, 5, true, gen);  // 64 x 300: the vector loops and a tail
  auto run = [&](bool fused) {
    for (auto* m : {&l1, &l2}) m->zero_grad();
    fvar x(x0, true), out;
    {
      amp::autocast<amp::mixed_bf16> scope;
      const fvar h = l1.forward(x);
      fvar g;
      if (fused) {
        g = autograd::gelu(h);
        CHECK(g.precision() == autograd::value_precision::bfloat16);
        CHECK(bit_equal(g.value(), rounded(g.value())));
      } else {
        const fvar plain = autograd::mul(h, 1.0);  // an fp32 var of h's rounded values, untagged
        g = autograd::gelu(plain);
        CHECK(g.precision() == autograd::value_precision::full);
      }
      out = l2.forward(g);
    }
    autograd::mse_loss(out, fvar(target)).backward();
    std::vector<ftensor> r{out.value().clone(), x.grad().clone()};
    for (auto* m : {&l1, &l2})
      for (auto& p : m->parameters()) r.push_back(p.grad().clone());
    return r;
  };
  const auto a = run(true), b = run(false);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    REQUIRE(bit_equal(a[i], b[i]));
  }
  // The kernels' vector lanes and scalar tail against the scalar rule, deferred input or not.
  const index_t n = 1003;
  const ftensor xs = random_float({n}, rng) * 4.0f, gs = random_float({n}, rng);
  for (bool round_x : {false, true}) {
    ftensor y = ftensor::empty({n}), dx = ftensor::empty({n});
    backend::gelu<cpu>::forward_bf16(n, xs.data(), y.data(), round_x);
    backend::gelu<cpu>::backward_bf16(n, gs.data(), xs.data(), dx.data(), round_x);
    for (index_t i = 0; i < n; ++i) {
      const float xi = round_x ? float(bf16(xs.data()[i])) : xs.data()[i];
      CAPTURE(round_x, i, xi);
      const float want_y = float(bf16(functors::gelu{}(xi))), want_dx = float(bf16(functors::gelu_backward{}(gs.data()[i], xi)));
      // The vector erf/exp are within a few ulp of std::erf/std::exp: allow one bf16 step.
      CHECK(std::abs(y.data()[i] - want_y) <= std::abs(want_y) * 0x1p-7f + 1e-30f);
      CHECK(std::abs(dx.data()[i] - want_dx) <= std::abs(want_dx) * 0x1p-7f + 1e-30f);
      CHECK(float(bf16(y.data()[i])) == y.data()[i]);
      CHECK(float(bf16(dx.data()[i])) == dx.data()[i]);
    }
  }
}

TEST_CASE("on the widened route a sum rounds a deferred GEMM result in its own pass, with the same numbers",
          "[amp][bf16]") {
  TRAINKIT_SKIP_UNLESS(!backend::blas<cpu>::bf16_native(),
                       "bf16 GEMMs run natively here: their results are held in bf16, nothing is deferred");
  std::mt19937 rng(16);
  const ftensor x0 = random_float({33, 40}, rng), target = random_float({33, 40}, rng);
  generator gen(5);
  nn::linear<> l1(40, 40, true, gen), l2(40, 40, true, gen);
  // residual: x + l1(x) (one operand deferred, fp32 sum); both: l1(x) + l2(x) (both deferred: a
  // bf16 sum, rounded). materialise: each GEMM result's value read before the sum (its own pass).
  auto run = [&](bool both, bool materialise) {
    for (auto* m : {&l1, &l2}) m->zero_grad();
    fvar x(x0, true), out;
    {
      amp::autocast<amp::mixed_bf16> scope;
      fvar a = both ? l2.forward(x) : x, b = l1.forward(x);
      CHECK(b.rounding_deferred() == autograd::value_precision::bfloat16);
      if (materialise) (void)a.value(), (void)b.value();
      out = autograd::add(a, b);
      CHECK(out.precision() == (both ? autograd::value_precision::bfloat16 : autograd::value_precision::full));
    }
    autograd::mse_loss(out, fvar(target)).backward();
    std::vector<ftensor> r{out.value().clone(), x.grad().clone()};
    for (auto* m : {&l1, &l2})
      for (auto& p : m->parameters())
        if (p.grad().defined()) r.push_back(p.grad().clone());
    return r;
  };
  for (bool both : {false, true}) {
    INFO("both deferred: " << both);
    const auto a = run(both, false), b = run(both, true);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("tensor " << i);
      REQUIRE(bit_equal(a[i], b[i]));
    }
  }
}

TEST_CASE("on the widened route an input read by three projections is rounded once, and again once changed",
          "[amp][bf16]") {
  TRAINKIT_SKIP_UNLESS(!backend::blas<cpu>::bf16_native(),
                       "bf16 GEMMs run natively here: their inputs are converted to bf16, not rounded in fp32");
  std::mt19937 rng(17);
  generator gen(6);
  nn::linear<> q(24, 16, true, gen), k(24, 16, true, gen), v(24, 16, true, gen);
  fvar x(random_float({5, 24}, rng));
  amp::autocast<amp::mixed_bf16> scope;
  CHECK(x.rounded_copy(autograd::value_precision::bfloat16) == nullptr);
  const fvar yq = q.forward(x);
  const auto* kept = x.rounded_copy(autograd::value_precision::bfloat16);
  REQUIRE(kept != nullptr);
  const fvar& cx = x;  // reads through a const var (the mutable value() drops the kept copy)
  REQUIRE(bit_equal(*kept, rounded(cx.value())));
  const ftensor* first = kept;
  (void)k.forward(x), (void)v.forward(x);
  CHECK(x.rounded_copy(autograd::value_precision::bfloat16) == first);  // the same copy, not a new one
  // Each projection gives what it gives on its own input.
  fvar fresh(cx.value().clone());
  REQUIRE(bit_equal(k.forward(fresh).value(), k.forward(x).value()));
  // Values changed in place: the kept copy is dropped, the next read rounds the new values.
  x.value().data()[0] += 1.0f;
  CHECK(x.rounded_copy(autograd::value_precision::bfloat16) == nullptr);
  const fvar again = q.forward(x);
  kept = x.rounded_copy(autograd::value_precision::bfloat16);
  REQUIRE(kept != nullptr);
  REQUIRE(bit_equal(*kept, rounded(cx.value())));
}

TEST_CASE("on the widened route a weight's gradient rounds in the optimizer's pass, with the same numbers",
          "[amp][bf16][optim]") {
  TRAINKIT_SKIP_UNLESS(!backend::blas<cpu>::bf16_native(),
                       "bf16 GEMMs run natively here: weight gradients come out of them in bf16");
  std::mt19937 rng(23);
  const ftensor x0 = random_float({8, 30}, rng), x1 = random_float({8, 30}, rng),
                target = random_float({8, 4}, rng);
  // Three steps, the second of two micro-batches (the gradients add up), a layer used twice per forward (its
  // weight's gradients meet on the way to it), two ways: as it runs (the weight gradients reach the
  // leaves unrounded and the optimizer rounds them as it reads them), and with a hook on every
  // parameter (a hook sees the incoming gradient, so it is rounded before it).
  auto train = [&](bool adam, bool hooked) {
    generator gen(7);
    nn::linear<> l0(30, 16, true, gen), lt(16, 16, true, gen), l2(16, 4, false, gen);
    std::vector<fvar> params;
    for (auto* m : {&l0, &lt, &l2})
      for (auto& p : m->parameters()) params.push_back(p);
    if (hooked)
      for (auto& p : params) p.register_hook([](const ftensor&) { return ftensor(); });
    optim::sgd<> sgd(params, {.lr = 0.1, .momentum = 0.9});
    optim::adamw<> adamw(params, {.lr = 0.01});
    std::vector<ftensor> outs;
    for (int step = 0; step < 3; ++step) {
      adam ? adamw.zero_grad() : sgd.zero_grad();
      const std::vector<const ftensor*> batches = step == 1 ? std::vector<const ftensor*>{&x0, &x1}
                                                             : std::vector<const ftensor*>{&x0};
      for (const ftensor* x : batches) {
        fvar out;
        {
          amp::autocast<amp::mixed_bf16> scope;
          out = l2.forward(autograd::relu(lt.forward(autograd::relu(lt.forward(autograd::relu(l0.forward(fvar(*x))))))));
        }
        autograd::mse_loss(out, fvar(target)).backward();
        outs.push_back(out.value().clone());
      }
      if (!hooked && step == 2) {
        // The rounding waits; grad() does it, in place, once.
        const fvar w = l0.parameters()[0];
        CHECK(w.grad_rounding_deferred() == autograd::value_precision::bfloat16);
        const ftensor unrounded = w.grad_unrounded().clone();
        REQUIRE(bit_equal(w.grad(), rounded(unrounded)));
        CHECK(w.grad_rounding_deferred() == autograd::value_precision::full);
      }
      adam ? adamw.step() : sgd.step();
    }
    for (auto& p : params) outs.push_back(static_cast<const fvar&>(p).value().clone());
    for (auto& p : params) outs.push_back(p.grad().clone());
    return outs;
  };
  for (bool adam : {false, true}) {
    INFO((adam ? "adamw" : "sgd"));
    const auto a = train(adam, false), b = train(adam, true);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("tensor " << i);
      REQUIRE(bit_equal(a[i], b[i]));
    }
  }
}

TEST_CASE("a deferred weight gradient is rounded before a plain one adds to it", "[amp][bf16][optim]") {
  TRAINKIT_SKIP_UNLESS(!backend::blas<cpu>::bf16_native(),
                       "bf16 GEMMs run natively here: weight gradients come out of them in bf16");
  std::mt19937 rng(24);
  const ftensor x0 = random_float({6, 12}, rng), x1 = random_float({6, 12}, rng);
  // Two micro-batches: the first under bf16 autocast (its weight gradient reaches the leaf with its
  // rounding deferred), the second in fp32 (a plain gradient); against a hook that rounds the first.
  auto run = [&](bool hooked) {
    generator gen(8);
    nn::linear<> l(12, 5, true, gen);
    fvar w = l.parameters()[0];
    if (hooked) w.register_hook([](const ftensor&) { return ftensor(); });
    {
      amp::autocast<amp::mixed_bf16> scope;
      autograd::sum(l.forward(fvar(x0))).backward();
    }
    if (!hooked) CHECK(w.grad_rounding_deferred() == autograd::value_precision::bfloat16);
    autograd::sum(l.forward(fvar(x1))).backward();
    return w.grad().clone();
  };
  REQUIRE(bit_equal(run(false), run(true)));
}
