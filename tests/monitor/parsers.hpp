// tests/monitor/parsers.hpp - independent readers of what monitor/ writes: the Prometheus text
// exposition format 0.0.4 (strict: HELP/TYPE before samples, names and labels by the grammar) and
// JSON (a complete recursive-descent validator that also returns the top-level numbers).
#pragma once

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace monitor_test {

struct sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
struct exposition {
  std::map<std::string, std::string> help, type;
  std::vector<sample> samples;
  /// The value of name with exactly these labels; nullopt when absent.
  std::optional<double> value(const std::string& name,
                              const std::map<std::string, std::string>& l = {}) const {
    for (const auto& s : samples)
      if (s.name == name && s.labels == l) return s.value;
    return std::nullopt;
  }
};

inline bool metric_name_ok(const std::string& n) {
  if (n.empty()) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(n[i]);
    if (!(std::isalpha(c) || c == '_' || c == ':' || (i > 0 && std::isdigit(c)))) return false;
  }
  return true;
}

inline double parse_prom_value(const std::string& v) {
  if (v == "+Inf") return INFINITY;
  if (v == "-Inf") return -INFINITY;
  if (v == "NaN") return NAN;
  std::size_t used = 0;
  const double d = std::stod(v, &used);
  if (used != v.size()) throw std::runtime_error("bad value '" + v + "'");
  return d;
}

/// Parses the text format; throws std::runtime_error naming the line on any violation.
inline exposition parse_prometheus(const std::string& text) {
  exposition e;
  std::istringstream in(text);
  std::string line;
  int no = 0;
  auto fail = [&](const std::string& why) {
    throw std::runtime_error("line " + std::to_string(no) + ": " + why + ": " + line);
  };
  if (!text.empty() && text.back() != '\n')
    throw std::runtime_error("the exposition must end with a newline");
  while (std::getline(in, line)) {
    ++no;
    if (line.empty()) continue;
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const std::string rest = line.substr(7);
      const auto sp = rest.find(' ');
      if (sp == std::string::npos) fail("no text");
      const std::string name = rest.substr(0, sp);
      if (!metric_name_ok(name)) fail("bad metric name");
      if (line[2] == 'H') {
        if (e.help.count(name)) fail("second HELP");
        e.help[name] = rest.substr(sp + 1);
      } else {
        const std::string t = rest.substr(sp + 1);
        if (t != "counter" && t != "gauge" && t != "histogram" && t != "summary" && t != "untyped")
          fail("bad type");
        if (e.type.count(name)) fail("second TYPE");
        for (const auto& s : e.samples)
          if (s.name == name || s.name.rfind(name + "_", 0) == 0) fail("TYPE after samples");
        e.type[name] = t;
      }
      continue;
    }
    if (line[0] == '#') continue;  // comment
    sample s;
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (!metric_name_ok(s.name)) fail("bad sample name");
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        std::size_t j = i;
        while (j < line.size() && line[j] != '=') ++j;
        const std::string ln = line.substr(i, j - i);
        if (ln.empty() || j + 1 >= line.size() || line[j + 1] != '"') fail("bad label");
        std::string v;
        j += 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\') {
            ++j;
            if (j >= line.size()) fail("dangling escape");
            v += line[j] == 'n' ? '\n' : line[j];
          } else {
            v += line[j];
          }
        }
        if (j >= line.size()) fail("unterminated label value");
        s.labels[ln] = v;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) fail("unterminated labels");
      ++i;
    }
    if (i >= line.size() || line[i] != ' ') fail("no value");
    std::string rest = line.substr(i + 1);
    const auto sp = rest.find(' ');  // an optional timestamp
    s.value = parse_prom_value(rest.substr(0, sp));
    e.samples.push_back(s);
  }
  // Every sample belongs to a family with a TYPE (histogram children by their suffixes).
  for (const auto& s : e.samples) {
    std::string fam = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sf(suffix);
      if (!e.type.count(fam) && fam.size() > sf.size() &&
          fam.compare(fam.size() - sf.size(), sf.size(), sf) == 0 &&
          e.type.count(fam.substr(0, fam.size() - sf.size())))
        fam = fam.substr(0, fam.size() - sf.size());
    }
    if (!e.type.count(fam)) throw std::runtime_error("sample " + s.name + " has no TYPE line");
  }
  return e;
}

/// A strict JSON parser (RFC 8259) that keeps the numbers of the top-level object's members.
class json_reader {
 public:
  explicit json_reader(std::string s) : s_(std::move(s)) {}
  /// Parses one complete value; throws std::runtime_error with the offset on invalid input.
  void parse_document() {
    ws();
    value(0);
    ws();
    if (i_ != s_.size()) fail("trailing characters");
  }
  std::map<std::string, double> top_numbers;
  std::map<std::string, bool> top_null;

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw std::runtime_error("JSON: " + why + " at " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string() {
    expect('"');
    std::string r;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return r;
      if (c < 0x20) fail("control character in string");
      if (c == '\\') {
        if (i_ >= s_.size()) fail("dangling escape");
        const char e = s_[i_++];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k)
            if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_++])))
              fail("bad \\u escape");
          r += '?';
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          fail("bad escape");
        } else {
          r += e;
        }
      } else {
        r += static_cast<char>(c);
      }
    }
  }
  double number() {
    const std::size_t start = i_;
    if (s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) fail("bad number");
    if (s_[i_] == '0') {
      ++i_;
    } else {
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) fail("bad fraction");
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) fail("bad exponent");
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    return std::strtod(s_.substr(start, i_ - start).c_str(), nullptr);
  }
  void literal(const char* w) {
    for (const char* p = w; *p; ++p) expect(*p);
  }
  // Returns the number when the value was one (for the top-level members).
  std::optional<double> value(int depth) {
    if (depth > 64) fail("too deep");
    if (i_ >= s_.size()) fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return std::nullopt;
      }
      while (true) {
        ws();
        const std::string k = string();
        ws();
        expect(':');
        ws();
        const bool is_null = i_ < s_.size() && s_[i_] == 'n';
        auto v = value(depth + 1);
        if (depth == 0) {
          if (v) top_numbers[k] = *v;
          if (is_null) top_null[k] = true;
        }
        ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return std::nullopt;
      }
    }
    if (c == '[') {
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return std::nullopt;
      }
      while (true) {
        ws();
        value(depth + 1);
        ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return std::nullopt;
      }
    }
    if (c == '"') {
      string();
      return std::nullopt;
    }
    if (c == 't') {
      literal("true");
      return std::nullopt;
    }
    if (c == 'f') {
      literal("false");
      return std::nullopt;
    }
    if (c == 'n') {
      literal("null");
      return std::nullopt;
    }
    return number();
  }
  std::string s_;
  std::size_t i_ = 0;
};

}  // namespace monitor_test
