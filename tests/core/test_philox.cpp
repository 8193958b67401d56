// tests/core/test_philox.cpp - Philox4x32-10 against Random123's known answers, the maps from
// words to numbers, and the generator's stream rule (core/generator.hpp), which the CUDA backend
// must reproduce.
#include "trainkit/core/philox.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/core/half.hpp"
#if defined(_OPENMP)
#include <omp.h>
#endif

using namespace trainkit;

namespace {

constexpr std::uint32_t lo32(std::uint64_t x) { return static_cast<std::uint32_t>(x); }
constexpr std::uint32_t hi32(std::uint64_t x) { return static_cast<std::uint32_t>(x >> 32); }

/// Mean and variance of a sample, in double.
struct moments {
  double mean = 0, var = 0;
};
template <class T>
moments moments_of(const std::vector<T>& v) {
  double s = 0, s2 = 0;
  for (const T& x : v) s += static_cast<double>(x);
  const double mean = s / static_cast<double>(v.size());
  for (const T& x : v) s2 += (static_cast<double>(x) - mean) * (static_cast<double>(x) - mean);
  return {mean, s2 / static_cast<double>(v.size() - 1)};
}

constexpr std::size_t n_stat = 1'000'000;

}  // namespace

TEST_CASE("philox4x32_10 reproduces Random123's known-answer vectors", "[philox]") {
  // Random123 tests/kat_vectors, the three "philox4x32 10" lines: ctr[4] key[2] -> result[4].
  STATIC_REQUIRE(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
                 philox_result{{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  REQUIRE(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
          philox_result{{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  REQUIRE(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
          philox_result{{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
  // Every input word matters.
  REQUIRE(philox4x32_10({0, 0, 0, 1}, {0, 0}) != philox4x32_10({0, 0, 0, 0}, {0, 0}));
  REQUIRE(philox4x32_10({0, 0, 0, 0}, {0, 1}) != philox4x32_10({0, 0, 0, 0}, {0, 0}));
}

TEST_CASE("philox_block puts the block in the low counter words and the seed in the key", "[philox]") {
  const std::uint64_t seed = 0x0123456789abcdefull, block = 0xfedcba9876543210ull;
  REQUIRE(philox_block(seed, block) == philox4x32_10({lo32(block), hi32(block), 0, 0}, {lo32(seed), hi32(seed)}));
}

TEST_CASE("words map to uniforms in the documented intervals", "[philox]") {
  STATIC_REQUIRE(uniform_float(0u) == 0.0f);
  STATIC_REQUIRE(uniform_float(0xffffffffu) == 1.0f - 0x1p-24f);
  STATIC_REQUIRE(uniform_float_open_closed(0u) == 0x1p-33f);
  STATIC_REQUIRE(uniform_float_open_closed(0xffffffffu) == 1.0f);
  STATIC_REQUIRE(uniform_double(0u, 0u) == 0.0);
  STATIC_REQUIRE(uniform_double(0xffffffffu, 0xffffffffu) == 1.0 - 0x1p-53);
  STATIC_REQUIRE(uniform_double_open_closed(0u, 0u) == 0x1p-54);
  for (std::uint64_t x = 0; x <= 0xffffffffull; x += 65521) {
    const auto w = static_cast<std::uint32_t>(x);
    const float u = uniform_float(w), v = uniform_float_open_closed(w);
    REQUIRE((u >= 0.0f && u < 1.0f));
    REQUIRE((v > 0.0f && v <= 1.0f));
    const double d = uniform_double(w, ~w), e = uniform_double_open_closed(w, ~w);
    REQUIRE((d >= 0.0 && d < 1.0));
    REQUIRE((e > 0.0 && e <= 1.0));
  }
}

TEST_CASE("box_muller maps radius and angle as documented", "[philox]") {
  const normal_pair<float> zero = box_muller(1.0f, 0.3f);
  REQUIRE(zero.v[0] == 0.0f);
  REQUIRE(zero.v[1] == 0.0f);
  const normal_pair<double> unit = box_muller(std::exp(-0.5), 0.25);  // r = 1, theta = pi/2
  REQUIRE(unit.v[0] == Approx(0.0).margin(1e-15));
  REQUIRE(unit.v[1] == Approx(1.0).epsilon(1e-15));
  const normal_pair<float> tail = box_muller(uniform_float_open_closed(0u), 0.0f);
  REQUIRE(std::isfinite(tail.v[0]));
  REQUIRE(tail.v[0] == Approx(std::sqrt(66 * std::log(2.0))).epsilon(1e-5));  // the largest radius
}

TEST_CASE("generator reserves whole blocks of four values", "[philox][generator]") {
  generator g;
  REQUIRE(g.seed() == 0);
  REQUIRE(g.offset() == 0);
  REQUIRE(g.reserve(10) == 0);
  REQUIRE(g.offset() == 3);
  REQUIRE(g.reserve(0) == 3);
  REQUIRE(g.offset() == 3);
  REQUIRE(g.reserve(4) == 3);
  REQUIRE(g.reserve(5) == 4);
  REQUIRE(g.offset() == 6);
  REQUIRE(g.reserve_blocks(7) == 6);
  REQUIRE(g.offset() == 13);
  generator big(1);
  REQUIRE(big.reserve(std::numeric_limits<std::uint64_t>::max()) == 0);  // no overflow in ceil
  REQUIRE(big.offset() == (std::uint64_t(1) << 62));
}

TEST_CASE("the stream rule: value i of a draw at offset o depends only on (seed, o, i)", "[philox][generator]") {
  // An offset just below 2^32 so that the block counter carries into its high word.
  const std::uint64_t seed = 0x9e3779b97f4a7c15ull, o = 0xfffffffeull;
  for (std::uint64_t i = 0; i < 24; ++i) {
    const philox_result w = philox4x32_10({lo32(o + i / 4), hi32(o + i / 4), 0, 0}, {lo32(seed), hi32(seed)});
    const auto j = static_cast<int>(i % 4);
    REQUIRE(uniform_at(seed, o, i) == uniform_float(w.v[j]));
    REQUIRE(bernoulli_at(seed, o, i, 0.5f) == (uniform_float(w.v[j]) < 0.5f));
    const int k = j / 2;
    const normal_pair<float> n = box_muller(uniform_float_open_closed(w.v[2 * k]), uniform_float_open_closed(w.v[2 * k + 1]));
    REQUIRE(normal_at(seed, o, i) == n.v[j % 2]);

    const philox_result d = philox4x32_10({lo32(o + i / 2), hi32(o + i / 2), 0, 0}, {lo32(seed), hi32(seed)});
    const auto m = static_cast<int>(i % 2);
    REQUIRE(uniform_double_at(seed, o, i) == uniform_double(d.v[2 * m], d.v[2 * m + 1]));
    const normal_pair<double> nd = box_muller(uniform_double_open_closed(d.v[0], d.v[1]), uniform_double_open_closed(d.v[2], d.v[3]));
    REQUIRE(normal_double_at(seed, o, i) == nd.v[m]);
  }
}

TEST_CASE("fills follow the stream rule and advance the offset", "[philox][generator]") {
  const std::uint64_t seed = 1234, o = 77;
  generator g(seed);
  g.set_state(seed, o);

  SECTION("float uniform: 10 values then 7") {
    std::vector<float> a(10), b(7);
    fill_uniform(g, a.data(), a.size(), 0.0f, 1.0f);
    REQUIRE(g.offset() == o + 3);
    fill_uniform(g, b.data(), b.size(), 0.0f, 1.0f);
    REQUIRE(g.offset() == o + 5);
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == uniform_at(seed, o, i));
    for (std::size_t i = 0; i < b.size(); ++i) REQUIRE(b[i] == uniform_at(seed, o + 3, i));
  }
  SECTION("float normal and bernoulli") {
    std::vector<float> a(10), b(7);
    fill_normal(g, a.data(), a.size(), 0.0f, 1.0f);
    fill_bernoulli(g, b.data(), b.size(), 0.4f);
    REQUIRE(g.offset() == o + 5);
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == normal_at(seed, o, i));
    for (std::size_t i = 0; i < b.size(); ++i) REQUIRE(b[i] == (bernoulli_at(seed, o + 3, i, 0.4f) ? 1.0f : 0.0f));
  }
  SECTION("double draws take two words per value") {
    std::vector<double> a(9), b(4);
    fill_uniform(g, a.data(), a.size(), 0.0, 1.0);
    REQUIRE(g.offset() == o + 5);
    fill_normal(g, b.data(), b.size(), 0.0, 1.0);
    REQUIRE(g.offset() == o + 7);
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == uniform_double_at(seed, o, i));
    for (std::size_t i = 0; i < b.size(); ++i) REQUIRE(b[i] == normal_double_at(seed, o + 5, i));
  }
  SECTION("scale and shift, half and bfloat16 round the float draw once") {
    std::vector<float> u(13), n(13);
    std::vector<half> uh(13);
    std::vector<trainkit::bfloat16> nb(13);
    fill_uniform(g, u.data(), u.size(), -2.0f, 5.0f);
    fill_normal(g, n.data(), n.size(), 3.0f, 0.5f);
    fill_uniform(g, uh.data(), uh.size(), half(-2.0f), half(5.0f));
    fill_normal(g, nb.data(), nb.size(), trainkit::bfloat16(3.0f), trainkit::bfloat16(0.5f));
    REQUIRE(g.offset() == o + 16);
    for (std::size_t i = 0; i < 13; ++i) {
      REQUIRE(u[i] == -2.0f + 7.0f * uniform_at(seed, o, i));
      REQUIRE(n[i] == 3.0f + 0.5f * normal_at(seed, o + 4, i));
      REQUIRE(uh[i].bits() == half(-2.0f + 7.0f * uniform_at(seed, o + 8, i)).bits());
      REQUIRE(nb[i].bits() == trainkit::bfloat16(3.0f + 0.5f * normal_at(seed, o + 12, i)).bits());
    }
  }
  SECTION("draws of whole blocks concatenate into one draw") {
    std::vector<float> whole(20), parts(20);
    generator h = g;
    fill_normal(g, whole.data(), 20, 0.0f, 1.0f);
    fill_normal(h, parts.data(), 8, 0.0f, 1.0f);
    fill_normal(h, parts.data() + 8, 12, 0.0f, 1.0f);
    REQUIRE(whole == parts);
    REQUIRE(g.get_state() == h.get_state());
  }
}

TEST_CASE("fills do not depend on the number of threads", "[philox][generator]") {
  const std::size_t n = 100'003;  // more blocks than the parallel threshold, not a multiple of 4
  std::vector<float> a(n), b(n);
  generator g(99);
  generator h = g;
  fill_normal(g, a.data(), n, 0.0f, 1.0f);
#if defined(_OPENMP)
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  fill_normal(h, b.data(), n, 0.0f, 1.0f);
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
  REQUIRE(a == b);
  for (std::size_t i = 0; i < n; i += 9973) REQUIRE(a[i] == normal_at(99, 0, i));
}

TEST_CASE("seeds: the same seed repeats, another seed differs", "[philox][generator]") {
  std::vector<float> a(1000), b(1000), c(1000), d(1000);
  generator g1(42), g2(42), g3(43), g4(42ull | (1ull << 32));
  fill_uniform(g1, a.data(), a.size(), 0.0f, 1.0f);
  fill_uniform(g2, b.data(), b.size(), 0.0f, 1.0f);
  fill_uniform(g3, c.data(), c.size(), 0.0f, 1.0f);
  fill_uniform(g4, d.data(), d.size(), 0.0f, 1.0f);  // differs only in the high key word
  REQUIRE(a == b);
  int same_c = 0, same_d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    same_c += a[i] == c[i];
    same_d += a[i] == d[i];
  }
  REQUIRE(same_c < 5);
  REQUIRE(same_d < 5);
}

TEST_CASE("set_state restores the stream; manual_seed resets the default generator", "[philox][generator]") {
  generator g(7);
  (void)g.reserve(40);
  const generator::state s = g.get_state();
  REQUIRE(s == generator::state{7, 10});
  std::vector<float> a(33), b(33);
  fill_normal(g, a.data(), a.size(), 0.0f, 1.0f);
  REQUIRE(g.get_state() != s);
  g.set_state(s);
  fill_normal(g, b.data(), b.size(), 0.0f, 1.0f);
  REQUIRE(a == b);
  generator other(0);
  other.set_state(s.seed, s.offset);
  REQUIRE(other.get_state() == s);

  manual_seed(2024);
  REQUIRE(default_generator().get_state() == generator::state{2024, 0});
  fill_uniform(default_generator(), a.data(), a.size(), 0.0f, 1.0f);
  REQUIRE(default_generator().offset() == 9);
  manual_seed(2024);
  fill_uniform(default_generator(), b.data(), b.size(), 0.0f, 1.0f);
  REQUIRE(a == b);
  REQUIRE(&default_generator() == &default_generator());
}

TEST_CASE("uniform draws have the moments of U[0, 1)", "[philox][generator][statistics]") {
  // Loose 5-sigma bounds over 10^6 draws: sd(mean) = sqrt(1/12/n); sd(var) = sqrt((1/80 - 1/144)/n).
  generator g(31337);
  const double sd_mean = std::sqrt(1.0 / 12 / n_stat), sd_var = std::sqrt((1.0 / 80 - 1.0 / 144) / n_stat);
  SECTION("float") {
    std::vector<float> v(n_stat);
    fill_uniform(g, v.data(), v.size(), 0.0f, 1.0f);
    const moments m = moments_of(v);
    REQUIRE(std::fabs(m.mean - 0.5) < 5 * sd_mean);
    REQUIRE(std::fabs(m.var - 1.0 / 12) < 5 * sd_var);
    for (float x : v) REQUIRE((x >= 0.0f && x < 1.0f));
  }
  SECTION("double") {
    std::vector<double> v(n_stat);
    fill_uniform(g, v.data(), v.size(), 0.0, 1.0);
    const moments m = moments_of(v);
    REQUIRE(std::fabs(m.mean - 0.5) < 5 * sd_mean);
    REQUIRE(std::fabs(m.var - 1.0 / 12) < 5 * sd_var);
    for (double x : v) REQUIRE((x >= 0.0 && x < 1.0));
  }
  SECTION("scaled") {
    std::vector<float> v(n_stat);
    fill_uniform(g, v.data(), v.size(), -3.0f, 5.0f);
    const moments m = moments_of(v);
    REQUIRE(std::fabs(m.mean - 1.0) < 5 * 8 * sd_mean);
    REQUIRE(std::fabs(m.var - 64.0 / 12) < 5 * 64 * sd_var);
  }
}

TEST_CASE("normal draws have the moments of N(0, 1)", "[philox][generator][statistics]") {
  // sd(mean) = 1/sqrt(n), sd(var) = sqrt(2/n); P(|z| < 1) = 0.682689 with sd sqrt(p(1-p)/n).
  generator g(4242);
  const double sd_mean = 1.0 / std::sqrt(double(n_stat)), sd_var = std::sqrt(2.0 / n_stat);
  const double p1 = 0.682689492137, sd_p1 = std::sqrt(p1 * (1 - p1) / n_stat);
  auto check = [&](const auto& v, double mean, double sd) {
    const moments m = moments_of(v);
    REQUIRE(std::fabs(m.mean - mean) < 5 * sd * sd_mean);
    REQUIRE(std::fabs(m.var / (sd * sd) - 1.0) < 5 * sd_var);
    std::size_t within = 0;
    for (const auto& x : v) within += std::fabs((static_cast<double>(x) - mean) / sd) < 1.0;
    REQUIRE(std::fabs(static_cast<double>(within) / n_stat - p1) < 5 * sd_p1);
  };
  SECTION("float") {
    std::vector<float> v(n_stat);
    fill_normal(g, v.data(), v.size(), 0.0f, 1.0f);
    check(v, 0.0, 1.0);
  }
  SECTION("double") {
    std::vector<double> v(n_stat);
    fill_normal(g, v.data(), v.size(), 0.0, 1.0);
    check(v, 0.0, 1.0);
  }
  SECTION("shifted and scaled") {
    std::vector<float> v(n_stat);
    fill_normal(g, v.data(), v.size(), 3.0f, 2.0f);
    check(v, 3.0, 2.0);
  }
  SECTION("the two values of each pair are uncorrelated") {
    std::vector<float> v(n_stat);
    fill_normal(g, v.data(), v.size(), 0.0f, 1.0f);
    double s = 0;
    for (std::size_t i = 0; i + 1 < n_stat; i += 2) s += double(v[i]) * v[i + 1];
    REQUIRE(std::fabs(s / (n_stat / 2)) < 5 / std::sqrt(n_stat / 2.0));
  }
}

TEST_CASE("bernoulli draws have frequency p, exactly 0 and 1 at the ends", "[philox][generator][statistics]") {
  generator g(5);
  std::vector<float> v(n_stat);
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    fill_bernoulli(g, v.data(), v.size(), p);
    double ones = 0;
    for (float x : v) {
      REQUIRE((x == 0.0f || x == 1.0f));
      ones += x;
    }
    REQUIRE(std::fabs(ones / n_stat - p) < 5 * std::sqrt(p * (1 - p) / n_stat));
  }
  std::vector<double> d(10'000);
  fill_bernoulli(g, d.data(), d.size(), 0.0f);
  for (double x : d) REQUIRE(x == 0.0);
  fill_bernoulli(g, d.data(), d.size(), 1.0f);
  for (double x : d) REQUIRE(x == 1.0);
  std::vector<half> h(8);
  fill_bernoulli(g, h.data(), h.size(), 1.0f);
  for (half x : h) REQUIRE(x.bits() == 0x3c00);
}

TEST_CASE("fills reject bad arguments before drawing", "[philox][generator]") {
  generator g(1);
  float out[4];
  REQUIRE_THROWS_AS(fill_uniform(g, out, 4, 1.0f, 0.0f), value_error);
  REQUIRE_THROWS_AS(fill_normal(g, out, 4, 0.0f, -1.0f), value_error);
  REQUIRE_THROWS_AS(fill_normal(g, out, 4, 0.0f, std::numeric_limits<float>::quiet_NaN()), value_error);
  REQUIRE_THROWS_AS(fill_bernoulli(g, out, 4, 1.5f), value_error);
  REQUIRE_THROWS_AS(fill_bernoulli(g, out, 4, -0.1f), value_error);
  REQUIRE_THROWS_AS(fill_uniform(g, static_cast<float*>(nullptr), 4, 0.0f, 1.0f), value_error);
  REQUIRE(g.offset() == 0);  // nothing was reserved
  fill_uniform(g, static_cast<float*>(nullptr), 0, 0.0f, 1.0f);  // an empty draw is fine
  REQUIRE(g.offset() == 0);
  REQUIRE_THROWS_WITH(fill_bernoulli(g, out, 4, 2.0f), Catch::Contains("fill_bernoulli") && Catch::Contains("2"));
}
