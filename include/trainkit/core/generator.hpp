// trainkit/core/generator.hpp - the random stream every backend draws from: a (seed, offset)
// generator, the per-element functions that define the stream, and host fills.
//
// THE STREAM RULE (a CUDA backend reproduces it; change it only together with every backend).
// A generator is a 64-bit seed and a 64-bit offset, counted in Philox blocks of four 32-bit
// words. A draw of n values reserves its blocks first (generator::reserve), which returns the
// offset o where the draw starts; from then on value i is a pure function of (seed, o, i):
//
//   block(b)   = philox4x32_10(counter = {lo32(b), hi32(b), 0, 0},
//                              key     = {lo32(seed), hi32(seed)})          -> words w0..w3
//
//   float draws: four values per block, value i from block(o + i/4), j = i % 4:
//     uniform    uniform_float(w_j)                                         in [0, 1)
//     bernoulli  uniform_float(w_j) < p                                     (in float)
//     normal     pair k = j / 2:  box_muller(uniform_float_open_closed(w_2k),
//                                            uniform_float_open_closed(w_2k+1)).v[j % 2]
//   double draws: two values per block, value i from block(o + i/2), k = i % 2:
//     uniform    uniform_double(w_2k, w_2k+1)                               in [0, 1)
//     normal     box_muller(uniform_double_open_closed(w0, w1),
//                           uniform_double_open_closed(w2, w3)).v[k]
//
// So a draw of n floats advances the offset by ceil(n / 4) blocks and a draw of n doubles by
// ceil(n / 2) (reserve(2 * n)). Uniform and Bernoulli values are bit-identical on every device;
// normals agree to a few ulps (libm and CUDA's sin/cos/log differ in the last bits).
// fill_uniform/fill_normal/fill_bernoulli below compute in float for every element type except
// double, then convert to the element type.
#pragma once

#include <cstddef>      // std::size_t, std::ptrdiff_t
#include <cstdint>      // std::uint32_t, std::uint64_t
#include <type_traits>  // std::is_same_v

#include "trainkit/config.hpp"      // TRAINKIT_HD, TRAINKIT_HAS_OPENMP
#include "trainkit/core/error.hpp"  // TRAINKIT_CHECK, value_error
#include "trainkit/core/philox.hpp"

namespace trainkit {

// ---- The stream, element by element (host and device) --------------------------------------

/// The four words of block b of the stream of `seed`.
TRAINKIT_HD constexpr philox_result philox_block(std::uint64_t seed, std::uint64_t block) noexcept {
  return philox4x32_10({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0u, 0u},
                       {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

/// Value i of a float uniform draw that starts at offset: in [0, 1).
TRAINKIT_HD constexpr float uniform_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) noexcept {
  return uniform_float(philox_block(seed, offset + i / 4).v[i % 4]);
}

/// Value i of a double uniform draw that starts at offset: in [0, 1).
TRAINKIT_HD constexpr double uniform_double_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) noexcept {
  const philox_result r = philox_block(seed, offset + i / 2);
  const auto k = static_cast<int>(i % 2);
  return uniform_double(r.v[2 * k], r.v[2 * k + 1]);
}

/// Value i of a Bernoulli draw that starts at offset: true with probability p (p in [0, 1];
/// p = 0 is never true and p = 1 always, since the uniform lies in [0, 1)).
TRAINKIT_HD constexpr bool bernoulli_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i, float p) noexcept {
  return uniform_at(seed, offset, i) < p;
}

namespace detail {
TRAINKIT_HD inline float normal_from_block(const philox_result& r, int j) noexcept {
  const int k = j / 2;
  const normal_pair<float> n =
      box_muller(uniform_float_open_closed(r.v[2 * k]), uniform_float_open_closed(r.v[2 * k + 1]));
  return n.v[j % 2];
}
TRAINKIT_HD inline normal_pair<double> normal_double_pair_from_block(const philox_result& r) noexcept {
  return box_muller(uniform_double_open_closed(r.v[0], r.v[1]), uniform_double_open_closed(r.v[2], r.v[3]));
}
}  // namespace detail

/// Value i of a float standard-normal draw that starts at offset.
TRAINKIT_HD inline float normal_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) noexcept {
  return detail::normal_from_block(philox_block(seed, offset + i / 4), static_cast<int>(i % 4));
}

/// Value i of a double standard-normal draw that starts at offset.
TRAINKIT_HD inline double normal_double_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) noexcept {
  return detail::normal_double_pair_from_block(philox_block(seed, offset + i / 2)).v[i % 2];
}

// ---- The generator ---------------------------------------------------------------------------

/// A Philox stream position: the seed (the key) and the offset (the next unused block). A value
/// type: copy it to fork, get_state/set_state to snapshot and resume. Not synchronised: give each
/// thread its own, or reserve under a lock.
class generator {
 public:
  /// Everything needed to resume the stream bit for bit; snapshots store it.
  struct state {
    std::uint64_t seed = 0;
    std::uint64_t offset = 0;
    friend constexpr bool operator==(const state&, const state&) = default;
  };

  constexpr explicit generator(std::uint64_t seed = 0) noexcept : seed_(seed) {}

  constexpr std::uint64_t seed() const noexcept { return seed_; }
  constexpr std::uint64_t offset() const noexcept { return offset_; }

  constexpr state get_state() const noexcept { return {seed_, offset_}; }
  constexpr void set_state(const state& s) noexcept {
    seed_ = s.seed;
    offset_ = s.offset;
  }
  constexpr void set_state(std::uint64_t seed, std::uint64_t offset) noexcept { set_state(state{seed, offset}); }

  /// Reserves the blocks of a draw of n float-sized values (four per block): returns the offset
  /// the draw starts at and moves past ceil(n / 4) blocks. A draw of n doubles is reserve(2 * n).
  constexpr std::uint64_t reserve(std::uint64_t n_elements) noexcept {
    return reserve_blocks(n_elements / 4 + (n_elements % 4 != 0 ? 1 : 0));
  }
  /// Reserves n_blocks whole Philox blocks; returns the first.
  constexpr std::uint64_t reserve_blocks(std::uint64_t n_blocks) noexcept {
    const std::uint64_t start = offset_;
    offset_ += n_blocks;
    return start;
  }

 private:
  std::uint64_t seed_ = 0;
  std::uint64_t offset_ = 0;
};

/// The process-wide generator (seed 0 until manual_seed). Its construction is thread-safe;
/// drawing from it concurrently is not (see generator).
inline generator& default_generator() {
  static generator g;
  return g;
}

/// Reseeds the default generator and rewinds it to offset 0, as torch.manual_seed does.
inline void manual_seed(std::uint64_t seed) { default_generator().set_state(seed, 0); }

// ---- Host fills --------------------------------------------------------------------------------

namespace detail {

/// Float for every element type but double: half and bfloat16 draw like float and round once.
template <class T>
using draw_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Runs f(b) for blocks b in [0, n_blocks), across threads when OpenMP is on. Each block is a
/// pure function of its index, so the result does not depend on the number of threads.
template <class F>
void for_each_block(std::uint64_t n_blocks, F&& f) {
  const auto n = static_cast<std::ptrdiff_t>(n_blocks);
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (n > 4096)
#endif
  for (std::ptrdiff_t b = 0; b < n; ++b) f(static_cast<std::uint64_t>(b));
}

}  // namespace detail

/// Fills out[0, n) with uniform values in [low, high) (high itself only where rounding to T, or
/// low + (high - low) * u in float, lands on it), drawn from gen by the stream rule.
template <class T>
void fill_uniform(generator& gen, T* out, std::size_t n, T low, T high) {
  using D = detail::draw_t<T>;
  const D lo = static_cast<D>(low), hi = static_cast<D>(high);
  TRAINKIT_CHECK(lo <= hi, value_error, "fill_uniform", "low must not exceed high, got low = " << lo << ", high = " << hi);
  TRAINKIT_CHECK(n == 0 || out != nullptr, value_error, "fill_uniform", "null output for " << n << " elements");
  const D span = hi - lo;
  const std::uint64_t seed = gen.seed();
  if constexpr (std::is_same_v<D, double>) {
    const std::uint64_t start = gen.reserve(2 * static_cast<std::uint64_t>(n));
    detail::for_each_block((n + 1) / 2, [&](std::uint64_t b) {
      const philox_result r = philox_block(seed, start + b);
      for (std::uint64_t k = 0; k < 2 && 2 * b + k < n; ++k)
        out[2 * b + k] = static_cast<T>(lo + span * uniform_double(r.v[2 * k], r.v[2 * k + 1]));
    });
  } else {
    const std::uint64_t start = gen.reserve(n);
    detail::for_each_block((n + 3) / 4, [&](std::uint64_t b) {
      const philox_result r = philox_block(seed, start + b);
      for (std::uint64_t k = 0; k < 4 && 4 * b + k < n; ++k)
        out[4 * b + k] = static_cast<T>(lo + span * uniform_float(r.v[k]));
    });
  }
}

/// Fills out[0, n) with normal values of the given mean and standard deviation (stddev >= 0).
template <class T>
void fill_normal(generator& gen, T* out, std::size_t n, T mean, T stddev) {
  using D = detail::draw_t<T>;
  const D mu = static_cast<D>(mean), sigma = static_cast<D>(stddev);
  TRAINKIT_CHECK(sigma >= D(0), value_error, "fill_normal", "stddev must be >= 0, got " << sigma);
  TRAINKIT_CHECK(n == 0 || out != nullptr, value_error, "fill_normal", "null output for " << n << " elements");
  const std::uint64_t seed = gen.seed();
  if constexpr (std::is_same_v<D, double>) {
    const std::uint64_t start = gen.reserve(2 * static_cast<std::uint64_t>(n));
    detail::for_each_block((n + 1) / 2, [&](std::uint64_t b) {
      const normal_pair<double> z = detail::normal_double_pair_from_block(philox_block(seed, start + b));
      for (std::uint64_t k = 0; k < 2 && 2 * b + k < n; ++k) out[2 * b + k] = static_cast<T>(mu + sigma * z.v[k]);
    });
  } else {
    const std::uint64_t start = gen.reserve(n);
    detail::for_each_block((n + 3) / 4, [&](std::uint64_t b) {
      const philox_result r = philox_block(seed, start + b);
      for (int j = 0; j < 4 && 4 * b + static_cast<std::uint64_t>(j) < n; ++j)
        out[4 * b + static_cast<std::uint64_t>(j)] = static_cast<T>(mu + sigma * detail::normal_from_block(r, j));
    });
  }
}

/// Fills out[0, n) with 1 (probability p) or 0; p in [0, 1]. Always a float draw (one word per
/// value, p compared in float), whatever T is, so a dropout mask costs the same in any precision.
template <class T>
void fill_bernoulli(generator& gen, T* out, std::size_t n, float p) {
  TRAINKIT_CHECK(p >= 0.0f && p <= 1.0f, value_error, "fill_bernoulli", "p must be in [0, 1], got " << p);
  TRAINKIT_CHECK(n == 0 || out != nullptr, value_error, "fill_bernoulli", "null output for " << n << " elements");
  const std::uint64_t seed = gen.seed();
  const std::uint64_t start = gen.reserve(n);
  const T one = static_cast<T>(1.0f), zero = static_cast<T>(0.0f);
  detail::for_each_block((n + 3) / 4, [&](std::uint64_t b) {
    const philox_result r = philox_block(seed, start + b);
    for (std::uint64_t k = 0; k < 4 && 4 * b + k < n; ++k) out[4 * b + k] = uniform_float(r.v[k]) < p ? one : zero;
  });
}

}  // namespace trainkit
