// trainkit/monitor/prometheus.hpp - the Prometheus text exposition format, version 0.0.4:
//
//   # HELP trainkit_steps_total Optimizer steps taken.
//   # TYPE trainkit_steps_total counter
//   trainkit_steps_total 1200
//   # HELP trainkit_step_duration_seconds Wall time of one training step.
//   # TYPE trainkit_step_duration_seconds histogram
//   trainkit_step_duration_seconds_bucket{le="0.001"} 0
//   ...
//   trainkit_step_duration_seconds_bucket{le="+Inf"} 1200
//   trainkit_step_duration_seconds_sum 50.4
//   trainkit_step_duration_seconds_count 1200
//
// Values print in the shortest form that reads back exactly; +Inf, -Inf and NaN as Prometheus
// spells them. Label values escape backslash, double quote and newline; help texts backslash and
// newline.
#pragma once

#include <charconv>  // std::to_chars: shortest round-trip doubles
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "trainkit/monitor/metrics.hpp"

namespace trainkit::monitor {

/// The Content-Type an HTTP exporter answers with.
inline constexpr std::string_view prometheus_content_type = "text/plain; version=0.0.4; charset=utf-8";

namespace detail {

inline void append_value(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out.append(buf, r.ptr);
  }
}
inline void append_escaped(std::string& out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quote && c == '"')
      out += "\\\"";
    else
      out += c;
  }
}
/// {a="x",b="y"} with an optional extra label (a histogram's le) last; nothing for no labels.
inline void append_labels(std::string& out, const labels& l, std::string_view extra_name = {},
                          std::string_view extra_value = {}) {
  if (l.empty() && extra_name.empty()) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : l) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    append_escaped(out, v, true);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

}  // namespace detail

/// The whole registry in the text format (families in name order, children in creation order).
inline std::string to_prometheus(const registry& reg) {
  std::string out;
  reg.visit([&](const registry::family& f) {
    out += "# HELP ";
    out += f.name;
    out += ' ';
    detail::append_escaped(out, f.help, false);
    out += "\n# TYPE ";
    out += f.name;
    out += ' ';
    out += to_string(f.type);
    out += '\n';
    for (const auto& c : f.children) {
      if (f.type == metric_type::histogram) {
        const auto s = c.h->read();
        std::uint64_t cumulative = 0;
        for (std::size_t i = 0; i <= s.bounds.size(); ++i) {
          cumulative += s.counts[i];
          std::string le;
          detail::append_value(le,
                               i < s.bounds.size() ? s.bounds[i] : std::numeric_limits<double>::infinity());
          out += f.name;
          out += "_bucket";
          detail::append_labels(out, c.label_set, "le", le);
          out += ' ';
          out += std::to_string(cumulative);
          out += '\n';
        }
        out += f.name;
        out += "_sum";
        detail::append_labels(out, c.label_set);
        out += ' ';
        detail::append_value(out, s.sum);
        out += '\n';
        out += f.name;
        out += "_count";
        detail::append_labels(out, c.label_set);
        out += ' ';
        out += std::to_string(s.count);
        out += '\n';
      } else {
        out += f.name;
        detail::append_labels(out, c.label_set);
        out += ' ';
        detail::append_value(out, f.type == metric_type::counter ? c.c->value() : c.g->value());
        out += '\n';
      }
    }
  });
  return out;
}

}  // namespace trainkit::monitor
