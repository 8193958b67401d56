// tests/cuda/test_tensor_ops.cu - tensors on the GPU against the host backend on the same inputs:
// elementwise kernels (dense/vectorised, strided, broadcast, in place, casts), reductions, GEMM
// (fp32, TF32, fp16, bf16, fp64) and the basic autograd ops forward and backward.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cuda/support.cuh"

namespace tk = trainkit;
namespace ag = trainkit::autograd;
using tk::cpu;
using tk::cuda;
using tk::index_t;
using tk::shape;
using cuda_test::check_op;
using cuda_test::random;

TEST_CASE("unary elementwise ops match the host", "[cuda][elementwise]") {
  std::mt19937 rng(1);
  // Sizes around the vector width and the per-block tile, to hit the dense tail and the block edges.
  for (index_t n : {index_t(1), index_t(3), index_t(4099), index_t(1 << 20) + 5}) {
    INFO("n = " << n);
    const auto x = random<float>({n}, rng, 0.1, 3.0);
    const auto d = x.to<cuda>();
    CUDA_TEST_REQUIRE_CLOSE(tk::exp(d), tk::exp(x), 1e-6, 0);
    CUDA_TEST_REQUIRE_CLOSE(tk::log(d), tk::log(x), 1e-6, 1e-7);
    CUDA_TEST_REQUIRE_CLOSE(tk::sqrt(d), tk::sqrt(x), 1e-6, 0);
    CUDA_TEST_REQUIRE_CLOSE(tk::tanh(d), tk::tanh(x), 1e-6, 1e-7);
    CUDA_TEST_REQUIRE_CLOSE(tk::sigmoid(-d), tk::sigmoid(-x), 1e-6, 1e-7);
    CUDA_TEST_REQUIRE_CLOSE(tk::gelu(d - 1.5), tk::gelu(x - 1.5), 1e-6, 1e-7);
    CUDA_TEST_REQUIRE_CLOSE(tk::relu(d - 1.5), tk::relu(x - 1.5), 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(tk::reciprocal(d), tk::reciprocal(x), 1e-7, 0);
    CUDA_TEST_REQUIRE_CLOSE(tk::sign(d - 1.0), tk::sign(x - 1.0), 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(tk::abs(d - 1.0), tk::abs(x - 1.0), 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(tk::pow(d, 1.7), tk::pow(x, 1.7), 1e-6, 0);
    CUDA_TEST_REQUIRE_CLOSE(tk::clamp(d, 0.5, 2.0), tk::clamp(x, 0.5, 2.0), 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(2.0 - d * 3.0 / 1.5 + 1.0, 2.0 - x * 3.0 / 1.5 + 1.0, 1e-6, 1e-6);
  }
  const auto xd = random<double>({1000}, rng, 0.1, 3.0);
  CUDA_TEST_REQUIRE_CLOSE(tk::exp(xd.to<cuda>()), tk::exp(xd), 1e-14, 0);
}

TEST_CASE("binary ops broadcast and read strided views like the host", "[cuda][elementwise]") {
  std::mt19937 rng(2);
  const auto a = random<float>({7, 1, 5}, rng, 0.5, 2.0), b = random<float>({3, 1}, rng, 0.5, 2.0);
  const auto da = a.to<cuda>(), db = b.to<cuda>();
  CUDA_TEST_REQUIRE_CLOSE(da + db, a + b, 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(da - db, a - b, 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(da * db, a * b, 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(da / db, a / b, 1e-7, 0);
  CUDA_TEST_REQUIRE_CLOSE(tk::pow(da, db), tk::pow(a, b), 1e-6, 0);
  CUDA_TEST_REQUIRE_CLOSE(tk::maximum(da, db), tk::maximum(a, b), 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(tk::minimum(da, db), tk::minimum(a, b), 0, 0);
  // Views: transposed, sliced with a step, expanded; an unaligned offset takes the strided kernel.
  const auto m = random<float>({64, 48}, rng);
  const auto dm = m.to<cuda>();
  CUDA_TEST_REQUIRE_CLOSE(tk::exp(dm.t()), tk::exp(m.t()), 1e-6, 0);
  CUDA_TEST_REQUIRE_CLOSE(dm.slice(1, 1, 47, 3) * 2.0, m.slice(1, 1, 47, 3) * 2.0, 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(dm.slice(0, 1, 64) + dm.slice(0, 0, 63), m.slice(0, 1, 64) + m.slice(0, 0, 63), 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(dm.flatten().slice(0, 3, 3001) + 1.0, m.flatten().slice(0, 3, 3001) + 1.0, 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(dm.permute({1, 0}).contiguous(), m.permute({1, 0}).contiguous(), 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(dm.slice(1, 0, 1).expand({64, 48}).contiguous(), m.slice(1, 0, 1).expand({64, 48}).contiguous(),
                          0, 0);
  // 0-d and empty tensors.
  CUDA_TEST_REQUIRE_CLOSE(tk::tensor<float, cuda>::scalar(2.5f) * dm, tk::tensor<float>::scalar(2.5f) * m, 0, 0);
  REQUIRE(tk::exp(tk::tensor<float, cuda>::empty({0, 3})).numel() == 0);
}

TEST_CASE("in-place ops, fill, copy into views and casts", "[cuda][elementwise]") {
  std::mt19937 rng(3);
  const auto x = random<float>({33, 17}, rng);
  auto h = x.clone();
  auto d = x.to<cuda>();
  const auto y = random<float>({17}, rng);
  tk::add_(h, y, 0.5);
  tk::add_(d, y.to<cuda>(), 0.5);
  tk::mul_(h, 3.0);
  tk::mul_(d, 3.0);
  CUDA_TEST_REQUIRE_CLOSE(d, h, 1e-7, 0);
  auto hv = h.slice(1, 2, 15, 2);
  auto dv = d.slice(1, 2, 15, 2);
  tk::fill_(hv, -1.0f);
  tk::fill_(dv, -1.0f);
  CUDA_TEST_REQUIRE_CLOSE(d, h, 1e-7, 0);
  auto ht = h.t();
  auto dt = d.t();
  tk::copy_(ht, x.t());
  tk::copy_(dt, x.to<cuda>().t());
  CUDA_TEST_REQUIRE_CLOSE(d, h, 0, 0);
  tk::zero_(d);
  REQUIRE(double(tk::sum(d).item()) == 0.0);
  // Casts round to nearest even, bit for bit the host's.
  const auto big = random<float>({100003}, rng, -70000.0, 70000.0);
  const auto db = big.to<cuda>();
  REQUIRE(cuda_test::identical(tk::cast<tk::half>(db), tk::cast<tk::half>(big)));
  REQUIRE(cuda_test::identical(tk::cast<tk::bfloat16>(db), tk::cast<tk::bfloat16>(big)));
  REQUIRE(cuda_test::identical(tk::cast<double>(db), tk::cast<double>(big)));
  REQUIRE(cuda_test::identical(tk::cast<std::int32_t>(db), tk::cast<std::int32_t>(big)));
  REQUIRE(cuda_test::identical(tk::cast<float>(tk::cast<tk::half>(db)), tk::cast<float>(tk::cast<tk::half>(big))));
  const auto hh = tk::cast<tk::half>(random<float>({4097}, rng));
  CUDA_TEST_REQUIRE_CLOSE(tk::cast<float>(tk::exp(hh.to<cuda>())), tk::cast<float>(tk::exp(hh)), 0, 0);
}

TEST_CASE("reductions over every kind of dimension set match the host", "[cuda][reduce]") {
  std::mt19937 rng(4);
  const auto x = random<float>({6, 7, 300}, rng);
  const auto d = x.to<cuda>();
  for (std::vector<index_t> dims : {std::vector<index_t>{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1}}) {
    INFO("dims of size " << dims.size() << (dims.empty() ? "" : ", first " + std::to_string(dims[0])));
    CUDA_TEST_REQUIRE_CLOSE(tk::sum(d, dims), tk::sum(x, dims), 1e-5, 1e-5);
    CUDA_TEST_REQUIRE_CLOSE(tk::mean(d, dims, true), tk::mean(x, dims, true), 1e-5, 1e-6);
    CUDA_TEST_REQUIRE_CLOSE(tk::amax(d, dims), tk::amax(x, dims), 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(tk::amin(d, dims), tk::amin(x, dims), 0, 0);
  }
  for (index_t dim : {0, 1, 2}) {
    REQUIRE(cuda_test::identical(tk::argmax(d, dim), tk::argmax(x, dim)));
    REQUIRE(cuda_test::identical(tk::argmin(d, dim, true), tk::argmin(x, dim, true)));
  }
  // Strided input, and sum_to (the gradient of broadcasting).
  CUDA_TEST_REQUIRE_CLOSE(tk::sum(d.transpose(0, 2), {1}), tk::sum(x.transpose(0, 2), {1}), 1e-5, 1e-5);
  CUDA_TEST_REQUIRE_CLOSE(tk::sum_to(d, {7, 1}), tk::sum_to(x, {7, 1}), 1e-5, 1e-5);
  // Ties and NaN: the first occurrence, as on the host.
  const auto t = tk::tensor<float>::from_vector({1, 3, 3, 2, 3, 0, 5, 5, 5, 5, 5, 5}, {2, 6});
  REQUIRE(cuda_test::identical(tk::argmax(t.to<cuda>(), 1), tk::argmax(t, 1)));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto tn = tk::tensor<float>::from_vector({1, nan, 3, 7}, {4});
  REQUIRE(std::isnan(double(tk::amax(tn.to<cuda>()).item())));
  REQUIRE(tk::argmax(tn.to<cuda>(), 0).item() == tk::argmax(tn, 0).item());
  // Long rows (split across blocks), int64 and half inputs, an empty reduced dim.
  const auto big = random<float>({3, 1 << 20}, rng);
  CUDA_TEST_REQUIRE_CLOSE(tk::sum(big.to<cuda>(), {1}), tk::sum(big, {1}), 1e-4, 1e-3);
  const auto full = random<float>({(1 << 22) + 3}, rng);
  CUDA_TEST_REQUIRE_CLOSE(tk::sum(full.to<cuda>()), tk::sum(full), 1e-4, 1e-2);
  REQUIRE(cuda_test::identical(tk::argmax(full.to<cuda>(), 0), tk::argmax(full, 0)));
  const auto ints = tk::tensor<std::int64_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(cuda_test::identical(tk::sum(ints.to<cuda>(), {0}), tk::sum(ints, {0})));
  const auto hx = tk::cast<tk::half>(random<float>({5, 999}, rng));
  CUDA_TEST_REQUIRE_CLOSE(tk::cast<float>(tk::sum(hx.to<cuda>(), {1})), tk::cast<float>(tk::sum(hx, {1})), 2e-3, 1e-3);
  const auto e = tk::tensor<float>::zeros({3, 0});
  CUDA_TEST_REQUIRE_CLOSE(tk::sum(e.to<cuda>(), {1}), tk::sum(e, {1}), 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(tk::mean(e.to<cuda>(), {1}), tk::mean(e, {1}), 0, 0);
}

TEST_CASE("GEMM through cuBLASLt: fp32, TF32, fp16, bf16 and fp64 against the host", "[cuda][blas]") {
  std::mt19937 rng(5);
  cuda_test::settings_guard keep;
  for (auto [m, k, n] : {std::array<index_t, 3>{1, 1, 1}, {17, 33, 9}, {128, 256, 64}, {300, 7, 513}}) {
    INFO(m << "x" << k << " @ " << k << "x" << n);
    const auto a = random<float>({m, k}, rng), b = random<float>({k, n}, rng);
    const auto da = a.to<cuda>(), db = b.to<cuda>();
    tk::gpu::settings().allow_tf32 = false;
    CUDA_TEST_REQUIRE_CLOSE(tk::mm(da, db), tk::mm(a, b), 1e-5, 1e-5);
    // Transposed operands read without copies.
    const auto at = random<float>({k, m}, rng), bt = random<float>({n, k}, rng);
    CUDA_TEST_REQUIRE_CLOSE(tk::mm(at.to<cuda>().t(), bt.to<cuda>().t()), tk::mm(at.t(), bt.t()), 1e-5, 1e-5);
    tk::gpu::settings().allow_tf32 = true;
    CUDA_TEST_REQUIRE_CLOSE(tk::mm(da, db), tk::mm(a, b), 5e-3, 5e-3 * std::sqrt(double(k)));
    tk::gpu::settings().allow_tf32 = false;
    // 16-bit: the host widens to fp32 and accumulates in fp32, as cuBLASLt does: equal up to
    // the order of the sums and one rounding to the 16-bit type.
    const auto ah = tk::cast<tk::half>(a), bh = tk::cast<tk::half>(b);
    CUDA_TEST_REQUIRE_CLOSE(tk::cast<float>(tk::mm(ah.to<cuda>(), bh.to<cuda>())), tk::cast<float>(tk::mm(ah, bh)),
                            2e-3, 1e-3);
    const auto ab = tk::cast<tk::bfloat16>(a), bb = tk::cast<tk::bfloat16>(b);
    CUDA_TEST_REQUIRE_CLOSE(tk::cast<float>(tk::mm(ab.to<cuda>(), bb.to<cuda>())), tk::cast<float>(tk::mm(ab, bb)),
                            1.6e-2, 1e-2);
    const auto a64 = tk::cast<double>(a), b64 = tk::cast<double>(b);
    CUDA_TEST_REQUIRE_CLOSE(tk::mm(a64.to<cuda>(), b64.to<cuda>()), tk::mm(a64, b64), 1e-12, 1e-12);
  }
  // mm_into with beta, batched/broadcast matmul, vectors, k = 0.
  const auto a = random<float>({5, 6}, rng), b = random<float>({6, 4}, rng), c = random<float>({5, 4}, rng);
  auto hc = c.clone();
  auto dc = c.to<cuda>();
  tk::mm_into(hc, a, b, 0.5, 2.0);
  tk::mm_into(dc, a.to<cuda>(), b.to<cuda>(), 0.5, 2.0);
  CUDA_TEST_REQUIRE_CLOSE(dc, hc, 1e-5, 1e-5);
  const auto ba = random<float>({3, 1, 5, 6}, rng), bb = random<float>({4, 6, 2}, rng);
  CUDA_TEST_REQUIRE_CLOSE(tk::matmul(ba.to<cuda>(), bb.to<cuda>()), tk::matmul(ba, bb), 1e-5, 1e-5);
  const auto v = random<float>({6}, rng);
  CUDA_TEST_REQUIRE_CLOSE(tk::matmul(a.to<cuda>(), v.to<cuda>()), tk::matmul(a, v), 1e-5, 1e-5);
  const auto e1 = tk::tensor<float>::zeros({3, 0}), e2 = tk::tensor<float>::zeros({0, 2});
  CUDA_TEST_REQUIRE_CLOSE(tk::mm(e1.to<cuda>(), e2.to<cuda>()), tk::mm(e1, e2), 0, 0);
}

TEST_CASE("basic autograd ops: forward and backward on cuda match cpu", "[cuda][autograd]") {
  std::mt19937 rng(6);
  const auto a = random<float>({4, 5}, rng, 0.2, 2.0), b = random<float>({4, 5}, rng, 0.2, 2.0),
             r = random<float>({5}, rng, 0.2, 2.0);
  check_op<float>([](const auto& v) { return v[0] * v[1] + v[0] / v[1] - v[1]; }, {a, b}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::add(v[0], v[1], 0.5) * v[0]; }, {a, r}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::pow(v[0], v[1]); }, {a, b}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::pow(v[0], 2.5) + ag::neg(v[0]); }, {a}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::exp(v[0]) + ag::log(v[0]) + ag::sqrt(v[0]); }, {a}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::tanh(v[0]) * ag::sigmoid(v[0]); }, {a}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::relu(v[0] - 1.0) + ag::gelu(v[0] - 1.0); }, {a}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::matmul(v[0], ag::transpose(v[1], 0, 1)); }, {a, b}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::sum(v[0], {1}) + ag::mean(v[0], {1}); }, {a}, 1e-5, 1e-6);
  check_op<float>([](const auto& v) { return ag::sum(v[0]); }, {a}, 1e-5, 1e-6);
  check_op<float>(
      [](const auto& v) {
        auto p = ag::permute(ag::reshape(v[0], {2, 2, 5}), {2, 0, 1});
        return ag::slice(ag::contiguous(p), 0, 1, 5, 2);
      },
      {a}, 0, 0);
  check_op<float>([](const auto& v) { return ag::expand(ag::unsqueeze(v[0], 0), {3, 5}); }, {r}, 1e-6, 0);
  check_op<float>([](const auto& v) { return ag::concat(std::vector{v[0], v[1]}, 1); }, {a, b}, 0, 0);
  const auto ad = tk::cast<double>(a), bd = tk::cast<double>(b);
  check_op<double>([](const auto& v) { return ag::matmul(v[0], ag::transpose(v[1], 0, 1)) * 3.0; }, {ad, bd}, 1e-12,
                   1e-12);
}
