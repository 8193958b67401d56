// trainkit/monitor/progress.hpp - a live progress line while an epoch runs, like tqdm's bar or
// Lightning's: when the output is a terminal it is redrawn in place (carriage return, erase to the
// end of the line) at most every refresh_seconds; otherwise it writes nothing, so logs and pipes
// keep only the per-epoch lines the program prints itself.
//
//   monitor::progress_line bar;                                   // stdout; live only on a terminal
//   for (epoch ...) {
//     bar.begin("epoch " + std::to_string(e + 1) + "/" + std::to_string(epochs), steps_per_epoch);
//     for (auto& b : loader) { ...; bar.step(b.x.size(0), loss); }
//     bar.end();                                                   // clears the line
//     std::printf("epoch %d  loss %.4f ...\n", ...);
//   }
//
// What it shows: `epoch 1/3 [=========>          ] 120/469  loss 0.5123  2345 samples/s  ETA 0:12
// mem 45.1 MiB` - steps done of the epoch's total, the loss of the last step (or its running mean),
// the throughput since begin(), the time left at that pace and the bytes held by live tensors
// (the CPU allocator's, or what the caller passes, e.g. a GPU allocator's).
#pragma once

#include <unistd.h>  // isatty, fileno

#include <algorithm>  // std::clamp, std::min
#include <chrono>
#include <cmath>  // std::isfinite
#include <cstdint>
#include <cstdio>
#include <cstdlib>  // std::getenv, std::strtol
#include <cstring>  // std::strcmp
#include <limits>   // quiet_NaN
#include <optional>
#include <string>
#include <utility>

#include "trainkit/core/allocator.hpp"
#include "trainkit/core/device.hpp"
#include "trainkit/core/error.hpp"

namespace trainkit::monitor {

/// When the progress line is drawn.
enum class progress_mode {
  /// When the output is a terminal and TERM is not "dumb", and not in a process Open MPI started
  /// (mpirun hands every rank a pseudo-terminal whatever its own output is, so a log would fill
  /// with redraws). TRAINKIT_PROGRESS=always|never in the environment overrides it.
  automatic,
  always,     ///< always (tests, or a terminal the check cannot see)
  never,      ///< never
};

/// Settings of progress_line.
struct progress_options {
  std::FILE* out = stdout;             ///< where the line goes
  progress_mode mode = progress_mode::automatic;
  double refresh_seconds = 0.1;        ///< redraw at most this often (the last step always draws)
  int width = 0;                       ///< columns; 0: $COLUMNS, else 100
};

/// A progress line for the steps of one epoch (or any counted pass). Not thread-safe: call it from
/// the training loop's thread.
class progress_line {
 public:
  using clock = std::chrono::steady_clock;

  explicit progress_line(progress_options o = {}) : o_(o) {
    TRAINKIT_CHECK(o_.out != nullptr, value_error, "progress_line", "no output stream");
    TRAINKIT_CHECK(o_.refresh_seconds >= 0.0, value_error, "progress_line",
                   "refresh_seconds must be >= 0, got " << o_.refresh_seconds);
    live_ = o_.mode == progress_mode::always ||
            (o_.mode == progress_mode::automatic && automatic_live(o_.out));
    width_ = o_.width > 0 ? o_.width : columns_from_env();
  }
  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;
  ~progress_line() { end(); }

  /// Whether the line is drawn (a terminal, or mode always).
  bool live() const noexcept { return live_; }

  /// Starts a pass of `total` steps (0: unknown; no bar and no ETA), shown after `label`, of which
  /// `done` are behind already (a resumed epoch); the rate and the ETA count only the steps to come.
  void begin(std::string label, std::int64_t total, std::int64_t done = 0) {
    TRAINKIT_CHECK(total >= 0, value_error, "progress_line::begin", "total must be >= 0, got " << total);
    TRAINKIT_CHECK(done >= 0 && (total == 0 || done <= total), value_error, "progress_line::begin",
                   "done must be in [0, total = " << total << "], got " << done);
    end();
    label_ = std::move(label);
    total_ = total;
    done_ = first_ = done;
    samples_ = 0;
    loss_.reset();
    start_ = clock::now();
    open_ = true;
    draw();
  }

  /// One step done: `samples` trained on, its loss (NaN: not shown), and the bytes to show as
  /// memory (default: the CPU allocator's live bytes).
  void step(std::int64_t samples, double loss = std::numeric_limits<double>::quiet_NaN(),
            std::optional<std::uint64_t> memory_bytes = std::nullopt) {
    if (!open_) return;
    ++done_;
    samples_ += samples;
    if (std::isfinite(loss)) loss_ = loss;
    memory_ = memory_bytes ? *memory_bytes : static_cast<std::uint64_t>(allocator<cpu>::stats().allocated);
    const auto now = clock::now();
    const bool last = total_ > 0 && done_ >= total_;
    if (last || std::chrono::duration<double>(now - last_draw_).count() >= o_.refresh_seconds) draw();
  }

  /// Ends the pass: the line is erased, so the caller's summary line takes its place.
  void end() {
    if (!open_) return;
    open_ = false;
    if (live_) {
      std::fputs("\r\033[K", o_.out);
      std::fflush(o_.out);
    }
  }

  /// The line as it would be drawn now (without the carriage return); for tests and logs.
  std::string render() const {
    const double elapsed = std::chrono::duration<double>(clock::now() - start_).count();
    std::string s = label_;
    if (total_ > 0) {
      // The bar takes what the figures leave of the width, between 10 and 30 columns.
      const int bar = std::clamp(width_ - 80 - static_cast<int>(label_.size()), 10, 30);
      const int filled = static_cast<int>(static_cast<double>(bar) * static_cast<double>(done_) /
                                          static_cast<double>(total_));
      s += " [";
      for (int i = 0; i < bar; ++i) s += i < filled ? '=' : (i == filled ? '>' : ' ');
      s += "] " + std::to_string(done_) + "/" + std::to_string(total_);
    } else {
      s += " " + std::to_string(done_);
    }
    char buf[160];
    if (loss_) {
      std::snprintf(buf, sizeof buf, "  loss %.4f", *loss_);
      s += buf;
    }
    if (elapsed > 0 && samples_ > 0) {
      std::snprintf(buf, sizeof buf, "  %.0f samples/s", static_cast<double>(samples_) / elapsed);
      s += buf;
    }
    if (total_ > 0 && done_ > first_) {
      const double left = elapsed / static_cast<double>(done_ - first_) *
                          static_cast<double>(total_ - std::min(done_, total_));
      s += "  ETA " + format_duration(left);
    }
    std::snprintf(buf, sizeof buf, "  mem %.1f MiB", static_cast<double>(memory_) / (1024.0 * 1024.0));
    s += buf;
    if (static_cast<int>(s.size()) > width_ - 1) s.resize(static_cast<std::size_t>(std::max(width_ - 1, 0)));
    return s;
  }

  /// h:mm:ss or m:ss.
  static std::string format_duration(double seconds) {
    auto t = static_cast<long long>(seconds + 0.5);
    if (t < 0) t = 0;
    char buf[32];
    if (t >= 3600)
      std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, (t / 60) % 60, t % 60);
    else
      std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
    return buf;
  }

 private:
  static bool automatic_live(std::FILE* out) {
    if (const char* env = std::getenv("TRAINKIT_PROGRESS")) {
      if (std::strcmp(env, "always") == 0) return true;
      if (std::strcmp(env, "never") == 0) return false;
    }
    const char* term = std::getenv("TERM");
    if (term != nullptr && std::strcmp(term, "dumb") == 0) return false;
    if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) return false;  // mpirun's pty, not the user's
    return ::isatty(::fileno(out)) != 0;
  }
  static int columns_from_env() {
    if (const char* c = std::getenv("COLUMNS")) {
      const long v = std::strtol(c, nullptr, 10);
      if (v >= 20 && v <= 1000) return static_cast<int>(v);
    }
    return 100;
  }

  /// Redraws the line now (the caller decides when: begin(), or step() past the refresh time).
  void draw() {
    if (!live_) return;
    last_draw_ = clock::now();
    const std::string line = render();
    std::fputs("\r", o_.out);
    std::fputs(line.c_str(), o_.out);
    std::fputs("\033[K", o_.out);  // erase what a longer previous line left
    std::fflush(o_.out);
  }

  progress_options o_;
  bool live_ = false;
  int width_ = 100;
  bool open_ = false;
  std::string label_;
  std::int64_t total_ = 0, done_ = 0, first_ = 0, samples_ = 0;
  std::optional<double> loss_;
  std::uint64_t memory_ = 0;
  clock::time_point start_{}, last_draw_{};
};

}  // namespace trainkit::monitor
