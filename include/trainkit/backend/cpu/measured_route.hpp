// trainkit/backend/cpu/measured_route.hpp - kernel routes chosen by measuring, per shape, on the
// machine that runs them, and remembered across processes.
//
// Under the automatic routes (TRAINKIT_CPU_GEMM, TRAINKIT_CPU_CONV unset or "auto") an fp32 GEMM or
// a convolution pass of a shape not seen before runs both ways - the built-in kernel (OpenBLAS,
// im2col + GEMM) and oneDNN's - a few times each, the way cuDNN's benchmark mode does, and the faster
// one takes that shape from then on. Which is faster depends on the CPU, the thread count and the
// shape (on a 2-core AVX2 EPYC oneDNN wins the 3x3 convolutions of the residual net by 1.3-3x and
// loses the backward passes of a 1-channel input by 2.6-4.5x), so no table tuned on one machine
// chooses well everywhere.
//
// The two routes round differently, so a choice must not change between the processes of one
// training: a run resumed from a snapshot must continue bit-exactly, and ranks started apart must
// agree. So the choices are also kept in a file, shared by every process of the machine (and of a
// cluster, on a shared file system): the first process to meet a shape measures it while holding
// the file's lock, writes the choice, and every later process reads it instead of measuring.
//   TRAINKIT_ROUTE_CACHE=<dir>    the directory of route files; default $XDG_CACHE_HOME/trainkit
//                                 ($HOME/.cache/trainkit when XDG_CACHE_HOME is unset). The file is
//                                 cpu-routes-<machine>.tsv, where <machine> hashes the CPU model,
//                                 its usable flags, the ISA limit, the library versions and the core
//                                 OpenBLAS runs its kernels for (another CPU, TRAINKIT_MAX_CPU_ISA or
//                                 OPENBLAS_CORETYPE measures afresh)
//   TRAINKIT_ROUTE_CACHE=off      measure in each process (choices may then differ between runs)
//   TRAINKIT_ROUTE_LOG=1          print each choice, with both times, on stderr
// Where the file cannot be written, one line on stderr says so and choices are measured per
// process. A forced route (TRAINKIT_CPU_GEMM=openblas|onednn, TRAINKIT_CPU_CONV=im2col|onednn)
// measures nothing.
#pragma once

#include <cblas.h>    // openblas_get_corename
#include <fcntl.h>     // open
#include <sys/file.h>  // flock
#include <unistd.h>    // read, write, close

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>   // std::fprintf, std::snprintf
#include <cstdlib>  // std::getenv, std::strtod
#include <cstring>  // std::strerror
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trainkit/backend/cpu/cpu_features.hpp"  // describe()
#include "trainkit/backend/cpu/onednn_route.hpp"  // TRAINKIT_HAS_ONEDNN
#include "trainkit/config.hpp"

#if TRAINKIT_HAS_ONEDNN
#include <dnnl.h>  // dnnl_version
#endif
#if TRAINKIT_HAS_OPENMP
#include <omp.h>
#endif

namespace trainkit::backend {

/// One measured choice: the key (the kernel and its shape), whether oneDNN runs it, and the
/// times measured for both routes (microseconds; negative where a route could not run).
struct route_choice {
  std::string key;
  bool onednn = false;
  double builtin_us = 0, onednn_us = 0;
};

namespace detail {

/// The process's table of choices and the file behind it.
class route_table {
 public:
  static route_table& get() {
    static route_table table;
    return table;
  }

  /// The choice for `key`: from this process's table, else from the file, else measured now.
  /// trial(onednn) runs one route once and returns false where that route cannot take the call
  /// (oneDNN without a kernel for it); the caller runs the chosen route afterwards.
  template <class Trial>
  bool choose(const std::string& key, Trial&& trial) {
    if (auto known = lookup(key)) return *known;
    std::lock_guard measuring(measure_mutex_);  // recursive: a convolution's trial may meet a new GEMM
    file_lock file(*this);
    if (auto known = lookup(key)) return *known;
    route_choice c = measure(key, trial);
    remember(c, file.held);
    return c.onednn;
  }

  /// Every choice this process has made or read, in key order.
  std::vector<route_choice> choices() {
    std::lock_guard lock(map_mutex_);
    std::vector<route_choice> out;
    for (auto& [k, c] : choices_) out.push_back(c);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.key < b.key; });
    return out;
  }

  /// This process's choices as the file holds them (one "key<TAB>route<TAB>us<TAB>us" line each):
  /// what a snapshot carries, so that a run resumed on a fresh machine of the same kind takes the
  /// routes the snapshotted run took.
  std::string serialize() {
    std::string out;
    for (const auto& c : choices()) out += line_of(c);
    return out;
  }

  /// Takes the choices of serialize()d `text` for this process, over any it has (not into the file:
  /// other processes keep the machine's own). Lines that do not parse are skipped.
  void adopt(std::string_view text) {
    std::lock_guard lock(map_mutex_);
    for_each_line(text, [&](const route_choice& c) { choices_.insert_or_assign(c.key, c); });
  }

  /// What the choices hold for: the CPU (model, usable flags, ISA limit) and the library versions.
  /// Choices measured under another identity are not taken (the file's name hashes it).
  static std::string machine() {
    std::string m = cpu_features::describe();
    m += "|trainkit " + std::to_string(TRAINKIT_VERSION_MAJOR) + "." + std::to_string(TRAINKIT_VERSION_MINOR) + "." +
         std::to_string(TRAINKIT_VERSION_PATCH);
    // OpenBLAS picks its kernels by itself (by the CPU, or OPENBLAS_CORETYPE): a choice measured
    // against its AVX-512 sgemm does not hold for its Haswell one.
    m += "|OpenBLAS " + std::string(openblas_get_corename());
#if TRAINKIT_HAS_ONEDNN
    const dnnl_version_t* v = dnnl_version();
    m += "|oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " " +
         v->hash;
#endif
    return m;
  }

  /// Starts over on another file (tests): forgets this process's choices and takes `path` as the
  /// file ("off": this process only; "": the environment's file again, opened at the next use).
  void use_file(const std::string& path) {
    std::lock_guard measuring(measure_mutex_);
    std::lock_guard lock(map_mutex_);
    choices_.clear();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    warned_ = false;
    opened_ = !path.empty();
    path_ = path;
    if (opened_ && path != "off") open_path();
  }

 private:
  route_table() = default;
  ~route_table() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// The file's lock, taken by the outermost measurement of the process (flock is per open file:
  /// a nested one would not block, but it would release the outer's lock early).
  struct file_lock {
    route_table& t;
    bool held = false;
    explicit file_lock(route_table& table) : t(table) {
      std::lock_guard lock(t.map_mutex_);
      if (t.lock_depth_++ > 0) {
        held = t.fd_ >= 0;
        return;
      }
      t.open_file();
      if (t.fd_ >= 0) {
        while (::flock(t.fd_, LOCK_EX) != 0 && errno == EINTR) {
        }
        held = true;
        t.read_file();
      }
    }
    ~file_lock() {
      std::lock_guard lock(t.map_mutex_);
      if (--t.lock_depth_ == 0 && t.fd_ >= 0) ::flock(t.fd_, LOCK_UN);
    }
  };

  std::optional<bool> lookup(const std::string& key) {
    std::lock_guard lock(map_mutex_);
    if (auto it = choices_.find(key); it != choices_.end()) return it->second.onednn;
    return std::nullopt;
  }

  template <class Trial>
  static route_choice measure(const std::string& key, Trial& trial) {
    using clock = std::chrono::steady_clock;
    auto once = [&](bool onednn) {
      const auto t0 = clock::now();
      if (!trial(onednn)) return -1.0;
      return std::chrono::duration<double, std::micro>(clock::now() - t0).count();
    };
    route_choice c;
    c.key = key;
    // A first run of each (oneDNN creates and JIT-compiles its primitive, buffers are allocated),
    // then three interleaved rounds; the faster minimum wins. Minima within 10 % of each other get
    // three rounds more: a near tie is where noise (another process, the data loader's threads)
    // would make two machines of one kind choose differently.
    const bool onednn_runs = once(true) >= 0;
    once(false);
    double b = 1e300, o = 1e300;
    for (int round = 0; round < 6; ++round) {
      if (round == 3 && !(onednn_runs && std::max(b, o) < 1.1 * std::min(b, o))) break;
      b = std::min(b, once(false));
      if (onednn_runs) o = std::min(o, once(true));
    }
    c.builtin_us = b;
    c.onednn_us = onednn_runs ? o : -1;
    c.onednn = onednn_runs && o < b;
    return c;
  }

  void remember(const route_choice& c, bool write) {
    if (log_enabled())
      std::fprintf(stderr, "trainkit: route %s -> %s (built-in %.1f us, oneDNN %.1f us)\n", c.key.c_str(),
                   c.onednn ? "onednn" : "built-in", c.builtin_us, c.onednn_us);
    std::lock_guard lock(map_mutex_);
    choices_.emplace(c.key, c);
    if (!write || fd_ < 0) return;
    // One write of a whole line, appended (O_APPEND): a reader never sees half of it unless the
    // writer dies inside the call, and a torn last line is skipped when read.
    const std::string line = line_of(c);
    if (::write(fd_, line.data(), line.size()) != ssize_t(line.size())) warn_once("cannot append to", errno);
  }

  static std::string line_of(const route_choice& c) {
    char times[64];
    std::snprintf(times, sizeof times, "\t%.1f\t%.1f\n", c.builtin_us, c.onednn_us);
    return c.key + (c.onednn ? "\tonednn" : "\tbuiltin") + times;
  }

  /// f(choice) for each complete line of text that parses (a last line without its newline is a
  /// write in progress or torn: skipped).
  template <class F>
  static void for_each_line(std::string_view text, F&& f) {
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) break;
      const std::string_view line = text.substr(pos, end - pos);
      pos = end + 1;
      route_choice c;
      if (parse_line(line, c)) f(c);
    }
  }

  static bool log_enabled() {
    static const bool on = [] {
      const char* v = std::getenv("TRAINKIT_ROUTE_LOG");
      return v != nullptr && *v != '\0' && std::string_view(v) != "0";
    }();
    return on;
  }

  /// The file's path: cpu-routes-<machine>.tsv in TRAINKIT_ROUTE_CACHE, else in the user's cache
  /// directory ("" where there is none).
  static std::string default_path(std::string_view dir_env) {
    // FNV-1a: the same name in every process and every build (std::hash need not be).
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : machine()) h = (h ^ ch) * 1099511628211ull;
    char name[64];
    std::snprintf(name, sizeof name, "cpu-routes-%016llx.tsv", static_cast<unsigned long long>(h));
    std::string dir;
    if (!dir_env.empty())
      dir = dir_env;
    else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/')
      dir = std::string(x) + "/trainkit";
    else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
      dir = std::string(home) + "/.cache/trainkit";
    else
      return {};
    return dir + "/" + name;
  }

  /// Opens the file once (map_mutex_ held); on failure says so once and keeps choices in memory.
  void open_file() {
    if (opened_) return;
    opened_ = true;
    const char* env = std::getenv("TRAINKIT_ROUTE_CACHE");
    const std::string_view v = env != nullptr ? env : "";
    if (v == "off" || v == "0") return;
    path_ = default_path(v);
    if (path_.empty()) {
      warn_once("cannot place (neither XDG_CACHE_HOME nor HOME is set)", 0);
      return;
    }
    open_path();
  }

  void open_path() {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) warn_once("cannot open", errno);
  }

  /// Reads the file's choices into the table (the file lock held). The first line of a key wins;
  /// a line that does not parse (a torn write) is skipped.
  void read_file() {
    std::string text;
    char buf[16384];
    for (off_t off = 0;;) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf, off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(buf, std::size_t(n));
      off += n;
    }
    for_each_line(text, [&](const route_choice& c) { choices_.emplace(c.key, c); });
  }

  static bool parse_line(std::string_view line, route_choice& c) {
    std::string_view f[4];
    for (int i = 0; i < 4; ++i) {
      const std::size_t tab = line.find('\t');
      f[i] = line.substr(0, tab);
      line = tab == std::string_view::npos ? std::string_view() : line.substr(tab + 1);
    }
    if (f[0].empty() || (f[1] != "onednn" && f[1] != "builtin")) return false;
    c.key = std::string(f[0]);
    c.onednn = f[1] == "onednn";
    c.builtin_us = std::strtod(std::string(f[2]).c_str(), nullptr);
    c.onednn_us = std::strtod(std::string(f[3]).c_str(), nullptr);
    return true;
  }

  void warn_once(const char* what, int err) {
    if (warned_) return;
    warned_ = true;
    std::fprintf(stderr,
                 "trainkit: %s the CPU route cache %s%s%s; kernel routes are measured in this process only, so "
                 "separate processes may choose (and round) differently - set TRAINKIT_ROUTE_CACHE=<file>, or force "
                 "TRAINKIT_CPU_GEMM / TRAINKIT_CPU_CONV\n",
                 what, path_.c_str(), err != 0 ? ": " : "", err != 0 ? std::strerror(err) : "");
  }

  std::mutex map_mutex_;
  std::recursive_mutex measure_mutex_;
  std::unordered_map<std::string, route_choice> choices_;
  std::string path_;
  int fd_ = -1;
  int lock_depth_ = 0;
  bool opened_ = false;
  bool warned_ = false;
};

/// Whether a call of this process may measure now: not inside a parallel region (a convolution's
/// per-image GEMMs, a user's own region), where timings would be the other threads' too.
inline bool may_measure() {
#if TRAINKIT_HAS_OPENMP
  return !omp_in_parallel();
#else
  return true;
#endif
}

/// The threads a kernel runs on now (part of every key: the faster route depends on them).
inline int route_threads() {
#if TRAINKIT_HAS_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace detail

/// The measured choices this process has made or read (for a start-up report and for tests).
inline std::vector<route_choice> measured_routes() { return detail::route_table::get().choices(); }

}  // namespace trainkit::backend
