// Gradient compression: codec round trips and bounds, error feedback, the quantized allreduce on
// thread_group (any length, any world size, overflowing sums) and the bytes it puts on the wire.
// Catch2's assertions are not thread-safe: rank threads only record, the test thread checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "trainkit/compression/codecs.hpp"
#include "trainkit/compression/quantized_allreduce.hpp"
#include "trainkit/dist/thread_group.hpp"

namespace dist = trainkit::dist;
namespace compression = trainkit::compression;
using trainkit::index_t;

namespace {

std::vector<float> random_values(index_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

template <class C>
std::vector<float> round_trip(const std::vector<float>& x) {
  const auto n = static_cast<index_t>(x.size());
  std::vector<std::uint8_t> wire(C::wire_bytes(n));
  std::vector<float> y(x.size());
  C::encode(x.data(), n, wire.data());
  C::decode(wire.data(), n, y.data());
  return y;
}

float absmax(const float* x, index_t n) {
  float m = 0;
  for (index_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

}  // namespace

TEST_CASE("compression: fp16 and bf16 round trips are correctly rounded", "[dist][compression]") {
  const auto x = random_values(1000, 1, 3.0f);
  const auto h = round_trip<compression::fp16>(x);
  const auto b = round_trip<compression::bf16>(x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(h[i] == static_cast<float>(trainkit::half(x[i])));
    REQUIRE(b[i] == static_cast<float>(trainkit::bfloat16(x[i])));
    REQUIRE(std::fabs(h[i] - x[i]) <= std::fabs(x[i]) * 0x1p-11f + 0x1p-25f);
    REQUIRE(std::fabs(b[i] - x[i]) <= std::fabs(x[i]) * 0x1p-8f);
  }
  // Finite values beyond fp16's range saturate; inf and NaN pass through.
  const auto s = round_trip<compression::fp16>({1e6f, -1e6f, std::numeric_limits<float>::infinity(), NAN});
  CHECK(s[0] == 65504.0f);
  CHECK(s[1] == -65504.0f);
  CHECK(std::isinf(s[2]));
  CHECK(std::isnan(s[3]));
}

TEST_CASE("compression: the fp16 codec converts exactly like trainkit::half", "[dist][compression]") {
  const compression::detail::compress_fp16_decode_fn dec;
  const compression::detail::compress_fp16_encode_fn enc;
  for (std::uint32_t b = 0; b < 65536; ++b) {  // every half decodes exactly, and encodes back
    const auto h = trainkit::half::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(dec(static_cast<std::uint16_t>(b))));
      continue;
    }
    REQUIRE(trainkit::detail::bit_cast<std::uint32_t>(dec(static_cast<std::uint16_t>(b))) ==
            trainkit::detail::bit_cast<std::uint32_t>(f));
    REQUIRE(enc(f) == b);
  }
  // Floats in fp16's range (normal, subnormal, halfway cases) round like half(float) does.
  std::mt19937 gen(5);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x477fe000u);
  for (int k = 0; k < 200000; ++k) {
    const std::uint32_t u = bits(gen) | (k % 2 ? 0x80000000u : 0u);
    const float f = trainkit::detail::bit_cast<float>(u);
    REQUIRE(enc(f) == trainkit::half(f).bits());
  }
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {  // the exact midpoints between neighbouring halves
    const double mid = (static_cast<double>(static_cast<float>(trainkit::half::from_bits(static_cast<std::uint16_t>(h)))) +
                        static_cast<double>(static_cast<float>(trainkit::half::from_bits(static_cast<std::uint16_t>(h + 1))))) / 2;
    const auto f = static_cast<float>(mid);
    REQUIRE(enc(f) == trainkit::half(f).bits());
  }
}

TEST_CASE("compression: fp16::encode (F16C where the CPU has it) writes the integer rule's bits", "[dist][compression]") {
  // Every 4099th float bit pattern (both signs, subnormals, the saturation edge, inf, NaN), each
  // midpoint's neighbourhood, and groups of 8 with one NaN among finite values.
  std::vector<float> x;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4099) x.push_back(trainkit::detail::bit_cast<float>(static_cast<std::uint32_t>(u)));
  for (float f : {65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e30f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f}) {
    x.push_back(f);
    x.push_back(-f);
  }
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  x.push_back(1.5f);
  const auto n = static_cast<index_t>(x.size());
  std::vector<std::uint16_t> wire(x.size());  // 2-byte aligned, as the allreduce's buffers
  compression::fp16::encode(x.data(), n, reinterpret_cast<std::uint8_t*>(wire.data()));
  // (Mismatches counted, the first one named: a REQUIRE per element made this test 7 s under ASan.)
  const compression::detail::compress_fp16_encode_fn enc;
  std::size_t encode_bad = 0, first_encode_bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (wire[i] != enc(x[i]) && encode_bad++ == 0) first_encode_bad = i;
  INFO("first mismatch: float bits 0x" << std::hex << trainkit::detail::bit_cast<std::uint32_t>(x[first_encode_bad])
                                        << ", encoded 0x" << wire[first_encode_bad] << ", the rule's 0x"
                                        << enc(x[first_encode_bad]));
  REQUIRE(encode_bad == 0);
  std::vector<float> back(x.size());
  compression::fp16::decode(reinterpret_cast<const std::uint8_t*>(wire.data()), n, back.data());
  const compression::detail::compress_fp16_decode_fn dec;
  std::size_t decode_bad = 0, first_decode_bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (trainkit::detail::bit_cast<std::uint32_t>(back[i]) != trainkit::detail::bit_cast<std::uint32_t>(dec(wire[i])) &&
        decode_bad++ == 0)
      first_decode_bad = i;
  INFO("first decode mismatch: half bits 0x" << std::hex << wire[first_decode_bad]);
  REQUIRE(decode_bad == 0);
}

TEST_CASE("compression: int8_block error is at most half a step of its block's scale", "[dist][compression]") {
  constexpr index_t B = 64;
  using C = compression::int8_block<B>;
  auto x = random_values(B * 20, 2);
  for (index_t i = 0; i < B; ++i) x[static_cast<std::size_t>(i)] *= 1000.0f;  // blocks of very different ranges
  for (index_t i = B; i < 2 * B; ++i) x[static_cast<std::size_t>(i)] = 0.0f;  // an all-zero block
  const auto y = round_trip<C>(x);
  for (index_t b = 0; b < 20; ++b) {
    const float scale = absmax(x.data() + b * B, B) / 127.0f;
    for (index_t i = b * B; i < (b + 1) * B; ++i) {
      const auto k = static_cast<std::size_t>(i);
      REQUIRE(std::fabs(y[k] - x[k]) <= scale * 0.5f * (1 + 1e-5f) + 1e-30f);
    }
  }
  for (index_t i = B; i < 2 * B; ++i) REQUIRE(y[static_cast<std::size_t>(i)] == 0.0f);
  // The block's max round-trips to itself (symmetric, 127 levels).
  const index_t imax = std::distance(x.begin(), std::max_element(x.begin(), x.begin() + B, [](float a, float b) {
                                       return std::fabs(a) < std::fabs(b);
                                     }));
  CHECK(y[static_cast<std::size_t>(imax)] == Approx(x[static_cast<std::size_t>(imax)]).epsilon(1e-6));
  STATIC_REQUIRE(C::wire_bytes(B * 20) == 20 * (B + 4));
}

TEST_CASE("compression: sign_1bit sends sign(x) * mean|x| of the block", "[dist][compression]") {
  constexpr index_t B = 32;
  using C = compression::sign_1bit_block<B>;
  const auto x = random_values(B * 7, 3);
  const auto y = round_trip<C>(x);
  for (index_t b = 0; b < 7; ++b) {
    double s = 0;
    for (index_t i = b * B; i < (b + 1) * B; ++i) s += std::fabs(x[static_cast<std::size_t>(i)]);
    const auto mean = static_cast<float>(s / B);
    for (index_t i = b * B; i < (b + 1) * B; ++i) {
      const auto k = static_cast<std::size_t>(i);
      REQUIRE(y[k] == Approx(x[k] >= 0 ? mean : -mean).epsilon(1e-6));  // the mean is summed in float
      if (k % B) REQUIRE(y[k] == (x[k] >= 0 ? 1 : -1) * std::fabs(y[k - k % B]));  // one scale per block
    }
  }
  STATIC_REQUIRE(C::wire_bytes(B * 7) == 7 * (B / 8 + 4));
}

TEST_CASE("compression: a non-finite block decodes to NaN and leaves no residual", "[dist][compression]") {
  constexpr index_t B = 16;
  std::vector<float> x(2 * B, 1.0f);
  x[3] = std::numeric_limits<float>::infinity();
  std::vector<float> residual(2 * B, 0.0f), sent(2 * B);
  std::vector<std::uint8_t> wire(compression::int8_block<B>::wire_bytes(2 * B));
  compression::encode_with_feedback<compression::int8_block<B>>(x.data(), 2 * B, residual.data(), wire.data(), sent.data());
  for (index_t i = 0; i < B; ++i) REQUIRE(std::isnan(sent[static_cast<std::size_t>(i)]));  // the loss scaler sees it
  for (index_t i = B; i < 2 * B; ++i) REQUIRE(sent[static_cast<std::size_t>(i)] == 1.0f);
  for (float r : residual) REQUIRE(r == 0.0f);  // nothing poisons the next steps
}

TEMPLATE_TEST_CASE("compression: a block with a NaN or inf writes and decodes to the one NaN 0x7fc00000",
                   "[dist][compression]", compression::int8_block<16>, compression::sign_1bit_block<16>) {
  // A GPU encodes the same bytes (tests/cuda/test_nn_ops.cu): NaN arithmetic keeps the operand's
  // payload on x86 and gives 0x7fffffff on a GPU, so the codecs select a fixed NaN instead.
  using C = TestType;
  constexpr index_t B = 16;
  const auto bits = [](float f) { return std::bit_cast<std::uint32_t>(f); };
  for (std::uint32_t nan : {0xffc00123u, 0x7f800001u, 0x7fc00000u, 0xff800000u /* -inf */}) {
    CAPTURE(nan);
    std::vector<float> x(2 * B, -0.5f);
    x[5] = std::bit_cast<float>(nan);
    std::vector<std::uint8_t> wire(C::wire_bytes(2 * B));
    C::encode(x.data(), 2 * B, wire.data());
    std::uint32_t scale = 0;
    std::memcpy(&scale, wire.data(), 4);
    const bool is_inf = nan == 0xff800000u;
    if (!is_inf || std::is_same_v<C, compression::int8_block<B>>) REQUIRE(scale == 0x7fc00000u);  // int8: NaN for inf too
    else REQUIRE(scale == 0x7f800000u);  // 1-bit: mean |x| = +inf
    std::vector<float> y(2 * B, 1.0f);
    C::decode(wire.data(), 2 * B, y.data());
    for (index_t i = 0; i < B; ++i) {
      const auto got = bits(y[static_cast<std::size_t>(i)]);
      if (scale == 0x7fc00000u) REQUIRE(got == 0x7fc00000u);
      else REQUIRE((got == 0x7f800000u || got == 0xff800000u));
    }
    for (index_t i = B; i < 2 * B; ++i) REQUIRE(std::isfinite(y[static_cast<std::size_t>(i)]));
  }
}

TEMPLATE_TEST_CASE("compression: error feedback - what was sent sums to the true gradients minus the residual",
                   "[dist][compression]", compression::fp16, compression::bf16, compression::int8_block<32>, compression::sign_1bit_block<32>) {
  using C = TestType;
  constexpr index_t n = 32 * 16;
  constexpr int steps = 400;
  std::vector<float> residual(n, 0.0f), sent(n);
  std::vector<double> sum_sent(n, 0.0), sum_true(n, 0.0);
  std::vector<std::uint8_t> wire(C::wire_bytes(n));
  float max_residual = 0, max_grad = 0;
  for (int k = 0; k < steps; ++k) {
    // A gradient with a persistent mean (what training sees) plus noise.
    auto g = random_values(n, 100 + static_cast<unsigned>(k), 0.5f);
    for (index_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] += 0.01f * static_cast<float>(i % 7 - 3);
    compression::encode_with_feedback<C>(g.data(), n, residual.data(), wire.data(), sent.data());
    for (index_t i = 0; i < n; ++i) {
      const auto j = static_cast<std::size_t>(i);
      sum_sent[j] += sent[j];
      sum_true[j] += g[j];
      max_grad = std::max(max_grad, std::fabs(g[j]));
    }
    // The telescoping identity: sum(sent) = sum(true) - residual, up to the float round-off of
    // each step's residual.
    for (index_t i = 0; i < n; ++i) {
      const auto j = static_cast<std::size_t>(i);
      REQUIRE(std::fabs(sum_sent[j] - (sum_true[j] - residual[j])) <= 1e-4 + 1e-6 * k);
    }
    max_residual = std::max(max_residual, absmax(residual.data(), n));
  }
  // The residual stays bounded (it does not grow with the number of steps) ...
  CHECK(max_residual < 4.0f * max_grad);
  // ... so the average of what was sent converges to the average of the true gradients.
  for (index_t i = 0; i < n; ++i) {
    const auto j = static_cast<std::size_t>(i);
    REQUIRE(std::fabs(sum_sent[j] - sum_true[j]) / steps <= 4.0 * max_grad / steps);
  }
}

TEMPLATE_TEST_CASE("compression: encode_residual = encode, decode and subtract", "[dist][compression]",
                   compression::int8_block<32>, compression::int8_block<100>, compression::sign_1bit_block<64>) {
  using C = TestType;
  constexpr index_t n = 1600;  // whole blocks of each B
  auto x = random_values(n, 9, 2.0f);
  std::fill(x.begin() + 200, x.begin() + 300, 0.0f);       // zero blocks
  x[450] = std::numeric_limits<float>::infinity();          // a non-finite block
  std::vector<std::uint8_t> w1(C::wire_bytes(n)), w2(C::wire_bytes(n));
  std::vector<float> sent(n), r1(n), r2(n);
  C::encode(x.data(), n, w1.data());
  C::decode(w1.data(), n, sent.data());
  for (index_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    r1[k] = compression::detail::compress_residual_fn{}(x[k], sent[k]);
  }
  C::encode_residual(x.data(), n, w2.data(), r2.data());
  REQUIRE(w1 == w2);
  for (index_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    REQUIRE(trainkit::detail::bit_cast<std::uint32_t>(r1[k]) == trainkit::detail::bit_cast<std::uint32_t>(r2[k]));
  }
}

namespace {
/// Blocks of every kind the codecs treat apart: normal, zero, tiny (below 1e-30), with inf, with a
/// NaN, with -0, with quantization ties, with FLT_MAX.
std::vector<float> special_blocks(index_t B, index_t blocks, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> u(0, 99);
  std::vector<float> x(static_cast<std::size_t>(B * blocks));
  for (auto& v : x) v = d(gen) * std::pow(10.0f, float(u(gen) % 7 - 3));
  for (index_t b = 0; b < blocks; ++b) {
    float* xb = x.data() + b * B;
    const int kind = u(gen) % 8, at = int(u(gen) % B);
    switch (kind) {
      case 0: std::fill(xb, xb + B, 0.0f); break;
      case 1: for (index_t i = 0; i < B; ++i) xb[i] *= 1e-33f; break;
      case 2: xb[at] = -std::numeric_limits<float>::infinity(); break;
      case 3: xb[at] = std::bit_cast<float>(0xffc00123u); break;
      case 4: xb[at] = -0.0f; break;
      case 5:  // x * 127 / 3 lands on k + 0.5 for every element
        for (index_t i = 0; i < B; ++i) xb[i] = (float(u(gen) - 50) + 0.5f) * 3.0f / 127.0f;
        xb[0] = 3.0f;
        break;
      case 6: xb[at] = std::numeric_limits<float>::max(); break;
      default: break;
    }
  }
  return x;
}
}  // namespace

TEST_CASE("compression: int8 and 1-bit bytes, decodes and residuals are the functors', element by element",
          "[dist][compression]") {
  // The host loops take AVX2 where the CPU has it (run again under TRAINKIT_MAX_CPU_ISA=sse41 for
  // the portable loops): both must give what the per-element functors - which the GPU kernels use
  // too - give, bit for bit.
  namespace cd = compression::detail;
  const auto bits = [](float f) { return std::bit_cast<std::uint32_t>(f); };
  for (index_t B : {8, 40, 128, 256}) {
    CAPTURE(B);
    if (B == 128) WARN("int8/1-bit host loops: " << (cd::compress_blocks_avx2(B) ? "AVX2" : "portable"));
    const index_t blocks = 400, n = B * blocks;
    const auto x = special_blocks(B, blocks, unsigned(B));
    // int8: encode, encode with residual, decode, decode-add.
    std::vector<std::uint8_t> w(std::size_t(n + 4 * blocks)), w2(w.size());
    const auto size = static_cast<std::size_t>(n);
    std::vector<float> r(size), y(size), acc(size, 0.25f);
    cd::compress_encode_int8_residual(x.data(), n, B, w.data(), r.data());
    cd::compress_encode_int8(x.data(), n, B, w2.data());
    REQUIRE(w == w2);
    cd::compress_decode_int8(w.data(), n, B, y.data());
    cd::compress_decode_add_int8(w.data(), n, B, acc.data());
    for (index_t b = 0; b < blocks; ++b) {
      const float* xb = x.data() + b * B;
      float m = 0;
      bool finite = true;
      for (index_t i = 0; i < B; ++i) {
        finite = finite && std::isfinite(xb[i]);
        if (!std::isnan(xb[i])) m = std::max(m, std::fabs(xb[i]));
      }
      const float scale = cd::compress_int8_scale_fn{}(m, finite);
      const std::uint8_t* wb = w.data() + b * (4 + B);
      REQUIRE(bits(cd::compress_load_scale(wb)) == bits(scale));
      const cd::compress_int8_dequantize_fn deq{scale};
      for (index_t i = 0; i < B; ++i) {
        const auto k = std::size_t(b * B + i);
        const std::int8_t q = scale > 0.0f ? cd::compress_int8_quantize_fn{127.0f / m}(xb[i]) : std::int8_t(0);
        REQUIRE(std::int8_t(wb[4 + i]) == q);
        REQUIRE(bits(r[k]) == bits(cd::compress_residual_fn{}(xb[i], deq(q))));
        REQUIRE(bits(y[k]) == bits(deq(q)));
        REQUIRE(bits(acc[k]) == bits(0.25f + deq(q)));
      }
    }
    // 1-bit: encode, encode with residual, decode, decode-add.
    std::vector<std::uint8_t> s(std::size_t(n / 8 + 4 * blocks)), s2(s.size());
    std::fill(acc.begin(), acc.end(), 0.25f);
    cd::compress_encode_sign_residual(x.data(), n, B, s.data(), r.data());
    cd::compress_encode_sign(x.data(), n, B, s2.data());
    REQUIRE(s == s2);
    cd::compress_decode_sign(s.data(), n, B, y.data());
    cd::compress_decode_add_sign(s.data(), n, B, acc.data());
    for (index_t b = 0; b < blocks; ++b) {
      const float* xb = x.data() + b * B;
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // the host's order: eight running sums, then a tree
      for (index_t i = 0; i < B; ++i) part[i % 8] += std::fabs(xb[i]);
      const float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
      const float scale = cd::compress_sign_scale_fn{}(sum, B);
      const std::uint8_t* sb = s.data() + b * (4 + B / 8);
      REQUIRE(bits(cd::compress_load_scale(sb)) == bits(scale));
      const cd::compress_sign_decode_fn dec{scale};
      for (index_t i = 0; i < B; ++i) {
        const auto k = std::size_t(b * B + i);
        const int bit = cd::compress_sign_bit_fn{}(xb[i]);
        REQUIRE(((sb[4 + i / 8] >> (i % 8)) & 1) == bit);
        REQUIRE(bits(r[k]) == bits(cd::compress_residual_fn{}(xb[i], dec(bit))));
        REQUIRE(bits(y[k]) == bits(dec(bit)));
        REQUIRE(bits(acc[k]) == bits(0.25f + dec(bit)));
      }
    }
  }
}

TEST_CASE("compression: state() and load_state() restore the residuals", "[dist][compression]") {
  compression::int8 c;
  std::fill_n(c.feedback().worker(0, 5), 5, 0.25f);
  std::fill_n(c.feedback().server(2, 3), 3, -1.0f);
  const auto s = c.state();
  REQUIRE(s.size() == 2);
  CHECK(s[0].first == "worker.0");
  CHECK(s[1].first == "server.2");
  compression::int8 d;
  d.load_state(s);
  CHECK(d.feedback().worker(0, 5)[4] == 0.25f);
  CHECK(d.feedback().server(2, 3)[0] == -1.0f);
  compression::compression_state bad = {{"weights.0", trainkit::tensor<float>::zeros({2})}};
  CHECK_THROWS_WITH(d.load_state(bad), Catch::Contains("weights.0"));
  CHECK(compression::none{}.state().empty());
}

namespace {

// Rank r's input of the allreduce tests: distinct per rank, with a few large blocks.
std::vector<float> rank_input(index_t n, int r) {
  auto v = random_values(n, 7 + static_cast<unsigned>(r), 1.0f + static_cast<float>(r));
  return v;
}

template <class C>
void check_allreduce(int world, index_t n, dist::reduce_op op, double rel_tol) {
  std::vector<std::vector<float>> results(static_cast<std::size_t>(world));
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    auto x = rank_input(n, comm.rank());
    C c;
    compression::compress_workspace ws;
    compression::compressed_allreduce(comm, c, x.data(), n, 0, op, &ws);
    results[static_cast<std::size_t>(comm.rank())] = x;
  });
  std::vector<double> exact(static_cast<std::size_t>(n), 0.0);
  double amax = 0;
  for (int r = 0; r < world; ++r) {
    const auto x = rank_input(n, r);
    for (index_t i = 0; i < n; ++i) {
      exact[static_cast<std::size_t>(i)] += x[static_cast<std::size_t>(i)];
      amax = std::max(amax, static_cast<double>(std::fabs(x[static_cast<std::size_t>(i)])));
    }
  }
  const double div = op == dist::reduce_op::avg ? world : 1;
  for (auto& e : exact) e /= div;
  for (int r = 0; r < world; ++r) {
    const auto& y = results[static_cast<std::size_t>(r)];
    REQUIRE(static_cast<index_t>(y.size()) == n);
    for (index_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      // Every rank ends with the same values, bit for bit.
      REQUIRE(y[k] == results[0][k]);
      if (world == 1) {
        REQUIRE(y[k] == static_cast<float>(exact[k]));
      } else {
        REQUIRE(std::fabs(y[k] - exact[k]) <= rel_tol * amax * world / div + 1e-6);
      }
    }
  }
}

}  // namespace

TEST_CASE("compressed_allreduce: any length and world size, every policy", "[dist][compression][allreduce]") {
  for (int world : {1, 2, 3, 4}) {
    for (index_t n : {index_t(0), index_t(1), index_t(7), index_t(130), index_t(1000), index_t(4099)}) {
      INFO("world " << world << ", n " << n);
      for (auto op : {dist::reduce_op::sum, dist::reduce_op::avg}) {
        check_allreduce<compression::none>(world, n, op, 1e-6);
        check_allreduce<compression::fp16>(world, n, op, 2 * 0x1p-11);
        check_allreduce<compression::bf16>(world, n, op, 2 * 0x1p-8);
        // Quantization on each rank (half a step of 1/127) plus once more on the sum.
        check_allreduce<compression::int8_block<64>>(world, n, op, 2.0 / 254 + 1e-6);
      }
    }
  }
}

TEST_CASE("compressed_allreduce: int8 stays right when the sum overflows int8", "[dist][compression][allreduce]") {
  // Every rank sends values whose codes are all 127 or close: a sum in int8 would wrap.
  constexpr int world = 4;
  constexpr index_t n = 1000;
  std::vector<std::vector<float>> out(world);
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    std::vector<float> x(n);
    for (index_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = 100.0f - 0.001f * static_cast<float>(i % 10);
    compression::int8_block<128> c;
    compression::compressed_allreduce(comm, c, x.data(), n, 0, dist::reduce_op::sum);
    out[static_cast<std::size_t>(comm.rank())] = x;
  });
  for (const auto& y : out)
    for (index_t i = 0; i < n; ++i) {
      const float expect = 4 * (100.0f - 0.001f * static_cast<float>(i % 10));
      REQUIRE(y[static_cast<std::size_t>(i)] == Approx(expect).epsilon(2.0 / 254));
    }
  // fp16: the average of values near fp16's maximum whose sum is far beyond it.
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    std::vector<float> x(n, 60000.0f + 100.0f * static_cast<float>(comm.rank()));
    compression::fp16 c;
    compression::compressed_allreduce(comm, c, x.data(), n, 0, dist::reduce_op::avg);
    out[static_cast<std::size_t>(comm.rank())] = x;
  });
  for (const auto& y : out)
    for (float v : y) REQUIRE(v == Approx(60150.0f).epsilon(1e-3));
}

TEST_CASE("compressed_allreduce: 1-bit with error feedback converges to the average", "[dist][compression][allreduce]") {
  // The same gradients every step: one 1-bit step is off by about mean|x| per element, but the
  // residuals stay bounded, so the mean of what arrives approaches the true average like 1/steps.
  constexpr int world = 3;
  constexpr index_t n = 1000;
  std::vector<double> exact(n, 0.0);
  for (int r = 0; r < world; ++r) {
    const auto x = rank_input(n, r);
    for (index_t i = 0; i < n; ++i) exact[static_cast<std::size_t>(i)] += x[static_cast<std::size_t>(i)] / world;
  }
  std::vector<std::vector<double>> worst(world);
  std::vector<std::size_t> state_entries(world);
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    const auto me = static_cast<std::size_t>(comm.rank());
    const auto g = rank_input(n, comm.rank());
    std::vector<double> acc(n, 0.0);
    compression::sign_1bit_block<64> c;
    compression::compress_workspace ws;
    auto worst_error = [&](int steps) {
      double worst = 0;
      for (index_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        worst = std::max(worst, std::fabs(acc[k] / steps - exact[k]));
      }
      return worst;
    };
    for (int k = 1; k <= 1024; ++k) {
      auto x = g;
      compression::compressed_allreduce(comm, c, x.data(), n, 5, dist::reduce_op::avg, &ws);
      for (index_t i = 0; i < n; ++i) acc[static_cast<std::size_t>(i)] += x[static_cast<std::size_t>(i)];
      if (k == 1 || k == 256 || k == 1024) worst[me].push_back(worst_error(k));
    }
    state_entries[me] = c.state().size();
  });
  for (int r = 0; r < world; ++r) {
    const auto& w = worst[static_cast<std::size_t>(r)];
    REQUIRE(w.size() == 3);
    CHECK(w[0] > 1.0);
    CHECK(w[2] < 0.6 * w[1]);  // ~1/steps once the residuals have settled
    CHECK(w[2] < 0.25);
    CHECK(state_entries[static_cast<std::size_t>(r)] == 2);  // worker.5 and server.5
  }
}

TEST_CASE("compressed_allreduce: bytes on the wire, counted", "[dist][compression][allreduce]") {
  constexpr int world = 4;
  constexpr index_t n = (index_t(1) << 20) + 7;  // not a multiple of the world size or a block
  std::vector<std::uint64_t> fp32(world), i8(world), s1(world), h16(world);
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    auto x = rank_input(n, comm.rank());
    const auto r = static_cast<std::size_t>(comm.rank());
    compression::none a;
    compression::int8 b;
    compression::sign_1bit c;
    compression::fp16 d;
    compression::compress_workspace ws;
    compression::compressed_allreduce(comm, a, x.data(), n, 0, dist::reduce_op::avg, &ws);
    compression::compressed_allreduce(comm, b, x.data(), n, 0, dist::reduce_op::avg, &ws);
    compression::compressed_allreduce(comm, c, x.data(), n, 0, dist::reduce_op::avg, &ws);
    compression::compressed_allreduce(comm, d, x.data(), n, 0, dist::reduce_op::avg, &ws);
    fp32[r] = a.bytes_sent();
    i8[r] = b.bytes_sent();
    s1[r] = c.bytes_sent();
    h16[r] = d.bytes_sent();
  });
  // fp32's ring allreduce: 2 (W-1) chunks of ceil(n / W) floats.
  CHECK(fp32[0] == 2ull * (world - 1) * ((n + world - 1) / world) * 4);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": int8 " << i8[r] << ", 1-bit " << s1[r] << ", fp16 " << h16[r] << ", fp32 " << fp32[r]);
    CHECK(static_cast<double>(i8[r]) <= 0.27 * static_cast<double>(fp32[r]));
    CHECK(static_cast<double>(s1[r]) <= 0.04 * static_cast<double>(fp32[r]));
    CHECK(static_cast<double>(h16[r]) <= 0.501 * static_cast<double>(fp32[r]));
  }
}

TEST_CASE("compressed_allreduce: only sum and avg", "[dist][compression][allreduce]") {
  bool threw = false;
  dist::thread_group::run(1, [&](dist::thread_group& comm) {
    float x = 1;
    compression::int8 c;
    try {
      compression::compressed_allreduce(comm, c, &x, 1, 0, dist::reduce_op::max);
    } catch (const trainkit::value_error&) {
      threw = true;
    }
  });
  CHECK(threw);
}

namespace {

// The quantized allreduce of every rank's x, all ranks simulated in one thread, whole chunks at a
// time (no pieces, no tiles): what compressed_allreduce computed before it was pipelined. Updates
// x, the worker residuals wres and the server residuals sres of every rank.
template <class C>
void whole_chunk_allreduce(std::vector<std::vector<float>>& x, std::vector<std::vector<float>>& wres,
                           std::vector<std::vector<float>>& sres, index_t n, dist::reduce_op op) {
  const int w = static_cast<int>(x.size());
  const index_t chunk = trainkit::compression::detail::compress_chunk(n, w, C::block);
  const index_t padded = chunk * w;
  const std::size_t cb = C::wire_bytes(chunk);
  std::vector<std::vector<std::uint8_t>> sent(static_cast<std::size_t>(w), std::vector<std::uint8_t>(w * cb));
  for (int r = 0; r < w; ++r) {
    auto& xr = x[static_cast<std::size_t>(r)];
    auto& wr = wres[static_cast<std::size_t>(r)];
    if (wr.empty()) wr.assign(static_cast<std::size_t>(n), 0.0f);
    std::vector<float> meant(static_cast<std::size_t>(padded), 0.0f), back(static_cast<std::size_t>(padded));
    for (index_t i = 0; i < n; ++i) meant[i] = C::lossy ? xr[i] + wr[i] : xr[i];
    C::encode(meant.data(), padded, sent[static_cast<std::size_t>(r)].data());
    C::decode(sent[static_cast<std::size_t>(r)].data(), padded, back.data());
    if (C::lossy)
      for (index_t i = 0; i < n; ++i) wr[i] = meant[i] - back[i];
  }
  std::vector<std::uint8_t> reduced(static_cast<std::size_t>(w) * cb);
  for (int r = 0; r < w; ++r) {  // rank r sums chunk r
    auto& sr = sres[static_cast<std::size_t>(r)];
    if (sr.empty()) sr.assign(static_cast<std::size_t>(chunk), 0.0f);
    const index_t valid = std::clamp<index_t>(n - r * chunk, 0, chunk);
    std::vector<float> acc(static_cast<std::size_t>(chunk), 0.0f), tmp(static_cast<std::size_t>(chunk));
    for (int i = 0; i < w; ++i) {
      C::decode(sent[static_cast<std::size_t>(i)].data() + r * cb, chunk, tmp.data());
      for (index_t e = 0; e < valid; ++e) acc[e] += tmp[e];
    }
    if (C::lossy) {
      const float scale = op == dist::reduce_op::avg ? 1.0f / static_cast<float>(w) : 1.0f;
      for (index_t e = 0; e < valid; ++e) acc[e] = acc[e] * scale + sr[e];
    } else if (op == dist::reduce_op::avg) {
      for (index_t e = 0; e < valid; ++e) acc[e] /= static_cast<float>(w);
    }
    C::encode(acc.data(), chunk, reduced.data() + r * cb);
    C::decode(reduced.data() + r * cb, chunk, tmp.data());
    if (C::lossy)
      for (index_t e = 0; e < valid; ++e) sr[e] = acc[e] - tmp[e];
  }
  std::vector<float> all(static_cast<std::size_t>(padded));
  C::decode(reduced.data(), padded, all.data());
  for (auto& xr : x) std::copy(all.begin(), all.begin() + n, xr.begin());
}

template <class C>
void check_pieces_match_whole_chunks(int world, index_t n, dist::reduce_op op) {
  const auto chunk = trainkit::compression::detail::compress_chunk(n, world, C::block);
  const auto split = trainkit::compression::detail::compress_split<C>(chunk);
  INFO(C::name << ", world " << world << ", n " << n << ": " << split.count << " pieces of " << split.piece);
  constexpr int steps = 2;
  std::vector<std::vector<float>> x(static_cast<std::size_t>(world)), wres(x.size()), sres(x.size());
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(steps), x);
  std::vector<trainkit::compression::compression_state> state(x.size());
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    C c;
    compression::compress_workspace ws;
    for (int s = 0; s < steps; ++s) {
      auto v = rank_input(n, comm.rank() + 10 * s);
      compression::compressed_allreduce(comm, c, v.data(), n, 2, op, &ws);
      got[static_cast<std::size_t>(s)][r] = std::move(v);
    }
    state[r] = c.state();
  });
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) x[static_cast<std::size_t>(r)] = rank_input(n, r + 10 * s);
    whole_chunk_allreduce<C>(x, wres, sres, n, op);
    for (int r = 0; r < world; ++r) {
      INFO("step " << s << ", rank " << r);
      const auto& a = got[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
      REQUIRE(std::memcmp(a.data(), x[static_cast<std::size_t>(r)].data(), a.size() * sizeof(float)) == 0);
    }
  }
  if constexpr (C::lossy) {
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      const auto& st = state[static_cast<std::size_t>(r)];
      REQUIRE(st.size() == 2);
      for (const auto& [key, t] : st) {
        const auto& want = key == "worker.2" ? wres[static_cast<std::size_t>(r)] : sres[static_cast<std::size_t>(r)];
        REQUIRE((key == "worker.2" || key == "server.2"));
        REQUIRE(t.numel() == static_cast<index_t>(want.size()));
        CHECK(std::memcmp(t.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("compressed_allreduce: the pipelined pieces give the bytes and residuals of whole chunks",
          "[dist][compression][allreduce]") {
  // Lengths that cut each chunk into several pieces (one shorter) and leave padding in the last chunk.
  // (pieces carry at most 32 KiB of wire per rank and 2^18 elements: int8 ~3, fp16 ~5 and none ~9
  // pieces at 70000 elements per rank, 1-bit 2 at 270000).
  for (auto [world, op] : {std::pair{2, dist::reduce_op::sum}, std::pair{3, dist::reduce_op::avg}}) {
    for (index_t per_rank : {index_t(333), index_t(70001)}) {
      check_pieces_match_whole_chunks<compression::int8_block<128>>(world, per_rank * world, op);
      check_pieces_match_whole_chunks<compression::fp16>(world, per_rank * world, op);
      check_pieces_match_whole_chunks<compression::none>(world, per_rank * world, op);
    }
    for (index_t per_rank : {index_t(333), index_t(270001)})
      check_pieces_match_whole_chunks<compression::sign_1bit>(world, per_rank * world, op);
  }
  // The split itself: whole blocks, small messages and pieces, at most compress_max_pieces, covering the chunk.
  for (index_t chunk : {index_t(256), index_t(65536), index_t(65536 + 256), index_t(1) << 26, index_t(1) << 30}) {
    const auto s = trainkit::compression::detail::compress_split<compression::sign_1bit>(chunk);
    INFO("chunk " << chunk);
    CHECK(s.piece % 256 == 0);
    CHECK(s.count <= trainkit::compression::detail::compress_max_pieces);
    if (s.count < trainkit::compression::detail::compress_max_pieces) {  // within a block of the limits
      CHECK(compression::sign_1bit::wire_bytes(s.piece - 256) < trainkit::compression::detail::compress_piece_wire);
      CHECK(s.piece - 256 < trainkit::compression::detail::compress_piece_elements);
    }
    CHECK(s.count * s.piece >= chunk);
    CHECK((s.count - 1) * s.piece < chunk);
  }
}
