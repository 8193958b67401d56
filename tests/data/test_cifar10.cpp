// tests/data/test_cifar10.cpp - the CIFAR-10 binary reader on files the test writes in the exact
// format (label byte + 3072 CHW pixel bytes per record), and every way a file can be wrong.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/idx_test_files.hpp"  // temp_dir, write_plain, bytes
#include "trainkit/data/cifar10.hpp"

using Catch::Matchers::Contains;
using trainkit::index_t;
using trainkit::io_error;
namespace data = trainkit::data;
using namespace trainkit_test;

namespace {

/// Pixel byte j (0..3071) of global sample g: independent of the reader's arithmetic.
std::uint8_t pixel(index_t g, index_t j) {
  return static_cast<std::uint8_t>((g * 13 + j * 7 + j / 1024) % 256);
}
std::uint8_t label_of(index_t g) { return static_cast<std::uint8_t>(g % 10); }

/// n records for global samples first .. first + n - 1, raw bytes.
bytes records(index_t first, index_t n) {
  bytes b;
  for (index_t g = first; g < first + n; ++g) {
    b.push_back(label_of(g));
    for (index_t j = 0; j < 3072; ++j) b.push_back(pixel(g, j));
  }
  return b;
}

/// The five training files with 3, 2, 4, 1, 2 records (12 samples) and a test file with 3.
void write_split_files(const std::filesystem::path& dir) {
  const index_t counts[] = {3, 2, 4, 1, 2};
  index_t g = 0;
  for (int f = 0; f < 5; ++f) {
    write_plain(dir / ("data_batch_" + std::to_string(f + 1) + ".bin"), records(g, counts[f]));
    g += counts[f];
  }
  write_plain(dir / "test_batch.bin", records(100, 3));
}

template <class F>
std::string io_message(F&& f) {
  try {
    f();
  } catch (const io_error& e) {
    return e.what();
  }
  FAIL("expected an io_error");
  return {};
}

}  // namespace

TEST_CASE("cifar10: the training split is the five files in order, CHW, scaled to [0, 1]",
          "[data][cifar10]") {
  temp_dir dir("cifar10-good");
  write_split_files(dir.path());
  const auto train = data::load_cifar10(dir.path(), data::split::train);
  REQUIRE(train.images.sizes() == trainkit::shape{12, 3, 32, 32});
  REQUIRE(train.labels.sizes() == trainkit::shape{12});
  REQUIRE(train.images.is_contiguous());
  REQUIRE(train.size() == 12);
  for (index_t g = 0; g < 12; ++g) {
    REQUIRE(train.labels.at({g}) == label_of(g));
    for (index_t c = 0; c < 3; ++c)
      for (index_t y : {0, 5, 31})
        for (index_t x : {0, 17, 31}) {
          const index_t j = c * 1024 + y * 32 + x;  // the record's plane c, row y, column x
          REQUIRE(train.images.at({g, c, y, x}) == static_cast<float>(pixel(g, j)) / 255.0f);
        }
  }
  float lo = 1, hi = 0;
  for (float v : train.images.to_vector()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);

  const auto test = data::load_cifar10<double>(dir.path(), data::split::test);
  REQUIRE(test.images.sizes() == trainkit::shape{3, 3, 32, 32});
  CHECK(test.labels.to_vector() == std::vector<std::int64_t>{label_of(100), label_of(101), label_of(102)});
  CHECK(test.images.at({2, 1, 3, 4}) == static_cast<double>(pixel(102, 1024 + 3 * 32 + 4)) / 255.0);
}

TEST_CASE("cifar10: limit, the cifar-10-batches-bin subdirectory and exact record counts",
          "[data][cifar10]") {
  temp_dir dir("cifar10-sub");
  const auto sub = dir.path() / "cifar-10-batches-bin";
  std::filesystem::create_directories(sub);
  write_split_files(sub);

  const auto five = data::load_cifar10(dir.path(), data::split::train, {.limit = 5});
  REQUIRE(five.images.sizes() == trainkit::shape{5, 3, 32, 32});
  CHECK(five.labels.to_vector() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  CHECK(five.images.at({4, 2, 31, 31}) == static_cast<float>(pixel(4, 3071)) / 255.0f);
  CHECK(data::load_cifar10(dir.path(), data::split::train, {.limit = 0}).size() == 0);
  CHECK(data::load_cifar10(dir.path(), data::split::train, {.limit = 1000}).size() == 12);

  CHECK(data::load_cifar10(dir.path(), data::split::test, {.records_per_file = 3}).size() == 3);
  const std::string msg = io_message(
      [&] { (void)data::load_cifar10(dir.path(), data::split::test, {.records_per_file = 10000}); });
  CHECK_THAT(msg, Contains("test_batch.bin") && Contains("holds 3 records") && Contains("expected 10000") &&
                      Contains("9219 bytes"));

  const data::cifar10_file f = data::read_cifar10_file(sub / "data_batch_3.bin");
  REQUIRE(f.size() == 4);
  CHECK(f.labels[0] == label_of(5));
  CHECK(f.pixels[3072 + 10] == pixel(6, 10));
  CHECK_THROWS_AS(data::read_cifar10_file(sub / "data_batch_3.bin", 5), io_error);
}

TEST_CASE("cifar10: a truncated file names its size and the incomplete record", "[data][cifar10]") {
  temp_dir dir("cifar10-trunc");
  write_split_files(dir.path());
  bytes b = records(0, 2);
  b.resize(b.size() + 100, 7);  // 2 whole records and 100 bytes of a third
  write_plain(dir / "data_batch_2.bin", b);
  const std::string msg = io_message([&] { (void)data::load_cifar10(dir.path(), data::split::train); });
  CHECK_THAT(msg, Contains("load_cifar10") && Contains("data_batch_2.bin") && Contains("6246 bytes") &&
                      Contains("record 2 at byte offset 6146") && Contains("incomplete") &&
                      Contains("100 of 3073 bytes"));
  // Less than one record, and nothing at all.
  write_plain(dir / "test_batch.bin", bytes(3000, 1));
  CHECK_THAT(io_message([&] { (void)data::read_cifar10_file(dir / "test_batch.bin"); }),
             Contains("test_batch.bin") && Contains("3000 bytes") && Contains("record 0 at byte offset 0"));
  write_plain(dir / "test_batch.bin", bytes{});
  CHECK_THAT(io_message([&] { (void)data::load_cifar10(dir.path(), data::split::test); }),
             Contains("test_batch.bin") && Contains("empty"));
}

TEST_CASE("cifar10: a label >= 10 names the file, the record and the value", "[data][cifar10]") {
  temp_dir dir("cifar10-label");
  write_split_files(dir.path());
  bytes b = records(0, 4);
  b[2 * 3073] = 10;  // record 2's label byte
  write_plain(dir / "data_batch_4.bin", b);
  const std::string msg = io_message([&] { (void)data::load_cifar10(dir.path(), data::split::train); });
  CHECK_THAT(msg, Contains("data_batch_4.bin") && Contains("record 2") && Contains("byte offset 6146") &&
                      Contains("label 10") && Contains("expected 0 to 9"));
  b[2 * 3073] = 255;
  write_plain(dir / "test_batch.bin", b);
  CHECK_THAT(io_message([&] { (void)data::read_cifar10_file(dir / "test_batch.bin"); }),
             Contains("test_batch.bin") && Contains("label 255"));
}

TEST_CASE("cifar10: missing files are listed with every path looked for", "[data][cifar10]") {
  temp_dir dir("cifar10-missing");
  write_split_files(dir.path());
  std::filesystem::remove(dir / "data_batch_3.bin");
  const std::string msg = io_message([&] { (void)data::load_cifar10(dir.path(), data::split::train); });
  CHECK_THAT(msg, Contains("load_cifar10") && Contains("training split") && Contains("data_batch_5.bin") &&
                      Contains("missing '" + (dir.path() / "data_batch_3.bin").string() + "'") &&
                      Contains("'" + (dir.path() / "cifar-10-batches-bin").string() + "' does not exist"));
  CHECK_THAT(msg, !Contains((dir.path() / "data_batch_1.bin").string()));  // only the missing one
  // Files in both places, neither complete: each place's missing files.
  std::filesystem::create_directories(dir / "cifar-10-batches-bin");
  write_plain(dir.path() / "cifar-10-batches-bin" / "data_batch_3.bin", records(0, 1));
  CHECK_THAT(io_message([&] { (void)data::load_cifar10(dir.path(), data::split::train); }),
             Contains((dir.path() / "data_batch_3.bin").string()) &&
                 Contains((dir.path() / "cifar-10-batches-bin" / "data_batch_1.bin").string()) &&
                 !Contains((dir.path() / "cifar-10-batches-bin" / "data_batch_3.bin").string()));

  temp_dir empty("cifar10-none");
  CHECK_THAT(io_message([&] { (void)data::load_cifar10(empty.path(), data::split::test); }),
             Contains("test split") && Contains("test_batch.bin"));
  CHECK_THAT(io_message([&] { (void)data::read_cifar10_file(empty / "nothing.bin"); }),
             Contains("nothing.bin"));
  CHECK_THROWS_AS(data::load_cifar10(dir.path(), data::split::train, {.limit = -1}), trainkit::value_error);
}
