// tests/core/test_half.cpp - trainkit::half against two independent references: the compiler's
// _Float16 (libgcc's soft-float conversions under g++) where it has one, and a table of all finite
// halfs with exact midpoints in double.
#include "trainkit/core/half.hpp"
#include "trainkit/core/functors.hpp"   // round_to
#include "trainkit/ops/elementwise.hpp"  // cast, map: the bulk conversions
#include "support/bits.hpp"

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

using trainkit::half;

namespace {

using trainkit::test::bits32;
using trainkit::test::f32;
using trainkit::test::splitmix;

bool half_bits_nan(std::uint16_t b) { return (b & 0x7fffu) > 0x7c00u; }

#if (defined(__GNUC__) && !defined(__clang__) && defined(__FLT16_MAX__)) || \
    (defined(__clang__) && __clang_major__ >= 15)
#define TEST_HAVE_FLOAT16 1
static_assert(sizeof(_Float16) == 2);
std::uint16_t oracle_bits(_Float16 h) { return std::bit_cast<std::uint16_t>(h); }
_Float16 oracle_from_bits(std::uint16_t b) { return std::bit_cast<_Float16>(b); }
template <class F>
std::uint16_t oracle_round(F x) { return oracle_bits(static_cast<_Float16>(x)); }
float oracle_to_float(std::uint16_t b) { return static_cast<float>(oracle_from_bits(b)); }
// Same bits, or both NaN (the oracle's NaN payload rules are its own).
bool same_half(std::uint16_t a, std::uint16_t b) { return a == b || (half_bits_nan(a) && half_bits_nan(b)); }
#else
#define TEST_HAVE_FLOAT16 0  // no oracle: the table reference below still checks everything
#endif

/// Every non-negative finite half, by bit pattern (bits 0..0x7bff increase with the value), decoded
/// with ldexp rather than with any bit trick the implementation uses.
const std::vector<double>& finite_halfs() {
  static const std::vector<double> values = [] {
    std::vector<double> v(0x7c00);
    for (std::uint32_t b = 0; b < 0x7c00; ++b) {
      const int e = static_cast<int>(b >> 10), m = static_cast<int>(b & 0x3ff);
      v[b] = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    }
    return v;
  }();
  return values;
}

/// Round-to-nearest-even of x to half by comparing with the exact midpoints of neighbours.
std::uint16_t reference_round_half(double x) {
  const auto& v = finite_halfs();
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;  // 65520, the midpoint to 2^16, ties to the even "inf"
  const auto k = static_cast<std::uint16_t>(std::upper_bound(v.begin(), v.end(), a) - v.begin() - 1);
  if (v[k] == a || k == 0x7bff) return sign | k;
  const double mid = (v[k] + v[k + 1]) / 2;  // 12 significant bits at most: exact in double
  if (a < mid) return sign | k;
  if (a > mid) return sign | static_cast<std::uint16_t>(k + 1);
  return sign | static_cast<std::uint16_t>((k & 1) == 0 ? k : k + 1);
}


}  // namespace

TEST_CASE("half is a trivial 2-byte type usable in constant expressions", "[half]") {
  STATIC_REQUIRE(sizeof(half) == 2);
  STATIC_REQUIRE(std::is_trivially_copyable_v<half>);
  STATIC_REQUIRE(std::is_trivially_default_constructible_v<half>);
  STATIC_REQUIRE(half(1.0f).bits() == 0x3c00);
  STATIC_REQUIRE(half(-2.0).bits() == 0xc000);
  STATIC_REQUIRE(half(65520.0f).bits() == 0x7c00);
  STATIC_REQUIRE(float(half::from_bits(0x0001)) == 0x1p-24f);
  STATIC_REQUIRE(half(3) + half(4) == half(7));
  STATIC_REQUIRE(!std::is_convertible_v<float, half>);  // rounding is explicit
  STATIC_REQUIRE(std::is_convertible_v<half, float>);   // widening is implicit
}

TEST_CASE("half to float is exact for all 65536 bit patterns", "[half]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float mine = half::from_bits(bits);
#if TEST_HAVE_FLOAT16
    const float oracle = oracle_to_float(bits);
#else
    const float oracle = mine;
#endif
    INFO("bits 0x" << std::hex << b);
    if (half_bits_nan(bits)) {
      REQUIRE(std::isnan(mine));
      REQUIRE(std::isnan(oracle));
      // Sign and payload carried over unchanged.
      REQUIRE(bits32(mine) == (((b & 0x8000u) << 16) | 0x7f800000u | ((b & 0x3ffu) << 13)));
    } else {
      REQUIRE(bits32(mine) == bits32(oracle));
      if (b < 0x7c00) REQUIRE(static_cast<double>(mine) == finite_halfs()[b]);
    }
  }
}

TEST_CASE("half -> float -> half round-trips every bit pattern", "[half]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const half h = half::from_bits(bits);
    INFO("bits 0x" << std::hex << b);
    const std::uint16_t via_float = half(static_cast<float>(h)).bits();
    const std::uint16_t via_double = half(static_cast<double>(static_cast<float>(h))).bits();
    if (half_bits_nan(bits)) {
      // A NaN stays a NaN with its sign and payload; a signalling one comes back quiet.
      REQUIRE(via_float == (bits | 0x0200u));
      REQUIRE(via_double == (bits | 0x0200u));
    } else {
      REQUIRE(via_float == bits);
      REQUIRE(via_double == bits);
    }
  }
}

TEST_CASE("float -> half rounds to nearest even at every midpoint", "[half]") {
  // For each pair of neighbours (a, b) with a >= 0 (the last pair is max and infinity, whose
  // midpoint is 65520), the float midpoint goes to the even one and one float ulp either side goes
  // to the nearer one. The same holds for the negatives.
  for (std::uint32_t k = 0; k < 0x7c00; ++k) {
    const auto a = static_cast<std::uint16_t>(k), b = static_cast<std::uint16_t>(k + 1);
    const double mid_exact = k == 0x7bff ? 65520.0 : (finite_halfs()[a] + finite_halfs()[b]) / 2;
    const auto mid = static_cast<float>(mid_exact);
    REQUIRE(static_cast<double>(mid) == mid_exact);
    const std::uint16_t even = (a & 1) == 0 ? a : b;
    const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, 1e30f);
    INFO("pair 0x" << std::hex << a << " 0x" << b);
    for (const std::uint16_t sign : {std::uint16_t(0), std::uint16_t(0x8000)}) {
      const float s = sign ? -1.0f : 1.0f;
      REQUIRE(half(s * mid).bits() == (sign | even));
      REQUIRE(half(s * below).bits() == (sign | a));
      REQUIRE(half(s * above).bits() == (sign | b));
#if TEST_HAVE_FLOAT16
      REQUIRE(half(s * mid).bits() == oracle_round(s * mid));
      REQUIRE(half(s * below).bits() == oracle_round(s * below));
      REQUIRE(half(s * above).bits() == oracle_round(s * above));
#endif
      // The same points as doubles, and one double ulp either side.
      const double md = s * mid_exact;
      REQUIRE(half(md).bits() == (sign | even));
      REQUIRE(half(std::nextafter(md, 0.0)).bits() == (sign | a));
      REQUIRE(half(std::nextafter(md, s * 1e300)).bits() == (sign | b));
    }
  }
}

TEST_CASE("float -> half agrees with both references on a sweep and on random floats", "[half]") {
  // All 2^32 floats were checked against _Float16 once (0 mismatches); a full sweep takes minutes
  // with libgcc's soft-float oracle, so the suite takes a strided sweep plus random patterns.
  std::uint64_t mismatches = 0, first = 0;
  auto check = [&](std::uint32_t u) {
    const float f = f32(u);
    const std::uint16_t mine = half(f).bits();
    bool ok = std::isnan(f) ? half_bits_nan(mine) : mine == reference_round_half(f);
#if TEST_HAVE_FLOAT16
    ok = ok && same_half(mine, oracle_round(f));
#endif
    if (!ok && mismatches++ == 0) first = u;
  };
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4093) check(static_cast<std::uint32_t>(u));
  splitmix rng{1};
  for (int i = 0; i < (1 << 20); ++i) check(static_cast<std::uint32_t>(rng.next()));
  // Concentrate on the range where half is neither 0 nor inf: exponents 2^-26 .. 2^16.
  for (int i = 0; i < (1 << 20); ++i) {
    const auto r = static_cast<std::uint32_t>(rng.next());
    const std::uint32_t exp = 101 + (r >> 23) % 42;
    check((r & 0x807fffffu) | (exp << 23));
  }
  INFO("first mismatch: float bits 0x" << std::hex << first);
  REQUIRE(mismatches == 0);
}

TEST_CASE("double -> half rounds once, directly from double", "[half]") {
  SECTION("just above a midpoint whose float rounding lands on the midpoint") {
    // 1 + 2^-11 is the midpoint of 1 (0x3c00, even) and 1 + 2^-10 (0x3c01). d is above it by
    // less than half a float ulp, so float(d) is the midpoint itself and ties down to 1.
    const double d = 1.0 + 0x1p-11 + 0x1p-40;
    REQUIRE(static_cast<double>(static_cast<float>(d)) == 1.0 + 0x1p-11);
    REQUIRE(half(static_cast<float>(d)).bits() == 0x3c00);  // what double rounding would give
    REQUIRE(half(d).bits() == 0x3c01);
    REQUIRE(half(-d).bits() == 0xbc01);
    // And just below one whose tie goes up: between 0x3c01 (odd) and 0x3c02.
    const double e = 1.0 + 3 * 0x1p-11 - 0x1p-40;
    REQUIRE(half(static_cast<float>(e)).bits() == 0x3c02);
    REQUIRE(half(e).bits() == 0x3c01);
  }
  SECTION("just below the overflow threshold") {
    const double d = 65520.0 - 0x1p-20;
    REQUIRE(half(static_cast<float>(d)).bits() == 0x7c00);
    REQUIRE(half(d).bits() == 0x7bff);
    REQUIRE(half(65520.0).bits() == 0x7c00);
  }
  SECTION("in the subnormal range") {
    const double d = 0x1p-25 + 0x1p-60;  // just above the midpoint of 0 and the smallest subnormal
    REQUIRE(half(static_cast<float>(d)).bits() == 0x0000);
    REQUIRE(half(d).bits() == 0x0001);
    REQUIRE(half(0x1p-25).bits() == 0x0000);
    REQUIRE(half(-0x1p-25).bits() == 0x8000);
    REQUIRE(half(3 * 0x1p-25).bits() == 0x0002);
  }
  SECTION("random doubles against both references") {
    splitmix rng{7};
    std::uint64_t mismatches = 0;
    double first = 0;
    for (int i = 0; i < (1 << 20); ++i) {
      std::uint64_t r = rng.next();
      const std::uint64_t exp = 1023 - 27 + (r >> 52) % 45;  // 2^-27 .. 2^17
      r = (r & 0x800fffffffffffffull) | (exp << 52);
      const double d = std::bit_cast<double>(r);
      const std::uint16_t mine = half(d).bits();
      bool ok = mine == reference_round_half(d);
#if TEST_HAVE_FLOAT16
      ok = ok && mine == oracle_round(d);
#endif
      if (!ok && mismatches++ == 0) first = d;
    }
    INFO("first mismatch: " << first);
    REQUIRE(mismatches == 0);
  }
}

TEST_CASE("half overflow, subnormals, zeros, NaN", "[half]") {
  SECTION("overflow boundaries") {
    REQUIRE(half(65504.0f).bits() == 0x7bff);
    REQUIRE(half(std::nextafter(65520.0f, 0.0f)).bits() == 0x7bff);
    REQUIRE(half(65520.0f).bits() == 0x7c00);
    REQUIRE(half(-65520.0f).bits() == 0xfc00);
    REQUIRE(half(std::numeric_limits<float>::max()).bits() == 0x7c00);
    REQUIRE(half(std::numeric_limits<float>::infinity()).bits() == 0x7c00);
    REQUIRE(half(-std::numeric_limits<double>::infinity()).bits() == 0xfc00);
    REQUIRE(half(1e300).bits() == 0x7c00);
  }
  SECTION("subnormals") {
    REQUIRE(half(0x1p-24f).bits() == 0x0001);
    REQUIRE(half(0x1p-25f).bits() == 0x0000);  // tie with 0: even
    REQUIRE(half(std::nextafter(0x1p-25f, 1.0f)).bits() == 0x0001);
    REQUIRE(half(1.5f * 0x1p-24f).bits() == 0x0002);  // tie between 1 and 2 ulps: even
    REQUIRE(half(2.5f * 0x1p-24f).bits() == 0x0002);
    REQUIRE(half(0x1p-14f - 0x1p-25f).bits() == 0x0400);  // tie at the top: carries to min normal
    REQUIRE(half(0x1p-14f).bits() == 0x0400);
    REQUIRE(float(half::from_bits(0x03ff)) == 1023 * 0x1p-24f);
    REQUIRE(half(std::numeric_limits<float>::denorm_min()).bits() == 0x0000);
    REQUIRE(half(1e-300).bits() == 0x0000);
  }
  SECTION("negative zero") {
    REQUIRE(half(-0.0f).bits() == 0x8000);
    REQUIRE(half(-0.0).bits() == 0x8000);
    REQUIRE(half(-1e-10f).bits() == 0x8000);
    REQUIRE(std::signbit(float(half::from_bits(0x8000))));
    REQUIRE(float(half::from_bits(0x8000)) == 0.0f);
    REQUIRE(half::from_bits(0x8000) == half::from_bits(0x0000));
    REQUIRE(trainkit::signbit(-half(0.0f)));
  }
  SECTION("NaN stays NaN, quiet, with sign and top payload bits") {
    REQUIRE(half(std::numeric_limits<float>::quiet_NaN()).bits() == 0x7e00);
    REQUIRE(half(f32(0x7f800001u)).bits() == 0x7e00);  // payload only in dropped bits: not inf
    REQUIRE(half(f32(0xff800001u)).bits() == 0xfe00);
    REQUIRE(half(f32(0x7fc12345u)).bits() == (0x7e00 | ((0x412345u >> 13) & 0x3ffu)));
    REQUIRE(half(std::bit_cast<double>(0x7ff0000000000001ull)).bits() == 0x7e00);
    REQUIRE(half(-std::numeric_limits<double>::quiet_NaN()).bits() == 0xfe00);
    REQUIRE(trainkit::isnan(half(std::nanf(""))));
  }
}

TEST_CASE("half from integers", "[half]") {
  REQUIRE(half(0).bits() == 0x0000);
  REQUIRE(half(1) == half(1.0f));
  REQUIRE(half(-2048).bits() == half(-2048.0f).bits());
  REQUIRE(half(2049).bits() == half(2048.0f).bits());  // tie between 2048 and 2050: even
  REQUIRE(half(2051).bits() == half(2052.0f).bits());
  REQUIRE(half(65504).bits() == 0x7bff);
  REQUIRE(half(65519u).bits() == 0x7bff);
  REQUIRE(half(65520L).bits() == 0x7c00);
  REQUIRE(half(std::numeric_limits<std::uint64_t>::max()).bits() == 0x7c00);
  REQUIRE(half(std::numeric_limits<std::int64_t>::min()).bits() == 0xfc00);
  REQUIRE(half(static_cast<short>(-3)) == half(-3.0f));
  REQUIRE(half(true) == half(1.0f));
}

TEST_CASE("half arithmetic is correctly rounded", "[half]") {
  // Sums, differences and products of two halfs are exact in double, and the double quotient
  // rounds to half correctly (53 > 2*11+2), so reference_round of the double result is the
  // correctly rounded answer.
  splitmix rng{3};
  std::uint64_t mismatches = 0;
  std::uint16_t first_a = 0, first_b = 0;
  for (int i = 0; i < (1 << 20); ++i) {
    const std::uint64_t r = rng.next();
    const auto ab = static_cast<std::uint16_t>(r), bb = static_cast<std::uint16_t>(r >> 16);
    if (half_bits_nan(ab) || half_bits_nan(bb)) continue;
    const half a = half::from_bits(ab), b = half::from_bits(bb);
    const double x = static_cast<float>(a), y = static_cast<float>(b);
    bool ok = true;
    auto expect = [&](half got, double exact) {
      if (std::isnan(exact)) {
        ok = ok && trainkit::isnan(got);
      } else {
        ok = ok && got.bits() == reference_round_half(exact);
      }
    };
    if (std::isfinite(x) && std::isfinite(y)) {
      expect(a + b, x + y);
      expect(a - b, x - y);
      expect(a * b, x * y);
      if (y != 0) expect(a / b, x / y);
    }
    half c = a;
    c += b;
    ok = ok && c.bits() == (a + b).bits();
    c = a;
    c *= b;
    ok = ok && c.bits() == (a * b).bits();
    ok = ok && (a < b) == (x < y) && (a == b) == (x == y) && (a >= b) == (x >= y) && (a != b) == (x != y);
    ok = ok && (-a).bits() == (ab ^ 0x8000u) && (+a).bits() == ab;
    if (!ok && mismatches++ == 0) first_a = ab, first_b = bb;
  }
  INFO("first mismatch: 0x" << std::hex << first_a << " 0x" << first_b);
  REQUIRE(mismatches == 0);

  const half nan = std::numeric_limits<half>::quiet_NaN();
  REQUIRE_FALSE(nan == nan);
  REQUIRE(nan != nan);
  REQUIRE_FALSE(nan < half(1.0f));
  REQUIRE(trainkit::isnan(half(1.0f) / half(0.0f) - half(1.0f) / half(0.0f)));
  REQUIRE(half(1.0f) / half(0.0f) == std::numeric_limits<half>::infinity());
  REQUIRE(half(2.0f) * 3.5f == 7.0f);  // mixed expressions are float
}

TEST_CASE("half classification matches float's", "[half]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const half h = half::from_bits(static_cast<std::uint16_t>(b));
    const float f = h;
    INFO("bits 0x" << std::hex << b);
    REQUIRE(trainkit::isnan(h) == std::isnan(f));
    REQUIRE(trainkit::isinf(h) == std::isinf(f));
    REQUIRE(trainkit::isfinite(h) == std::isfinite(f));
    REQUIRE(trainkit::signbit(h) == std::signbit(f));
  }
}

TEST_CASE("numeric_limits<half>", "[half]") {
  using L = std::numeric_limits<half>;
  STATIC_REQUIRE(L::is_specialized);
  STATIC_REQUIRE(L::digits == 11);
  STATIC_REQUIRE(L::is_iec559);
  REQUIRE(float(L::max()) == 65504.0f);
  REQUIRE(float(L::lowest()) == -65504.0f);
  REQUIRE(float(L::min()) == 0x1p-14f);
  REQUIRE(float(L::denorm_min()) == 0x1p-24f);
  REQUIRE(float(L::epsilon()) == 0x1p-10f);
  REQUIRE(float(half::from_bits(0x3c01)) - 1.0f == float(L::epsilon()));
  REQUIRE(float(L::round_error()) == 0.5f);
  REQUIRE(std::isinf(float(L::infinity())));
  REQUIRE(float(L::infinity()) > 0);
  REQUIRE(trainkit::isnan(L::quiet_NaN()));
  REQUIRE(trainkit::isnan(L::signaling_NaN()));
  REQUIRE((L::quiet_NaN().bits() & 0x0200) != 0);
  REQUIRE((L::signaling_NaN().bits() & 0x0200) == 0);
  // The decimal digit counts match what a half can hold.
  REQUIRE(std::ldexp(1.0, L::max_exponent - 1) <= 65504.0);
  REQUIRE(std::ldexp(1.0, L::min_exponent - 1) == double(float(L::min())));
}

TEST_CASE("half prints as its float value", "[half]") {
  std::ostringstream os;
  os << half(1.5f) << ' ' << half(-0.0f) << ' ' << std::numeric_limits<half>::infinity() << ' ' << half(65504);
  REQUIRE(os.str() == "1.5 -0 inf 65504");
}

// ---- bulk conversions of tensors (backend/cpu/convert16.hpp: F16C where the CPU has it) ----------

TEST_CASE("tensor casts float <-> half and round_to<half> give half's own bits", "[half][cast]") {
  INFO("F16C path: " << (trainkit::backend::cpu_convert::has_f16c() ? "yes" : "no (scalar loop)"));
  // Floats: a strided sweep of all 2^32 patterns, every midpoint of neighbouring halfs and one
  // float ulp either side (both signs), signed zeros, infinities, NaNs with payloads.
  std::vector<float> in;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 251) in.push_back(f32(static_cast<std::uint32_t>(u)));
  for (std::uint32_t k = 0; k < 0x7c00; ++k) {
    const double mid = k == 0x7bff ? 65520.0 : (finite_halfs()[k] + finite_halfs()[k + 1]) / 2;
    for (const float s : {1.0f, -1.0f}) {
      const auto m = s * static_cast<float>(mid);
      in.insert(in.end(), {m, std::nextafter(m, 0.0f), std::nextafter(m, s * 1e30f)});
    }
  }
  for (const std::uint32_t b : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                0x7f800001u, 0x7fa00000u, 0xff9fffffu, 0x00000001u, 0x807fffffu})
    in.push_back(f32(b));
  const auto n = static_cast<trainkit::index_t>(in.size());
  const auto t = trainkit::tensor<float>::from_vector(in, {n});

  const auto h = trainkit::cast<half>(t);
  const auto r = trainkit::map(trainkit::functors::round_to<half>{}, t);
  std::uint64_t bad_cast = 0, bad_round = 0;
  for (trainkit::index_t i = 0; i < n; ++i) {
    const std::uint16_t want = half(in[std::size_t(i)]).bits();
    if (h.data()[i].bits() != want) ++bad_cast;
    const float back = static_cast<float>(half::from_bits(want));
    if (bits32(r.data()[i]) != bits32(back)) ++bad_round;
  }
  CHECK(bad_cast == 0);
  CHECK(bad_round == 0);

  // half -> float: all 65536 patterns, NaN payloads included, bit for bit.
  std::vector<half> all(1 << 16);
  for (std::uint32_t b = 0; b < (1u << 16); ++b) all[b] = half::from_bits(static_cast<std::uint16_t>(b));
  const auto f = trainkit::cast<float>(trainkit::tensor<half>::from_vector(all, {1 << 16}));
  std::uint64_t bad_widen = 0;
  for (std::uint32_t b = 0; b < (1u << 16); ++b)
    if (bits32(f.data()[b]) != bits32(static_cast<float>(all[b]))) ++bad_widen;
  CHECK(bad_widen == 0);

  // A strided view takes the element loop: same bits.
  const auto strided = trainkit::cast<half>(t.slice(0, 0, n - 1, 2));
  for (trainkit::index_t i = 0; i < strided.numel(); i += 997)
    REQUIRE(strided.data()[i].bits() == half(in[std::size_t(2 * i)]).bits());
}

TEST_CASE("rounded_to rounds a handed-over tensor in place and never writes a shared one", "[half]") {
  using trainkit::tensor;
  const std::vector<float> v{1.0f + 1.0f / 4096, -3.14159265f, 65504.0f, 1e-8f, 70000.0f, 0.1f, 2.5f, -0.0f, 1e6f};
  std::vector<float> want;
  for (float f : v) want.push_back(float(half(f)));
  // Handed over (std::move, nobody else holds it): rounded in its own storage.
  auto t = tensor<float>::from_vector(v, {3, 3});
  const float* storage = t.data();
  auto r = trainkit::rounded_to<half>(std::move(t));
  CHECK(r.data() == storage);
  CHECK(std::memcmp(r.to_vector().data(), want.data(), want.size() * sizeof(float)) == 0);
  // Shared (a copy of the handle, or a view of it is alive): a new tensor, the original untouched.
  auto a = tensor<float>::from_vector(v, {3, 3});
  const auto view = a.t();
  auto b = trainkit::rounded_to<half>(a);
  CHECK(b.data() != a.data());
  CHECK(a.to_vector() == v);
  CHECK(std::memcmp(b.to_vector().data(), want.data(), want.size() * sizeof(float)) == 0);
  auto c = trainkit::rounded_to<trainkit::bfloat16>(tensor<float>(view));
  CHECK(a.to_vector() == v);
  CHECK(c.sizes() == view.sizes());
  CHECK(c.to_vector()[1] == float(trainkit::bfloat16(v[3])));  // view [0][1] = a[1][0]
}
