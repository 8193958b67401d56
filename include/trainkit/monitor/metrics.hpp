// trainkit/monitor/metrics.hpp - counters, gauges and histograms in a registry, the data model of
// Prometheus: a metric family has a name, a help text, a type and one child per label set.
//
//   monitor::registry reg;
//   auto& steps = reg.counter("trainkit_steps_total", "Optimizer steps taken");
//   auto& loss = reg.gauge("trainkit_loss", "Training loss of the last step");
//   auto& dt = reg.histogram("trainkit_step_duration_seconds", "Step time",
//   monitor::exponential_buckets(1e-3, 2, 15)); auto& temp = reg.gauge("trainkit_gpu_temperature_celsius",
//   "GPU temperature", {{"gpu", "0"}}); steps.inc(); loss.set(0.31); dt.observe(0.042);
//
// Updates are lock-free atomics (counters, gauges) or a short lock (histograms), so the training
// thread and an exporter thread can use a registry at the same time. References returned by the
// registry stay valid for its lifetime.
#pragma once

#include <algorithm>  // std::sort, std::is_sorted
#include <atomic>
#include <cmath>  // std::isnan
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/core/error.hpp"

namespace trainkit::monitor {

/// A label set: (name, value) pairs. Order does not matter (the registry sorts them).
using labels = std::vector<std::pair<std::string, std::string>>;

/// The Prometheus metric types this library exposes.
enum class metric_type { counter, gauge, histogram };

constexpr std::string_view to_string(metric_type t) noexcept {
  switch (t) {
    case metric_type::counter:
      return "counter";
    case metric_type::gauge:
      return "gauge";
    case metric_type::histogram:
      return "histogram";
  }
  return "untyped";
}

/// A value that only goes up (Prometheus resets are process restarts).
class counter {
 public:
  /// Adds v >= 0 (value_error for a negative or NaN increment).
  void inc(double v = 1.0) {
    TRAINKIT_CHECK(v >= 0.0, value_error, "counter::inc", "increments must be >= 0, got " << v);
    value_.fetch_add(v, std::memory_order_relaxed);
  }
  double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// A value that goes up and down.
class gauge {
 public:
  void set(double v) noexcept { value_.store(v, std::memory_order_relaxed); }
  void inc(double v = 1.0) noexcept { value_.fetch_add(v, std::memory_order_relaxed); }
  void dec(double v = 1.0) noexcept { value_.fetch_sub(v, std::memory_order_relaxed); }
  double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// Observations counted in buckets by upper bound (cumulative on exposition, as Prometheus
/// wants), with their sum and count.
class histogram {
 public:
  /// What an exposition reads, consistent (taken under the lock).
  struct snapshot {
    std::vector<double> bounds;         // upper bounds, increasing; +Inf is implicit
    std::vector<std::uint64_t> counts;  // per bucket, not cumulative; counts.size() == bounds.size() + 1
    double sum = 0.0;
    std::uint64_t count = 0;
  };

  explicit histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
    TRAINKIT_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()) &&
                       std::adjacent_find(bounds_.begin(), bounds_.end()) == bounds_.end(),
                   value_error, "histogram", "bucket bounds must be strictly increasing");
    for (double b : bounds_)
      TRAINKIT_CHECK(!std::isnan(b) && b != std::numeric_limits<double>::infinity(), value_error, "histogram",
                     "bucket bounds must be finite (+Inf is always the last bucket), got " << b);
  }

  /// Counts v in the first bucket whose bound is >= v (NaN goes to +Inf only).
  void observe(double v) {
    const std::size_t i =
        std::isnan(v)
            ? bounds_.size()
            : static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
    std::lock_guard lk(mu_);
    ++counts_[i];
    sum_ += v;
    ++count_;
  }
  snapshot read() const {
    std::lock_guard lk(mu_);
    return {bounds_, counts_, sum_, count_};
  }
  const std::vector<double>& bounds() const noexcept { return bounds_; }

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<std::uint64_t> counts_;
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

/// count bounds start, start*factor, start*factor^2, ... (Prometheus client's ExponentialBuckets).
inline std::vector<double> exponential_buckets(double start, double factor, std::size_t count) {
  TRAINKIT_CHECK(start > 0.0 && factor > 1.0 && count >= 1, value_error, "exponential_buckets",
                 "need start > 0, factor > 1, count >= 1, got " << start << ", " << factor << ", " << count);
  std::vector<double> b(count);
  double v = start;
  for (auto& x : b) {
    x = v;
    v *= factor;
  }
  return b;
}
/// count bounds start, start+width, ... (LinearBuckets).
inline std::vector<double> linear_buckets(double start, double width, std::size_t count) {
  TRAINKIT_CHECK(width > 0.0 && count >= 1, value_error, "linear_buckets",
                 "need width > 0, count >= 1, got " << width << ", " << count);
  std::vector<double> b(count);
  for (std::size_t i = 0; i < count; ++i) b[i] = start + width * static_cast<double>(i);
  return b;
}

namespace detail {
inline bool valid_metric_name(std::string_view n) {
  if (n.empty()) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}
inline bool valid_label_name(std::string_view n) {
  if (n.empty() || n.starts_with("__")) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}
}  // namespace detail

/// The metrics of a process (or of one job in it), by family name.
class registry {
 public:
  /// One child of a family: its labels and its metric (one of the three is set).
  struct child {
    labels label_set;
    std::unique_ptr<monitor::counter> c;
    std::unique_ptr<monitor::gauge> g;
    std::unique_ptr<monitor::histogram> h;
  };
  /// A family: name, help, type, children in creation order.
  struct family {
    std::string name, help;
    metric_type type;
    std::deque<child> children;
  };

  registry() = default;
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  /// The counter of `name` with these labels, created on first use. A name registered with
  /// another type, or with another help text, is a usage_error; so is an invalid name.
  monitor::counter& counter(std::string_view name, std::string_view help, labels l = {}) {
    return *get(name, help, metric_type::counter, std::move(l), {}).c;
  }
  monitor::gauge& gauge(std::string_view name, std::string_view help, labels l = {}) {
    return *get(name, help, metric_type::gauge, std::move(l), {}).g;
  }
  /// Every child of a histogram family has the bounds given at the family's first use.
  monitor::histogram& histogram(std::string_view name, std::string_view help, std::vector<double> bounds,
                                labels l = {}) {
    return *get(name, help, metric_type::histogram, std::move(l), std::move(bounds)).h;
  }

  /// Runs fn just before every exposition (collect()): for figures read on demand (GPU gauges,
  /// allocator statistics).
  void on_collect(std::function<void()> fn) {
    std::lock_guard lk(mu_);
    hooks_.push_back(std::move(fn));
  }

  /// Calls the collect hooks, then f(const family&) for every family in name order, under the
  /// registry's lock (f must not register metrics).
  template <class F>
  void visit(F&& f) const {
    std::vector<std::function<void()>> hooks;
    {
      std::lock_guard lk(mu_);
      hooks = hooks_;
    }
    for (auto& h : hooks) h();
    std::lock_guard lk(mu_);
    for (const auto& [n, fam] : families_) f(*fam);
  }

  bool contains(std::string_view name) const {
    std::lock_guard lk(mu_);
    return families_.count(std::string(name)) != 0;
  }

 private:
  child& get(std::string_view name, std::string_view help, metric_type type, labels l,
             std::vector<double> bounds) {
    TRAINKIT_CHECK(detail::valid_metric_name(name), usage_error, "monitor::registry",
                   "invalid metric name '" << name << "' (Prometheus names match [a-zA-Z_:][a-zA-Z0-9_:]*)");
    for (const auto& [k, v] : l) {
      TRAINKIT_CHECK(detail::valid_label_name(k) && k != "le" && k != "quantile", usage_error,
                     "monitor::registry", "invalid label name '" << k << "' on metric '" << name << "'");
    }
    std::sort(l.begin(), l.end());
    std::lock_guard lk(mu_);
    auto it = families_.find(std::string(name));
    if (it == families_.end()) {
      auto fam = std::make_unique<family>();
      fam->name = std::string(name);
      fam->help = std::string(help);
      fam->type = type;
      it = families_.emplace(fam->name, std::move(fam)).first;
    }
    family& fam = *it->second;
    TRAINKIT_CHECK(
        fam.type == type, usage_error, "monitor::registry",
        "metric '" << name << "' is a " << to_string(fam.type) << ", asked for a " << to_string(type));
    TRAINKIT_CHECK(fam.help == help, usage_error, "monitor::registry",
                   "metric '" << name << "' was registered with another help text");
    for (auto& c : fam.children)
      if (c.label_set == l) return c;
    child c;
    c.label_set = std::move(l);
    switch (type) {
      case metric_type::counter:
        c.c = std::make_unique<monitor::counter>();
        break;
      case metric_type::gauge:
        c.g = std::make_unique<monitor::gauge>();
        break;
      case metric_type::histogram:
        if (!fam.children.empty()) bounds = fam.children.front().h->bounds();
        c.h = std::make_unique<monitor::histogram>(std::move(bounds));
        break;
    }
    fam.children.push_back(std::move(c));
    return fam.children.back();
  }

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<family>> families_;
  std::vector<std::function<void()>> hooks_;
};

}  // namespace trainkit::monitor
