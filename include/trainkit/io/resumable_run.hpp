// trainkit/io/resumable_run.hpp - resumable_run: what a training program needs for --snapshot-dir
// and --resume in a few lines - a training_state, a snapshot_manager, a snapshot_timer and a
// preemption_guard, driven from the loop by one call per step.
//
//   io::resumable_run run({.dir = flags.snapshot_dir, .resume = flags.resume, .every_steps = 500});
//   run.track("model", *model).track("optimizer", opt).track("schedule", schedule).track("batches", batches);
//   run.resume();                                           // no-op without --resume or a snapshot
//   for (auto epoch = batches.epoch(); epoch < epochs; ++epoch) {
//     if (epoch != batches.epoch()) batches.set_epoch(epoch);  // a resumed epoch continues mid-way
//     for (auto& b : batches) {
//       ...forward, backward, step...
//       if (run.step_done()) return 0;                      // SIGTERM/SIGINT: snapshot written, exit
//     }
//   }
//   run.finish();                                           // the final snapshot
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/preemption.hpp"
#include "trainkit/io/snapshot_manager.hpp"
#include "trainkit/io/training_state.hpp"

namespace trainkit::io {

/// Settings of resumable_run (the examples' --snapshot-dir, --resume, --snapshot-every).
struct resumable_run_options {
  std::string dir = {};          ///< snapshot directory; empty: no snapshots, step_done() only counts
  bool resume = false;           ///< resume() loads the newest good snapshot of dir
  std::int64_t every_steps = 0;  ///< periodic snapshot every this many steps (0: off)
  double every_seconds = 0.0;    ///< and/or every this many seconds (0: off)
  std::size_t keep_last = 3;     ///< snapshots kept
  int rank = 0;                  ///< data parallel: only rank 0 writes, every rank reads
  bool handle_signals = true;    ///< SIGTERM/SIGINT -> snapshot at the next step boundary, stop
  /// Data parallel: the OR of a flag over the ranks (io::any_rank_of(comm)), so that every rank
  /// stops and snapshots at the same steps; empty in a single process.
  std::function<bool(bool)> any_rank = {};
  /// Data parallel with per-rank state: every rank's bytes to every rank
  /// (io::allgather_bytes_of(comm)); rank 0 puts every rank's per-rank sections in the file.
  std::function<std::vector<std::vector<std::byte>>(const std::vector<std::byte>&)> allgather_bytes = {};
  /// Messages (resumed from, fallbacks); empty: stderr on rank 0.
  std::function<void(std::string_view)> log = {};
  write_options write = {};
};

/// Snapshots and resume for a training loop (see the top of this file). Not copyable: it holds
/// references to the tracked objects, which must outlive it.
class resumable_run {
 public:
  explicit resumable_run(resumable_run_options o, bool include_default_generator = true)
      : o_(std::move(o)), state_(include_default_generator), timer_({o_.every_steps, o_.every_seconds}) {
    if (o_.dir.empty()) return;
    snapshot_manager_options mo;
    mo.keep_last = o_.keep_last;
    mo.rank = o_.rank;
    mo.write = o_.write;
    mo.log = [this](std::string_view m) { say(m); };
    manager_.emplace(o_.dir, std::move(mo));
    if (o_.handle_signals) guard_.emplace();
  }
  resumable_run(const resumable_run&) = delete;
  resumable_run& operator=(const resumable_run&) = delete;

  /// Adds a component to the saved state (training_state::add).
  template <class X>
  resumable_run& track(std::string section, X& x) {
    state_.add(std::move(section), x);
    return *this;
  }
  /// Adds a component that differs by rank (error-feedback residuals): every rank's copy is saved
  /// and each rank restores its own.
  template <class X>
  resumable_run& track_per_rank(std::string section, X& x) {
    state_.add_per_rank(std::move(section), x);
    return *this;
  }
  training_state& state() noexcept { return state_; }
  bool enabled() const noexcept { return manager_.has_value(); }
  snapshot_manager* manager() noexcept { return manager_ ? &*manager_ : nullptr; }

  /// With resume set: restores the newest snapshot that verifies (falling back past damaged
  /// ones) and returns true; false when resume is off or the directory holds none.
  bool resume() {
    if (!manager_ || !o_.resume) return false;
    auto got = manager_->load_latest();
    if (!got) {
      say("resumable_run: no snapshot in '" + o_.dir + "', starting from scratch");
      return false;
    }
    state_.restore(got->snap, o_.rank);
    timer_.saved(state_.progress().step);
    last_saved_ = got->from.path;
    say("resumable_run: resumed from '" + got->from.path.string() + "' at step " +
        std::to_string(state_.progress().step));
    return true;
  }

  std::int64_t step() const noexcept { return state_.progress().step; }
  std::int64_t epoch() const noexcept { return state_.progress().epoch; }
  void set_epoch(std::int64_t e) noexcept { state_.progress().epoch = e; }

  /// Call once after every optimizer step: counts it, writes the periodic snapshot when due, and
  /// when a stop was requested (signal, request_stop()) writes a snapshot and returns true - the
  /// loop should then return.
  bool step_done() {
    ++state_.progress().step;
    bool stop = stop_requested_ || (guard_ && guard_->requested());
    if (o_.any_rank) stop = o_.any_rank(stop);
    bool due = manager_ && timer_.due(step());
    // Steps agree across ranks, wall clocks do not: a time-based decision is made together.
    if (o_.any_rank && o_.every_seconds > 0.0) due = o_.any_rank(due);
    if (stop || due) save();
    stopped_ = stop;
    if (stop)
      say("resumable_run: stop requested" +
          (guard_ && guard_->signal() ? " (signal " + std::to_string(guard_->signal()) + ")"
                                      : std::string()) +
          " - snapshot of step " + std::to_string(step()) + " written, stopping");
    return stop;
  }

  /// Writes a snapshot of the current step now (no-op without a directory). Returns its path.
  /// With per-rank components and allgather_bytes, a collective: call it on every rank.
  std::optional<std::filesystem::path> save() {
    if (!manager_) return std::nullopt;
    snapshot snap = state_.capture_shared();
    if (state_.has_per_rank()) {
      const snapshot mine = state_.capture_per_rank(o_.rank);
      if (o_.allgather_bytes) {
        const auto all = o_.allgather_bytes(mine.to_bytes());
        if (o_.rank == 0)
          for (std::size_t r = 0; r < all.size(); ++r) {
            const snapshot part = snapshot::from_bytes(all[r], "rank " + std::to_string(r));
            for (const auto& name : part.section_names()) snap.add_section_copy(part.section(name));
          }
      } else {
        for (const auto& name : mine.section_names()) snap.add_section_copy(mine.section(name));
      }
    }
    last_saved_ = manager_->save(step(), snap);
    timer_.saved(step());
    return last_saved_;
  }
  /// The final snapshot, unless the current step was just saved.
  void finish() {
    if (manager_ && (!last_saved_ || *last_saved_ != manager_->path_for(step()))) save();
  }

  /// Asks the loop to stop at the next step_done(), as a signal would.
  void request_stop() noexcept { stop_requested_ = true; }
  /// Whether a stop is pending: a handled signal arrived or request_stop() was called (the next
  /// step_done() will snapshot and return true).
  bool stop_pending() const noexcept { return stop_requested_ || (guard_ && guard_->requested()); }
  /// Whether step_done() has returned true.
  bool stopped() const noexcept { return stopped_; }
  const std::optional<std::filesystem::path>& last_saved() const noexcept { return last_saved_; }

 private:
  void say(std::string_view m) const {
    if (o_.log)
      o_.log(m);
    else if (o_.rank == 0)
      std::fprintf(stderr, "%.*s\n", static_cast<int>(m.size()), m.data());
  }

  resumable_run_options o_;
  training_state state_;
  snapshot_timer timer_;
  std::optional<snapshot_manager> manager_;
  std::optional<preemption_guard> guard_;
  std::optional<std::filesystem::path> last_saved_;
  bool stopped_ = false;
  bool stop_requested_ = false;
};

}  // namespace trainkit::io
