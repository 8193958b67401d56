// trainkit/core/wait_governor.hpp - how long idle OpenMP workers spin, decided while the program
// runs: spin when the process has its cores, sleep at once while they are contended.
//
// Between two parallel regions (every GEMM, convolution and parallel loop is one) the OpenMP
// runtime's idle workers spin. Alone, that is what makes short regions cheap: libgomp's default
// spin of about 300,000 pauses (a few ms) costs nothing on cores nobody else wants, and a passive
// wait costs a futex wake-up per region (0-34 % of the MLP example's step on 2 cores). Next to
// another busy process the same spinning burns the time slices the other process (and this one's
// own master thread) needs: the example ran 13x slower next to a busy copy of itself.
//
// libgomp fixes its spin count when it loads, but it has a second one: while it manages more
// threads than the process has CPUs, every wait spins only GOMP's throttled count (1000 pauses,
// tens of microseconds) and then sleeps (libgomp manual, GOMP_SPINCOUNT). The governor uses that:
// a monitor thread reads the CPU pressure every 100 ms - the share of time some runnable task
// waited for a CPU (Linux PSI: the cgroup's cpu.pressure, else /proc/pressure/cpu; without PSI,
// runnable tasks from /proc/loadavg against the online CPUs) - and while it is high, a holder
// thread keeps a small idle OpenMP team of its own, which puts libgomp over its CPU count; when
// the pressure has been low for three windows the holder leaves and the full spin is back.
// Alone the program keeps the runtime's spinning default; contended it waits like
// OMP_WAIT_POLICY=passive - without the environment variable, which libgomp reads only at load.
//
// It starts with the first CPU GEMM, oneDNN primitive or parallel loop of the process. The
// process's governor is never destroyed and its threads are detached, so exit and fork behave as
// without it.
//
// TRAINKIT_WAIT=adaptive (default) | spin (never throttle) | sleep (always). It stays out of the
// way (mode "runtime") where the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT, where the OpenMP
// runtime is not libgomp (LLVM's and Intel's have KMP_BLOCKTIME), and without OpenMP.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/core/threads.hpp"  // detail::affinity_cores

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#if defined(__linux__)
#include <dlfcn.h>  // dlsym: which OpenMP runtime is loaded
#endif
#include <unistd.h>  // sysconf

namespace trainkit {

/// What decides the OpenMP workers' wait (see the top of this file).
enum class wait_mode {
  adaptive,  ///< spin while the CPUs are free, sleep while they are contended (the default)
  spin,      ///< the runtime's spinning default, always (TRAINKIT_WAIT=spin)
  sleep,     ///< a short spin, then sleep, always (TRAINKIT_WAIT=sleep)
  runtime,   ///< not governed: the user's OMP_WAIT_POLICY / GOMP_SPINCOUNT, or not libgomp
};

inline const char* to_string(wait_mode m) {
  switch (m) {
    case wait_mode::adaptive: return "adaptive";
    case wait_mode::spin: return "spin";
    case wait_mode::sleep: return "sleep";
    case wait_mode::runtime: return "runtime";
  }
  return "?";
}

/// The governor's state, for a start-up line or a test.
struct wait_status {
  wait_mode mode = wait_mode::runtime;
  std::string reason;     ///< why this mode (the variable or the runtime), or the pressure source
  bool sleeping = false;  ///< workers now take the short spin
  double pressure = 0;    ///< the last window's CPU pressure (share of time a task waited for a CPU)
  long switches = 0;      ///< how often the wait changed so far
  long windows = 0;       ///< adaptive: 100 ms windows measured so far
  long sleeping_windows = 0;  ///< adaptive: of those, the ones that ended throttled
};

namespace detail {

/// The decision, window by window: sleep as soon as one window's pressure exceeds `on`; spin again
/// after `calm_windows` windows in a row below `off` (the gap and the delay keep two processes that
/// both throttle from flipping back and forth).
struct wait_decider {
  double on = 0.15;
  double off = 0.08;
  int calm_windows = 3;
  bool sleeping = false;
  int calm = 0;

  bool update(double pressure) {
    if (!sleeping) {
      if (pressure > on) sleeping = true, calm = 0;
    } else if (pressure < off) {
      if (++calm >= calm_windows) sleeping = false, calm = 0;
    } else {
      calm = 0;
    }
    return sleeping;
  }
};

/// CPU pressure over a window: PSI's "some" total (microseconds a runnable task waited) per
/// microsecond of wall time, or (no PSI) the runnable tasks beyond the online CPUs per CPU.
class cpu_pressure_meter {
 public:
  cpu_pressure_meter() {
    // cgroup v2: the pressure of this process's own cgroup, so other containers' load does not count
    if (std::FILE* f = std::fopen("/proc/self/cgroup", "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, f))
        if (std::strncmp(line, "0::", 3) == 0) {
          line[std::strcspn(line, "\n")] = '\0';
          const std::string p = std::string("/sys/fs/cgroup") + (line + 3) + (line[3] == '/' && line[4] == '\0' ? "" : "/") +
                                "cpu.pressure";
          if (psi_total(p) >= 0) path_ = p;
        }
      std::fclose(f);
    }
    if (path_.empty() && psi_total("/proc/pressure/cpu") >= 0) path_ = "/proc/pressure/cpu";
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cpus_ = cpus > 0 ? double(cpus) : 1.0;
  }

  /// Whether the window needs sample() calls (no PSI).
  bool samples() const { return path_.empty(); }

  /// Where the figures come from.
  std::string source() const { return path_.empty() ? std::string("/proc/loadavg") : path_; }

  /// Starts a window.
  void begin() {
    t0_ = std::chrono::steady_clock::now();
    total0_ = path_.empty() ? 0 : psi_total(path_);
    runnable_sum_ = 0, samples_ = 0;
  }
  /// Without PSI, called every few ms within the window.
  void sample() {
    if (!path_.empty()) return;
    if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
      double a, b, c;
      long running = 0, total = 0;
      if (std::fscanf(f, "%lf %lf %lf %ld/%ld", &a, &b, &c, &running, &total) == 5)
        runnable_sum_ += double(running - 1), ++samples_;  // not counting this thread, which reads
      std::fclose(f);
    }
  }
  /// Ends the window: its pressure in [0, 1] (0 when nothing could be read).
  double end() {
    if (path_.empty()) {
      if (samples_ == 0) return 0;
      const double over = runnable_sum_ / double(samples_) - cpus_;
      return over > 0 ? (over / cpus_ > 1 ? 1 : over / cpus_) : 0;
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
    const long long total = psi_total(path_);
    if (total < 0 || total0_ < 0 || us <= 0) return 0;
    const double share = double(total - total0_) / us;
    return share < 0 ? 0 : (share > 1 ? 1 : share);
  }

  /// PSI "some ... total=N" of a pressure file (-1 when unreadable).
  static long long psi_total(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return -1;
    char line[256];
    long long total = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "some ", 5) == 0)
        if (const char* t = std::strstr(line, "total=")) total = std::atoll(t + 6);
    std::fclose(f);
    return total;
  }

 private:
  std::string path_;
  double cpus_ = 1;
  std::chrono::steady_clock::time_point t0_{};
  long long total0_ = 0;
  double runnable_sum_ = 0;
  int samples_ = 0;
};

/// The mode the environment and the loaded runtime allow, and why.
inline wait_mode governed_mode(std::string& reason) {
#if !TRAINKIT_HAS_OPENMP
  reason = "built without OpenMP";
  return wait_mode::runtime;
#else
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      reason = std::string(name) + " is set";
      return wait_mode::runtime;
    }
#if defined(__linux__)
  if (dlsym(RTLD_DEFAULT, "kmp_set_blocktime") != nullptr || dlsym(RTLD_DEFAULT, "GOMP_parallel") == nullptr) {
    reason = "the OpenMP runtime is not libgomp";
    return wait_mode::runtime;
  }
#endif
  const char* v = std::getenv("TRAINKIT_WAIT");
  const std::string s = v != nullptr ? v : "";
  if (s.empty() || s == "adaptive") return wait_mode::adaptive;
  reason = "TRAINKIT_WAIT=" + s;
  if (s == "spin") return wait_mode::spin;
  if (s == "sleep") return wait_mode::sleep;
  std::fprintf(stderr, "trainkit: TRAINKIT_WAIT=%s is not adaptive, spin or sleep; adaptive it is\n", s.c_str());
  reason.clear();
  return wait_mode::adaptive;
#endif
}

class wait_governor {
 public:
  /// The process's governor, started at the first call, in the mode the environment allows; never
  /// destroyed (its threads are detached and outlive static destruction).
  static wait_governor& get() {
    static wait_governor* g = [] {
      std::string reason;
      const wait_mode mode = governed_mode(reason);
      return new wait_governor(mode, std::move(reason));
    }();
    return *g;
  }

  /// A governor in `mode` (adaptive: with its monitor thread; sleep: throttling from now on). The
  /// process has one (get()); tests make their own.
  explicit wait_governor(wait_mode mode, std::string reason = {}) {
    status_.mode = mode;
    status_.reason = std::move(reason);
    if (mode == wait_mode::sleep) {
      std::unique_lock lock(mutex_);
      set_sleeping(lock, true);
    }
    if (mode == wait_mode::adaptive) {
      status_.reason = meter_.source();
      ++threads_alive_;
      std::thread([this] { monitor(); }).detach();
    }
  }

  /// Stops the monitor and lets the holder go; returns when neither is left.
  ~wait_governor() {
    std::unique_lock lock(mutex_);
    stop_ = true;
    set_sleeping(lock, false);
    cv_.notify_all();
    cv_.wait(lock, [this] { return threads_alive_ == 0; });
  }

  wait_status status() const {
    std::lock_guard lock(mutex_);
    return status_;
  }

  /// Throttles (or not) now; in adaptive mode the next windows decide from there. For tests.
  void force_sleeping(bool on) {
    std::unique_lock lock(mutex_);
    set_sleeping(lock, on);
  }

  wait_governor(const wait_governor&) = delete;
  wait_governor& operator=(const wait_governor&) = delete;

 private:
  void monitor() {
    wait_decider decide;
    // With PSI one reading per window; /proc/loadavg is sampled every 10 ms of it.
    constexpr auto window = std::chrono::milliseconds(100);
    const auto tick = meter_.samples() ? std::chrono::milliseconds(10) : window;
    std::unique_lock lock(mutex_);
    while (!stop_) {
      meter_.begin();
      for (auto t = std::chrono::milliseconds(0); t < window && !stop_; t += tick) {
        cv_.wait_for(lock, tick, [this] { return stop_; });
        meter_.sample();
      }
      if (stop_) break;
      const double p = meter_.end();
      status_.pressure = p;
      decide.sleeping = status_.sleeping;  // a forced state is where the decision goes on from
      set_sleeping(lock, decide.update(p));
      ++status_.windows;
      if (status_.sleeping) ++status_.sleeping_windows;
    }
    --threads_alive_;
    cv_.notify_all();
  }

  /// The holder: an OpenMP team of its own, idle, so that libgomp manages more threads than the
  /// CPUs and every wait takes the throttled spin; it leaves (and the team with it) when told.
  void set_sleeping(std::unique_lock<std::mutex>& lock, bool on) {
    if (on == status_.sleeping) return;
    ++status_.switches;
    status_.sleeping = on;
    ++holder_gen_;  // a holder leaves as soon as the generation is not its own
    cv_.notify_all();
    if (!on) return;
#if TRAINKIT_HAS_OPENMP
    const long gen = holder_gen_;
    ++threads_alive_;
    std::thread([this, gen] {
      // libgomp counts every team's threads but the master, and the program's team has at most
      // omp_get_max_threads(): together more than the CPUs it found at load (the affinity mask).
      const int team = std::max(2, affinity_cores() - omp_get_max_threads() + 2);
#pragma omp parallel num_threads(team)
      { (void)omp_get_thread_num(); }
      std::unique_lock l(mutex_);
      holder_ready_ = gen;
      cv_.notify_all();
      cv_.wait(l, [this, gen] { return holder_gen_ != gen; });
      --threads_alive_;
      cv_.notify_all();
    }).detach();
    cv_.wait(lock, [this, gen] { return holder_ready_ == gen || holder_gen_ != gen; });
#else
    (void)lock;
#endif
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  long holder_gen_ = 0, holder_ready_ = -1;
  int threads_alive_ = 0;
  bool stop_ = false;
  wait_status status_;
  cpu_pressure_meter meter_;
};

}  // namespace detail

/// Starts the governor if it is not running (the CPU kernels call this) and returns its state.
inline wait_status wait_policy() { return detail::wait_governor::get().status(); }

namespace detail {
/// The CPU kernels' call: the first one starts the governor.
inline void start_wait_governor() noexcept {
  static const bool started = (wait_governor::get(), true);
  (void)started;
}
}  // namespace detail

}  // namespace trainkit
