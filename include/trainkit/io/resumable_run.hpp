// trainkit/io/resumable_run.hpp - resumable_run: what a training program needs for --snapshot-dir
// and --resume in a few lines - a training_state, a snapshot_manager, a snapshot_timer and a
// preemption_guard, driven from the loop by one call per step.
//
//   io::resumable_run run({.dir = flags.snapshot_dir, .resume = io::resume_mode::required, .every_steps = 500,
//                          .config = {{"batch", "128"}, {"seed", "1"}, {"model", signature}}});
//   run.track("model", *model).track("optimizer", opt).track("schedule", schedule).track("batches", batches);
//   run.resume();                                           // see resume_mode
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

/// What resume() does (the examples' --resume 0 | 1 | auto).
enum class resume_mode {
  off,         ///< start from step 0 (snapshots are still written)
  required,    ///< a usable snapshot must be there: none (an empty or mistyped directory, only
               ///< damaged files) is an io_error; a differing `config` is an error too
  if_present,  ///< resume when a usable snapshot is there, else start from step 0 (for jobs a
               ///< scheduler requeues); a differing `config` is a warning naming each difference
};

/// Settings of resumable_run (the examples' --snapshot-dir, --resume, --snapshot-every).
struct resumable_run_options {
  std::string dir = {};          ///< snapshot directory; empty: no snapshots, step_done() only counts
  resume_mode resume = resume_mode::off;  ///< what resume() does
  /// What changes the trajectory (batch size, world size, seed, compression, a model signature...):
  /// written into every snapshot ("run_config" section) and compared on resume - a value that
  /// differs, or a key only one side has, is an error (required) or a warning (if_present).
  std::vector<std::pair<std::string, std::string>> config = {};
  std::int64_t every_steps = 0;  ///< periodic snapshot every this many steps (0: off)
  double every_seconds = 0.0;    ///< and/or every this many seconds (0: off)
  std::size_t keep_last = 3;     ///< snapshots kept
  int rank = 0;                  ///< data parallel: only rank 0 writes, every rank reads
  /// Data parallel: the number of ranks now. A snapshot written by another number resumes with its
  /// per-rank state redistributed (training_state::restore) and says so; 0: the snapshot's own.
  int world_size = 0;
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
    std::error_code ec;
    dir_existed_ = std::filesystem::is_directory(o_.dir, ec);
    // --resume 1 on a directory that is not there: resume() says so, and nothing is created (a
    // retry, or --resume auto, must not find an empty directory made by the typo).
    if (!dir_existed_ && o_.resume == resume_mode::required) {
      if (o_.handle_signals) guard_.emplace();
      return;
    }
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

  /// Restores the newest snapshot that verifies (falling back past damaged ones, which the
  /// manager renames aside) and returns true; false when resume is off, or with if_present when
  /// the directory holds none. With required, no usable snapshot is an io_error naming the
  /// directory and each rejected file; a config that differs from the snapshot's is a
  /// value_error naming each difference (if_present: a warning). Nothing is restored on error.
  bool resume() {
    boundary_ = state_.capture_boundary();  // step 0, for save_after_failure() (or the resumed step's below)
    if (o_.resume == resume_mode::off) return false;
    TRAINKIT_CHECK(manager_.has_value() || !o_.dir.empty(), usage_error, "resumable_run::resume",
                   "resuming needs a snapshot directory (resumable_run_options::dir is empty)");
    TRAINKIT_CHECK(manager_.has_value(), io_error, "resumable_run::resume",
                   "--resume: no usable snapshot in '" << o_.dir
                                                       << "' (the directory did not exist; nothing was created); to "
                                                          "start from scratch when there is none, resume if present "
                                                          "(--resume auto)");
    auto got = manager_->load_latest();
    if (!got) {
      TRAINKIT_CHECK(o_.resume != resume_mode::required, io_error, "resumable_run::resume",
                     "--resume: no usable snapshot in '"
                         << o_.dir << "'"
                         << (dir_existed_ ? std::string() : std::string(" (the directory did not exist)"))
                         << rejected_list(manager_->last_rejected()) << set_aside_list()
                         << "; to start from scratch when there is none, resume if present (--resume auto)");
      say("resumable_run: no usable snapshot in '" + o_.dir + "', starting from scratch");
      return false;
    }
    check_config(got->snap);
    const int written_by = state_.restore(got->snap, o_.rank, o_.world_size);
    boundary_ = state_.capture_boundary();
    timer_.saved(state_.progress().step);
    if (const auto why = training_state::per_rank_dropped_in(got->snap); !why.empty())
      say("resumable_run: the snapshot holds no per-rank state (" + why +
          "): error feedback and per-rank generators start afresh");
    last_saved_ = got->from.path;
    say("resumable_run: resumed from '" + got->from.path.string() + "' at step " +
        std::to_string(state_.progress().step) +
        (written_by != o_.world_size ? " (written by " + std::to_string(written_by) + " ranks, now " +
                                           std::to_string(o_.world_size) + ": per-rank state redistributed)"
                                     : std::string()));
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
    // Data parallel: the state of the step just completed, before any collective below can fail -
    // what save_after_failure() writes (a few small records; a single process has no peer to lose).
    if (manager_ && o_.any_rank) boundary_ = state_.capture_boundary();
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
    add_config(snap);
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
  /// After a peer failed (a dist_error), on the one surviving rank chosen to write (for MPI:
  /// rank == comm.lowest_surviving_rank()): writes the snapshot of the last completed step from
  /// this rank alone, no collective - progress and the small components (loader position,
  /// schedule, generators) as step_done() captured them at that step, the model and optimizer as
  /// they are (unchanged since, when the failure came before the optimizer's update, as it does
  /// in backward or finish()), no per-rank state (the other ranks' is gone: error feedback and
  /// per-rank generators restart on resume, which says so). Nothing when a snapshot of that step
  /// exists (a complete periodic one) or without a directory. A requeued job then loses at most
  /// the step that was running. Returns the path written.
  std::optional<std::filesystem::path> save_after_failure() {
    if (!manager_) return std::nullopt;
    if (!boundary_.contains("progress")) boundary_ = state_.capture_boundary();
    run_progress p;
    load_state(boundary_, "progress", p);
    snapshot snap = state_.capture_after_failure(boundary_, o_.rank);
    add_config(snap);
    auto path = manager_->save_as_survivor(p.step, snap);
    // Either way the user learns where the job will resume from.
    const std::string m =
        path ? "resumable_run: rank " + std::to_string(o_.rank) + " wrote the snapshot of step " +
                   std::to_string(p.step) + " after a peer failed: " + path->string()
             : "resumable_run: rank " + std::to_string(o_.rank) + ": the snapshot of step " + std::to_string(p.step) +
                   " (the last completed) was already written after a peer failed: " +
                   manager_->path_for(p.step).string();
    if (path) last_saved_ = path;
    if (o_.log)  // say() speaks for rank 0 only; the writer may be another rank
      o_.log(m);
    else
      std::fprintf(stderr, "%s\n", m.c_str());
    return path;
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

  /// The snapshot section that holds resumable_run_options::config.
  static constexpr std::string_view config_section = "run_config";

 private:
  void add_config(snapshot& snap) const {
    if (o_.config.empty()) return;
    auto& c = snap.add_section(std::string(config_section));
    for (const auto& [k, v] : o_.config) c.put_string(k, v);
  }
  // Damaged snapshots an earlier resume set aside (*.damaged): named, so a second attempt says why.
  std::string set_aside_list() const {
    std::string r;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(o_.dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".damaged") r += (r.empty() ? "; set aside earlier as damaged: " : ", ") + it->path().string();
    return r;
  }
  static std::string rejected_list(const std::vector<std::string>& rejected) {
    std::string r;
    for (const auto& why : rejected) r += "; rejected: " + why;
    return r;
  }
  /// Compares the snapshot's run_config with ours (before anything is restored).
  void check_config(const snapshot& snap) const {
    if (o_.config.empty()) return;
    if (!snap.contains(config_section)) {
      say("resumable_run: the snapshot records no run configuration (written by an older trainkit); "
          "not compared");
      return;
    }
    const snapshot_section& saved = snap.section(config_section);
    std::string diff;
    int n = 0;
    auto add = [&](const std::string& what) { diff += (n++ ? "; " : "") + what; };
    for (const auto& [k, v] : o_.config) {
      if (!saved.contains(k))
        add(k + ": not recorded in the snapshot, now '" + v + "'");
      else if (saved.get_string(k) != v)
        add(k + ": snapshot '" + saved.get_string(k) + "', now '" + v + "'");
    }
    for (const auto& k : saved.names()) {
      bool ours = false;
      for (const auto& kv : o_.config) ours = ours || kv.first == k;
      if (!ours) add(k + ": snapshot '" + saved.get_string(k) + "', not set now");
    }
    if (n == 0) return;
    const std::string where = snap.source().empty() ? std::string("the snapshot") : "'" + snap.source() + "'";
    TRAINKIT_CHECK(o_.resume != resume_mode::required, value_error, "resumable_run::resume",
                   "this run differs from " << where << " in what changes the trajectory (" << diff
                                            << "); run with the snapshot's settings, or --resume auto to continue anyway");
    say("resumable_run: warning: this run differs from " + where + " (" + diff + "); continuing as asked");
  }

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
  snapshot boundary_;  // capture_boundary() at the last completed step
  bool stopped_ = false;
  bool stop_requested_ = false;
  bool dir_existed_ = false;  // before the manager created it: a mistyped --snapshot-dir shows
};

}  // namespace trainkit::io
