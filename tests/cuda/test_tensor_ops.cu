// tests/cuda/test_tensor_ops.cu - tensors on the GPU against the host backend on the same inputs:
// elementwise kernels (dense/vectorised, strided, broadcast, in place, casts), reductions, GEMM
// (fp32, TF32, fp16, bf16, fp64) and the basic autograd ops forward and backward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>
#include <string>
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

namespace {

/// Exact row sums of a [rows, n] float tensor (in double), and for each the rounding error a
/// float sum may carry: a pairwise (tree) sum of n terms is within ceil(log2 n) * u * sum|x| of
/// the exact one (u = 2^-24). The GPU's and the host's sums are trees with sequential stretches
/// (per-thread folds, merges of splits) whose rounding errors are random, growing as the square
/// root of the stretch; 4 times the tree bound covers them.
struct float_sums {
  std::vector<double> exact, tol;
};

float_sums exact_row_sums(const tk::tensor<float>& x) {
  const index_t rows = x.size(0), n = x.size(1);
  const auto v = x.to_vector();
  const double u = std::ldexp(1.0, -24), depth = std::ceil(std::log2(double(n)));
  float_sums r;
  for (index_t i = 0; i < rows; ++i) {
    double sum = 0, abs_sum = 0;
    for (index_t j = 0; j < n; ++j) {
      sum += double(v[std::size_t(i * n + j)]);
      abs_sum += std::abs(double(v[std::size_t(i * n + j)]));
    }
    r.exact.push_back(sum);
    r.tol.push_back(4 * depth * u * abs_sum);
  }
  return r;
}

/// Empty when every float sum in `got` is within its tolerance of the exact one.
template <class D>
std::string check_sums(const tk::tensor<float, D>& got, const float_sums& want) {
  const auto v = cuda_test::host(got).to_vector();
  std::ostringstream os;
  if (v.size() != want.exact.size()) {
    os << v.size() << " sums, expected " << want.exact.size();
    return os.str();
  }
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!(std::abs(double(v[i]) - want.exact[i]) <= want.tol[i]))
      os << "sum " << i << ": " << double(v[i]) << ", exact " << want.exact[i] << ", tolerance " << want.tol[i] << "; ";
  return os.str();
}

/// Largest distance in units in the last place between two half tensors (adjacent values: 1).
template <class D1, class D2>
int half_ulp_distance(const tk::tensor<tk::half, D1>& a, const tk::tensor<tk::half, D2>& b) {
  const auto va = cuda_test::host(a).to_vector(), vb = cuda_test::host(b).to_vector();
  REQUIRE(va.size() == vb.size());
  // Sign-magnitude bits to a line on which adjacent halfs differ by 1 (+0 and -0 meet at 0).
  auto line = [](tk::half h) {
    const int bits = h.bits();
    return bits & 0x8000 ? -(bits & 0x7fff) : bits;
  };
  int worst = 0;
  for (std::size_t i = 0; i < va.size(); ++i) worst = std::max(worst, std::abs(line(va[i]) - line(vb[i])));
  return worst;
}

}  // namespace

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
  // exp in half: both round a float exp, which may differ by a float ulp, so the halfs may be
  // one half ulp apart.
  const auto hh = tk::cast<tk::half>(random<float>({4097}, rng));
  REQUIRE(half_ulp_distance(tk::exp(hh.to<cuda>()), tk::exp(hh)) <= 1);
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
  // Long sums: both backends against the exact sum, within the rounding of a float sum.
  const auto big = random<float>({3, 1 << 20}, rng);
  auto require_empty = [](const std::string& msg) {
    INFO(msg);
    REQUIRE(msg.empty());
  };
  const auto big_exact = exact_row_sums(big);
  require_empty(check_sums(tk::sum(big.to<cuda>(), {1}), big_exact));
  require_empty(check_sums(tk::sum(big, {1}), big_exact));
  const auto full = random<float>({(1 << 22) + 3}, rng);
  const auto full_exact = exact_row_sums(full.reshape({1, full.numel()}));
  require_empty(check_sums(tk::sum(full.to<cuda>()).reshape({1}), full_exact));
  require_empty(check_sums(tk::sum(full).reshape({1}), full_exact));
  REQUIRE(cuda_test::identical(tk::argmax(full.to<cuda>(), 0), tk::argmax(full, 0)));
  const auto ints = tk::tensor<std::int64_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(cuda_test::identical(tk::sum(ints.to<cuda>(), {0}), tk::sum(ints, {0})));
  const auto hx = tk::cast<tk::half>(random<float>({5, 999}, rng));
  CUDA_TEST_REQUIRE_CLOSE(tk::cast<float>(tk::sum(hx.to<cuda>(), {1})), tk::cast<float>(tk::sum(hx, {1})), 2e-3, 1e-3);
  const auto e = tk::tensor<float>::zeros({3, 0});
  CUDA_TEST_REQUIRE_CLOSE(tk::sum(e.to<cuda>(), {1}), tk::sum(e, {1}), 0, 0);
  CUDA_TEST_REQUIRE_CLOSE(tk::mean(e.to<cuda>(), {1}), tk::mean(e, {1}), 0, 0);
}

TEST_CASE("column reductions (reduced dims not innermost) over many rows match the host bit for bit",
          "[cuda][reduce]") {
  std::mt19937 rng(8);
  // Small integers: every partial sum is exact in float, so any summation order gives the host's
  // bits, and ties test that argmax keeps the first row.
  auto ints = [&](const shape& s) {
    std::uniform_int_distribution<int> u(-4, 4);
    std::vector<float> v(static_cast<std::size_t>(tk::numel(s)));
    for (auto& e : v) e = float(u(rng));
    return tk::tensor<float>::from_vector(v, s);
  };
  // Few columns and many rows (split over blocks), a warp of columns or more, few rows.
  for (shape xs : {shape{100000, 5}, shape{(1 << 20) + 7, 2}, shape{20000, 33}, shape{3000, 1000}, shape{7, 300000}}) {
    INFO("x " << tk::to_string(xs));
    const auto x = ints(xs);
    const auto d = x.to<cuda>();
    const auto sd = tk::sum(d, {0});
    REQUIRE(cuda_test::identical(sd, tk::sum(x, {0})));
    REQUIRE(cuda_test::identical(tk::sum(d, {0}), sd));  // run to run
    REQUIRE(cuda_test::identical(tk::argmax(d, 0), tk::argmax(x, 0)));
    REQUIRE(cuda_test::identical(tk::amin(d, {0}), tk::amin(x, {0})));
    REQUIRE(cuda_test::identical(tk::sum(d.t(), {1}), tk::sum(x.t(), {1})));
    CUDA_TEST_REQUIRE_CLOSE(tk::mean(d, {0}), tk::mean(x, {0}), 1e-6, 0);
    const auto hx = tk::cast<tk::half>(x);
    REQUIRE(cuda_test::identical(tk::sum(hx.to<cuda>(), {0}), tk::sum(hx, {0})));
  }
  // Two reduced dims that do not coalesce, the inner one strided: steps carry across it.
  const auto x4 = ints({40, 6, 50, 3});
  const auto d4 = x4.to<cuda>();
  REQUIRE(cuda_test::identical(tk::sum(d4, {0, 2}), tk::sum(x4, {0, 2})));
  REQUIRE(cuda_test::identical(tk::amax(d4, {0, 2}), tk::amax(x4, {0, 2})));
  REQUIRE(cuda_test::identical(tk::argmax(d4, 2), tk::argmax(x4, 2)));
}

TEST_CASE("reductions on the benchmark's launch shapes: a warp per row, a block per row, many splits", "[cuda][reduce]") {
  std::mt19937 rng(11);
  // 9000 rows of 2048: enough rows to fill an H200 with warps (a warp per row); 300 rows of 4096:
  // a block per row; one long row: 1000+ splits merged by the warp finish kernel.
  for (shape xs : {shape{9000, 2048}, shape{300, 4096}, shape{1, (1 << 23) + 5}}) {
    INFO("x " << tk::to_string(xs));
    auto x = random<float>(xs, rng);
    // Ties on the maximum, early and late in a row: argmax keeps the first.
    x.data()[7] = 2.0f;
    x.data()[xs[1] - 3] = 2.0f;
    const auto d = x.to<cuda>();
    REQUIRE(cuda_test::identical(tk::argmax(d, 1), tk::argmax(x, 1)));
    REQUIRE(cuda_test::identical(tk::argmin(d, 1), tk::argmin(x, 1)));
    REQUIRE(cuda_test::identical(tk::amax(d, {1}), tk::amax(x, {1})));
    REQUIRE(cuda_test::identical(tk::amin(d), tk::amin(x)));
    const auto s = tk::sum(d, {1});
    REQUIRE(cuda_test::identical(tk::sum(d, {1}), s));  // run to run
    CUDA_TEST_REQUIRE_CLOSE(s, tk::sum(x, {1}), 1e-4, 1e-4);
    // A NaN anywhere makes amax NaN and argmax its index, wherever the split boundaries fall.
    for (index_t at : {index_t(0), xs[1] / 2 + 1, xs[1] - 1}) {
      auto xn = x.clone();
      xn.data()[at] = std::numeric_limits<float>::quiet_NaN();
      const auto dn = xn.to<cuda>();
      REQUIRE(std::isnan(double(tk::amax(dn).item())));
      REQUIRE(std::isnan(double(tk::amin(dn).item())));
      REQUIRE(cuda_test::identical(tk::argmax(dn, 1), tk::argmax(xn, 1)));
    }
  }
  // Column sums over many rows (the bias gradient's shape): four loads in flight per lane.
  const auto c = random<float>({20001, 4096 + 3}, rng);
  CUDA_TEST_REQUIRE_CLOSE(tk::sum(c.to<cuda>(), {0}), tk::sum(c, {0}), 1e-4, 1e-4);
  // Integer amax/amin: the fold starts from the type's limits, not from an infinity it lacks.
  const auto ints = tk::tensor<std::int64_t>::from_vector({-5, -7, -9, -6}, {2, 2});
  REQUIRE(cuda_test::identical(tk::amax(ints.to<cuda>(), {1}), tk::amax(ints, {1})));
  REQUIRE(tk::amax(ints.to<cuda>()).item() == -5);
  REQUIRE(tk::amin(tk::tensor<std::int64_t>::from_vector({5, 7}, {2}).to<cuda>()).item() == 5);
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
