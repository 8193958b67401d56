// examples/common/example.hpp - the little each example needs besides trainkit itself:
// command-line flags, a timer, the parameters digest and the choice of run_monitor. Kept out of
// the library on purpose.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include <trainkit/trainkit.hpp>
#if TRAINKIT_EXAMPLE_HTTP  // set by examples/CMakeLists.txt when trainkit::monitor_http is linked
#include <trainkit/monitor/http_exporter.hpp>  // run_monitor: /metrics over HTTP (cpp-httplib)
#endif

namespace example {

/// --name value flags (and bare --flag for booleans); unknown flags are an error, so a typo
/// does not silently train with defaults.
class flags {
 public:
  flags(int argc, char** argv, std::map<std::string, std::string> defaults) : values_(std::move(defaults)) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::cout << "flags (default):\n";
        for (auto& [k, v] : values_) std::cout << "  --" << k << " (" << v << ")\n";
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + a + "'");
      a = a.substr(2);
      std::string v = "1";
      if (auto eq = a.find('='); eq != std::string::npos) {
        v = a.substr(eq + 1);
        a = a.substr(0, eq);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        v = argv[++i];
      }
      if (!values_.count(a)) throw std::invalid_argument("unknown flag --" + a + " (see --help)");
      values_[a] = v;
    }
  }
  std::string str(const std::string& k) const { return values_.at(k); }
  long num(const std::string& k) const { return std::stol(values_.at(k)); }
  double real(const std::string& k) const { return std::stod(values_.at(k)); }

 private:
  std::map<std::string, std::string> values_;
};

/// --metrics-port and --metrics-log: the library's run_monitor, with the /metrics endpoint where
/// trainkit::monitor_http is linked; without it a port is a clear error and the log still works.
#if TRAINKIT_EXAMPLE_HTTP
using run_monitor = trainkit::monitor::run_monitor;
#else
using run_monitor = trainkit::monitor::basic_run_monitor<>;
#endif

/// Seconds since construction.
class stopwatch {
 public:
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

/// FNV-1a over the bytes of every parameter and buffer (state_dict order): equal digests mean
/// bit-identical models, e.g. a run that was interrupted and resumed against one that was not.
template <class Model>
std::uint64_t digest(const Model& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& [name, t] : model.state_dict()) {
    const auto c = t.template to<trainkit::cpu>().contiguous();  // a CUDA model's too
    const auto* p = reinterpret_cast<const unsigned char*>(c.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(c.numel()) * sizeof(*c.data()); ++i)
      h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace example
