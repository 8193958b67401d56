// tests/io/test_snapshot.cpp - the snapshot format: round trips of every record kind and dtype,
// clear errors for wrong magic/version, truncation, corruption and mismatched reads, the atomic
// write (a failure midway - injected, or a real write error from RLIMIT_FSIZE - never destroys the
// previous file), and the snapshot directory: keep the last K, fall back past damaged files.
#include <sys/resource.h>  // setrlimit(RLIMIT_FSIZE): a real failing write

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/io/io.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

io::snapshot sample_snapshot(float base = 1.0f) {
  io::snapshot s;
  auto& m = s.add_section("model");
  m.put_tensor("w", tensor<float>::from_vector({base, 2, 3, 4, 5, 6}, {2, 3}));
  m.put_tensor("scalar", tensor<double>::scalar(0.125));
  m.put_tensor("empty", tensor<float>::empty({0, 4}));
  auto& misc = s.add_section("misc");
  misc.put_int("step", 1234)
      .put_int("neg", -5)
      .put_real("lr", 0.1)
      .put_string("name", std::string("run\0x", 5));
  misc.put_int("u64max", static_cast<std::int64_t>(std::numeric_limits<std::uint64_t>::max()));
  return s;
}

template <class T>
std::vector<T> values_of(const tensor<T>& t) {
  return t.to_vector();
}

}  // namespace

TEST_CASE("snapshot round trip of every record kind and dtype", "[io][snapshot]") {
  const auto dir = io_test::fresh_dir("snapshot_roundtrip");
  io::snapshot s = sample_snapshot();
  auto& d = s.add_section("dtypes");
  d.put_tensor("f16", tensor<half>::from_vector({half(1.5f), half(-2.0f)}, {2}));
  d.put_tensor("bf16", tensor<trainkit::bfloat16>::from_vector({trainkit::bfloat16(3.0f)}, {1}));
  d.put_tensor("i8", tensor<std::int8_t>::from_vector({-1, 2}, {2}));
  d.put_tensor("u8", tensor<std::uint8_t>::from_vector({255}, {1}));
  d.put_tensor("i16", tensor<std::int16_t>::from_vector({-300}, {1}));
  d.put_tensor("i32", tensor<std::int32_t>::from_vector({70000}, {1}));
  d.put_tensor("i64", tensor<std::int64_t>::from_vector({-(std::int64_t(1) << 40)}, {1}));
  // A non-contiguous view is stored as its elements in row-major order.
  auto base = tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  d.put_tensor("transposed", base.t());

  const fs::path p = dir / "a.tks";
  s.write(p);
  io::snapshot r = io::snapshot::read(p);
  REQUIRE(r.section_names() == std::vector<std::string>{"model", "misc", "dtypes"});
  REQUIRE(r.source() == p.string());
  const auto& m = r.section("model");
  REQUIRE(m.names() == std::vector<std::string>{"w", "scalar", "empty"});
  REQUIRE(values_of(m.get_tensor<float>("w", {2, 3})) == std::vector<float>{1, 2, 3, 4, 5, 6});
  REQUIRE(m.get_tensor<double>("scalar").dim() == 0);
  REQUIRE(m.get_tensor<double>("scalar").item() == 0.125);
  REQUIRE(m.get_tensor<float>("empty").sizes() == shape{0, 4});
  const auto& misc = r.section("misc");
  REQUIRE(misc.get_int("step") == 1234);
  REQUIRE(misc.get_int("neg") == -5);
  REQUIRE(misc.get_real("lr") == 0.1);
  REQUIRE(misc.get_string("name") == std::string("run\0x", 5));
  REQUIRE(static_cast<std::uint64_t>(misc.get_int("u64max")) == std::numeric_limits<std::uint64_t>::max());
  const auto& rd = r.section("dtypes");
  REQUIRE(float(rd.get_tensor<half>("f16").to_vector()[1]) == -2.0f);
  REQUIRE(float(rd.get_tensor<trainkit::bfloat16>("bf16").item()) == 3.0f);
  REQUIRE(rd.get_tensor<std::int8_t>("i8").to_vector() == std::vector<std::int8_t>{-1, 2});
  REQUIRE(rd.get_tensor<std::uint8_t>("u8").item() == 255);
  REQUIRE(rd.get_tensor<std::int16_t>("i16").item() == -300);
  REQUIRE(rd.get_tensor<std::int32_t>("i32").item() == 70000);
  REQUIRE(rd.get_tensor<std::int64_t>("i64").item() == -(std::int64_t(1) << 40));
  REQUIRE(values_of(rd.get_tensor<float>("transposed", {3, 2})) == std::vector<float>{1, 4, 2, 5, 3, 6});
  REQUIRE(rd.info("transposed").dtype == io::dtype_code::float32);

  // The file image is exactly what to_bytes() gives, and it parses from memory too.
  const auto image = s.to_bytes();
  const auto disk = io_test::read_all(p);
  REQUIRE(image.size() == disk.size());
  REQUIRE(std::memcmp(image.data(), disk.data(), disk.size()) == 0);
  REQUIRE(io::snapshot::from_bytes(image).section("misc").get_int("step") == 1234);
  // The header is the documented one.
  REQUIRE(static_cast<unsigned char>(disk[0]) == 0x89);
  REQUIRE(std::string(disk.data() + 1, 7) == "TKSNAP\n");
  REQUIRE(disk[8] == 1);
  // No temporary file is left behind.
  REQUIRE(io_test::count_files_with(dir, io::temp_file_marker.data()) == 0);
}

TEST_CASE("snapshot reads name the record, section, file and offset", "[io][snapshot]") {
  const auto dir = io_test::fresh_dir("snapshot_errors");
  const fs::path p = dir / "a.tks";
  sample_snapshot().write(p);
  io::snapshot r = io::snapshot::read(p);
  const auto& m = r.section("model");
  const std::string off = std::to_string(m.info("w").file_offset);
  REQUIRE(m.info("w").file_offset > io::snapshot_header_size);
  REQUIRE_THROWS_WITH(m.get_tensor<double>("w"), Contains("record 'w' of section 'model'") &&
                                                     Contains(p.string()) && Contains("byte offset " + off) &&
                                                     Contains("float32") && Contains("float64"));
  REQUIRE_THROWS_WITH(m.get_tensor<float>("w", {3, 2}), Contains("has shape [2, 3], expected [3, 2]"));
  REQUIRE_THROWS_WITH(r.section("misc").get_real("step"), Contains("is an integer, read as a real"));
  REQUIRE_THROWS_WITH(m.get_int("nope"), Contains("no record 'nope'") && Contains("'w', 'scalar', 'empty'"));
  REQUIRE_THROWS_WITH(r.section("optimizer"), Contains("no section 'optimizer'") && Contains(p.string()));
  REQUIRE_THROWS_AS(m.get_tensor<double>("w"), io_error);

  io::snapshot b;
  auto& s = b.add_section("x");
  s.put_int("a", 1);
  REQUIRE_THROWS_AS(s.put_real("a", 2.0), usage_error);
  REQUIRE_THROWS_AS(b.add_section("x"), usage_error);
  REQUIRE_THROWS_AS(s.put_tensor("u", tensor<float>()), usage_error);
}

TEST_CASE("damaged snapshot files are rejected with file and offset", "[io][snapshot]") {
  const auto dir = io_test::fresh_dir("snapshot_damage");
  const fs::path good = dir / "good.tks";
  sample_snapshot().write(good);
  const auto bytes = io_test::read_all(good);
  const fs::path p = dir / "bad.tks";

  SECTION("wrong magic") {
    auto b = bytes;
    b[1] = 'X';
    io_test::write_all(p, b);
    REQUIRE_THROWS_WITH(io::snapshot::read(p),
                        Contains("wrong magic") && Contains(p.string()) && Contains("offset 0"));
  }
  SECTION("not a snapshot at all, and an empty file") {
    io_test::write_all(p, {'h', 'e', 'l', 'l', 'o'});
    REQUIRE_THROWS_WITH(io::snapshot::read(p), Contains("wrong magic"));
    io_test::write_all(p, {});
    REQUIRE_THROWS_WITH(io::snapshot::read(p), Contains("truncated"));
  }
  SECTION("truncated in the header and in the payload") {
    io_test::write_all(p, bytes);
    io_test::truncate_to(p, 20);
    REQUIRE_THROWS_WITH(io::snapshot::read(p), Contains("truncated") && Contains("offset 20"));
    io_test::write_all(p, bytes);
    io_test::truncate_to(p, bytes.size() - 3);
    REQUIRE_THROWS_WITH(io::snapshot::read(p),
                        Contains("truncated") && Contains("offset " + std::to_string(bytes.size() - 3)));
  }
  SECTION("trailing bytes") {
    auto b = bytes;
    b.push_back(0);
    io_test::write_all(p, b);
    REQUIRE_THROWS_WITH(io::snapshot::read(p), Contains("unexpected bytes after the payload"));
  }
  SECTION("a flipped payload byte fails the checksum") {
    io_test::write_all(p, bytes);
    io_test::corrupt_byte(p, bytes.size() - 10);
    REQUIRE_THROWS_WITH(io::snapshot::read(p), Contains("payload checksum mismatch") && Contains(p.string()));
  }
  SECTION("a flipped header byte fails the header checksum") {
    io_test::write_all(p, bytes);
    io_test::corrupt_byte(p, 17);
    REQUIRE_THROWS_WITH(io::snapshot::read(p), Contains("header checksum"));
  }
  SECTION("another format version") {
    auto b = bytes;
    b[8] = 2;
    // Recompute the header checksum so that only the version is wrong.
    const auto h = io::detail::crc32_update(0, b.data(), 28);
    std::memcpy(b.data() + 28, &h, 4);
    io_test::write_all(p, b);
    REQUIRE_THROWS_WITH(io::snapshot::read(p), Contains("format version 2") && Contains("offset 8"));
  }
  SECTION("a missing file") {
    REQUIRE_THROWS_WITH(io::snapshot::read(dir / "none.tks"), Contains("cannot open"));
  }
}

namespace {
/// A snapshot image from hex, its header (payload size, both checksums) made valid, so that only
/// the record itself is wrong - the shape the fuzzer (tests/fuzz/fuzz_snapshot.cpp) found them in.
std::vector<std::byte> sealed(const std::string& hex) {
  std::vector<std::byte> b;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    b.push_back(static_cast<std::byte>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  const auto* data = reinterpret_cast<const unsigned char*>(b.data());
  const std::size_t payload = b.size() - io::snapshot_header_size;
  const auto header =
      io::detail::make_header(payload, io::detail::crc32_update(0, data + io::snapshot_header_size, payload));
  std::memcpy(b.data(), header.data(), header.size());
  return b;
}
}  // namespace

TEST_CASE("snapshot records the fuzzer found are rejected at decode, not read out of bounds", "[io][snapshot]") {
  SECTION("sizes [2^40, 2^40, 0]: empty, but numel() would overflow int64 (UBSan)") {
    const auto b = sealed(
        "89544b534e41500a010000000000000038000000000000003a98a70c3cc08ff5010000000100000073010000000101"
        "0000007401030000000000000000010000000000000001000000000000000000000000000000000000");
    REQUIRE_THROWS_WITH(io::snapshot::from_bytes(b), Contains("tensor 't'") && Contains("product overflows"));
  }
  SECTION("int64 sizes [2^61 + 1] with 8 bytes: the byte count wrapped modulo 2^64 (ASan overflow)") {
    const auto b = sealed(
        "89544b534e41500a01000000000000003000000000000000cc7a69888e464445010000000100000073010000000101"
        "000000740901000000010000000000002008000000000000000707070707070707");
    REQUIRE_THROWS_WITH(io::snapshot::from_bytes(b), Contains("tensor 't'") && Contains("product overflows"));
  }
  SECTION("a bool tensor holding the byte 2 (reading it is undefined behaviour)") {
    const auto b = sealed(
        "89544b534e41500a010000000000000029000000000000005941df3f15a5cf91010000000100000073010000000101"
        "000000620a010000000100000000000000010000000000000002");
    REQUIRE_THROWS_WITH(io::snapshot::from_bytes(b), Contains("bool tensor 'b'") && Contains("byte 2"));
  }
}

TEST_CASE("a save that fails midway leaves the previous snapshot intact", "[io][snapshot][atomic]") {
  const auto dir = io_test::fresh_dir("snapshot_atomic");
  const fs::path p = dir / "s.tks";
  sample_snapshot(1.0f).write(p);
  const auto before = io_test::read_all(p);

  SECTION("an exception from the writer hook (disk full, injected)") {
    io::write_options o;
    o.before_write = [](std::uint64_t offset, std::size_t) {
      if (offset >= io::snapshot_header_size) throw io_error("injected: No space left on device");
    };
    REQUIRE_THROWS_WITH(sample_snapshot(9.0f).write(p, o), Contains("injected"));
  }
  SECTION("a real failing write(2): the file size limit (EFBIG)") {
    // RLIMIT_FSIZE makes write(2) past the limit fail (SIGXFSZ is ignored so that it is an
    // error, not a kill) - the same path as ENOSPC on a full disk.
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto previous = std::signal(SIGXFSZ, SIG_IGN);
    rlimit small = old;
    small.rlim_cur = 64;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    io::snapshot big;
    big.add_section("model").put_tensor("w", tensor<float>::zeros({1000}));
    bool threw = false;
    std::string what;
    try {
      big.write(p);
    } catch (const io_error& e) {
      threw = true;
      what = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, previous);
    REQUIRE(threw);
    REQUIRE_THAT(what, Contains("failed at byte offset") && Contains("File too large"));
  }
  SECTION("an unwritable target directory") {
    REQUIRE_THROWS_WITH(sample_snapshot().write(dir / "no" / "such" / "dir" / "s.tks"),
                        Contains("cannot create"));
  }
  REQUIRE(io_test::read_all(p) == before);
  REQUIRE(io::snapshot::read(p).section("model").get_tensor<float>("w").to_vector()[0] == 1.0f);
  REQUIRE(io_test::count_files_with(dir, io::temp_file_marker.data()) == 0);
}

TEST_CASE("snapshot_manager keeps the last K and falls back past damaged files", "[io][manager]") {
  const auto dir = io_test::fresh_dir("snapshot_manager");
  std::vector<std::string> log;
  io::snapshot_manager mgr(dir, {.keep_last = 3, .log = [&](std::string_view m) { log.emplace_back(m); }});
  REQUIRE(!mgr.latest());
  REQUIRE(!mgr.load_latest());
  for (std::int64_t step : {10, 20, 30, 40, 50}) {
    io::snapshot s;
    s.add_section("progress").put_int("step", step);
    const auto path = mgr.save(step, s);
    REQUIRE(path == mgr.path_for(step));
    REQUIRE(path.filename().string() ==
            "snapshot-" + std::string(12 - std::to_string(step).size(), '0') + std::to_string(step) + ".tks");
  }
  auto l = mgr.list();
  REQUIRE(l.size() == 3);
  REQUIRE(l[0].step == 30);
  REQUIRE(l[2].step == 50);
  REQUIRE(mgr.latest()->step == 50);
  auto got = mgr.load_latest();
  REQUIRE(got);
  REQUIRE(got->from.step == 50);
  REQUIRE(got->rejected.empty());

  // Other files in the directory are ignored; a leftover temporary is cleaned by the next prune.
  io_test::write_all(dir / "notes.txt", {'x'});
  io_test::write_all(dir / ".snapshot-000000000060.tks.tmp-1-0", {'x'});
  mgr.prune();
  REQUIRE(fs::exists(dir / "notes.txt"));
  REQUIRE(io_test::count_files_with(dir, io::temp_file_marker.data()) == 0);

  SECTION("a corrupted newest snapshot: the previous one is used, and the log says so") {
    io_test::corrupt_byte(mgr.path_for(50), 40);
    auto g = mgr.load_latest();
    REQUIRE(g);
    REQUIRE(g->from.step == 40);
    REQUIRE(g->snap.section("progress").get_int("step") == 40);
    REQUIRE(g->rejected.size() == 1);
    REQUIRE_THAT(g->rejected[0], Contains("checksum mismatch") && Contains(mgr.path_for(50).string()));
    REQUIRE(!log.empty());
    REQUIRE_THAT(log.back(), Contains("falling back to") && Contains(mgr.path_for(40).string()));
  }
  SECTION("truncated newest two: the third is used") {
    io_test::truncate_to(mgr.path_for(50), 10);
    io_test::truncate_to(mgr.path_for(40), 100);
    auto g = mgr.load_latest();
    REQUIRE(g);
    REQUIRE(g->from.step == 30);
    REQUIRE(g->rejected.size() == 2);
  }
  SECTION("all damaged: nothing to load") {
    for (auto& e : mgr.list()) io_test::truncate_to(e.path, 5);
    REQUIRE(!mgr.load_latest());
    REQUIRE_THAT(log.back(), Contains("no usable snapshot"));
  }
  SECTION("a failed save keeps every earlier snapshot") {
    io::snapshot_manager failing(dir,
                                 {.keep_last = 3, .write = {.before_write = [](std::uint64_t o, std::size_t) {
                                                    if (o > 0) throw io_error("injected: disk full");
                                                  }}});
    io::snapshot s;
    s.add_section("progress").put_int("step", 60);
    REQUIRE_THROWS_AS(failing.save(60, s), io_error);
    REQUIRE(mgr.list().size() == 3);
    REQUIRE(mgr.load_latest()->from.step == 50);
  }
  SECTION("ranks other than 0 do not write") {
    io::snapshot_manager r1(dir, {.keep_last = 3, .rank = 1});
    io::snapshot s;
    s.add_section("progress").put_int("step", 70);
    r1.save(70, s);
    REQUIRE(mgr.latest()->step == 50);
    REQUIRE(r1.load_latest()->from.step == 50);  // but they read
  }
  REQUIRE_THROWS_AS(io::snapshot_manager(dir, 0), value_error);
}
