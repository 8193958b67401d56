// trainkit/monitor/http_exporter.hpp - serves a registry over HTTP for Prometheus to scrape
// (GET /metrics), on a thread of its own. OPTIONAL: this header needs Debian's libcpp-httplib-dev
// (<httplib.h>) and its library - link trainkit::monitor_http (CMake) or add
// `pkg-config --cflags --libs cpp-httplib` and -pthread. Nothing else in trainkit includes it.
//
//   monitor::registry reg;
//   monitor::training_metrics metrics(reg);
//   monitor::http_exporter http(reg, {.port = 9464});      // port 0: any free port, see port()
//   // prometheus.yml: scrape_configs: - job_name: trainkit, static_configs: - targets: [host:9464]
#pragma once

#include <httplib.h>     // httplib::Server (Debian: libcpp-httplib-dev)
#include <sys/socket.h>  // setsockopt

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "trainkit/core/error.hpp"
#include "trainkit/monitor/jsonl_logger.hpp"
#include "trainkit/monitor/metrics.hpp"
#include "trainkit/monitor/prometheus.hpp"
#include "trainkit/monitor/training_metrics.hpp"

namespace trainkit::monitor {

/// Where the exporter listens.
struct http_exporter_options {
  std::string host = "0.0.0.0";  ///< every interface (Prometheus usually scrapes from another host)
  int port = 9464;               ///< 0: a free port chosen by the system (tests)
  std::string path = "/metrics";
};

/// An HTTP server answering `path` with to_prometheus(reg). The registry must outlive it; the
/// destructor stops the server and joins its thread.
class http_exporter {
 public:
  explicit http_exporter(const registry& reg, http_exporter_options o = {}) : o_(std::move(o)) {
    TRAINKIT_CHECK(o_.port >= 0 && o_.port <= 65535, value_error, "http_exporter",
                   "invalid port " << o_.port);
    // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second exporter (another job
    // on the same machine) share the port silently and answer half the scrapes.
    server_.set_socket_options([](socket_t sock) {  // httplib.h declares socket_t globally
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    const registry* r = &reg;
    server_.Get(o_.path, [r](const httplib::Request&, httplib::Response& res) {
      res.set_content(to_prometheus(*r), std::string(prometheus_content_type));
    });
    server_.Get("/", [p = o_.path](const httplib::Request&, httplib::Response& res) {
      res.set_content("<html><body><a href=\"" + p + "\">" + p + "</a></body></html>", "text/html");
    });
    if (o_.port == 0) {
      port_ = server_.bind_to_any_port(o_.host);
    } else {
      port_ = server_.bind_to_port(o_.host, o_.port) ? o_.port : -1;
    }
    TRAINKIT_CHECK(port_ > 0, runtime_failure, "http_exporter",
                   "cannot listen on " << o_.host << ":" << o_.port << " (port in use, or no permission)");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() before the server runs would be lost (httplib checks is_running), so wait for it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!server_.is_running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  http_exporter(const http_exporter&) = delete;
  http_exporter& operator=(const http_exporter&) = delete;
  ~http_exporter() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  /// The port it listens on (the chosen one when 0 was asked).
  int port() const noexcept { return port_; }
  const std::string& host() const noexcept { return o_.host; }
  const std::string& path() const noexcept { return o_.path; }

 private:
  http_exporter_options o_;
  httplib::Server server_;
  int port_ = -1;
  std::thread thread_;
};

/// Settings of run_monitor (the examples' --metrics-port and --metrics-log).
struct run_monitor_options {
  int port = 0;  ///< serve /metrics on this port; 0: no HTTP server
  std::string host = "0.0.0.0";
  std::string jsonl_path = {};  ///< append JSON lines here; empty: no log
  bool gpu = true;              ///< NVML gauges where present
};

/// Everything a training program needs for monitoring in one object: a registry with the
/// standard training metrics, the HTTP exporter when a port is given, a JSON-lines log when a
/// path is given.
///
///   monitor::run_monitor mon({.port = static_cast<int>(f.num("metrics-port"))});
///   train::train_step step(*model, opt, {.metrics = &mon.metrics()});   // or mon.metrics().observe(...)
///   ... every N steps: mon.log(step_no, epoch);
class run_monitor {
 public:
  explicit run_monitor(const run_monitor_options& o = {}) : metrics_(reg_, {.gpu = o.gpu}) {
    if (o.port > 0) http_.emplace(reg_, http_exporter_options{.host = o.host, .port = o.port});
    if (!o.jsonl_path.empty()) log_.emplace(std::filesystem::path(o.jsonl_path));
  }
  registry& metrics_registry() noexcept { return reg_; }
  training_metrics& metrics() noexcept { return metrics_; }
  /// The port /metrics is served on (0 when off).
  int port() const noexcept { return http_ ? http_->port() : 0; }
  /// A JSON line with the step and epoch (no-op without a log).
  void log(std::int64_t step, std::int64_t epoch) {
    metrics_.set_epoch(epoch);
    if (log_) log_->log(reg_, {{"step", static_cast<double>(step)}, {"epoch", static_cast<double>(epoch)}});
  }

 private:
  registry reg_;
  training_metrics metrics_;
  std::optional<http_exporter> http_;
  std::optional<jsonl_logger> log_;
};

}  // namespace trainkit::monitor
