// trainkit/data/transforms.hpp - per-sample image transforms (normalize, random crop with padding,
// random horizontal flip, composition), seeded so that a run is reproducible whatever thread
// transforms which sample.
//
// THE AUGMENTATION RULE (snapshots rely on it: a sample's augmentation is recomputed, never stored).
// A random transform draws at most four uniform floats per sample, all from one Philox4x32-10 block
// that depends only on the seed s, the epoch e, the sample's index i in the dataset (not its
// position in a batch, nor the thread or rank that loads it) and the transform's stream number q:
//
//   block = philox4x32_10(counter = {lo32(i), hi32(i), lo32(e), hi32(e)},
//                         key     = {lo32(s) ^ lo32(t), hi32(s) ^ hi32(t)}),
//           t = (q + 1) * 0x9E3779B97F4A7C15  (mod 2^64)                      -> words v0..v3
//   u_j   = uniform_float(v_j)  (core/philox.hpp: top 24 bits * 2^-24, in [0, 1)),  j = 0..3
//
// A transform used alone has stream q = 0; in compose(t_0, ..., t_n-1) at stream q, t_k has stream
// q * 64 + k + 1 (so siblings and nested composes never share a stream; up to 63 per compose).
// t is never 0, so no augmentation stream is the shuffle stream of data/permutation.hpp (key = s).
// The generator's uniform_at (core/generator.hpp) is not used because its counter is a single
// 64-bit block number; a per-sample draw needs (index, epoch) in the counter.
//
//   random_crop:            top = floor(u_0 * (H + 2p - h + 1)), left = floor(u_1 * (W + 2p - w + 1))
//                           (in double), in the image zero-padded by p on every side
//   random_horizontal_flip: flips when u_0 < p
//
// Transforms work on one sample [C, H, W] of floats, out of place: f(in, in_shape, out, rng)
// writes output_shape(in_shape) elements to out (in and out never overlap).
#pragma once

#include <algorithm>  // std::clamp, std::fill, std::copy, std::reverse_copy, std::min
#include <array>
#include <cmath>      // std::floor
#include <concepts>   // std::copy_constructible, std::same_as
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint32_t, std::uint64_t
#include <cstring>    // std::memcpy
#include <exception>  // std::exception_ptr: errors out of an OpenMP loop
#include <memory>     // std::shared_ptr
#include <string>
#include <tuple>
#include <type_traits>  // std::remove_cvref_t
#include <utility>      // std::move
#include <vector>

#include "trainkit/backend/cpu/elementwise.hpp"  // host loops behind copy_: the data lives on the host
#include "trainkit/config.hpp"                   // TRAINKIT_HAS_OPENMP
#include "trainkit/ops/elementwise.hpp"         // copy_, behind tensor::contiguous()
#include "trainkit/core/error.hpp"               // shape_error, value_error, TRAINKIT_CHECK
#include "trainkit/core/philox.hpp"              // philox4x32_10, uniform_float
#include "trainkit/core/shape.hpp"               // index_t, shape, to_string
#include "trainkit/core/tensor.hpp"              // tensor

namespace trainkit::data {

/// The shape of one image sample: channels, height, width (a [C, H, W] tensor row).
struct image_shape {
  index_t channels = 0;
  index_t height = 0;
  index_t width = 0;

  index_t numel() const noexcept { return channels * height * width; }
  shape to_shape() const { return {channels, height, width}; }
  friend constexpr bool operator==(const image_shape&, const image_shape&) = default;
};

/// "[3, 32, 32]"
inline std::string to_string(const image_shape& s) { return trainkit::to_string(s.to_shape()); }

/// The [C, H, W] of a sample shape; shape_error (naming op) unless it has three non-negative sizes.
inline image_shape to_image_shape(const shape& s, const char* op) {
  TRAINKIT_CHECK(s.size() == 3, shape_error, op,
                 "image transforms work on [C, H, W] samples, got sample sizes " << trainkit::to_string(s));
  return {s[0], s[1], s[2]};
}

/// The random words of one sample for one transform, by the augmentation rule at the top of this
/// header. A small value: the loader makes one per sample and passes it down.
struct sample_rng {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;   ///< the sample's index in the dataset
  std::uint64_t stream = 0;  ///< the transform's stream number q

  /// Most uniforms one transform may draw per sample.
  static constexpr int max_draws = 4;

  /// The four uniforms u_0..u_3 in [0, 1).
  std::array<float, 4> uniforms() const noexcept {
    const std::uint64_t t = (stream + 1) * 0x9E3779B97F4A7C15ull;
    const philox_result r =
        philox4x32_10({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                       static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(epoch >> 32)},
                      {static_cast<std::uint32_t>(seed ^ t), static_cast<std::uint32_t>((seed ^ t) >> 32)});
    return {uniform_float(r.v[0]), uniform_float(r.v[1]), uniform_float(r.v[2]), uniform_float(r.v[3])};
  }

  /// The stream of child k of a compose at this stream.
  sample_rng child(std::uint64_t k) const noexcept { return {seed, epoch, index, stream * 64 + k + 1}; }
};

/// A per-sample transform. A model provides
///   image_shape output_shape(const image_shape& in) const  - validates in (throws) and says what
///                                                           operator() writes
///   void operator()(const float* in, const image_shape& s, float* out, const sample_rng& rng) const
///                                                         - in: s.numel() values, out:
///                                                           output_shape(s).numel(), no overlap
/// operator() is called concurrently from loader threads: it must not modify shared state, and
/// its random choices must come from rng only (that is what makes them reproducible).
template <class F>
concept sample_transform = std::copy_constructible<F> &&
    requires(const F& f, const float* in, float* out, const image_shape& s, const sample_rng& rng) {
  { f.output_shape(s) } -> std::same_as<image_shape>;
  f(in, s, out, rng);
};

// ---- normalize -----------------------------------------------------------------------------------

/// Per-channel mean and standard deviation; one value each applies to every channel.
struct normalize_options {
  std::vector<float> mean;
  std::vector<float> stddev;  ///< every value > 0
};

/// out[c, y, x] = (in[c, y, x] - mean[c]) / stddev[c], as torchvision's Normalize.
/// `normalize({.mean = {0.4914f, 0.4822f, 0.4465f}, .stddev = {0.2470f, 0.2435f, 0.2616f}})`
class normalize {
 public:
  explicit normalize(normalize_options o) : mean_(std::move(o.mean)), stddev_(std::move(o.stddev)) {
    TRAINKIT_CHECK(!mean_.empty() && mean_.size() == stddev_.size(), value_error, "normalize",
                   "mean and stddev need the same number (>= 1) of values, got " << mean_.size() << " and "
                                                                                 << stddev_.size());
    for (std::size_t c = 0; c < stddev_.size(); ++c)
      TRAINKIT_CHECK(stddev_[c] > 0.0f, value_error, "normalize",
                     "stddev must be > 0, got " << stddev_[c] << " for channel " << c);
  }

  const std::vector<float>& mean() const noexcept { return mean_; }
  const std::vector<float>& stddev() const noexcept { return stddev_; }

  image_shape output_shape(const image_shape& s) const {
    check(s);
    return s;
  }

  void operator()(const float* in, const image_shape& s, float* out, const sample_rng&) const {
    check(s);
    const index_t plane = s.height * s.width;
    for (index_t c = 0; c < s.channels; ++c) {
      const std::size_t k = mean_.size() == 1 ? 0 : static_cast<std::size_t>(c);
      const float m = mean_[k], sd = stddev_[k];
      const float* src = in + c * plane;
      float* dst = out + c * plane;
      // A division, as torchvision (sub_ then div_): same bits as the reference.
      for (index_t j = 0; j < plane; ++j) dst[j] = (src[j] - m) / sd;
    }
  }

 private:
  void check(const image_shape& s) const {
    TRAINKIT_CHECK(mean_.size() == 1 || static_cast<index_t>(mean_.size()) == s.channels, shape_error,
                   "normalize",
                   "has " << mean_.size() << " channel statistics but the sample is " << to_string(s));
  }
  std::vector<float> mean_;
  std::vector<float> stddev_;
};

// ---- random_crop ---------------------------------------------------------------------------------

/// Output size and padding of random_crop. A size of 0 keeps the input's height or width (the
/// CIFAR-10 recipe is `random_crop({.padding = 4})`: pad 32x32 to 40x40, crop 32x32).
struct random_crop_options {
  index_t height = 0;
  index_t width = 0;
  index_t padding = 0;  ///< added on every side before cropping
  float fill = 0.0f;    ///< value of the padding (zero padding by default)
};

/// A height x width window at a random place in the image padded by `padding` on every side, as
/// torchvision's RandomCrop(size, padding) with constant padding. Draws u_0 (top), u_1 (left).
class random_crop {
 public:
  explicit random_crop(const random_crop_options& o) : o_(o) {
    TRAINKIT_CHECK(
        o.height >= 0 && o.width >= 0 && o.padding >= 0, value_error, "random_crop",
        "height, width and padding must be >= 0, got " << o.height << ", " << o.width << ", " << o.padding);
  }
  const random_crop_options& options() const noexcept { return o_; }

  image_shape output_shape(const image_shape& s) const {
    const image_shape r{s.channels, o_.height ? o_.height : s.height, o_.width ? o_.width : s.width};
    TRAINKIT_CHECK(r.height <= s.height + 2 * o_.padding && r.width <= s.width + 2 * o_.padding, shape_error,
                   "random_crop",
                   "a " << r.height << "x" << r.width << " crop does not fit in a sample of " << to_string(s)
                        << " padded by " << o_.padding);
    return r;
  }

  /// The (top, left) corner of the window in padded coordinates, for a sample of shape s.
  std::array<index_t, 2> corner(const image_shape& s, const sample_rng& rng) const {
    const image_shape r = output_shape(s);
    const auto u = rng.uniforms();
    const index_t rows = s.height + 2 * o_.padding - r.height + 1,
                  cols = s.width + 2 * o_.padding - r.width + 1;
    // In double, so u * n < n exactly; the min guards the rule against any rounding surprise.
    const auto pick = [](float v, index_t n) {
      return std::min(n - 1,
                      static_cast<index_t>(std::floor(static_cast<double>(v) * static_cast<double>(n))));
    };
    return {pick(u[0], rows), pick(u[1], cols)};
  }

  void operator()(const float* in, const image_shape& s, float* out, const sample_rng& rng) const {
    const image_shape r = output_shape(s);
    const auto [top, left] = corner(s, rng);
    const index_t y0 = top - o_.padding, x0 = left - o_.padding;  // window origin in the unpadded image
    // The part of each output row that lies inside the image: [xa, xb).
    const index_t xa = std::clamp<index_t>(-x0, 0, r.width),
                  xb = std::clamp<index_t>(s.width - x0, xa, r.width);
    for (index_t c = 0; c < s.channels; ++c)
      for (index_t y = 0; y < r.height; ++y) {
        float* dst = out + (c * r.height + y) * r.width;
        const index_t sy = y0 + y;
        if (sy < 0 || sy >= s.height) {
          std::fill(dst, dst + r.width, o_.fill);
          continue;
        }
        std::fill(dst, dst + xa, o_.fill);
        const float* src = in + (c * s.height + sy) * s.width + x0;
        std::copy(src + xa, src + xb, dst + xa);
        std::fill(dst + xb, dst + r.width, o_.fill);
      }
  }

 private:
  random_crop_options o_;
};

// ---- random_horizontal_flip ----------------------------------------------------------------------

struct random_horizontal_flip_options {
  float p = 0.5f;  ///< probability of a flip, in [0, 1]
};

/// Mirrors the image left-right (x -> W - 1 - x) with probability p. Draws u_0: flips when u_0 < p.
class random_horizontal_flip {
 public:
  explicit random_horizontal_flip(const random_horizontal_flip_options& o = {}) : p_(o.p) {
    TRAINKIT_CHECK(p_ >= 0.0f && p_ <= 1.0f, value_error, "random_horizontal_flip",
                   "p must be in [0, 1], got " << p_);
  }
  float p() const noexcept { return p_; }

  image_shape output_shape(const image_shape& s) const { return s; }

  /// Whether the sample of this rng is flipped.
  bool flips(const sample_rng& rng) const noexcept { return rng.uniforms()[0] < p_; }

  void operator()(const float* in, const image_shape& s, float* out, const sample_rng& rng) const {
    const index_t rows = s.channels * s.height, w = s.width;
    if (!flips(rng)) {
      std::memcpy(out, in, static_cast<std::size_t>(rows * w) * sizeof(float));
      return;
    }
    for (index_t r = 0; r < rows; ++r) std::reverse_copy(in + r * w, in + (r + 1) * w, out + r * w);
  }

 private:
  float p_;
};

// ---- composition ---------------------------------------------------------------------------------

/// Transforms applied in order, each with its own random stream (child k of the compose's).
/// Intermediate results go through two scratch buffers per call.
/// \tparam Ts the transforms, each a sample_transform
template <sample_transform... Ts>
class composed {
  static_assert(sizeof...(Ts) >= 1 && sizeof...(Ts) <= 63, "compose takes 1 to 63 transforms");

 public:
  explicit composed(Ts... ts) : ts_(std::move(ts)...) {}

  image_shape output_shape(const image_shape& s) const {
    image_shape r = s;
    std::apply([&](const auto&... t) { ((r = t.output_shape(r)), ...); }, ts_);
    return r;
  }

  void operator()(const float* in, const image_shape& s, float* out, const sample_rng& rng) const {
    if constexpr (sizeof...(Ts) == 1) {
      std::get<0>(ts_)(in, s, out, rng.child(0));
    } else {
      std::vector<float> a, b;
      run<0>(in, s, out, rng, a, b);
    }
  }

  const std::tuple<Ts...>& transforms() const noexcept { return ts_; }

 private:
  template <std::size_t K>
  void run(const float* in, const image_shape& s, float* out, const sample_rng& rng, std::vector<float>& a,
           std::vector<float>& b) const {
    const auto& t = std::get<K>(ts_);
    if constexpr (K + 1 == sizeof...(Ts)) {
      t(in, s, out, rng.child(K));
    } else {
      const image_shape r = t.output_shape(s);
      a.resize(static_cast<std::size_t>(r.numel()));
      t(in, s, a.data(), rng.child(K));
      run<K + 1>(a.data(), r, out, rng, b, a);  // the next step reads a and writes b
    }
  }

  std::tuple<Ts...> ts_;
};

/// compose(random_crop({.padding = 4}), random_horizontal_flip(), normalize({...})).
template <sample_transform... Ts>
composed<Ts...> compose(Ts... ts) {
  return composed<Ts...>(std::move(ts)...);
}

// ---- type erasure --------------------------------------------------------------------------------

/// Any sample_transform behind one type (the loader's options hold one). Empty by default; an empty
/// any_transform copies the sample unchanged. Copies share the wrapped transform (it is immutable).
class any_transform {
 public:
  any_transform() = default;
  template <sample_transform F>
  requires(!std::same_as<std::remove_cvref_t<F>, any_transform>) any_transform(F f)
      : impl_(std::make_shared<model<F>>(std::move(f))) {}  // NOLINT: implicit on purpose

  explicit operator bool() const noexcept { return impl_ != nullptr; }

  image_shape output_shape(const image_shape& s) const { return impl_ ? impl_->output_shape(s) : s; }

  void operator()(const float* in, const image_shape& s, float* out, const sample_rng& rng) const {
    if (impl_)
      impl_->apply(in, s, out, rng);
    else
      std::memcpy(out, in, static_cast<std::size_t>(s.numel()) * sizeof(float));
  }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual image_shape output_shape(const image_shape& s) const = 0;
    virtual void apply(const float* in, const image_shape& s, float* out, const sample_rng& rng) const = 0;
  };
  template <class F>
  struct model final : concept_t {
    explicit model(F g) : f(std::move(g)) {}
    image_shape output_shape(const image_shape& s) const override { return f.output_shape(s); }
    void apply(const float* in, const image_shape& s, float* out, const sample_rng& rng) const override {
      f(in, s, out, rng);
    }
    F f;
  };
  std::shared_ptr<const concept_t> impl_;
};

// ---- whole tensors -------------------------------------------------------------------------------

/// Applies t to every sample of images [N, C, H, W]: sample n is dataset index first_index + n and
/// draws from sample_rng{seed, epoch, first_index + n, 0}, exactly what the loader does for it.
/// Samples run in parallel (OpenMP); the result does not depend on the thread count.
/// Returns [N, C', H', W'] with [C', H', W'] = t.output_shape([C, H, W]).
template <sample_transform F>
tensor<float> transform_images(const F& t, const tensor<float>& images, std::uint64_t seed,
                               std::uint64_t epoch, std::uint64_t first_index = 0) {
  TRAINKIT_CHECK(images.defined() && images.dim() == 4, shape_error, "transform_images",
                 "images must be [N, C, H, W], got sizes " << trainkit::to_string(images.sizes()));
  const tensor<float> x = images.contiguous();
  const image_shape s{x.size(1), x.size(2), x.size(3)};
  const image_shape r = t.output_shape(s);
  const index_t n = x.size(0);
  auto out = tensor<float>::empty({n, r.channels, r.height, r.width});
  const float* src = x.data();
  float* dst = out.data();
  const index_t in_row = s.numel(), out_row = r.numel();
  // An exception must not leave an OpenMP region: the first one is kept and rethrown after it.
  std::exception_ptr failure;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (n * in_row > 65536)
#endif
  for (index_t i = 0; i < n; ++i) {
    try {
      t(src + i * in_row, s, dst + i * out_row,
        sample_rng{seed, epoch, first_index + static_cast<std::uint64_t>(i), 0});
    } catch (...) {
#if TRAINKIT_HAS_OPENMP
#pragma omp critical(trainkit_transform_images)
#endif
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  return out;
}

}  // namespace trainkit::data
