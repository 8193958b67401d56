// trainkit/monitor/tensorboard.hpp - TensorBoard event files written natively: TFRecord framing
// with masked CRC32C, and the few fields of tensorflow.Event / Summary a scalar needs, encoded by
// hand (no protobuf or TensorFlow library).
//
//   monitor::tensorboard_writer w("runs/a");           // runs/a/events.out.tfevents.<s>.<host>.<pid>.<n>
//   w.add_scalar("eval/accuracy", 0.91, step);
//   w.flush();                                         // a live `tensorboard --logdir runs` sees it
//
//   monitor::tensorboard_logger tb("runs/a");          // every metric of a registry, as scalars
//   tb.log(reg, step);                                 // train/loss, train/learning_rate, ...
//
// The file format (what TensorFlow's tf.summary and PyTorch's SummaryWriter write):
//   record  = uint64 length (little endian), uint32 masked_crc32c(length bytes), data,
//             uint32 masked_crc32c(data);  masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8
//   Event   = { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5 }
//   Summary = { repeated Value value = 1 },  Value = { string tag = 1; float simple_value = 2 }
// The first record of a file carries file_version "brain.Event:2". Scalars are float32 in the
// format: a value such as a byte count above 2^24 is rounded to 7 significant digits.
#pragma once

#include <unistd.h>  // gethostname, getpid: the file name TensorBoard's writers use

#include <array>
#include <atomic>
#include <bit>  // std::bit_cast
#include <chrono>
#include <cstddef>
#include <cmath>    // std::isnan
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "trainkit/core/error.hpp"       // io_error, TRAINKIT_CHECK
#include "trainkit/monitor/metrics.hpp"  // registry, labels

namespace trainkit::monitor {

namespace detail {

/// The byte-at-a-time table of CRC32C (Castagnoli, reflected polynomial 0x82F63B78).
constexpr std::array<std::uint32_t, 256> make_crc32c_table() noexcept {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
inline constexpr std::array<std::uint32_t, 256> crc32c_table = make_crc32c_table();

/// A protocol-buffers encoder for the handful of wire types an Event uses (append-only).
class proto_writer {
 public:
  void varint(std::uint32_t field, std::uint64_t v) {
    key(field, 0);
    raw_varint(v);
  }
  void fixed64(std::uint32_t field, double v) {
    key(field, 1);
    little_endian(std::bit_cast<std::uint64_t>(v), 8);
  }
  void fixed32(std::uint32_t field, float v) {
    key(field, 5);
    little_endian(std::bit_cast<std::uint32_t>(v), 4);
  }
  /// A string, bytes or an embedded message (already encoded).
  void bytes(std::uint32_t field, std::string_view s) {
    key(field, 2);
    raw_varint(s.size());
    out_.append(s);
  }
  const std::string& str() const noexcept { return out_; }

 private:
  void key(std::uint32_t field, std::uint32_t wire_type) {
    raw_varint((std::uint64_t{field} << 3) | wire_type);
  }
  void raw_varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }
  void little_endian(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xFF);
  }

  std::string out_;
};

inline double unix_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace detail

/// CRC32C (Castagnoli) of s, continuing from crc (0 for a fresh checksum): crc32c("123456789")
/// is 0xE3069283.
constexpr std::uint32_t crc32c(std::string_view s, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
  for (char ch : s) crc = detail::crc32c_table[(crc ^ static_cast<unsigned char>(ch)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

/// The checksum a TFRecord stores: CRC32C rotated right by 15 bits plus a constant (so that the
/// CRC of data that itself embeds CRCs stays well distributed).
constexpr std::uint32_t masked_crc32c(std::string_view s) noexcept {
  const std::uint32_t c = crc32c(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/// One TFRecord: length, masked CRC of the length, data, masked CRC of the data.
inline std::string tfrecord(std::string_view data) {
  std::string r;
  r.reserve(data.size() + 16);
  auto put = [&r](std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) r += static_cast<char>((v >> (8 * i)) & 0xFF);
  };
  put(data.size(), 8);
  put(masked_crc32c(r), 4);  // r holds exactly the 8 length bytes here
  r.append(data);
  put(masked_crc32c(data), 4);
  return r;
}

/// Writes one TensorBoard event file in a directory (created if missing). Records are buffered;
/// flush() (or the destructor) makes them visible to a running TensorBoard. Not thread-safe: one
/// writer per thread, or a lock around it.
class tensorboard_writer {
 public:
  /// Creates dir and the file `events.out.tfevents.SECONDS.HOST.PID.N` in it (Unix seconds, host
  /// name, process id, a counter) and writes the file_version record. An io_error when either
  /// cannot be created.
  explicit tensorboard_writer(const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    TRAINKIT_CHECK(!ec && std::filesystem::is_directory(dir), io_error, "tensorboard_writer",
                   "cannot create the directory '" << dir.string() << "'" << (ec ? ": " + ec.message() : ""));
    path_ = dir / file_name();
    // The name is unique in this process (the counter), and the pid sets processes apart.
    file_.open(path_, std::ios::binary | std::ios::trunc);
    TRAINKIT_CHECK(file_.good(), io_error, "tensorboard_writer", "cannot create '" << path_.string() << "'");
    detail::proto_writer e;
    e.fixed64(1, detail::unix_seconds());
    e.bytes(3, "brain.Event:2");
    write_record(e.str());
    flush();
  }
  tensorboard_writer(const tensorboard_writer&) = delete;
  tensorboard_writer& operator=(const tensorboard_writer&) = delete;
  ~tensorboard_writer() {
    if (file_.is_open()) file_.flush();  // no throw from a destructor; flush() reports errors
  }

  /// Appends one scalar event (float32 in the file). wall_time: Unix seconds, now by default.
  void add_scalar(std::string_view tag, double value, std::int64_t step,
                  double wall_time = detail::unix_seconds()) {
    detail::proto_writer v;
    v.bytes(1, tag);
    v.fixed32(2, static_cast<float>(value));
    detail::proto_writer s;
    s.bytes(1, v.str());
    detail::proto_writer e;
    e.fixed64(1, wall_time);
    e.varint(2, static_cast<std::uint64_t>(step));  // int64: two's complement, as protobuf does
    e.bytes(5, s.str());
    write_record(e.str());
  }

  /// Hands the buffered records to the operating system (no fsync).
  void flush() {
    file_.flush();
    TRAINKIT_CHECK(file_.good(), io_error, "tensorboard_writer", "writing '" << path_.string() << "' failed");
  }

  /// The event file.
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  static std::string file_name() {
    static std::atomic<unsigned> counter{0};
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0')
      std::string_view("localhost").copy(host, 9);
    const auto secs =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    return "events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(getpid()) + "." +
           std::to_string(counter.fetch_add(1));
  }
  void write_record(std::string_view data) {
    const std::string r = tfrecord(data);
    file_.write(r.data(), static_cast<std::streamsize>(r.size()));
    TRAINKIT_CHECK(file_.good(), io_error, "tensorboard_writer", "writing '" << path_.string() << "' failed");
  }

  std::filesystem::path path_;
  std::ofstream file_;
};

/// The TensorBoard tag of a registry metric: the standard trainkit families by group
/// (train/loss, train/learning_rate, perf/samples_per_second, comm/time_ratio, memory/peak_bytes,
/// gpu/temperature_celsius ...; see docs/monitoring.md), another trainkit_X as train/X, any other
/// name as it is; "_total" is dropped from counters; labels follow as /name=value (in name order):
/// memory/allocated_bytes/device=cpu.
inline std::string tensorboard_tag(std::string_view name, const labels& label_set = {}) {
  static const std::map<std::string_view, std::string_view> standard = {
      {"trainkit_loss", "train/loss"},
      {"trainkit_learning_rate", "train/learning_rate"},
      {"trainkit_loss_scale", "train/loss_scale"},
      {"trainkit_epoch", "train/epoch"},
      {"trainkit_steps_total", "train/steps"},
      {"trainkit_samples_total", "train/samples"},
      {"trainkit_skipped_steps_total", "train/skipped_steps"},
      {"trainkit_samples_per_second", "perf/samples_per_second"},
      {"trainkit_step_duration_seconds", "perf/step_seconds"},
      {"trainkit_data_wait_seconds_total", "perf/data_wait_seconds"},
      {"trainkit_communication_seconds_total", "comm/seconds"},
      {"trainkit_communication_time_ratio", "comm/time_ratio"},
      {"trainkit_bytes_sent_total", "comm/bytes_sent"},
      {"trainkit_memory_allocated_bytes", "memory/allocated_bytes"},
      {"trainkit_memory_peak_bytes", "memory/peak_bytes"},
  };
  std::string tag;
  if (auto it = standard.find(name); it != standard.end()) {
    tag = it->second;
  } else if (name.starts_with("trainkit_gpu_")) {
    tag = "gpu/" + std::string(name.substr(13));
  } else if (name.starts_with("trainkit_")) {
    tag = "train/" + std::string(name.substr(9));
    if (tag.ends_with("_total")) tag.resize(tag.size() - 6);
  } else {
    tag = name;
  }
  for (const auto& [k, v] : label_set) tag += "/" + k + "=" + v;
  return tag;
}

/// Writes every metric of a registry as TensorBoard scalars, one point per metric and call:
/// gauges and counters as their value, a histogram as the mean of the observations since the
/// previous call (perf/step_seconds: the mean step time of the interval; nothing when there were
/// none). Flushed after each call, so a live TensorBoard follows the run.
class tensorboard_logger {
 public:
  explicit tensorboard_logger(const std::filesystem::path& dir) : writer_(dir) {}

  /// One scalar per metric (and label set) of reg, at step, with the current time.
  void log(const registry& reg, std::int64_t step) {
    const double now = detail::unix_seconds();
    reg.visit([&](const registry::family& f) {
      for (const auto& c : f.children) {
        const std::string tag = tensorboard_tag(f.name, c.label_set);
        switch (f.type) {
          case metric_type::counter:
            writer_.add_scalar(tag, c.c->value(), step, now);
            break;
          case metric_type::gauge:
            // NaN: never measured (trainkit_grad_norm without clipping); a point would mislead.
            if (!std::isnan(c.g->value())) writer_.add_scalar(tag, c.g->value(), step, now);
            break;
          case metric_type::histogram: {
            const auto s = c.h->read();
            auto& [sum, count] = seen_[tag];
            if (s.count > count)
              writer_.add_scalar(tag, (s.sum - sum) / static_cast<double>(s.count - count), step, now);
            sum = s.sum;
            count = s.count;
            break;
          }
        }
      }
    });
    writer_.flush();
  }

  tensorboard_writer& writer() noexcept { return writer_; }

 private:
  tensorboard_writer writer_;
  std::map<std::string, std::pair<double, std::uint64_t>> seen_;  // histogram sum, count at the last call
};

}  // namespace trainkit::monitor
