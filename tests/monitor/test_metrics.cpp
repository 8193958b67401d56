// tests/monitor/test_metrics.cpp - counters, gauges, histograms; the Prometheus text format parsed
// back by an independent reader; JSON lines validated by a strict JSON parser; the standard
// training metrics; NVML absent -> no GPU gauges and no error.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "io/io_test_util.hpp"
#include "monitor/parsers.hpp"
#include "trainkit/monitor/monitor.hpp"

using namespace trainkit;
using Catch::Matchers::Contains;

TEST_CASE("counters, gauges and histograms", "[monitor]") {
  monitor::registry reg;
  auto& c = reg.counter("jobs_total", "Jobs.");
  c.inc();
  c.inc(2.5);
  REQUIRE(c.value() == 3.5);
  REQUIRE_THROWS_AS(c.inc(-1), value_error);
  REQUIRE(&reg.counter("jobs_total", "Jobs.") == &c);  // same family and labels: same child
  auto& g = reg.gauge("temp_celsius", "T.", {{"room", "a"}});
  g.set(20);
  g.inc(1.5);
  g.dec(0.5);
  REQUIRE(g.value() == 21);
  REQUIRE(&reg.gauge("temp_celsius", "T.", {{"room", "b"}}) != &g);

  auto& h = reg.histogram("lat_seconds", "L.", {0.1, 0.5, 1.0});
  for (double v : {0.05, 0.1, 0.2, 0.7, 3.0}) h.observe(v);
  const auto s = h.read();
  REQUIRE(s.counts == std::vector<std::uint64_t>{2, 1, 1, 1});  // le 0.1 includes 0.1 itself
  REQUIRE(s.count == 5);
  REQUIRE(s.sum == Approx(4.05));

  REQUIRE_THROWS_WITH(reg.gauge("jobs_total", "Jobs."), Contains("is a counter, asked for a gauge"));
  REQUIRE_THROWS_WITH(reg.counter("jobs_total", "Other."), Contains("another help text"));
  REQUIRE_THROWS_WITH(reg.counter("2bad", "x"), Contains("invalid metric name"));
  REQUIRE_THROWS_WITH(reg.counter("ok_total", "x", {{"__reserved", "v"}}), Contains("invalid label name"));
  REQUIRE_THROWS_AS(reg.histogram("h2", "x", {1.0, 0.5}), value_error);
  REQUIRE(monitor::exponential_buckets(1, 2, 4) == std::vector<double>{1, 2, 4, 8});
  REQUIRE(monitor::linear_buckets(0, 0.5, 3) == std::vector<double>{0, 0.5, 1.0});
}

TEST_CASE("the Prometheus exposition parses back", "[monitor][prometheus]") {
  monitor::registry reg;
  reg.counter("trainkit_steps_total", "Optimizer steps taken.").inc(42);
  reg.gauge("trainkit_loss", "Loss with a backslash \\ and\nnewline.").set(0.125);
  reg.gauge("odd_labels", "Escaping.", {{"path", "a\"b\\c\nd"}, {"a", "1"}}).set(-2.5);
  reg.gauge("inf_gauge", "Inf.").set(std::numeric_limits<double>::infinity());
  reg.gauge("nan_gauge", "NaN.").set(std::numeric_limits<double>::quiet_NaN());
  reg.gauge("tiny_gauge", "Tiny.").set(1e-300);
  auto& h = reg.histogram("trainkit_step_duration_seconds", "Step time.", {0.01, 0.1}, {{"rank", "0"}});
  h.observe(0.005);
  h.observe(0.05);
  h.observe(5);

  const std::string text = monitor::to_prometheus(reg);
  INFO(text);
  const auto e = monitor_test::parse_prometheus(text);
  REQUIRE(e.type.at("trainkit_steps_total") == "counter");
  REQUIRE(e.type.at("trainkit_loss") == "gauge");
  REQUIRE(e.type.at("trainkit_step_duration_seconds") == "histogram");
  REQUIRE(e.help.at("trainkit_loss") == "Loss with a backslash \\\\ and\\nnewline.");
  REQUIRE(*e.value("trainkit_steps_total") == 42);
  REQUIRE(*e.value("trainkit_loss") == 0.125);
  REQUIRE(*e.value("odd_labels", {{"path", "a\"b\\c\nd"}, {"a", "1"}}) == -2.5);
  REQUIRE(std::isinf(*e.value("inf_gauge")));
  REQUIRE(std::isnan(*e.value("nan_gauge")));
  REQUIRE(*e.value("tiny_gauge") == 1e-300);  // shortest round-trip form
  REQUIRE(*e.value("trainkit_step_duration_seconds_bucket", {{"rank", "0"}, {"le", "0.01"}}) == 1);
  REQUIRE(*e.value("trainkit_step_duration_seconds_bucket", {{"rank", "0"}, {"le", "0.1"}}) == 2);
  REQUIRE(*e.value("trainkit_step_duration_seconds_bucket", {{"rank", "0"}, {"le", "+Inf"}}) == 3);
  REQUIRE(*e.value("trainkit_step_duration_seconds_count", {{"rank", "0"}}) == 3);
  REQUIRE(*e.value("trainkit_step_duration_seconds_sum", {{"rank", "0"}}) == Approx(5.055));
  // Families appear in name order, each HELP/TYPE once.
  REQUIRE(text.find("# TYPE inf_gauge") < text.find("# TYPE trainkit_loss"));
  REQUIRE(monitor::prometheus_content_type == "text/plain; version=0.0.4; charset=utf-8");
}

TEST_CASE("jsonl_logger writes one valid object per line", "[monitor][jsonl]") {
  monitor::registry reg;
  auto& steps = reg.counter("trainkit_steps_total", "S.");
  auto& loss = reg.gauge("trainkit_loss", "L.");
  reg.gauge("nan_gauge", "N.").set(std::numeric_limits<double>::quiet_NaN());
  reg.gauge("g", "G.", {{"gpu", "0"}}).set(1);
  reg.gauge("g", "G.", {{"gpu", "1"}}).set(2);
  reg.histogram("h_seconds", "H.", {1.0}).observe(0.5);
  const auto dir = io_test::fresh_dir("jsonl");
  const auto path = dir / "log.jsonl";
  {
    monitor::jsonl_logger log(path);
    for (int i = 1; i <= 3; ++i) {
      steps.inc();
      loss.set(1.0 / i);
      log.log(reg, {{"step", double(i)}, {"epoch", 0}});
    }
  }
  {
    monitor::jsonl_logger again(path);  // appends
    again.log(reg, {{"step", 4}});
  }
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    INFO(line);
    monitor_test::json_reader r(line);
    REQUIRE_NOTHROW(r.parse_document());
    REQUIRE(r.top_numbers.at("step") == n);
    REQUIRE(r.top_numbers.at("trainkit_steps_total") == std::min(n, 3));
    REQUIRE(r.top_numbers.count("time"));
    REQUIRE(r.top_null.count("nan_gauge"));
    REQUIRE_THAT(line, Contains("\"g\":{\"gpu=0\":1,\"gpu=1\":2}") &&
                           Contains("\"h_seconds\":{\"count\":1,\"sum\":0.5}"));
  }
  REQUIRE(n == 4);
  // The validator does reject broken JSON.
  monitor_test::json_reader bad("{\"a\":nan}");
  REQUIRE_THROWS(bad.parse_document());
  std::ostringstream os;
  monitor::jsonl_logger to_stream(os);
  to_stream.log(reg);
  REQUIRE(os.str().back() == '\n');
}

TEST_CASE("training_metrics: the standard families", "[monitor][training]") {
  monitor::registry reg;
  monitor::training_metrics m(reg);
  m.observe({.seconds = 0.5,
             .samples = 64,
             .loss = 2.0,
             .learning_rate = 0.1,
             .loss_scale = 1024,
             .skipped = true,
             .communication_seconds = 0.1,
             .bytes_sent = 4096,
             .data_wait_seconds = 0.01,
             .grad_norm = 3.5});
  m.observe({.seconds = 0.25, .samples = 64, .loss = 1.5});
  m.set_epoch(3);
  const auto e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
  REQUIRE(*e.value("trainkit_steps_total") == 2);
  REQUIRE(*e.value("trainkit_samples_total") == 128);
  REQUIRE(*e.value("trainkit_step_duration_seconds_count") == 2);
  REQUIRE(*e.value("trainkit_step_duration_seconds_sum") == 0.75);
  REQUIRE(*e.value("trainkit_samples_per_second") == 256);
  REQUIRE(*e.value("trainkit_loss") == 1.5);
  REQUIRE(*e.value("trainkit_learning_rate") == 0.1);  // not reported by the second step: kept
  REQUIRE(*e.value("trainkit_loss_scale") == 1024);
  REQUIRE(*e.value("trainkit_grad_norm") == 3.5);  // not measured by the second step: kept
  REQUIRE(*e.value("trainkit_skipped_steps_total") == 1);
  REQUIRE(*e.value("trainkit_epoch") == 3);
  REQUIRE(*e.value("trainkit_communication_seconds_total") == 0.1);
  REQUIRE(*e.value("trainkit_communication_time_ratio") == 0);  // last step had none
  REQUIRE(*e.value("trainkit_bytes_sent_total") == 4096);
  REQUIRE(*e.value("trainkit_data_wait_seconds_total") == 0.01);
  REQUIRE(*e.value("trainkit_memory_allocated_bytes", {{"device", "cpu"}}) >= 0);
  REQUIRE(*e.value("trainkit_memory_peak_bytes", {{"device", "cpu"}}) >=
          *e.value("trainkit_memory_allocated_bytes", {{"device", "cpu"}}));
  REQUIRE(*e.value("trainkit_memory_reserved_bytes", {{"device", "cpu"}}) >= 0);
  REQUIRE(e.type.at("trainkit_step_duration_seconds") == "histogram");
  for (const auto& [name, type] : e.type)
    if (type == "counter") REQUIRE_THAT(name, Catch::Matchers::EndsWith("_total"));
}

TEST_CASE("training_metrics: interval figures replace the last step's until the next step", "[monitor][training]") {
  monitor::registry reg;
  monitor::training_metrics m(reg);
  m.observe({.seconds = 0.5, .samples = 64, .loss = 2.0});
  m.set_interval(1.75, 300.0);  // a log line's mean loss and samples/s
  auto e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
  CHECK(*e.value("trainkit_loss") == 1.75);
  CHECK(*e.value("trainkit_samples_per_second") == 300);
  CHECK(*e.value("trainkit_steps_total") == 1);  // no step counted
  m.set_interval(std::numeric_limits<double>::quiet_NaN(), 200.0);  // a loss not read: kept
  e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
  CHECK(*e.value("trainkit_loss") == 1.75);
  CHECK(*e.value("trainkit_samples_per_second") == 200);
  m.observe({.seconds = 0.25, .samples = 64, .loss = 1.5});
  e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
  CHECK(*e.value("trainkit_loss") == 1.5);
  CHECK(*e.value("trainkit_samples_per_second") == 256);
}

TEST_CASE("training_metrics exports another device's allocator figures", "[monitor]") {
  monitor::registry reg;
  monitor::training_metrics m(reg);
  trainkit::memory_stats fake{.allocated = 1000, .peak = 5000, .reserved = 8192, .allocations = 3};
  m.track_memory("cuda", [&] { return fake; });
  auto e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
  CHECK(*e.value("trainkit_memory_allocated_bytes", {{"device", "cuda"}}) == 1000);
  CHECK(*e.value("trainkit_memory_peak_bytes", {{"device", "cuda"}}) == 5000);
  CHECK(*e.value("trainkit_memory_reserved_bytes", {{"device", "cuda"}}) == 8192);
  fake.allocated = 2000;  // read again at every exposition
  e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
  CHECK(*e.value("trainkit_memory_allocated_bytes", {{"device", "cuda"}}) == 2000);
}

TEST_CASE("without NVML there are no GPU gauges and no error", "[monitor][nvml]") {
  monitor::nvml missing({.library = "libtrainkit-no-such-nvml.so.1"});
  REQUIRE(!missing.available());
  REQUIRE(missing.device_count() == 0);
  monitor::registry reg;
  REQUIRE(!monitor::export_gpu_metrics(reg, {.library = "libtrainkit-no-such-nvml.so.1"}));
  REQUIRE(!reg.contains("trainkit_gpu_utilization_ratio"));
  // The real library, where there is one (a CUDA machine), gives figures in range.
  monitor::nvml real;
  if (real.available() && real.device_count() > 0) {
    const auto s = real.sample(0);
    CHECK(s.utilization >= 0);
    CHECK(s.utilization <= 1);
    CHECK(s.memory_total_bytes > 0);
    CHECK(s.temperature_celsius > 0);
    monitor::registry greg;
    REQUIRE(monitor::export_gpu_metrics(greg));
    const auto e = monitor_test::parse_prometheus(monitor::to_prometheus(greg));
    REQUIRE(e.value("trainkit_gpu_memory_total_bytes", {{"gpu", "0"}}));
  } else {
    WARN("NVML not present: the GPU half of this test is skipped");
  }
}

TEST_CASE("a registry is safe to update while it is exposed", "[monitor][threads]") {
  monitor::registry reg;
  auto& c = reg.counter("c_total", "C.");
  auto& h = reg.histogram("h_seconds", "H.", {0.5});
  std::thread writer([&] {
    for (int i = 0; i < 20000; ++i) {
      c.inc();
      h.observe(0.25);
    }
  });
  for (int i = 0; i < 50; ++i) {
    const auto e = monitor_test::parse_prometheus(monitor::to_prometheus(reg));
    REQUIRE(*e.value("h_seconds_bucket", {{"le", "+Inf"}}) == *e.value("h_seconds_count"));
  }
  writer.join();
  REQUIRE(c.value() == 20000);
}
