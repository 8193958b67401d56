// tests/monitor/test_http_exporter.cpp - the HTTP exporter (cpp-httplib; this test links
// trainkit::monitor_http): GET /metrics on an ephemeral port returns the registry in the text
// format, updates are visible at the next scrape, a taken port is a clear error. Then a real
// Prometheus server (Debian's `prometheus` package), started on loopback, scrapes a training loop
// and its HTTP API returns the step counter - skipped, visibly, where the package is missing.
#include <fcntl.h>  // O_WRONLY (the log of the spawned server)
#include <httplib.h>
#include <netinet/in.h>  // a free port for Prometheus
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "io/io_test_util.hpp"
#include "monitor/parsers.hpp"
#include "trainkit/monitor/http_exporter.hpp"
#include "trainkit/monitor/monitor.hpp"
#include "trainkit/train/train.hpp"
#include "trainkit/trainkit.hpp"

extern char** environ;

using namespace trainkit;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

TEST_CASE("GET /metrics returns the registry in the Prometheus text format", "[monitor][http]") {
  monitor::registry reg;
  monitor::training_metrics metrics(reg, {.gpu = false});
  metrics.observe({.seconds = 0.1, .samples = 32, .loss = 0.75});
  monitor::http_exporter http(reg, {.host = "127.0.0.1", .port = 0});
  REQUIRE(http.port() > 0);

  httplib::Client client("127.0.0.1", http.port());
  auto res = client.Get("/metrics");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  REQUIRE(res->get_header_value("Content-Type") == std::string(monitor::prometheus_content_type));
  auto e = monitor_test::parse_prometheus(res->body);
  REQUIRE(*e.value("trainkit_steps_total") == 1);
  REQUIRE(*e.value("trainkit_loss") == 0.75);

  metrics.observe({.seconds = 0.1, .samples = 32, .loss = 0.5});
  res = client.Get("/metrics");
  REQUIRE(res);
  e = monitor_test::parse_prometheus(res->body);
  REQUIRE(*e.value("trainkit_steps_total") == 2);
  REQUIRE(*e.value("trainkit_loss") == 0.5);

  auto missing = client.Get("/nothing");
  REQUIRE(missing);
  REQUIRE(missing->status == 404);
  auto index = client.Get("/");
  REQUIRE(index);
  REQUIRE_THAT(index->body, Contains("/metrics"));

  // The same port again cannot be bound.
  REQUIRE_THROWS_WITH(monitor::http_exporter(reg, {.host = "127.0.0.1", .port = http.port()}),
                      Contains("cannot listen on 127.0.0.1:" + std::to_string(http.port())));
}

TEST_CASE("the exporter stops cleanly right after it starts", "[monitor][http]") {
  monitor::registry reg;
  for (int i = 0; i < 5; ++i) {
    int port = 0;
    {
      monitor::http_exporter http(reg, {.host = "127.0.0.1", .port = 0});
      port = http.port();
      REQUIRE(port > 0);
    }
    // Stopped: nothing answers on its port any more, and the port can be bound again at once.
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(std::chrono::seconds(1));
    CHECK_FALSE(client.Get("/metrics"));
    monitor::http_exporter again(reg, {.host = "127.0.0.1", .port = port});
    CHECK(again.port() == port);
  }
}

namespace {

std::string find_prometheus() {
  if (const char* e = std::getenv("TRAINKIT_PROMETHEUS")) return e;
  for (const char* p : {"/usr/bin/prometheus", "/usr/local/bin/prometheus", "/bin/prometheus"})
    if (fs::exists(p)) return p;
  return {};
}

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("a real Prometheus server scrapes a training loop", "[monitor][http][prometheus]") {
  const std::string prom = find_prometheus();
  if (prom.empty()) {
    WARN("SKIPPED: the prometheus binary is not installed (Debian: apt-get install prometheus)");
    return;
  }
  // A training loop that keeps stepping while Prometheus scrapes it.
  monitor::registry reg;
  monitor::training_metrics metrics(reg, {.gpu = false});
  monitor::http_exporter http(reg, {.host = "127.0.0.1", .port = 0});
  std::atomic<bool> done{false};
  std::atomic<double> steps_done{0};
  std::thread trainer([&] {
    auto net =
        nn::make_sequential(std::make_shared<nn::linear<float>>(8, 16), std::make_shared<nn::relu<float>>(),
                            std::make_shared<nn::linear<float>>(16, 2));
    optim::sgd<float> opt(net->parameters(), {.lr = 0.01});
    train::train_step step(*net, opt, {.metrics = &metrics});
    auto x = tensor<float>::ones({4, 8});
    auto y = tensor<std::int64_t>::zeros({4});
    while (!done) {
      step(x, [&](const var<float>& o) { return autograd::cross_entropy(o, y); });
      steps_done = metrics.steps();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });

  const auto dir = io_test::fresh_dir("prometheus");
  const int web = free_port();
  {
    std::ofstream cfg(dir / "prometheus.yml");
    cfg << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n  - job_name: trainkit\n    static_configs:\n      - targets: ['127.0.0.1:"
        << http.port() << "']\n";
  }
  std::string exe = prom, config = "--config.file=" + (dir / "prometheus.yml").string(),
              storage = "--storage.tsdb.path=" + (dir / "data").string(),
              listen = "--web.listen-address=127.0.0.1:" + std::to_string(web);
  char* argv[] = {exe.data(), config.data(), storage.data(), listen.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string log = (dir / "prometheus.log").string();
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, environ) == 0);
  posix_spawn_file_actions_destroy(&fa);

  // Ask its HTTP API for the step counter until a scrape has happened (or a minute passed).
  httplib::Client api("127.0.0.1", web);
  double seen = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (seen <= 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto res = api.Get("/api/v1/query?query=trainkit_steps_total");
    if (!res || res->status != 200) continue;
    // {"status":"success","data":{"resultType":"vector","result":[{"metric":{...},"value":[t,"123"]}]}}
    const auto at = res->body.find("\"value\":[");
    if (at == std::string::npos) continue;
    const auto q1 = res->body.find('"', res->body.find(',', at) + 1);
    const auto q2 = res->body.find('"', q1 + 1);
    seen = std::stod(res->body.substr(q1 + 1, q2 - q1 - 1));
  }
  done = true;
  trainer.join();
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO("prometheus log: " << log);
  REQUIRE(seen > 0);
  REQUIRE(seen <= steps_done.load());
}

TEST_CASE("run_monitor: metrics, HTTP and JSON lines in one object", "[monitor][http]") {
  const auto dir = io_test::fresh_dir("run_monitor");
  const int port = free_port();
  monitor::run_monitor mon(
      {.port = port, .host = "127.0.0.1", .jsonl_path = (dir / "m.jsonl").string(), .gpu = false});
  REQUIRE(mon.port() == port);
  mon.metrics().observe({.seconds = 0.01, .samples = 8, .loss = 1.25});
  mon.log(1, 0);
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  REQUIRE(res);
  REQUIRE(*monitor_test::parse_prometheus(res->body).value("trainkit_loss") == 1.25);
  std::ifstream in(dir / "m.jsonl");
  std::string line;
  REQUIRE(std::getline(in, line));
  monitor_test::json_reader r(line);
  r.parse_document();
  REQUIRE(r.top_numbers.at("step") == 1);
  monitor::run_monitor off;
  REQUIRE(off.port() == 0);
  off.log(1, 1);  // no log: nothing happens
}

TEST_CASE("basic_run_monitor without an HTTP server: a port is a usage_error naming it", "[monitor][http]") {
  const auto dir = io_test::fresh_dir("basic_run_monitor");
  REQUIRE_THROWS_AS(monitor::basic_run_monitor<>({.port = 9464, .gpu = false}), usage_error);
  REQUIRE_THROWS_WITH(monitor::basic_run_monitor<>({.port = 9464, .gpu = false}),
                      Contains("port 9464") && Contains("no HTTP exporter") && Contains("libcpp-httplib-dev"));
  // Metrics and JSON lines work the same without it.
  monitor::basic_run_monitor<> mon({.jsonl_path = (dir / "m.jsonl").string(), .gpu = false});
  REQUIRE(mon.port() == 0);
  mon.metrics().observe({.seconds = 0.01, .samples = 8, .loss = 0.5});
  mon.log(3, 1);
  std::ifstream in(dir / "m.jsonl");
  std::string line;
  REQUIRE(std::getline(in, line));
  monitor_test::json_reader r(line);
  r.parse_document();
  REQUIRE(r.top_numbers.at("step") == 3);
  REQUIRE(r.top_numbers.at("epoch") == 1);
}
