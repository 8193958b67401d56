// tests/data/test_idx.cpp - the IDX reader: every element type, plain and gzip, and every way a
// file can be wrong (each a clear io_error naming the file).
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "data/idx_test_files.hpp"
#include "trainkit/data/idx.hpp"

using Catch::Matchers::Contains;
using trainkit::index_t;
using trainkit::io_error;
namespace data = trainkit::data;
using namespace trainkit_test;

namespace {

bytes be_bytes(const void* p, std::size_t n) {  // host (little-endian) value to big-endian bytes
  bytes b(n);
  const auto* s = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = s[n - 1 - i];
  return b;
}

template <class S>
bytes payload_of(const std::vector<S>& v) {
  bytes out;
  for (const S& x : v) {
    const bytes b = be_bytes(&x, sizeof(S));
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

/// The message of the io_error that read_idx(p) throws (fails the test when it does not throw one).
std::string read_error(const std::filesystem::path& p) {
  try {
    (void)data::read_idx(p);
  } catch (const io_error& e) {
    return e.what();
  }
  FAIL("read_idx(" << p.string() << ") did not throw io_error");
  return {};
}

}  // namespace

TEST_CASE("read_idx reads ubyte images, plain and gzip", "[data][idx]") {
  temp_dir dir("idx-ubyte");
  bytes px(2 * 3 * 4);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i * 11);
  const bytes file = idx_file(data::idx_ubyte, {2, 3, 4}, px);
  write_plain(dir / "plain-idx3-ubyte", file);
  write_gz(dir / "packed-idx3-ubyte.gz", file);

  for (const char* name : {"plain-idx3-ubyte", "packed-idx3-ubyte.gz"}) {
    SECTION(name) {
      const data::idx_array a = data::read_idx(dir / name);
      CHECK(a.dims == trainkit::shape{2, 3, 4});
      CHECK(a.type == data::idx_ubyte);
      CHECK(a.numel() == 24);
      CHECK(a.element_size() == 1);
      CHECK(a.bytes == px);
      const auto t = a.to_tensor<float>();
      CHECK(t.sizes() == trainkit::shape{2, 3, 4});
      CHECK(t.at({1, 2, 3}) == static_cast<float>(px[23]));
      CHECK(a.get<int>(5) == px[5]);
      CHECK(a.to_vector<std::uint8_t>() == px);
    }
  }
}

TEST_CASE("read_idx decodes every element type from big-endian", "[data][idx]") {
  temp_dir dir("idx-types");
  SECTION("byte (signed)") {
    const std::vector<std::int8_t> v = {-128, -1, 0, 1, 127};
    write_plain(dir / "f", idx_file(data::idx_byte, {5}, payload_of(v)));
    const auto a = data::read_idx(dir / "f");
    CHECK(a.type == data::idx_byte);
    CHECK(a.to_vector<int>() == std::vector<int>{-128, -1, 0, 1, 127});
  }
  SECTION("short") {
    const std::vector<std::int16_t> v = {-32768, -2, 258, 32767};
    write_gz(dir / "f", idx_file(data::idx_short, {2, 2}, payload_of(v)));
    const auto a = data::read_idx(dir / "f");
    CHECK(a.element_size() == 2);
    CHECK(a.to_vector<std::int16_t>() == v);
    CHECK(a.to_tensor<double>().at({1, 0}) == 258.0);
  }
  SECTION("int") {
    const std::vector<std::int32_t> v = {-2147483647 - 1, -70000, 16909060, 2147483647};
    write_plain(dir / "f", idx_file(data::idx_int, {4}, payload_of(v)));
    const auto a = data::read_idx(dir / "f");
    CHECK(a.to_vector<std::int32_t>() == v);
    CHECK(a.get<std::int64_t>(2) == 16909060);  // 0x01020304: the byte order matters
  }
  SECTION("float") {
    const std::vector<float> v = {-1.5f, 0.0f, 3.25e-3f, 1e30f, 0.1f, 2.0f};
    write_gz(dir / "f", idx_file(data::idx_float, {3, 2}, payload_of(v)));
    const auto a = data::read_idx(dir / "f");
    CHECK(a.to_vector<float>() == v);
    CHECK(a.to_tensor<float>().sizes() == trainkit::shape{3, 2});
  }
  SECTION("double") {
    const std::vector<double> v = {-1e300, 0.1, 1.0 / 3.0};
    write_plain(dir / "f", idx_file(data::idx_double, {1, 1, 3}, payload_of(v)));
    const auto a = data::read_idx(dir / "f");
    CHECK(a.to_vector<double>() == v);
    CHECK(a.get<float>(1) == 0.1f);
  }
  SECTION("eight dimensions, one of them zero") {
    write_plain(dir / "f", idx_file(data::idx_ubyte, {1, 2, 1, 1, 1, 0, 1, 3}, {}));
    const auto a = data::read_idx(dir / "f");
    CHECK(a.dims == trainkit::shape{1, 2, 1, 1, 1, 0, 1, 3});
    CHECK(a.bytes.empty());
    CHECK(a.to_tensor<float>().numel() == 0);
  }
  SECTION("a large array goes through the parallel decode") {
    std::vector<std::int16_t> v(300000);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int16_t>(i * 37 - 20000);
    write_gz(dir / "f", idx_file(data::idx_short, {300, 1000}, payload_of(v)));
    CHECK(data::read_idx(dir / "f").to_vector<std::int16_t>() == v);
  }
}

TEST_CASE("read_idx detects gzip by its magic, not by the file name", "[data][idx]") {
  temp_dir dir("idx-magic");
  const bytes file = idx_file(data::idx_ubyte, {3}, {7, 8, 9});
  write_gz(dir / "compressed-without-suffix", file);
  write_plain(dir / "plain-named.gz", file);
  CHECK(data::read_idx(dir / "compressed-without-suffix").bytes == bytes{7, 8, 9});
  CHECK(data::read_idx(dir / "plain-named.gz").bytes == bytes{7, 8, 9});
}

TEST_CASE("read_idx rejects bad headers with a message naming the file", "[data][idx][errors]") {
  temp_dir dir("idx-header");
  const auto p = dir / "bad-idx";
  const std::string name = p.string();

  SECTION("missing file") {
    const std::string m = read_error(dir / "no-such-file");
    CHECK_THAT(m, Contains("read_idx") && Contains((dir / "no-such-file").string()) &&
                      Contains("No such file or directory"));
  }
  SECTION("a directory") {
    const std::string m = read_error(dir.path());
    CHECK_THAT(m, Contains(dir.path().string()) && Contains("Is a directory"));
  }
  SECTION("empty file") {
    write_plain(p, {});
    CHECK_THAT(read_error(p), Contains(name) && Contains("truncated") && Contains("has 0"));
  }
  SECTION("wrong magic") {
    write_plain(p, {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 5});
    CHECK_THAT(read_error(p), Contains(name) && Contains("bad magic") && Contains("0x12 0x34"));
  }
  SECTION("wrong magic inside a gzip file") {
    write_gz(p, {0x00, 0x01, 0x08, 0x01, 0, 0, 0, 1, 5});
    CHECK_THAT(read_error(p), Contains(name) && Contains("bad magic") && Contains("0x00 0x01") &&
                                  Contains("(decompressed)"));
  }
  SECTION("unknown type code") {
    write_plain(p, {0, 0, 0x07, 0x01, 0, 0, 0, 1, 5});
    CHECK_THAT(read_error(p), Contains(name) && Contains("unknown IDX type code 0x07"));
    write_plain(p, {0, 0, 0x0A, 0x01, 0, 0, 0, 1, 5});
    CHECK_THAT(read_error(p), Contains("type code 0x0A"));
  }
  SECTION("zero dimensions") {
    write_plain(p, {0, 0, 0x08, 0x00, 5});
    CHECK_THAT(read_error(p), Contains(name) && Contains("declares 0 dimensions") && Contains("1 to 8"));
  }
  SECTION("too many dimensions") {
    write_plain(p, idx_file(data::idx_ubyte, {1, 1, 1, 1, 1, 1, 1, 1, 1}, {7}));
    CHECK_THAT(read_error(p), Contains(name) && Contains("declares 9 dimensions"));
  }
  SECTION("dims cut short") {
    write_plain(p, {0, 0, 0x08, 0x03, 0, 0, 0, 2, 0, 0});
    CHECK_THAT(read_error(p), Contains(name) && Contains("truncated") && Contains("needs 16 bytes") &&
                                  Contains("byte offset 10"));
  }
  SECTION("dims whose product cannot be a file") {
    write_plain(p, idx_file(data::idx_double, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}));
    CHECK_THAT(read_error(p), Contains(name) && Contains("more bytes than any file can hold"));
  }
  SECTION("a zero dimension beside dims whose product overflows (found by fuzzing)") {
    // 00 00 08 03 ffffffff ffffffff 00000000: an empty payload, but numel() would overflow int64.
    write_plain(p, {0, 0, 0x08, 0x03, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0});
    CHECK_THAT(read_error(p), Contains(name) && Contains("their product overflows"));
  }
}

TEST_CASE("read_idx rejects payloads of the wrong size", "[data][idx][errors]") {
  temp_dir dir("idx-payload");
  bytes px(10 * 28 * 28, 3);
  const bytes full = idx_file(data::idx_ubyte, {10, 28, 28}, px);
  bytes cut(full.begin(), full.end() - 840);  // 7840 payload bytes expected, 7000 present
  bytes longer = full;
  longer.insert(longer.end(), {1, 2, 3, 4, 5});

  SECTION("truncated, plain") {
    const auto p = dir / "cut-idx3-ubyte";
    write_plain(p, cut);
    CHECK_THAT(read_error(p), Contains(p.string()) && Contains("truncated") && Contains("[10, 28, 28]") &&
                                  Contains("need 7840 payload bytes") && Contains("got 7000") &&
                                  Contains("ends at byte offset 7016"));
  }
  SECTION("truncated, gzip") {
    const auto p = dir / "cut-idx3-ubyte.gz";
    write_gz(p, cut);
    CHECK_THAT(read_error(p), Contains(p.string()) && Contains("truncated") &&
                                  Contains("need 7840 payload bytes") && Contains("got 7000") &&
                                  Contains("(decompressed) ends at byte offset 7016"));
  }
  SECTION("truncated short payload") {
    const auto p = dir / "short";
    write_plain(p, idx_file(data::idx_int, {3}, {0, 0, 0, 1, 0, 0}));
    CHECK_THAT(read_error(p), Contains("need 12 payload bytes") && Contains("got 6"));
  }
  SECTION("trailing bytes, plain") {
    const auto p = dir / "long-idx3-ubyte";
    write_plain(p, longer);
    CHECK_THAT(read_error(p), Contains(p.string()) && Contains("5 trailing bytes") &&
                                  Contains("make 7856 bytes") && Contains("has 7861"));
  }
  SECTION("trailing bytes, gzip") {
    const auto p = dir / "long-idx3-ubyte.gz";
    write_gz(p, longer);
    CHECK_THAT(read_error(p), Contains(p.string()) && Contains("5 trailing bytes"));
  }
}

TEST_CASE("read_idx reports corrupt gzip streams with zlib's message", "[data][idx][errors]") {
  temp_dir dir("idx-gzip");
  bytes px(20000);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>((i * i) % 251);
  write_gz(dir / "good.gz", idx_file(data::idx_ubyte, {20, 1000}, px));
  const bytes good = read_all(dir / "good.gz");
  REQUIRE(good.size() > 100);

  SECTION("damaged checksum") {
    bytes b = good;
    b[b.size() - 6] ^= 0xFF;  // inside the CRC-32 of the trailer
    write_plain(dir / "bad.gz", b);
    CHECK_THAT(read_error(dir / "bad.gz"), Contains((dir / "bad.gz").string()) &&
                                               Contains("corrupt gzip stream") &&
                                               Contains("incorrect data check"));
  }
  SECTION("damaged deflate data") {
    bytes b = good;
    for (std::size_t i = 12; i < 40; ++i) b[i] = 0xFF;
    write_plain(dir / "bad.gz", b);
    const std::string m = read_error(dir / "bad.gz");
    CHECK_THAT(m, Contains((dir / "bad.gz").string()) && Contains("corrupt gzip stream"));
    CAPTURE(m);
  }
  SECTION("stream cut short") {
    const bytes b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2));
    write_plain(dir / "cut.gz", b);
    CHECK_THAT(read_error(dir / "cut.gz"), Contains((dir / "cut.gz").string()) &&
                                               Contains("corrupt gzip stream") &&
                                               Contains("unexpected end of file"));
  }
  SECTION("the message names the file only once") {
    bytes b = good;
    b[b.size() - 6] ^= 0xFF;
    write_plain(dir / "bad.gz", b);
    const std::string m = read_error(dir / "bad.gz");
    const std::string name = (dir / "bad.gz").string();
    CHECK(m.find(name) != std::string::npos);
    CHECK(m.find(name, m.find(name) + 1) == std::string::npos);
  }
}

TEST_CASE("idx_array helpers check their inputs", "[data][idx][errors]") {
  data::idx_array a{{2, 2}, data::idx_short, bytes(3)};
  CHECK_THROWS_AS(a.to_tensor<float>(), trainkit::value_error);
  a.bytes.resize(8);
  CHECK_NOTHROW(a.to_tensor<float>());
  CHECK_THROWS_AS(a.get<float>(4), trainkit::index_error);
  a.type = 0x42;
  CHECK_THROWS_WITH(a.to_tensor<float>(), Contains("0x42"));
  CHECK(data::idx_type_name(data::idx_float) == "float");
  CHECK(data::idx_element_size(data::idx_double) == 8);
  CHECK(data::idx_element_size(0x01) == 0);
}
