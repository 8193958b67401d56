// trainkit/monitor/http_exporter.hpp - serves a registry over HTTP for Prometheus to scrape
// (GET /metrics), on a thread of its own. OPTIONAL: this header needs Debian's libcpp-httplib-dev
// (<httplib.h>) and its library - link trainkit::monitor_http (CMake) or add
// `pkg-config --cflags --libs cpp-httplib` and -pthread. Nothing else in trainkit includes it.
//
//   monitor::registry reg;
//   monitor::training_metrics metrics(reg);
//   monitor::http_exporter http(reg, {.port = 9464});      // port 0: any free port, see port()
//   monitor::run_monitor mon({.port = 9464});              // or all of it in one object (run_monitor.hpp)
//   // prometheus.yml: scrape_configs: - job_name: trainkit, static_configs: - targets: [host:9464]
#pragma once

#include <httplib.h>     // httplib::Server (Debian: libcpp-httplib-dev)
#include <sys/socket.h>  // setsockopt

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "trainkit/core/error.hpp"
#include "trainkit/monitor/metrics.hpp"      // registry
#include "trainkit/monitor/prometheus.hpp"   // to_prometheus
#include "trainkit/monitor/run_monitor.hpp"  // http_exporter_options, basic_run_monitor

namespace trainkit::monitor {

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

/// The monitoring object of a training program with the /metrics endpoint (run_monitor.hpp):
/// registry, standard metrics, this exporter when a port is given, JSON lines when a path is.
using run_monitor = basic_run_monitor<http_exporter>;

}  // namespace trainkit::monitor
