// trainkit/io/atomic_file.hpp - replacing a file so that a crash at any moment leaves either the
// old file or the complete new one, never a torn mix: write a temporary file in the same
// directory, fsync it, rename it over the target, fsync the directory (the rename itself is only
// durable once the directory entry is on disk).
#pragma once

#include <fcntl.h>     // open, O_*
#include <sys/stat.h>  // mode constants
#include <unistd.h>    // write, pwrite, fsync, close, unlink, getpid

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // std::rename
#include <filesystem>
#include <functional>  // std::function: the failure-injection hook
#include <string>
#include <system_error>  // std::generic_category
#include <utility>

#include "trainkit/core/error.hpp"

namespace trainkit::io {

/// How a file is written.
struct write_options {
  /// fsync the file and its directory (off only for throw-away files: tests, benchmarks of the
  /// format alone). Without it a power loss can lose the newest snapshot, never an older one.
  bool sync = true;
  /// Called before every write(2) with the file offset and the byte count; it may throw to
  /// simulate a failing disk (the tests' "disk full"). Empty: no hook.
  std::function<void(std::uint64_t offset, std::size_t bytes)> before_write = {};
};

namespace detail {

inline std::string errno_text(int e) { return std::generic_category().message(e); }

/// A file descriptor closed on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Closes and reports close(2)'s errno (0 on success): on NFS a failed write can surface here.
  int close() noexcept {
    if (fd_ < 0) return 0;
    const int r = ::close(std::exchange(fd_, -1));
    return r == 0 ? 0 : errno;
  }
  void reset() noexcept { (void)close(); }

 private:
  int fd_ = -1;
};

/// fsync of a directory, so that a rename or unlink in it is durable.
inline void fsync_directory(const std::filesystem::path& dir) {
  const std::string d = dir.empty() ? std::string(".") : dir.string();
  unique_fd fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  TRAINKIT_CHECK(static_cast<bool>(fd), io_error, "snapshot",
                 "cannot open directory '" << d << "' to sync it: " << errno_text(errno));
  TRAINKIT_CHECK(::fsync(fd.get()) == 0, io_error, "snapshot",
                 "fsync of directory '" << d << "' failed: " << errno_text(errno));
}

inline std::uint64_t next_temp_counter() {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace detail

/// The temporary files atomic_file leaves behind when the process dies mid-write start with this
/// (".<target name>.tmp-"), so a directory listing can skip or clean them.
inline constexpr std::string_view temp_file_marker = ".tmp-";

/// A new version of `target` being written. Writes go to a temporary file next to it; commit()
/// makes them the target's content atomically. Destroyed without commit() (an exception while
/// writing), the temporary file is removed and the target is untouched.
class atomic_file {
 public:
  atomic_file(std::filesystem::path target, write_options opts = {})
      : target_(std::move(target)), opts_(std::move(opts)) {
    const std::filesystem::path dir = target_.parent_path();
    // Appends, not "." + std::string&&: GCC 12 warns a false -Wrestrict on that (bug 105651).
    std::string name = ".";
    name.append(target_.filename().string()).append(temp_file_marker);
    name.append(std::to_string(::getpid())).append("-").append(std::to_string(detail::next_temp_counter()));
    temp_ = dir / name;
    fd_ = detail::unique_fd(::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    TRAINKIT_CHECK(static_cast<bool>(fd_), io_error, "snapshot",
                   "cannot create '" << temp_.string() << "' (for '" << target_.string()
                                     << "'): " << detail::errno_text(errno));
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() {
    if (committed_) return;
    fd_.reset();
    ::unlink(temp_.c_str());
  }

  /// Appends n bytes (the whole of them, across partial writes and EINTR).
  void write(const void* data, std::size_t n) {
    if (opts_.before_write) opts_.before_write(offset_, n);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ::ssize_t w = ::write(fd_.get(), p, n);
      if (w < 0 && errno == EINTR) continue;
      TRAINKIT_CHECK(w > 0, io_error, "snapshot",
                     "writing '" << temp_.string() << "' failed at byte offset " << offset_ << " (" << n
                                 << " bytes left to write): "
                                 << (w < 0 ? detail::errno_text(errno) : std::string("no progress")));
      p += w;
      n -= static_cast<std::size_t>(w);
      offset_ += static_cast<std::uint64_t>(w);
    }
  }

  /// Overwrites n bytes at offset (the snapshot header, once the checksum is known).
  void write_at(std::uint64_t offset, const void* data, std::size_t n) {
    if (opts_.before_write) opts_.before_write(offset, n);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ::ssize_t w = ::pwrite(fd_.get(), p, n, static_cast<::off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      TRAINKIT_CHECK(w > 0, io_error, "snapshot",
                     "writing '" << temp_.string() << "' failed at byte offset " << offset << ": "
                                 << (w < 0 ? detail::errno_text(errno) : std::string("no progress")));
      p += w;
      n -= static_cast<std::size_t>(w);
      offset += static_cast<std::uint64_t>(w);
    }
  }

  /// Bytes appended so far.
  std::uint64_t size() const noexcept { return offset_; }

  /// fsync, close, rename over the target, fsync the directory. After it the target holds what
  /// was written; if it throws before the rename, the target is untouched.
  void commit() {
    TRAINKIT_CHECK(!committed_, usage_error, "atomic_file::commit", "already committed");
    if (opts_.sync)
      TRAINKIT_CHECK(::fsync(fd_.get()) == 0, io_error, "snapshot",
                     "fsync of '" << temp_.string() << "' failed: " << detail::errno_text(errno));
    const int e = fd_.close();
    TRAINKIT_CHECK(e == 0, io_error, "snapshot",
                   "closing '" << temp_.string() << "' failed: " << detail::errno_text(e));
    TRAINKIT_CHECK(std::rename(temp_.c_str(), target_.c_str()) == 0, io_error, "snapshot",
                   "renaming '" << temp_.string() << "' to '" << target_.string()
                                << "' failed: " << detail::errno_text(errno));
    committed_ = true;
    if (opts_.sync) detail::fsync_directory(target_.parent_path());
  }

  const std::filesystem::path& target() const noexcept { return target_; }
  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_, temp_;
  write_options opts_;
  detail::unique_fd fd_;
  std::uint64_t offset_ = 0;
  bool committed_ = false;
};

}  // namespace trainkit::io
