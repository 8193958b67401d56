// trainkit/io/training_state.hpp - training_state: the list of everything a run must save to resume
// bit for bit, captured into one snapshot and restored from it.
//
//   io::training_state state;                 // the default generator is in it already
//   state.add("model", *model).add("optimizer", opt).add("schedule", schedule)
//        .add("scaler", scaler).add("batches", batches).add_generator("augment", augment_rng)
//        .add("compression", ddp.compression());
//   io::snapshot snap = state.capture();      // progress (step, epoch), every component
//   ...
//   state.restore(io::snapshot::read(path));  // the same components, in place
//
// The entries hold references: every added object must outlive the training_state.
#pragma once

#include <cstdint>
#include <ctime>  // std::time: the meta section
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/backend/cpu/measured_route.hpp"  // the CPU kernel routes a snapshot carries
#include "trainkit/config.hpp"  // TRAINKIT_VERSION_*
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/io/concepts.hpp"
#include "trainkit/io/snapshot.hpp"
#include "trainkit/io/state.hpp"

namespace trainkit::io {

/// Where the run is: optimizer steps taken and the current epoch. Saved as section "progress".
struct run_progress {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  friend constexpr bool operator==(const run_progress&, const run_progress&) = default;
  static constexpr std::array<std::string_view, 2> snapshot_field_names = {"step", "epoch"};
};

/// Whether a component is the same on every rank (model, optimizer, schedule, scaler: rank 0's
/// copy is saved) or its own on each rank (error-feedback residuals, a per-rank generator: every
/// rank's copy is saved, as section "<name>@rank<r>").
enum class state_scope { shared, per_rank };

/// The components of a run's state, by section name, captured and restored together.
class training_state {
 public:
  /// With include_default_generator, the process-wide generator (dropout masks, initialisers)
  /// is saved as section "rng.default": forgetting it is the usual way to lose bit-exactness.
  explicit training_state(bool include_default_generator = true) {
    if (include_default_generator) add("rng.default", default_generator());
  }
  training_state(const training_state&) = delete;
  training_state& operator=(const training_state&) = delete;

  /// Adds x (io::snapshottable) under `section`; usage_error if the name is taken, reserved
  /// ("progress", "meta") or contains '@'.
  template <class X>
  training_state& add(std::string section, X& x, state_scope scope = state_scope::shared) {
    static_assert(
        snapshottable<X>,
        "trainkit::io::training_state::add: the type is not io::snapshottable - give it state_dict()/"
        "load_state_dict(), get_state()/set_state() with a plain struct, or state()/load_state()");
    TRAINKIT_CHECK(section != "progress" && section != "meta" && section.find('@') == std::string::npos,
                   usage_error, "training_state::add", "section name '" << section << "' is reserved");
    for (const auto& e : entries_)
      TRAINKIT_CHECK(e.section != section, usage_error, "training_state::add",
                     "section '" << section << "' was added already");
    X* p = &x;
    entry e{std::move(section), scope, [p](snapshot_section& s) { save_state(s, *p); },
            [p](const snapshot_section& s) { load_state(s, *p); }, {},
            has_value_state<X> || state_value<X>};
    if constexpr (reshardable<X>) e.reshard = [p](const std::vector<const snapshot_section*>& old, int rank, int world) {
      reshard_from(old, *p, rank, world);
    };
    entries_.push_back(std::move(e));
    return *this;
  }
  /// add(section, x, state_scope::per_rank).
  template <class X>
  training_state& add_per_rank(std::string section, X& x) {
    return add(std::move(section), x, state_scope::per_rank);
  }
  /// Whether any component is per rank.
  bool has_per_rank() const noexcept {
    for (const auto& e : entries_)
      if (e.scope == state_scope::per_rank) return true;
    return false;
  }
  /// The name a per-rank section has in a snapshot.
  static std::string rank_section(const std::string& section, int rank) {
    return section + "@rank" + std::to_string(rank);
  }
  /// A named generator (an augmentation or a per-layer dropout stream), as section "rng.<name>".
  training_state& add_generator(std::string name, generator& g) { return add("rng." + std::move(name), g); }

  run_progress& progress() noexcept { return progress_; }
  const run_progress& progress() const noexcept { return progress_; }

  /// The section names rank `rank` reads, in capture order (progress first, then in the order
  /// added; per-rank ones as "<name>@rank<rank>").
  std::vector<std::string> sections(int rank = 0) const {
    std::vector<std::string> r{"progress"};
    for (const auto& e : entries_) r.push_back(name_of(e, rank));
    return r;
  }

  /// A snapshot of every component now - the shared ones and this rank's per-rank ones - plus
  /// "progress" and "meta" (library version, time). In a single process this is all there is.
  snapshot capture(int rank = 0) const {
    snapshot snap = capture_shared();
    for (const auto& e : entries_)
      if (e.scope == state_scope::per_rank) e.save(snap.add_section(name_of(e, rank)));
    return snap;
  }
  /// "meta", "progress" and the shared components only.
  snapshot capture_shared() const {
    snapshot snap;
    add_meta(snap);
    save_state(snap, "progress", progress_);
    for (const auto& e : entries_)
      if (e.scope == state_scope::shared) e.save(snap.add_section(e.section));
    return snap;
  }
  /// This rank's per-rank components only (what rank 0 gathers from every rank).
  snapshot capture_per_rank(int rank) const {
    snapshot snap;
    for (const auto& e : entries_)
      if (e.scope == state_scope::per_rank) e.save(snap.add_section(name_of(e, rank)));
    return snap;
  }

  /// "progress" and the small shared components (value states: positions, counters, generators)
  /// now - cheap enough to take at every step boundary, for capture_after_failure().
  snapshot capture_boundary() const {
    snapshot snap;
    save_state(snap, "progress", progress_);
    for (const auto& e : entries_)
      if (e.scope == state_scope::shared && e.small) e.save(snap.add_section(e.section));
    return snap;
  }

  /// What one surviving rank can write after a peer failed mid-step: "progress" and the small
  /// shared components as `boundary` (capture_boundary() at the last completed step) holds them,
  /// the other shared components as they are now (the model and optimizer: unchanged since that
  /// step when the failure came before the optimizer's update), and no per-rank component - the
  /// other ranks' are gone; meta says so, and restore() keeps per-rank components as they are.
  snapshot capture_after_failure(const snapshot& boundary, int writer) const {
    snapshot snap;
    add_meta(snap).put_string(std::string(per_rank_dropped), "written by rank " + std::to_string(writer) + " after a peer failed");
    snap.add_section_copy(boundary.section("progress"));
    for (const auto& e : entries_)
      if (e.scope == state_scope::shared) {
        if (e.small && boundary.contains(e.section))
          snap.add_section_copy(boundary.section(e.section));
        else
          e.save(snap.add_section(e.section));
      }
    return snap;
  }
  /// The meta record of a snapshot without per-rank state (capture_after_failure).
  static constexpr std::string_view per_rank_dropped = "per_rank_state_dropped";
  /// Whether snap was written without per-rank state (capture_after_failure); its reason, or "".
  static std::string per_rank_dropped_in(const snapshot& snap) {
    if (!snap.contains("meta")) return {};
    const auto& m = snap.section("meta");
    return m.contains(per_rank_dropped) ? m.get_string(per_rank_dropped) : std::string();
  }

  /// How many ranks wrote snap: the count of its "<name>@rank<r>" sections (r = 0, 1, ...) of the
  /// first per-rank component; 0 without per-rank components (or when snap holds none of them).
  int snapshot_world_size(const snapshot& snap) const {
    for (const auto& e : entries_)
      if (e.scope == state_scope::per_rank) {
        int n = 0;
        while (snap.contains(rank_section(e.section, n))) ++n;
        return n;
      }
    return 0;
  }

  /// Restores every component from snap (per-rank ones from "<name>@rank<rank>"). Every section
  /// must be present (checked before anything is changed); a component that does not fit its
  /// section (another model, another optimizer) is an io_error naming the section, the record
  /// and the file.
  /// Resume on another world size: with world > 0 and a snapshot written by another number of
  /// ranks N (snapshot_world_size), the shared components load as they are and each per-rank one
  /// is redistributed - a component with a reshard_state() customization (error-feedback
  /// residuals: compression::reshard_state) gets every old rank's state; any other one loads old rank
  /// `rank`'s section where there is one (rank < N) and keeps its current state otherwise (a new
  /// rank's own generator). Returns N (or world when nothing was redistributed).
  int restore(const snapshot& snap, int rank = 0, int world = 0) {
    const int old_world = snapshot_world_size(snap);
    const bool resize = world > 0 && old_world > 0 && old_world != world;
    const bool no_per_rank = !per_rank_dropped_in(snap).empty();  // kept as they are
    std::string missing;
    auto need = [&](const std::string& name) {
      if (!snap.contains(name)) missing += (missing.empty() ? "'" : ", '") + name + "'";
    };
    need("progress");
    for (const auto& e : entries_) {
      if (no_per_rank && e.scope == state_scope::per_rank) continue;
      if (!resize || e.scope == state_scope::shared)
        need(name_of(e, rank));
      else
        for (int r = 0; r < old_world; ++r) need(rank_section(e.section, r));
    }
    TRAINKIT_CHECK(missing.empty(), io_error, "training_state::restore",
                   "the snapshot" << (snap.source().empty() ? std::string() : " '" + snap.source() + "'")
                                  << " lacks section(s) " << missing);
    run_progress p;
    load_state(snap, "progress", p);
    adopt_routes(snap);
    for (auto& e : entries_) {
      if (no_per_rank && e.scope == state_scope::per_rank) continue;
      if (!resize || e.scope == state_scope::shared) {
        e.load(snap.section(name_of(e, rank)));
      } else if (e.reshard) {
        std::vector<const snapshot_section*> old;
        for (int r = 0; r < old_world; ++r) old.push_back(&snap.section(rank_section(e.section, r)));
        e.reshard(old, rank, world);
      } else if (rank < old_world) {
        e.load(snap.section(rank_section(e.section, rank)));
      }
    }
    progress_ = p;
    return resize ? old_world : world;
  }

 private:
  struct entry {
    std::string section;
    state_scope scope;
    std::function<void(snapshot_section&)> save;
    std::function<void(const snapshot_section&)> load;
    /// Per-rank components with a reshard_state() customization: every old rank's section, the new
    /// rank and world size.
    std::function<void(const std::vector<const snapshot_section*>&, int, int)> reshard;
    bool small = false;  // a value state (a position, a counter, a generator): cheap to capture every step
  };
  /// The "meta" section: library version, time.
  static snapshot_section& add_meta(snapshot& snap) {
    auto& meta = snap.add_section("meta");
    meta.put_string("library", "trainkit " + std::to_string(TRAINKIT_VERSION_MAJOR) + "." +
                                   std::to_string(TRAINKIT_VERSION_MINOR) + "." +
                                   std::to_string(TRAINKIT_VERSION_PATCH));
    meta.put_int("unix_time", static_cast<std::int64_t>(std::time(nullptr)));
    // The CPU kernel routes this process measured, and the machine they hold for: a run resumed
    // from this snapshot on a fresh machine of the same kind takes the same routes, so it rounds
    // as this run did (backend/cpu/measured_route.hpp).
    meta.put_string("cpu_machine", backend::detail::route_table::machine());
    meta.put_string("cpu_routes", backend::detail::route_table::get().serialize());
    return meta;
  }
  /// Takes the snapshot's CPU kernel routes where it was written on this kind of machine.
  static void adopt_routes(const snapshot& snap) {
    if (!snap.contains("meta")) return;
    const auto& m = snap.section("meta");
    if (m.contains("cpu_machine") && m.contains("cpu_routes") &&
        m.get_string("cpu_machine") == backend::detail::route_table::machine())
      backend::detail::route_table::get().adopt(m.get_string("cpu_routes"));
  }
  static std::string name_of(const entry& e, int rank) {
    return e.scope == state_scope::per_rank ? rank_section(e.section, rank) : e.section;
  }

  std::vector<entry> entries_;
  run_progress progress_;
};

}  // namespace trainkit::io
