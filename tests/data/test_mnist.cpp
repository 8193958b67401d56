// tests/data/test_mnist.cpp - load_mnist on generated files (every check it makes) and on the real
// Fashion-MNIST of Debian's dataset-fashion-mnist when it is installed.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>

#include "data/idx_test_files.hpp"
#include "trainkit/data/mnist.hpp"

using Catch::Matchers::Contains;
using trainkit::index_t;
using trainkit::io_error;
namespace data = trainkit::data;
using namespace trainkit_test;

namespace {

std::string load_error(const std::filesystem::path& dir, data::split s = data::split::train) {
  try {
    (void)data::load_mnist(dir, s);
  } catch (const io_error& e) {
    return e.what();
  }
  FAIL("load_mnist(" << dir.string() << ") did not throw io_error");
  return {};
}

std::filesystem::path fashion_mnist_dir() {
#ifdef TRAINKIT_FASHION_MNIST_DIR
  return TRAINKIT_FASHION_MNIST_DIR;
#else
  return "/usr/share/datasets/fashion-mnist";
#endif
}

}  // namespace

TEST_CASE("load_mnist reads generated train and test files", "[data][mnist]") {
  temp_dir dir("mnist-ok");
  write_mnist_pair(dir.path(), "train", 12, 12, 28, 28, {}, true);
  write_mnist_pair(dir.path(), "t10k", 5, 5, 28, 28, {9, 0, 3}, false);  // plain files also work

  const data::dataset train = data::load_mnist(dir.path(), data::split::train);
  REQUIRE(train.size() == 12);
  CHECK(train.images.sizes() == trainkit::shape{12, 1, 28, 28});
  CHECK(train.labels.sizes() == trainkit::shape{12});
  CHECK(train.images.is_contiguous());
  for (index_t i = 0; i < 12; ++i) {
    CHECK(train.labels.at({i}) == i % 10);
    // pixel (r, c) of image i was written as (i * 7 + r * 28 + c) % 256
    CHECK(train.images.at({i, 0, 1, 2}) == static_cast<float>((i * 7 + 30) % 256) / 255.0f);
  }
  const auto px = train.images.to_vector();
  CHECK(*std::min_element(px.begin(), px.end()) == 0.0f);
  CHECK(*std::max_element(px.begin(), px.end()) == 1.0f);  // 255 maps to exactly 1

  const data::dataset test = data::load_mnist(dir.path(), data::split::test);
  REQUIRE(test.size() == 5);
  CHECK(test.labels.to_vector() == std::vector<std::int64_t>{9, 0, 3, 9, 0});
}

TEST_CASE("load_mnist options: limit, normalisation, element type, rows and cols", "[data][mnist]") {
  temp_dir dir("mnist-options");
  write_mnist_pair(dir.path(), "train", 20, 20, 7, 5, {}, true);

  SECTION("limit keeps the first samples") {
    const auto d = data::load_mnist(dir.path(), data::split::train, {.limit = 3});
    CHECK(d.images.sizes() == trainkit::shape{3, 1, 7, 5});
    CHECK(d.labels.to_vector() == std::vector<std::int64_t>{0, 1, 2});
    CHECK(data::load_mnist(dir.path(), data::split::train, {.limit = 100}).size() == 20);
    CHECK(data::load_mnist(dir.path(), data::split::train, {.limit = 0}).size() == 0);
  }
  SECTION("mean and stddev") {
    const auto plain = data::load_mnist(dir.path(), data::split::train);
    const auto norm = data::load_mnist(dir.path(), data::split::train,
                                       {.mean = data::fashion_mnist_mean, .stddev = data::fashion_mnist_std});
    const auto a = plain.images.to_vector(), b = norm.images.to_vector();
    for (std::size_t i = 0; i < a.size(); i += 37)
      CHECK(b[i] == Approx((a[i] - data::fashion_mnist_mean) / data::fashion_mnist_std).epsilon(1e-5));
  }
  SECTION("double images") {
    const auto d = data::load_mnist<double>(dir.path(), data::split::train, {.mean = 0.5, .stddev = 0.25});
    CHECK(d.images.at({2, 0, 0, 1}) == Approx((15.0 / 255.0 - 0.5) / 0.25));
  }
  SECTION("bad options") {
    CHECK_THROWS_AS(data::load_mnist(dir.path(), data::split::train, {.stddev = 0.0}), trainkit::value_error);
    CHECK_THROWS_AS(data::load_mnist(dir.path(), data::split::train, {.limit = -1}), trainkit::value_error);
  }
}

TEST_CASE("load_mnist prefers the .gz file and falls back to the plain one", "[data][mnist]") {
  temp_dir dir("mnist-prefer");
  write_mnist_pair(dir.path(), "train", 4, 4, 2, 2, {1}, true);
  write_mnist_pair(dir.path(), "train", 6, 6, 2, 2, {2}, false);
  CHECK(data::load_mnist(dir.path(), data::split::train).size() == 4);
  std::filesystem::remove(dir / "train-labels-idx1-ubyte.gz");
  std::filesystem::remove(dir / "train-images-idx3-ubyte.gz");
  CHECK(data::load_mnist(dir.path(), data::split::train).size() == 6);
}

TEST_CASE("load_mnist rejects inconsistent files with messages naming them", "[data][mnist][errors]") {
  temp_dir dir("mnist-bad");
  const std::string images = (dir / "train-images-idx3-ubyte.gz").string();
  const std::string labels = (dir / "train-labels-idx1-ubyte.gz").string();

  SECTION("missing files") {
    const std::string m = load_error(dir.path());
    CHECK_THAT(m, Contains("load_mnist") && Contains(images) &&
                      Contains((dir / "train-images-idx3-ubyte").string()) && Contains("exists"));
    write_mnist_pair(dir.path(), "train", 3, 3, 28, 28, {}, true);
    std::filesystem::remove(labels);
    CHECK_THAT(load_error(dir.path()), Contains(labels));
    CHECK_THAT(load_error(dir.path(), data::split::test), Contains("t10k-images-idx3-ubyte"));
  }
  SECTION("image count differs from label count") {
    write_mnist_pair(dir.path(), "train", 7, 6, 28, 28, {}, true);
    CHECK_THAT(load_error(dir.path()), Contains(images) && Contains(labels) && Contains("holds 7 images") &&
                                           Contains("holds 6 labels"));
  }
  SECTION("label out of range") {
    write_mnist_pair(dir.path(), "train", 5, 5, 28, 28, {0, 1, 2, 10, 4}, true);
    CHECK_THAT(load_error(dir.path()), Contains(labels) && Contains("label 3 is 10") && Contains("0 to 9"));
  }
  SECTION("label out of range beyond the limit is still an error") {
    write_mnist_pair(dir.path(), "train", 5, 5, 28, 28, {0, 1, 2, 3, 255}, true);
    CHECK_THROWS_WITH(data::load_mnist(dir.path(), data::split::train, {.limit = 2}),
                      Contains("label 4 is 255"));
  }
  SECTION("labels that are not [N]") {
    write_mnist_pair(dir.path(), "train", 4, 4, 28, 28, {}, true);
    write_gz(labels, idx_file(data::idx_ubyte, {2, 2}, {0, 1, 2, 3}));
    CHECK_THAT(load_error(dir.path()),
               Contains(labels) && Contains("ubyte labels [N]") && Contains("[2, 2]"));
  }
  SECTION("images that are not ubyte [N, rows, cols]") {
    write_mnist_pair(dir.path(), "train", 2, 2, 28, 28, {}, true);
    write_gz(images, idx_file(data::idx_float, {2, 2}, bytes(16)));
    CHECK_THAT(load_error(dir.path()),
               Contains(images) && Contains("ubyte images") && Contains("float [2, 2]"));
  }
  SECTION("empty images") {
    write_mnist_pair(dir.path(), "train", 2, 2, 0, 28, {}, true);
    CHECK_THAT(load_error(dir.path()), Contains(images) && Contains("empty images"));
  }
  SECTION("a truncated image file") {
    write_mnist_pair(dir.path(), "train", 3, 3, 28, 28, {}, false);
    const auto p = dir / "train-images-idx3-ubyte";
    bytes b = read_all(p);
    b.resize(b.size() - 100);
    write_plain(p, b);
    CHECK_THAT(load_error(dir.path()), Contains(p.string()) && Contains("truncated") && Contains("got 2252"));
  }
}

TEST_CASE("Fashion-MNIST from dataset-fashion-mnist", "[data][mnist][fashion]") {
  const std::filesystem::path dir = fashion_mnist_dir();
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz") &&
      !std::filesystem::exists(dir / "train-images-idx3-ubyte")) {
    WARN("Fashion-MNIST not found in " << dir.string()
                                       << " (Debian: apt-get install dataset-fashion-mnist); skipped");
    return;
  }
  struct expect {
    data::split which;
    index_t n;
  };
  for (const expect e : {expect{data::split::train, 60000}, expect{data::split::test, 10000}}) {
    const data::dataset d = data::load_mnist(dir, e.which);
    REQUIRE(d.size() == e.n);
    CHECK(d.images.sizes() == trainkit::shape{e.n, 1, 28, 28});
    CHECK(d.labels.sizes() == trainkit::shape{e.n});

    std::array<index_t, 10> histogram{};
    index_t out_of_range = 0;
    for (std::int64_t v : d.labels.to_vector()) {
      if (v >= 0 && v < 10)
        ++histogram[static_cast<std::size_t>(v)];
      else
        ++out_of_range;
    }
    CHECK(out_of_range == 0);
    for (index_t c : histogram) CHECK(c == e.n / 10);  // 6000 per class in train, 1000 in test

    const auto px = d.images.to_vector();
    const auto [lo, hi] = std::minmax_element(px.begin(), px.end());
    CHECK(*lo == 0.0f);
    CHECK(*hi == 1.0f);
    double mean = 0.0;
    for (float v : px) mean += v;
    mean /= static_cast<double>(px.size());
    CHECK(mean == Approx(data::fashion_mnist_mean).margin(0.01));
  }
}
