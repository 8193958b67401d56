// tests/data/test_transforms.cpp - normalize, random crop with padding, horizontal flip and their
// composition: values and geometry on known images, and the seeding rule (same seed, same output,
// whatever the order or the thread count).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"  // TRAINKIT_HAS_OPENMP (and <omp.h>)
#include "trainkit/core/philox.hpp"
#include "trainkit/data/transforms.hpp"

using Catch::Matchers::Contains;
using trainkit::index_t;
using trainkit::tensor;
namespace data = trainkit::data;

namespace {

/// A [C, H, W] image whose value at (c, y, x) is 100 c + 10 y + x + 1 (never 0, so padding shows).
std::vector<float> known_image(const data::image_shape& s) {
  std::vector<float> v;
  for (index_t c = 0; c < s.channels; ++c)
    for (index_t y = 0; y < s.height; ++y)
      for (index_t x = 0; x < s.width; ++x) v.push_back(static_cast<float>(100 * c + 10 * y + x + 1));
  return v;
}

template <class F>
std::vector<float> run(const F& f, const std::vector<float>& in, const data::image_shape& s,
                       const data::sample_rng& rng) {
  std::vector<float> out(static_cast<std::size_t>(f.output_shape(s).numel()), -1.0f);
  f(in.data(), s, out.data(), rng);
  return out;
}

/// N images [N, 3, 32, 32] of varied values.
tensor<float> images(index_t n) {
  std::vector<float> v(static_cast<std::size_t>(n * 3 * 32 * 32));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % 251) / 251.0f;
  return tensor<float>::from_vector(v, {n, 3, 32, 32});
}

}  // namespace

TEST_CASE("transforms: the augmentation rule is the documented Philox block", "[data][transforms]") {
  const std::uint64_t seed = 0x0123456789ABCDEFull, epoch = 0x100000002ull, index = 0x300000004ull;
  for (std::uint64_t stream : {0ull, 1ull, 65ull}) {
    const std::uint64_t t = (stream + 1) * 0x9E3779B97F4A7C15ull, k = seed ^ t;
    const auto r = trainkit::philox4x32_10(
        {4u, 3u, 2u, 1u}, {static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k >> 32)});
    const auto u = data::sample_rng{seed, epoch, index, stream}.uniforms();
    for (int j = 0; j < 4; ++j) CHECK(u[static_cast<std::size_t>(j)] == trainkit::uniform_float(r.v[j]));
  }
  const data::sample_rng parent{1, 2, 3, 5};
  CHECK(parent.child(0).stream == 5 * 64 + 1);
  CHECK(parent.child(2).stream == 5 * 64 + 3);
}

TEST_CASE("transforms: normalize", "[data][transforms]") {
  const data::image_shape s{2, 2, 2};
  const std::vector<float> in = {1, 2, 3, 4, 10, 20, 30, 40};
  const data::normalize n({.mean = {1.0f, 10.0f}, .stddev = {2.0f, 5.0f}});
  CHECK(n.output_shape(s) == s);
  CHECK(run(n, in, s, {}) == std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 0.0f, 2.0f, 4.0f, 6.0f});
  const data::normalize all({.mean = {0.5f}, .stddev = {0.25f}});  // one value for every channel
  CHECK(run(all, in, s, {})[7] == (40.0f - 0.5f) / 0.25f);
  // Same bits as torchvision's (x - mean) / std in float.
  const data::normalize cifar({.mean = {0.4914f, 0.4822f, 0.4465f}, .stddev = {0.2470f, 0.2435f, 0.2616f}});
  const std::vector<float> px = {0.3f, 0.6f, 0.9f};
  const auto out = run(cifar, px, {3, 1, 1}, {});
  CHECK(out[1] == (0.6f - 0.4822f) / 0.2435f);

  CHECK_THROWS_WITH(n.output_shape({3, 2, 2}),
                    Contains("normalize") && Contains("2 channel statistics") && Contains("[3, 2, 2]"));
  CHECK_THROWS_AS(data::normalize({.mean = {0.0f}, .stddev = {0.0f}}), trainkit::value_error);
  CHECK_THROWS_WITH(data::normalize({.mean = {0.0f, 1.0f}, .stddev = {1.0f}}), Contains("2 and 1"));
}

TEST_CASE("transforms: random_crop pads with zeros and cuts the window at the drawn corner",
          "[data][transforms]") {
  const data::image_shape s{2, 4, 4};
  const auto in = known_image(s);
  const data::random_crop crop({.padding = 2});
  REQUIRE(crop.output_shape(s) == s);
  std::set<std::pair<index_t, index_t>> corners;
  for (std::uint64_t i = 0; i < 400; ++i) {
    const data::sample_rng rng{7, 0, i, 0};
    const auto [top, left] = crop.corner(s, rng);
    REQUIRE(top >= 0);
    REQUIRE(top <= 4);
    REQUIRE(left >= 0);
    REQUIRE(left <= 4);
    // The corner is the documented floor(u * range) of the first two draws.
    const auto u = rng.uniforms();
    REQUIRE(top == static_cast<index_t>(static_cast<double>(u[0]) * 5));
    REQUIRE(left == static_cast<index_t>(static_cast<double>(u[1]) * 5));
    corners.insert({top, left});
    const auto out = run(crop, in, s, rng);
    for (index_t c = 0; c < 2; ++c)
      for (index_t y = 0; y < 4; ++y)
        for (index_t x = 0; x < 4; ++x) {
          const index_t sy = top - 2 + y, sx = left - 2 + x;  // in the unpadded image
          const float expected =
              sy >= 0 && sy < 4 && sx >= 0 && sx < 4 ? static_cast<float>(100 * c + 10 * sy + sx + 1) : 0.0f;
          REQUIRE(out[static_cast<std::size_t>((c * 4 + y) * 4 + x)] == expected);
        }
  }
  CHECK(corners.size() == 25);  // every one of the 5 x 5 places occurs

  // A smaller window without padding stays inside the image; a custom fill value.
  const data::random_crop small({.height = 2, .width = 3});
  REQUIRE(small.output_shape(s) == data::image_shape{2, 2, 3});
  const auto [t, l] = small.corner(s, {1, 2, 3, 0});
  const auto out = run(small, in, s, {1, 2, 3, 0});
  CHECK(out[0] == static_cast<float>(10 * t + l + 1));
  CHECK(out[5] == static_cast<float>(10 * (t + 1) + l + 2 + 1));
  CHECK(out[6] == static_cast<float>(100 + 10 * t + l + 1));
  const data::random_crop filled({.padding = 10, .fill = -3.0f});
  const auto f = run(filled, in, s, {0, 0, 0, 0});
  for (float v : f) CHECK((v == -3.0f || v >= 1.0f));

  CHECK_THROWS_WITH(
      data::random_crop({.height = 9}).output_shape(s),
      Contains("random_crop") && Contains("9x4") && Contains("[2, 4, 4]") && Contains("padded by 0"));
  CHECK_THROWS_AS(data::random_crop({.padding = -1}), trainkit::value_error);
}

TEST_CASE("transforms: random_horizontal_flip mirrors each row with probability p", "[data][transforms]") {
  const data::image_shape s{2, 2, 3};
  const auto in = known_image(s);
  const std::vector<float> mirrored = {3, 2, 1, 13, 12, 11, 103, 102, 101, 113, 112, 111};
  const data::random_horizontal_flip flip;  // p = 0.5
  int flipped = 0;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    const data::sample_rng rng{3, 1, i, 0};
    const auto out = run(flip, in, s, rng);
    REQUIRE(flip.flips(rng) == (rng.uniforms()[0] < 0.5f));
    REQUIRE(out == (flip.flips(rng) ? mirrored : in));
    flipped += flip.flips(rng);
  }
  CHECK(flipped > 850);
  CHECK(flipped < 1150);
  const data::random_horizontal_flip never({.p = 0.0f}), always({.p = 1.0f});
  for (std::uint64_t i = 0; i < 100; ++i) {
    REQUIRE(run(never, in, s, {0, 0, i, 0}) == in);
    REQUIRE(run(always, in, s, {0, 0, i, 0}) == mirrored);
  }
  CHECK_THROWS_WITH(data::random_horizontal_flip({.p = 1.5f}),
                    Contains("p must be in [0, 1]") && Contains("1.5"));
}

TEST_CASE("transforms: compose runs each step on its own stream", "[data][transforms]") {
  const data::image_shape s{3, 5, 6};
  const auto in = known_image(s);
  const data::random_crop crop({.height = 4, .width = 4, .padding = 1});
  const data::random_horizontal_flip flip;
  const data::normalize norm({.mean = {1.0f, 2.0f, 3.0f}, .stddev = {2.0f, 4.0f, 8.0f}});
  const auto pipeline = data::compose(crop, flip, norm);
  REQUIRE(pipeline.output_shape(s) == data::image_shape{3, 4, 4});
  for (std::uint64_t i = 0; i < 50; ++i) {
    const data::sample_rng rng{11, 4, i, 0};
    const auto a = run(crop, in, s, rng.child(0));
    const auto b = run(flip, a, {3, 4, 4}, rng.child(1));
    const auto c = run(norm, b, {3, 4, 4}, rng.child(2));
    REQUIRE(run(pipeline, in, s, rng) == c);
  }
  // Two flips draw independently: both "one flip" and "no net flip" occur.
  const auto twice = data::compose(flip, flip);
  std::set<bool> net;
  for (std::uint64_t i = 0; i < 64; ++i) net.insert(run(twice, in, s, {5, 0, i, 0}) == in);
  CHECK(net.size() == 2);
  // Nested compose = the same steps on the nested streams; one-element compose.
  const auto nested = data::compose(data::compose(crop, flip), norm);
  CHECK(nested.output_shape(s) == data::image_shape{3, 4, 4});
  CHECK(run(data::compose(flip), in, s, {5, 0, 9, 0}) ==
        run(flip, in, s, data::sample_rng{5, 0, 9, 0}.child(0)));
  CHECK_THROWS_AS(pipeline.output_shape({2, 5, 6}), trainkit::shape_error);  // normalize has 3 channels

  // Type erasure: same results; an empty any_transform copies.
  const data::any_transform erased = pipeline;
  REQUIRE(static_cast<bool>(erased));
  CHECK(erased.output_shape(s) == pipeline.output_shape(s));
  CHECK(run(erased, in, s, {11, 4, 7, 0}) == run(pipeline, in, s, {11, 4, 7, 0}));
  const data::any_transform none;
  CHECK(run(none, in, s, {}) == in);
}

TEST_CASE("transforms: same seed, same output, whatever the order or thread count", "[data][transforms]") {
  const auto x = images(64);  // 64 * 3072 elements: the parallel path of transform_images
  const auto augment =
      data::compose(data::random_crop({.padding = 4}), data::random_horizontal_flip(),
                    data::normalize({.mean = {0.5f, 0.4f, 0.3f}, .stddev = {0.2f, 0.25f, 0.3f}}));
  const auto a = data::transform_images(augment, x, 42, 3).to_vector();
  CHECK(data::transform_images(augment, x, 42, 3).to_vector() == a);
  CHECK(data::transform_images(augment, x, 43, 3).to_vector() != a);  // another seed
  CHECK(data::transform_images(augment, x, 42, 4).to_vector() != a);  // another epoch

  // Sample by sample in reverse order, in one thread: the same bits.
  const data::image_shape s{3, 32, 32};
  std::vector<float> serial(a.size());
  const float* src = x.data();
  for (index_t i = 63; i >= 0; --i)
    augment(src + i * 3072, s, serial.data() + i * 3072,
            data::sample_rng{42, 3, static_cast<std::uint64_t>(i), 0});
  CHECK(serial == a);
  // A slice starting at sample 10 transforms like samples 10.. of the whole.
  const auto part = data::transform_images(augment, x.slice(0, 10, 20), 42, 3, 10).to_vector();
  CHECK(std::vector<float>(a.begin() + 10 * 3072, a.begin() + 20 * 3072) == part);

#if TRAINKIT_HAS_OPENMP
  const int before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    CHECK(data::transform_images(augment, x, 42, 3).to_vector() == a);
  }
  omp_set_num_threads(before);
#endif
  CHECK_THROWS_WITH(data::transform_images(augment, tensor<float>::zeros({2, 3, 4}), 0, 0),
                    Contains("transform_images") && Contains("[2, 3, 4]"));
}
