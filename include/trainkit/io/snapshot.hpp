// trainkit/io/snapshot.hpp - snapshot: sections of named records (tensors, integers, reals,
// strings) that are written to and read from the versioned, checksummed file format of
// io/format.hpp.
//
//   io::snapshot snap;
//   auto& s = snap.add_section("model");
//   s.put_tensor("0.weight", w).put_int("step", 1200).put_real("loss", 0.25);
//   snap.write("run/snapshot.tks");                    // temp file, fsync, rename, fsync dir
//
//   io::snapshot back = io::snapshot::read("run/snapshot.tks");   // magic, version, sizes, CRC
//   tensor<float> w2 = back.section("model").get_tensor<float>("0.weight", w.sizes());
//
// Every problem with a file names the file and the byte offset where it was found; a record of
// the wrong kind, element type or shape names the record, its section, the file and the offset.
#pragma once

#include <cstddef>
#include <deque>  // sections keep their addresses as more are added
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/io/atomic_file.hpp"  // write_options
#include "trainkit/io/snapshot_section.hpp"

namespace trainkit::io {

/// The saved state of a training run: sections of named records, in memory. Build it with
/// add_section()/put_*, write() it; read() a file back and get_* what it holds. Copies share the
/// tensor bytes (they are never modified after a put).
class snapshot {
 public:
  snapshot() = default;

  /// A new, empty section; usage_error when the name is taken.
  snapshot_section& add_section(std::string name) {
    TRAINKIT_CHECK(!name.empty(), usage_error, "snapshot::add_section", "section names must not be empty");
    TRAINKIT_CHECK(index_.find(name) == index_.end(), usage_error, "snapshot::add_section",
                   "the snapshot already has a section '" << name << "'");
    index_.emplace(name, sections_.size());
    sections_.push_back(snapshot_section(std::move(name), source_, 0));
    return sections_.back();
  }
  /// A copy of another snapshot's section under the same name (the tensor bytes are shared, not
  /// copied); usage_error when the name is taken. Gathering per-rank state uses it.
  snapshot_section& add_section_copy(const snapshot_section& from) {
    snapshot_section& s = add_section(from.name());
    s.records_ = from.records_;
    s.index_ = from.index_;
    return s;
  }
  bool contains(std::string_view name) const { return index_.find(std::string(name)) != index_.end(); }
  /// The section of that name; io_error naming the file and the sections it has when absent.
  const snapshot_section& section(std::string_view name) const {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) {
      std::string known;
      for (std::size_t i = 0; i < sections_.size(); ++i)
        known += (i ? ", '" : "'") + sections_[i].name() + "'";
      TRAINKIT_CHECK(false, io_error, "snapshot",
                     "the snapshot" << (source_.empty() ? std::string() : " '" + source_ + "'")
                                    << " has no section '" << name << "' (it has "
                                    << (sections_.empty() ? std::string("none") : known) << ")");
    }
    return sections_[it->second];
  }
  snapshot_section& section(std::string_view name) {
    return const_cast<snapshot_section&>(static_cast<const snapshot&>(*this).section(name));
  }
  std::vector<std::string> section_names() const {
    std::vector<std::string> r;
    for (const auto& s : sections_) r.push_back(s.name());
    return r;
  }
  std::size_t size() const noexcept { return sections_.size(); }
  /// The file this snapshot was read from ("" when built in memory).
  const std::string& source() const noexcept { return source_; }

  /// Writes the snapshot to path atomically (io/atomic_file.hpp): a failure at any point leaves
  /// whatever was at path before untouched, and no temporary file behind.
  void write(const std::filesystem::path& path, const write_options& opts = {}) const;

  /// The file image, in memory (what write() puts on disk).
  std::vector<std::byte> to_bytes() const;

  /// Reads and verifies a snapshot file: io_error naming the file and the byte offset for a
  /// wrong magic or version, a truncated or oversized file, a checksum mismatch or a malformed
  /// record.
  static snapshot read(const std::filesystem::path& path);

  /// Parses a file image held in memory; `source` names it in messages.
  static snapshot from_bytes(std::vector<std::byte> bytes, std::string source = "<memory>");

 private:
  friend struct snapshot_codec;
  std::deque<snapshot_section> sections_;
  std::unordered_map<std::string, std::size_t> index_;
  std::string source_;
};

}  // namespace trainkit::io

// The file image: snapshot's write/read/to_bytes/from_bytes, defined with the codec.
#include "trainkit/io/snapshot_codec.hpp"
