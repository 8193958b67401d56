// trainkit/monitor/jsonl_logger.hpp - the registry's figures as JSON lines: one object per call,
// one line each, flushed, so `tail -f`, jq and pandas.read_json(lines=True) read a run as it goes.
//
//   {"time":1718000000.25,"step":1200,"trainkit_loss":0.31,"trainkit_steps_total":1200,
//    "trainkit_step_duration_seconds":{"count":1200,"sum":50.4},
//    "trainkit_gpu_temperature_celsius":{"gpu=0":61}}
//
// A family without labels is a number; with labels, an object keyed "name=value[,name=value]";
// a histogram is {"count", "sum"} (per label set likewise). NaN and infinities, which JSON lacks,
// are written as null.
#pragma once

#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/core/error.hpp"
#include "trainkit/monitor/metrics.hpp"

namespace trainkit::monitor {

namespace detail {
inline void json_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}
inline void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}
inline std::string label_key(const labels& l) {
  std::string k;
  for (const auto& [n, v] : l) {
    if (!k.empty()) k += ',';
    k += n + "=" + v;
  }
  return k;
}
inline void json_metric(std::string& out, metric_type t, const registry::child& c) {
  if (t == metric_type::histogram) {
    const auto s = c.h->read();
    out += "{\"count\":";
    out += std::to_string(s.count);
    out += ",\"sum\":";
    json_number(out, s.sum);
    out += '}';
  } else {
    json_number(out, t == metric_type::counter ? c.c->value() : c.g->value());
  }
}
}  // namespace detail

/// One JSON object of every metric of reg, plus "time" (Unix seconds) and the extra fields
/// first. No trailing newline.
inline std::string to_json_line(const registry& reg,
                                std::initializer_list<std::pair<std::string_view, double>> extra = {}) {
  std::string out = "{\"time\":";
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  detail::json_number(out, now);
  for (const auto& [k, v] : extra) {
    out += ',';
    detail::json_string(out, k);
    out += ':';
    detail::json_number(out, v);
  }
  reg.visit([&](const registry::family& f) {
    if (f.children.empty()) return;
    out += ',';
    detail::json_string(out, f.name);
    out += ':';
    if (f.children.size() == 1 && f.children.front().label_set.empty()) {
      detail::json_metric(out, f.type, f.children.front());
      return;
    }
    out += '{';
    bool first = true;
    for (const auto& c : f.children) {
      if (!first) out += ',';
      first = false;
      detail::json_string(out, detail::label_key(c.label_set));
      out += ':';
      detail::json_metric(out, f.type, c);
    }
    out += '}';
  });
  out += '}';
  return out;
}

/// Appends to_json_line(reg) lines to a file (opened for appending: a resumed run continues the
/// same log) or to a stream the caller owns.
class jsonl_logger {
 public:
  explicit jsonl_logger(const std::filesystem::path& path)
      : file_(std::make_unique<std::ofstream>(path, std::ios::app)), out_(file_.get()) {
    TRAINKIT_CHECK(file_->good(), io_error, "jsonl_logger",
                   "cannot open '" << path.string() << "' for appending");
  }
  explicit jsonl_logger(std::ostream& out) : out_(&out) {}

  /// Writes one line (flushed). extra: fields such as {"step", 1200}, {"epoch", 3}.
  void log(const registry& reg, std::initializer_list<std::pair<std::string_view, double>> extra = {}) {
    const std::string line = to_json_line(reg, extra);
    *out_ << line << '\n';
    out_->flush();
    TRAINKIT_CHECK(out_->good(), io_error, "jsonl_logger", "writing a log line failed");
  }

 private:
  std::unique_ptr<std::ofstream> file_;
  std::ostream* out_;
};

}  // namespace trainkit::monitor
