// trainkit/io/preemption.hpp - stopping cleanly when the machine is taken away: preemption_guard
// turns SIGTERM/SIGINT into a flag the training loop reads at step boundaries, and
// snapshot_timer says when a periodic snapshot is due (every N steps or M minutes).
//
//   io::preemption_guard guard;                         // SIGTERM, SIGINT -> requested()
//   io::snapshot_timer timer({.every_steps = 500, .every_seconds = 600});
//   for (...) {
//     train_one_step();
//     ++step;
//     if (guard.requested() || timer.due(step)) { snaps.save(step, state.capture()); timer.saved(step); }
//     if (guard.requested()) return 0;                  // exit cleanly; the scheduler restarts us
//   }
//
// Under data parallelism a signal may reach the ranks at different steps: make the decision
// collective (dist::any_rank(comm, guard.requested())) so that every rank stops at the same step.
#pragma once

#include <pthread.h>  // pthread_sigmask
#include <signal.h>   // sigaction (POSIX)
#include <unistd.h>   // pause

#include <atomic>
#include <chrono>
#include <csignal>  // sig_atomic_t, SIGTERM, SIGINT
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <vector>

#include "trainkit/config.hpp"  // TRAINKIT_HAS_OPENMP
#include "trainkit/core/error.hpp"

namespace trainkit::io {

namespace detail {
// The handler may only touch lock-free atomics (async-signal-safe); one guard at a time owns them.
inline std::atomic<int>& preemption_signal() {
  static std::atomic<int> s{0};
  return s;
}
inline std::atomic<bool>& preemption_guard_active() {
  static std::atomic<bool> a{false};
  return a;
}
static_assert(std::atomic<int>::is_always_lock_free, "preemption_guard needs a lock-free atomic<int>");
inline void preemption_handler(int sig) noexcept {
  preemption_signal().store(sig, std::memory_order_relaxed);
}
// The handler's sigaction: record, and let a write() in progress continue (not fail with EINTR).
inline struct sigaction recording_action() noexcept {
  struct sigaction sa {};
  sa.sa_handler = &preemption_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  return sa;
}
// Where the handler runs: never on a thread that computes. oneDNN's generated f32 GEMM kernels
// (x64 "gemm:jit", the fp32 matmul on CPUs without AVX-512 - an AVX2-only EPYC; Debian's oneDNN
// 2.6) point rsp into the heap while they run (oneDNN issue 4845, fixed upstream in March 2026):
// a handler that interrupts one pushes its frame there and corrupts the heap. Seen from outside:
// the Slurm requeue test's ranks aborted in free() ("corrupted size vs. prev_size") or died with
// SIGBUS at exit after scontrol requeue's SIGTERM. So the signals are blocked in the calling
// thread - and in every thread it starts later, which inherit its mask - and in the OpenMP pool
// (oneDNN's and trainkit's parallel regions), and one idle thread of trainkit's own keeps every
// signal unblocked: the kernel delivers a process-directed signal (kill, a launcher, the
// scheduler) to a thread that does not block it, so the handler runs there. A thread-directed one
// (raise, pthread_kill) at a thread that blocks it stays pending.
/// Returns the calling thread's mask before the call.
inline sigset_t route_signals_away_from_compute(std::initializer_list<int> signals) {
  static std::once_flag started;
  std::call_once(started, [] {
    std::thread([] {
      sigset_t none;
      sigemptyset(&none);
      pthread_sigmask(SIG_SETMASK, &none, nullptr);
      for (;;) ::pause();  // returns after each handler
    }).detach();
  });
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  sigset_t before;
  pthread_sigmask(SIG_BLOCK, &set, &before);
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
#endif
  return before;
}
// Set by catch_stop_signals_early(): a signal recorded before the first guard is kept by it.
inline std::atomic<bool>& stop_signals_caught_early() {
  static std::atomic<bool> e{false};
  return e;
}
}  // namespace detail

/// Installs the recording handler for SIGTERM and SIGINT now, for the whole process, before
/// anything slow starts (MPI_Init, NCCL, loading data): a stop signal that arrives before the
/// training loop's preemption_guard exists is then kept, and that guard reports it at the first
/// step boundary (a clean snapshot and exit status 75) instead of the default action killing the
/// process (143). Call it first thing in main(), before any thread starts: the signals are then
/// blocked in every thread but one of trainkit's (detail::route_signals_away_from_compute); the
/// handlers stay for the life of the process.
inline void catch_stop_signals_early() {
  const struct sigaction sa = detail::recording_action();
  for (int s : {SIGTERM, SIGINT})
    TRAINKIT_CHECK(::sigaction(s, &sa, nullptr) == 0, usage_error, "catch_stop_signals_early",
                   "cannot install a handler for signal " << s);
  detail::route_signals_away_from_compute({SIGTERM, SIGINT});
  detail::stop_signals_caught_early().store(true);
}

/// Installs handlers (sigaction) for the given signals - SIGTERM and SIGINT by default - that
/// only record the signal; the loop polls requested() at step boundaries, snapshots and returns.
/// The signals stay blocked in the constructing thread, the threads it starts later and the
/// OpenMP pool, and are handled on a thread of trainkit's own
/// (detail::route_signals_away_from_compute): signals sent to the process (kill, launchers,
/// schedulers) are seen; raise() in a blocked thread is not. The destructor restores the handlers
/// that were there before and the constructing thread's signal mask. A signal that arrived after
/// catch_stop_signals_early() and before the guard counts as requested. One guard may exist at a time
/// (a second is a usage_error): signal dispositions are per process.
class preemption_guard {
 public:
  explicit preemption_guard(std::initializer_list<int> signals = {SIGTERM, SIGINT}) {
    bool expected = false;
    TRAINKIT_CHECK(detail::preemption_guard_active().compare_exchange_strong(expected, true), usage_error,
                   "preemption_guard", "another preemption_guard is active in this process");
    // A signal caught early (catch_stop_signals_early) is this guard's to report.
    if (!detail::stop_signals_caught_early().load()) detail::preemption_signal().store(0);
    const struct sigaction sa = detail::recording_action();
    for (int s : signals) {
      struct sigaction old {};
      if (::sigaction(s, &sa, &old) != 0) {
        restore();
        detail::preemption_guard_active().store(false);
        TRAINKIT_CHECK(false, usage_error, "preemption_guard", "cannot install a handler for signal " << s);
      }
      previous_.push_back({s, old});
    }
    mask_before_ = detail::route_signals_away_from_compute(signals);
  }
  preemption_guard(const preemption_guard&) = delete;
  preemption_guard& operator=(const preemption_guard&) = delete;
  ~preemption_guard() {
    restore();
    pthread_sigmask(SIG_SETMASK, &mask_before_, nullptr);  // blocked still where they were before
    detail::preemption_guard_active().store(false);
  }

  /// Whether a handled signal has arrived since construction (or the last clear()).
  bool requested() const noexcept { return detail::preemption_signal().load(std::memory_order_relaxed) != 0; }
  /// The signal that arrived (0 when none).
  int signal() const noexcept { return detail::preemption_signal().load(std::memory_order_relaxed); }
  /// Asks for a stop as a signal would (tests, a watchdog thread, an evaluation that says "done").
  void request(int sig = SIGTERM) noexcept {
    detail::preemption_signal().store(sig, std::memory_order_relaxed);
  }
  void clear() noexcept { detail::preemption_signal().store(0, std::memory_order_relaxed); }

 private:
  void restore() noexcept {
    for (auto it = previous_.rbegin(); it != previous_.rend(); ++it)
      ::sigaction(it->sig, &it->action, nullptr);
    previous_.clear();
  }
  struct saved {
    int sig;
    struct sigaction action;
  };
  std::vector<saved> previous_;
  sigset_t mask_before_;
};

/// When periodic snapshots are due.
struct snapshot_timer_options {
  std::int64_t every_steps = 0;  ///< a snapshot every this many steps (0: not by steps)
  double every_seconds = 0.0;    ///< and/or when this much wall time passed since the last (0: not by time)
};

/// Decides at a step boundary whether a periodic snapshot is due; saved(step) restarts both
/// clocks. Steps count from the last saved step, so a resumed run keeps the same cadence.
class snapshot_timer {
 public:
  using clock = std::chrono::steady_clock;

  explicit snapshot_timer(snapshot_timer_options o = {}, std::int64_t start_step = 0)
      : o_(o), last_step_(start_step), last_time_(clock::now()) {
    TRAINKIT_CHECK(
        o.every_steps >= 0 && o.every_seconds >= 0.0, value_error, "snapshot_timer",
        "every_steps and every_seconds must be >= 0, got " << o.every_steps << " and " << o.every_seconds);
  }
  /// True when `step` (the number of steps done) is a multiple of every_steps past the last
  /// save, or every_seconds have passed since it.
  bool due(std::int64_t step) const {
    if (step <= last_step_) return false;
    if (o_.every_steps > 0 && step % o_.every_steps == 0) return true;
    if (o_.every_seconds > 0.0 &&
        std::chrono::duration<double>(clock::now() - last_time_).count() >= o_.every_seconds)
      return true;
    return false;
  }
  /// A snapshot of `step` was written (periodic or not).
  void saved(std::int64_t step) {
    last_step_ = step;
    last_time_ = clock::now();
  }
  const snapshot_timer_options& options() const noexcept { return o_; }

 private:
  snapshot_timer_options o_;
  std::int64_t last_step_;
  clock::time_point last_time_;
};

}  // namespace trainkit::io
