// trainkit/io/snapshot_manager.hpp - a directory of snapshots: one file per saved step, the last K
// kept, and loading that falls back to an older snapshot when the newest is damaged.
//
//   io::snapshot_manager snaps("run/snapshots", 3);    // keep the last 3
//   snaps.save(step, state.capture());                 // run/snapshots/snapshot-000000001200.tks
//   if (auto got = snaps.load_latest()) state.restore(got->snap);
//
// Under data parallelism rank 0 writes and every rank reads: give each rank's manager its rank
// (save() does nothing on the others), and let the ranks meet at a barrier of their communicator
// after the save before any of them reads the directory.
#pragma once

#include <algorithm>  // std::sort
#include <charconv>   // std::from_chars
#include <cstddef>
#include <cstdint>
#include <cstdio>  // std::fprintf: the default log
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/snapshot.hpp"

namespace trainkit::io {

/// Settings of snapshot_manager.
struct snapshot_manager_options {
  std::size_t keep_last = 3;                       ///< files kept after each save (>= 1)
  int rank = 0;                                    ///< only rank 0 writes and prunes
  std::string prefix = "snapshot";                 ///< file names: `<prefix>-<step, 12 digits>.tks`
  write_options write = {};                        ///< fsync, failure-injection hook
  std::function<void(std::string_view)> log = {};  ///< fallbacks and pruning; empty: stderr
  /// load_latest() renames a snapshot it cannot use to "<name>.damaged" (rank 0), so that it is
  /// kept for inspection and a later save of the same step never overwrites it.
  bool set_aside_damaged = true;
};

/// The snapshots of one run in one directory (one writer per directory).
class snapshot_manager {
 public:
  /// One snapshot file.
  struct entry {
    std::int64_t step = 0;
    std::filesystem::path path;
  };
  /// What load_latest() found: the snapshot, its entry, and the newer files it had to skip
  /// (each with the reason).
  struct loaded {
    snapshot snap;
    entry from;
    std::vector<std::string> rejected;
  };

  snapshot_manager(std::filesystem::path dir, std::size_t keep_last = 3)
      : snapshot_manager(std::move(dir), snapshot_manager_options{.keep_last = keep_last}) {}
  snapshot_manager(std::filesystem::path dir, snapshot_manager_options opts)
      : dir_(std::move(dir)), opts_(std::move(opts)) {
    TRAINKIT_CHECK(opts_.keep_last >= 1, value_error, "snapshot_manager",
                   "keep_last must be >= 1, got " << opts_.keep_last);
    TRAINKIT_CHECK(!opts_.prefix.empty() && opts_.prefix.find('/') == std::string::npos, value_error,
                   "snapshot_manager", "invalid file prefix '" << opts_.prefix << "'");
    if (opts_.rank == 0) {
      std::error_code ec;
      std::filesystem::create_directories(dir_, ec);
      TRAINKIT_CHECK(!ec, io_error, "snapshot_manager",
                     "cannot create the snapshot directory '" << dir_.string() << "': " << ec.message());
    }
  }

  const std::filesystem::path& directory() const noexcept { return dir_; }
  const snapshot_manager_options& options() const noexcept { return opts_; }

  /// The path the snapshot of `step` has.
  std::filesystem::path path_for(std::int64_t step) const {
    TRAINKIT_CHECK(step >= 0, value_error, "snapshot_manager", "the step must be >= 0, got " << step);
    std::string digits = std::to_string(step);
    if (digits.size() < 12) digits.insert(0, 12 - digits.size(), '0');
    return dir_ / (opts_.prefix + "-" + digits + ".tks");
  }

  /// The snapshot files of the directory, oldest step first (names only: nothing is verified).
  std::vector<entry> list() const {
    std::vector<entry> r;
    std::error_code ec;
    if (!std::filesystem::is_directory(dir_, ec)) return r;
    for (const auto& de : std::filesystem::directory_iterator(dir_, ec)) {
      if (auto s = parse_step(de.path().filename().string())) r.push_back({*s, de.path()});
    }
    std::sort(r.begin(), r.end(), [](const entry& a, const entry& b) { return a.step < b.step; });
    return r;
  }
  /// The newest file, if any (not verified: load_latest() reads and checks).
  std::optional<entry> latest() const {
    auto l = list();
    if (l.empty()) return std::nullopt;
    return l.back();
  }

  /// Writes snap as the snapshot of `step` (atomically: a failure leaves every earlier snapshot
  /// as it was), then removes all but the newest keep_last. On ranks other than 0 it writes
  /// nothing. Returns the path.
  std::filesystem::path save(std::int64_t step, const snapshot& snap) {
    const auto path = path_for(step);
    if (opts_.rank != 0) return path;
    snap.write(path, opts_.write);
    prune();
    return path;
  }

  /// Writes snap as the snapshot of `step` from whichever rank calls it (the survivor of a failed
  /// job: rank 0 may be the rank that died), unless a snapshot of that step is there already (a
  /// periodic one, complete). Returns the path written, or nullopt when one was there.
  std::optional<std::filesystem::path> save_as_survivor(std::int64_t step, const snapshot& snap) {
    const auto path = path_for(step);
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) return std::nullopt;
    snap.write(path, opts_.write);
    return path;
  }

  /// Removes all but the newest keep_last snapshots, and temporary files a killed writer left
  /// (rank 0 only).
  void prune() {
    if (opts_.rank != 0) return;
    auto l = list();
    std::error_code ec;
    for (std::size_t i = 0; i + opts_.keep_last < l.size(); ++i) {
      std::filesystem::remove(l[i].path, ec);
      if (ec) say("snapshot_manager: could not remove '" + l[i].path.string() + "': " + ec.message());
    }
    // Temporaries from a process that died mid-save: ".<prefix>-<digits>.tks.tmp-<pid>-<n>".
    for (const auto& de : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string n = de.path().filename().string();
      if (n.size() > 1 && n[0] == '.' && n.find(std::string(temp_file_marker)) != std::string::npos &&
          parse_step(n.substr(1, n.find(std::string(temp_file_marker)) - 1)))
        std::filesystem::remove(de.path(), ec);
    }
    if (opts_.write.sync) detail::fsync_directory(dir_);
  }

  /// Reads the newest snapshot that verifies. A newer file that is truncated or corrupted is
  /// skipped and reported through the log ("falling back to ..."); std::nullopt when the
  /// directory holds no usable snapshot.
  std::optional<loaded> load_latest() const {
    auto l = list();
    std::vector<std::string> rejected;
    for (auto it = l.rbegin(); it != l.rend(); ++it) {
      try {
        snapshot s = snapshot::read(it->path);
        if (!rejected.empty())
          say("snapshot_manager: falling back to '" + it->path.string() + "' (step " +
              std::to_string(it->step) + ") after " + std::to_string(rejected.size()) +
              " unusable newer snapshot(s)");
        last_rejected_ = rejected;
        return loaded{std::move(s), *it, std::move(rejected)};
      } catch (const io_error& e) {
        rejected.push_back(e.what());
        say(std::string("snapshot_manager: skipping an unusable snapshot: ") + e.what());
        set_aside(it->path);
      }
    }
    if (!rejected.empty())
      say("snapshot_manager: no usable snapshot in '" + dir_.string() + "' (" +
          std::to_string(rejected.size()) + " file(s) rejected)");
    last_rejected_ = std::move(rejected);
    return std::nullopt;
  }
  /// Why each file was rejected by the last load_latest() that found nothing usable.
  const std::vector<std::string>& last_rejected() const noexcept { return last_rejected_; }

 private:
  /// The step of "<prefix>-<digits>.tks"; nullopt for any other name.
  std::optional<std::int64_t> parse_step(const std::string& name) const {
    const std::string head = opts_.prefix + "-";
    constexpr std::string_view tail = ".tks";
    if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
      return std::nullopt;
    const char* first = name.data() + head.size();
    const char* last = name.data() + name.size() - tail.size();
    std::int64_t step = 0;
    const auto [ptr, ec] = std::from_chars(first, last, step);
    if (ec != std::errc() || ptr != last || step < 0) return std::nullopt;
    return step;
  }
  /// Renames an unusable snapshot to "<name>.damaged" (".damaged.1", ... if taken); rank 0 only.
  void set_aside(const std::filesystem::path& p) const {
    if (!opts_.set_aside_damaged || opts_.rank != 0) return;
    std::error_code ec;
    std::filesystem::path to = p;
    to += ".damaged";
    for (int i = 1; std::filesystem::exists(to, ec) && i < 1000; ++i) {
      to = p;
      to += ".damaged." + std::to_string(i);
    }
    std::filesystem::rename(p, to, ec);
    if (ec)
      say("snapshot_manager: could not set '" + p.string() + "' aside: " + ec.message());
    else
      say("snapshot_manager: kept the unusable snapshot as '" + to.string() + "'");
  }
  void say(const std::string& msg) const {
    if (opts_.log)
      opts_.log(msg);
    else
      std::fprintf(stderr, "%s\n", msg.c_str());
  }

  std::filesystem::path dir_;
  snapshot_manager_options opts_;
  mutable std::vector<std::string> last_rejected_;
};

}  // namespace trainkit::io
