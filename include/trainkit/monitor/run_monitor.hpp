// trainkit/monitor/run_monitor.hpp - everything a training program needs for monitoring in one
// object: a registry with the standard training metrics, an HTTP /metrics endpoint when a port is
// given, a JSON-lines log when a path is given, TensorBoard event files when a directory is given.
// Light: it does not include cpp-httplib.
//
// The HTTP server is a template parameter so that this header works without it:
//   monitor::basic_run_monitor<>   here: no server, and asking for a port is a usage_error;
//   monitor::run_monitor           <trainkit/monitor/http_exporter.hpp> (trainkit::monitor_http):
//                                  basic_run_monitor<http_exporter>, which serves /metrics.
//
//   monitor::run_monitor mon({.port = int(f.num("metrics-port")), .jsonl_path = f.str("metrics-log"),
//                             .tensorboard_dir = f.str("tensorboard")});
//   train::train_step step(*model, opt, {.metrics = &mon.metrics()});   // or mon.metrics().observe(...)
//   ... every N steps: mon.log(step_no, epoch);
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "trainkit/core/error.hpp"                // usage_error, TRAINKIT_CHECK
#include "trainkit/monitor/jsonl_logger.hpp"      // jsonl_logger
#include "trainkit/monitor/metrics.hpp"           // registry
#include "trainkit/monitor/tensorboard.hpp"       // tensorboard_logger
#include "trainkit/monitor/training_metrics.hpp"  // training_metrics

namespace trainkit::monitor {

/// Where an HTTP exporter listens (http_exporter.hpp serves it; defined here so that the options
/// of a run_monitor do not need cpp-httplib).
struct http_exporter_options {
  std::string host = "0.0.0.0";  ///< every interface (Prometheus usually scrapes from another host)
  int port = 9464;               ///< 0: a free port chosen by the system (tests)
  std::string path = "/metrics";
};

/// Settings of a run_monitor (the examples' --metrics-port, --metrics-log and --tensorboard).
struct run_monitor_options {
  int port = 0;  ///< serve /metrics on this port; 0: no HTTP server
  std::string host = "0.0.0.0";
  std::string jsonl_path = {};       ///< append JSON lines here; empty: no log
  std::string tensorboard_dir = {};  ///< write a TensorBoard event file in this directory; empty: none
  bool gpu = true;                   ///< NVML gauges where present
};

namespace detail {

/// The HTTP server of a build without cpp-httplib: there is none, so asking for one is an error
/// rather than a silently missing endpoint.
class no_http_server {
 public:
  no_http_server(const registry&, const http_exporter_options& o) {
    TRAINKIT_CHECK(false, usage_error, "run_monitor",
                   "cannot serve /metrics on port "
                       << o.port
                       << ": this build has no HTTP exporter (Debian: libcpp-httplib-dev, link "
                          "trainkit::monitor_http and use monitor::run_monitor from "
                          "<trainkit/monitor/http_exporter.hpp>)");
  }
  int port() const noexcept { return 0; }
};

}  // namespace detail

/// A registry with the standard training metrics, an HTTP server on it when options.port > 0, a
/// JSON-lines log when options.jsonl_path is set and TensorBoard scalars when
/// options.tensorboard_dir is. Neither copyable nor movable: the server holds
/// a reference to the registry.
/// \tparam HttpServer constructed as HttpServer(const registry&, http_exporter_options) and
///         providing int port(); http_exporter, or the default, which refuses every port
template <class HttpServer = detail::no_http_server>
class basic_run_monitor {
 public:
  explicit basic_run_monitor(const run_monitor_options& o = {}) : metrics_(reg_, {.gpu = o.gpu}) {
    if (o.port > 0) http_.emplace(reg_, http_exporter_options{.host = o.host, .port = o.port});
    if (!o.jsonl_path.empty()) log_.emplace(std::filesystem::path(o.jsonl_path));
    if (!o.tensorboard_dir.empty()) tensorboard_.emplace(std::filesystem::path(o.tensorboard_dir));
  }
  basic_run_monitor(const basic_run_monitor&) = delete;
  basic_run_monitor& operator=(const basic_run_monitor&) = delete;

  registry& metrics_registry() noexcept { return reg_; }
  training_metrics& metrics() noexcept { return metrics_; }
  /// The port /metrics is served on (0 when off).
  int port() const noexcept { return http_ ? http_->port() : 0; }
  /// Sets the epoch gauge, appends a JSON line with the step and epoch and writes every metric as
  /// a TensorBoard scalar at this step (each only where configured).
  void log(std::int64_t step, std::int64_t epoch) {
    metrics_.set_epoch(epoch);
    if (log_) log_->log(reg_, {{"step", static_cast<double>(step)}, {"epoch", static_cast<double>(epoch)}});
    if (tensorboard_) tensorboard_->log(reg_, step);
  }
  /// The TensorBoard writer, for scalars of your own (eval/accuracy); nullptr without a directory.
  tensorboard_writer* tensorboard() noexcept { return tensorboard_ ? &tensorboard_->writer() : nullptr; }

 private:
  registry reg_;
  training_metrics metrics_;
  std::optional<HttpServer> http_;
  std::optional<jsonl_logger> log_;
  std::optional<tensorboard_logger> tensorboard_;
};

}  // namespace trainkit::monitor
