// tests/monitor/test_tensorboard.cpp - TensorBoard event files: CRC32C against published vectors,
// the files read back by an independent reader (TFRecord framing, both checksums recomputed
// bit by bit, the protobuf fields decoded), the tags of the standard training metrics, and
// run_monitor's tensorboard_dir. The hidden case "[.python]" writes known values into
// $TRAINKIT_TENSORBOARD_DIR for tests/monitor/read_tensorboard.py, which reads them with the real
// TensorBoard (ctest monitor_tensorboard_python).
#include <bit>  // std::bit_cast: the fixed32/fixed64 fields
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "trainkit/monitor/monitor.hpp"

using namespace trainkit;

namespace {

// --- an independent reader ---------------------------------------------------------------------

/// CRC32C bit by bit (no table), the reference the library's table-driven version must match.
std::uint32_t crc32c_bitwise(const std::string& s) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}
std::uint32_t mask(std::uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

std::uint64_t little_endian(const std::string& s, std::size_t at, int n) {
  if (at + static_cast<std::size_t>(n) > s.size()) throw std::runtime_error("truncated");
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

/// The records of a TFRecord file; throws on a bad length, a truncated record or a CRC mismatch.
std::vector<std::string> read_records(const std::filesystem::path& p) {
  const auto bytes = io_test::read_all(p);
  const std::string s(bytes.begin(), bytes.end());
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::uint64_t len = little_endian(s, at, 8);
    if (little_endian(s, at + 8, 4) != mask(crc32c_bitwise(s.substr(at, 8))))
      throw std::runtime_error("length CRC mismatch");
    if (at + 12 + len + 4 > s.size()) throw std::runtime_error("truncated record");
    std::string data = s.substr(at + 12, len);
    if (little_endian(s, at + 12 + len, 4) != mask(crc32c_bitwise(data)))
      throw std::runtime_error("data CRC mismatch");
    out.push_back(std::move(data));
    at += 12 + len + 4;
  }
  return out;
}

/// A protobuf message as (field, wire type, value) triples: varint and fixed values in `number`,
/// length-delimited ones in `bytes`.
struct field {
  std::uint32_t number, wire_type;
  std::uint64_t value = 0;
  std::string bytes;
};
std::vector<field> decode(const std::string& m) {
  std::size_t at = 0;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= m.size() || shift > 63) throw std::runtime_error("bad varint");
      const auto b = static_cast<unsigned char>(m[at++]);
      v |= std::uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
  };
  std::vector<field> out;
  while (at < m.size()) {
    const std::uint64_t key = varint();
    field f{static_cast<std::uint32_t>(key >> 3), static_cast<std::uint32_t>(key & 7), 0, {}};
    switch (f.wire_type) {
      case 0:
        f.value = varint();
        break;
      case 1:
        f.value = little_endian(m, at, 8);
        at += 8;
        break;
      case 5:
        f.value = little_endian(m, at, 4);
        at += 4;
        break;
      case 2: {
        const std::uint64_t n = varint();
        if (at + n > m.size()) throw std::runtime_error("bad length");
        f.bytes = m.substr(at, n);
        at += n;
        break;
      }
      default:
        throw std::runtime_error("unexpected wire type " + std::to_string(f.wire_type));
    }
    out.push_back(std::move(f));
  }
  return out;
}

struct event {
  double wall_time = NAN;
  std::int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;  // (tag, simple_value)
};
event parse_event(const std::string& rec) {
  event e;
  for (const auto& f : decode(rec)) {
    if (f.number == 1 && f.wire_type == 1)
      e.wall_time = std::bit_cast<double>(f.value);
    else if (f.number == 2 && f.wire_type == 0)
      e.step = static_cast<std::int64_t>(f.value);
    else if (f.number == 3 && f.wire_type == 2)
      e.file_version = f.bytes;
    else if (f.number == 5 && f.wire_type == 2) {
      for (const auto& v : decode(f.bytes)) {  // Summary.value
        REQUIRE((v.number == 1 && v.wire_type == 2));
        std::string tag;
        std::optional<float> x;
        for (const auto& vf : decode(v.bytes)) {
          if (vf.number == 1 && vf.wire_type == 2)
            tag = vf.bytes;
          else if (vf.number == 2 && vf.wire_type == 5)
            x = std::bit_cast<float>(static_cast<std::uint32_t>(vf.value));
          else
            FAIL("unexpected Summary.Value field " << vf.number);
        }
        REQUIRE(x.has_value());
        e.values.emplace_back(tag, *x);
      }
    } else {
      FAIL("unexpected Event field " << f.number << " wire type " << f.wire_type);
    }
  }
  return e;
}
std::vector<event> read_events(const std::filesystem::path& p) {
  std::vector<event> out;
  for (const auto& r : read_records(p)) out.push_back(parse_event(r));
  return out;
}
std::filesystem::path only_event_file(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  return files.front();
}
/// The value of tag at step in events; nullopt when absent.
std::optional<float> value_of(const std::vector<event>& events, const std::string& tag, std::int64_t step) {
  for (const auto& e : events)
    for (const auto& [t, v] : e.values)
      if (t == tag && e.step == step) return v;
  return std::nullopt;
}

}  // namespace

// --- the tests -----------------------------------------------------------------------------------

static_assert(monitor::crc32c("123456789") == 0xE3069283u, "the CRC-32C check value");

TEST_CASE("CRC32C and its TFRecord mask match published values", "[monitor][tensorboard]") {
  REQUIRE(monitor::crc32c("123456789") == 0xE3069283u);
  REQUIRE(monitor::crc32c("") == 0u);
  // RFC 3720 (iSCSI) B.4 vectors.
  std::string ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  REQUIRE(monitor::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  REQUIRE(monitor::crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  REQUIRE(monitor::crc32c(ascending) == 0x46DD794Eu);
  REQUIRE(monitor::crc32c(descending) == 0x113FDB5Cu);
  // Continuing a CRC over a second piece equals the CRC of the whole.
  REQUIRE(monitor::crc32c("56789", monitor::crc32c("1234")) == 0xE3069283u);
  // Masked values as TensorFlow's (and TensorBoard's) masked_crc32c computes them.
  REQUIRE(monitor::masked_crc32c("123456789") == 0xC78AB0E5u);
  REQUIRE(monitor::masked_crc32c("") == 0xA282EAD8u);
  REQUIRE(monitor::masked_crc32c(std::string(8, '\0')) ==
          0x07980329u);  // the length field of an empty record
  for (const std::string s : {"", "a", "brain.Event:2", "123456789"}) {
    REQUIRE(monitor::crc32c(s) == crc32c_bitwise(s));
    REQUIRE(monitor::masked_crc32c(s) == mask(crc32c_bitwise(s)));
  }
  const std::string r = monitor::tfrecord("abc");
  REQUIRE(r.size() == 8 + 4 + 3 + 4);
  REQUIRE(r.substr(12, 3) == "abc");
  REQUIRE(little_endian(r, 0, 8) == 3);
}

TEST_CASE("tensorboard_writer: the event file reads back", "[monitor][tensorboard]") {
  const auto dir = io_test::fresh_dir("tensorboard_writer") / "nested" / "run";  // created by the writer
  std::filesystem::path file;
  {
    monitor::tensorboard_writer w(dir);
    file = w.path();
    REQUIRE(file.parent_path() == dir);
    const std::string name = file.filename().string();
    REQUIRE(name.starts_with("events.out.tfevents."));
    // events.out.tfevents.<seconds>.<host>.<pid>.<n>: the seconds are now
    const auto secs = std::stoll(name.substr(std::strlen("events.out.tfevents.")));
    REQUIRE(std::abs(double(secs) - monitor::detail::unix_seconds()) < 60);

    // The file_version record is on disk at once (a live TensorBoard opens the file early).
    const auto head = read_events(file);
    REQUIRE(head.size() == 1);
    REQUIRE(head[0].file_version == "brain.Event:2");
    REQUIRE(std::abs(head[0].wall_time - monitor::detail::unix_seconds()) < 60);

    w.add_scalar("train/loss", 0.5, 1, 1700000000.25);
    w.add_scalar("train/loss", -3.25, 2, 1700000001.5);
    w.add_scalar("a tag/with spaces", 1e30, std::int64_t{1} << 40, 1700000002.0);  // a 6-byte varint
    w.add_scalar("nan", std::nan(""), 3, 1700000003.0);
    w.flush();
    const auto ev = read_events(file);  // before the writer is gone: flush() made them visible
    REQUIRE(ev.size() == 5);
    REQUIRE(ev[1].step == 1);
    REQUIRE(ev[1].wall_time == 1700000000.25);
    REQUIRE(ev[1].values == std::vector<std::pair<std::string, float>>{{"train/loss", 0.5f}});
    REQUIRE(ev[1].file_version.empty());
    REQUIRE(ev[2].values == std::vector<std::pair<std::string, float>>{{"train/loss", -3.25f}});
    REQUIRE(ev[3].step == std::int64_t{1} << 40);
    REQUIRE(ev[3].values[0].first == "a tag/with spaces");
    REQUIRE(ev[3].values[0].second == 1e30f);
    REQUIRE(std::isnan(ev[4].values[0].second));

    w.add_scalar("late", 7, 4);  // left to the destructor
  }
  const auto ev = read_events(file);
  REQUIRE(ev.size() == 6);
  REQUIRE(value_of(ev, "late", 4) == 7.0f);
  REQUIRE(std::abs(ev[5].wall_time - monitor::detail::unix_seconds()) < 60);  // the default: now

  // The reader is able to fail: one flipped byte in the last record's data is a CRC mismatch.
  io_test::corrupt_byte(file, std::filesystem::file_size(file) - 6);
  REQUIRE_THROWS_WITH(read_records(file), "data CRC mismatch");
}

TEST_CASE("tensorboard_writer: two writers in one directory get two files", "[monitor][tensorboard]") {
  const auto dir = io_test::fresh_dir("tensorboard_two");
  monitor::tensorboard_writer a(dir), b(dir);
  REQUIRE(a.path() != b.path());
  REQUIRE(io_test::count_files_with(dir, "events.out.tfevents.") == 2);
}

TEST_CASE("tensorboard_writer: a directory that cannot be created is an io_error", "[monitor][tensorboard]") {
  const auto dir = io_test::fresh_dir("tensorboard_bad");
  io_test::write_all(dir / "file", {'x'});
  REQUIRE_THROWS_AS(monitor::tensorboard_writer(dir / "file" / "run"), io_error);
}

TEST_CASE("tensorboard_tag: readable tags for the standard families", "[monitor][tensorboard]") {
  REQUIRE(monitor::tensorboard_tag("trainkit_loss") == "train/loss");
  REQUIRE(monitor::tensorboard_tag("trainkit_learning_rate") == "train/learning_rate");
  REQUIRE(monitor::tensorboard_tag("trainkit_loss_scale") == "train/loss_scale");
  REQUIRE(monitor::tensorboard_tag("trainkit_steps_total") == "train/steps");
  REQUIRE(monitor::tensorboard_tag("trainkit_samples_per_second") == "perf/samples_per_second");
  REQUIRE(monitor::tensorboard_tag("trainkit_step_duration_seconds") == "perf/step_seconds");
  REQUIRE(monitor::tensorboard_tag("trainkit_communication_time_ratio") == "comm/time_ratio");
  REQUIRE(monitor::tensorboard_tag("trainkit_memory_peak_bytes", {{"device", "cpu"}}) ==
          "memory/peak_bytes/device=cpu");
  REQUIRE(monitor::tensorboard_tag("trainkit_gpu_temperature_celsius", {{"gpu", "0"}}) ==
          "gpu/temperature_celsius/gpu=0");
  REQUIRE(monitor::tensorboard_tag("trainkit_grad_norm") == "train/grad_norm");  // a future family
  REQUIRE(monitor::tensorboard_tag("trainkit_tokens_total") == "train/tokens");
  REQUIRE(monitor::tensorboard_tag("myjob_eval_loss", {{"a", "1"}, {"b", "x"}}) == "myjob_eval_loss/a=1/b=x");
}

TEST_CASE("tensorboard_logger: every metric of the registry as a scalar", "[monitor][tensorboard]") {
  const auto dir = io_test::fresh_dir("tensorboard_logger");
  monitor::registry reg;
  monitor::training_metrics metrics(reg, {.gpu = false});
  reg.gauge("myjob_accuracy", "Accuracy.", {{"split", "test"}}).set(0.75);
  monitor::tensorboard_logger tb(dir);

  metrics.observe({.seconds = 0.5, .samples = 32, .loss = 2.0, .learning_rate = 0.1});
  metrics.observe(
      {.seconds = 0.25, .samples = 32, .loss = 1.5, .learning_rate = 0.05, .communication_seconds = 0.05});
  metrics.set_epoch(1);
  tb.log(reg, 2);
  auto ev = read_events(only_event_file(dir));  // flushed by log()
  REQUIRE(value_of(ev, "train/loss", 2) == 1.5f);
  REQUIRE(value_of(ev, "train/learning_rate", 2) == 0.05f);
  REQUIRE(value_of(ev, "train/loss_scale", 2) == 1.0f);
  REQUIRE(value_of(ev, "train/steps", 2) == 2.0f);
  REQUIRE(value_of(ev, "train/samples", 2) == 64.0f);
  REQUIRE(value_of(ev, "train/epoch", 2) == 1.0f);
  REQUIRE(value_of(ev, "train/skipped_steps", 2) == 0.0f);
  REQUIRE(value_of(ev, "perf/samples_per_second", 2) == 128.0f);
  REQUIRE(value_of(ev, "perf/step_seconds", 2) == 0.375f);  // mean of 0.5 and 0.25
  REQUIRE(value_of(ev, "comm/seconds", 2) == Approx(0.05));
  REQUIRE(value_of(ev, "comm/time_ratio", 2) == Approx(0.2));
  REQUIRE(value_of(ev, "comm/bytes_sent", 2) == 0.0f);
  REQUIRE(value_of(ev, "perf/data_wait_seconds", 2) == 0.0f);
  REQUIRE(value_of(ev, "memory/allocated_bytes/device=cpu", 2).has_value());
  REQUIRE(value_of(ev, "memory/peak_bytes/device=cpu", 2).has_value());
  REQUIRE(value_of(ev, "myjob_accuracy/split=test", 2) == 0.75f);

  // The histogram reports the mean of the interval; an interval without steps writes none.
  metrics.observe({.seconds = 1.0, .samples = 32, .loss = 1.0});
  tb.log(reg, 3);
  tb.log(reg, 4);
  ev = read_events(only_event_file(dir));
  REQUIRE(value_of(ev, "perf/step_seconds", 3) == 1.0f);
  REQUIRE_FALSE(value_of(ev, "perf/step_seconds", 4).has_value());
  REQUIRE(value_of(ev, "train/loss", 4) == 1.0f);
  REQUIRE(value_of(ev, "train/steps", 4) == 3.0f);
  // Each call is one step for every tag: steps never go back within a tag.
  for (const auto& e : ev)
    if (!e.values.empty()) REQUIRE((e.step >= 2 && e.step <= 4));
}

TEST_CASE("run_monitor: tensorboard_dir", "[monitor][tensorboard]") {
  const auto dir = io_test::fresh_dir("tensorboard_run_monitor");
  monitor::basic_run_monitor<> mon({.tensorboard_dir = (dir / "tb").string(), .gpu = false});
  REQUIRE(mon.tensorboard() != nullptr);
  mon.metrics().observe({.seconds = 0.1, .samples = 8, .loss = 0.25});
  mon.log(10, 1);
  mon.tensorboard()->add_scalar("eval/accuracy", 0.5, 10);
  mon.tensorboard()->flush();
  const auto ev = read_events(only_event_file(dir / "tb"));
  REQUIRE(value_of(ev, "train/loss", 10) == 0.25f);
  REQUIRE(value_of(ev, "train/epoch", 10) == 1.0f);
  REQUIRE(value_of(ev, "eval/accuracy", 10) == 0.5f);

  monitor::basic_run_monitor<> off({.gpu = false});
  REQUIRE(off.tensorboard() == nullptr);
  off.log(1, 1);  // nothing to write, no error
}

// Known values for tests/monitor/read_tensorboard.py --known DIR (run by ctest
// monitor_tensorboard_python): DIR/writer has test/sine = sin(0.5 step) at steps 0..9 with
// wall_time 1700000000 + step, and test/constant = 0.25 at steps 0, 5; DIR/logger has the
// training metrics of three steps with loss 1/step, logged at steps 1, 2, 3.
TEST_CASE("write known values for the TensorBoard reader", "[.python]") {
  const char* env = std::getenv("TRAINKIT_TENSORBOARD_DIR");
  if (env == nullptr || *env == '\0') FAIL("set TRAINKIT_TENSORBOARD_DIR to the directory to write");
  const std::filesystem::path dir(env);
  std::filesystem::remove_all(dir);
  {
    monitor::tensorboard_writer w(dir / "writer");
    for (int step = 0; step < 10; ++step) {
      w.add_scalar("test/sine", std::sin(0.5 * step), step, 1700000000.0 + step);
      if (step % 5 == 0) w.add_scalar("test/constant", 0.25, step, 1700000000.0 + step);
    }
  }
  monitor::registry reg;
  monitor::training_metrics metrics(reg, {.gpu = false});
  monitor::tensorboard_logger tb(dir / "logger");
  for (int step = 1; step <= 3; ++step) {
    metrics.observe(
        {.seconds = 0.125 * step, .samples = 16, .loss = 1.0 / step, .learning_rate = 0.01 * step});
    metrics.set_epoch(step);
    tb.log(reg, step);
  }
}
