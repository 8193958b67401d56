// examples/common/example.hpp - the little each example needs besides trainkit itself:
// command-line flags, a timer and test-set accuracy. Kept out of the library on purpose.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
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

#if TRAINKIT_EXAMPLE_HTTP
using monitor_options = trainkit::monitor::run_monitor_options;
using run_monitor = trainkit::monitor::run_monitor;
#else
struct monitor_options {
  int port = 0;
  std::string host = "0.0.0.0";
  std::string jsonl_path = {};
  bool gpu = true;
};
/// Built without cpp-httplib: the same metrics and JSON lines, and no HTTP server - asking for
/// one (--metrics-port) is an error rather than a silently missing endpoint.
class run_monitor {
 public:
  explicit run_monitor(const monitor_options& o = {}) : metrics_(reg_, {.gpu = o.gpu}) {
    if (o.port > 0)
      throw std::invalid_argument("--metrics-port " + std::to_string(o.port) +
                                  ": this build has no HTTP exporter (Debian: libcpp-httplib-dev, then rebuild)");
    if (!o.jsonl_path.empty()) log_.emplace(o.jsonl_path);
  }
  trainkit::monitor::training_metrics& metrics() noexcept { return metrics_; }
  int port() const noexcept { return 0; }
  void log(std::int64_t step, std::int64_t epoch) {
    metrics_.set_epoch(epoch);
    if (log_) log_->log(reg_, {{"step", double(step)}, {"epoch", double(epoch)}});
  }

 private:
  trainkit::monitor::registry reg_;
  trainkit::monitor::training_metrics metrics_;
  std::optional<trainkit::monitor::jsonl_logger> log_;
};
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
    const auto c = t.contiguous();
    const auto* p = reinterpret_cast<const unsigned char*>(c.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(c.numel()) * sizeof(*c.data()); ++i)
      h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

/// The plain forward: the module's own operator().
struct plain_forward {
  template <class Model, class X>
  auto operator()(Model& m, const X& x) const {
    return m(x);
  }
};

/// Share of correctly classified samples, in eval mode and without recording a graph;
/// `forward(model, x)` runs the model (e.g. trainkit::amp::module_forward<P> for mixed precision).
template <class Model, class Forward = plain_forward>
double accuracy(Model& model, const trainkit::tensor<float>& x, const trainkit::tensor<std::int64_t>& y,
                Forward forward = {}, trainkit::index_t batch = 1000) {
  trainkit::no_grad guard;
  model.eval();
  trainkit::index_t correct = 0;
  for (trainkit::index_t i = 0; i < x.size(0); i += batch) {
    const auto end = std::min(x.size(0), i + batch);
    auto logits = forward(model, trainkit::var<float>(x.slice(0, i, end).contiguous()));
    auto pred = trainkit::argmax(logits.value(), 1).to_vector();
    auto truth = y.slice(0, i, end).to_vector();
    for (std::size_t k = 0; k < pred.size(); ++k) correct += pred[k] == truth[k];
  }
  model.train();
  return x.size(0) ? double(correct) / double(x.size(0)) : 0.0;
}

}  // namespace example
