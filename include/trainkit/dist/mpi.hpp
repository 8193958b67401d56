// trainkit/dist/mpi.hpp - a communicator over MPI (OpenMPI, MPICH...): processes on one or many hosts,
// launched by mpirun/mpiexec/srun. Needs <mpi.h> and MPI's libraries: CMake target trainkit::mpi.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>  // sigaction: SIGPIPE
#include <unistd.h>  // getpid

#include "trainkit/core/error.hpp"
#include "trainkit/dist/check_consistent.hpp"
#include "trainkit/dist/detail/collective.hpp"
#include "trainkit/dist/detail/element.hpp"
#include "trainkit/dist/detail/mpi_types.hpp"
#include "trainkit/dist/detail/poll.hpp"
#include "trainkit/dist/detail/timeout_env.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::dist {

/// Options of an mpi communicator.
struct mpi_options {
  /// How long wait() polls a collective before it declares a peer dead or stalled and throws
  /// dist_error. The environment variable TRAINKIT_DIST_TIMEOUT_MS (milliseconds) overrides it, so a
  /// job script can tighten or loosen it without a rebuild. After a timeout the survivors ask
  /// each other (a short point-to-point probe) and the error names every rank that did not
  /// answer, with its host and pid.
  std::chrono::milliseconds timeout{30000};
};

namespace detail {

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  std::string s(text, static_cast<std::size_t>(std::max(0, len)));
  int cls = 0;
  if (MPI_Error_class(code, &cls) == MPI_SUCCESS && cls != code)
    s += " (error class " + std::to_string(cls) + ")";
  return s;
}

// Process-wide MPI facts trainkit needs: the thread level MPI gave us (below MPI_THREAD_MULTIPLE our
// calls are serialised by one mutex), and what failed: an MPI error, or requests given up after a
// timeout. MPI_Finalize would wait forever for a dead peer, so mpi_environment finalises only when
// no error was seen and every abandoned request has completed after all (a peer that was only late).
struct mpi_process {
  std::mutex serial;
  std::atomic<int> thread_level{MPI_THREAD_SINGLE};
  std::atomic<bool> error_seen{false};
  std::mutex abandoned_mutex;
  std::vector<std::pair<MPI_Request, std::shared_ptr<void>>> abandoned;  // request, memory it reads

  static mpi_process& get() {
    static mpi_process p;
    return p;
  }

  std::unique_lock<std::mutex> lock() {
    return thread_level.load() >= MPI_THREAD_MULTIPLE ? std::unique_lock<std::mutex>(serial, std::defer_lock)
                                                      : std::unique_lock<std::mutex>(serial);
  }

  void abandon(MPI_Request r, std::shared_ptr<void> keep) {
    if (r == MPI_REQUEST_NULL) return;
    std::lock_guard<std::mutex> lk(abandoned_mutex);
    abandoned.emplace_back(r, std::move(keep));
  }

  // Polls the abandoned requests for up to `grace`; true when nothing is left failed.
  bool settle(std::chrono::milliseconds grace) {
    const auto deadline = std::chrono::steady_clock::now() + grace;
    std::lock_guard<std::mutex> lk(abandoned_mutex);
    for (;;) {
      if (error_seen) return false;
      for (auto it = abandoned.begin(); it != abandoned.end();) {
        int flag = 0;
        int rc = MPI_SUCCESS;
        {
          auto serial_lock = lock();
          rc = MPI_Test(&it->first, &flag, MPI_STATUS_IGNORE);
        }
        if (rc != MPI_SUCCESS) {
          error_seen = true;
          return false;
        }
        it = flag ? abandoned.erase(it) : it + 1;
      }
      if (abandoned.empty()) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

// Open MPI's TCP transport writes to its peers' sockets; a write to the socket of a peer that just
// died raises SIGPIPE, whose default action ends this process too - a survivor killed before its
// timeout can name the dead rank and write the snapshot (seen in launch_trainkit_run_hosts: rank 0
// "killed by SIGPIPE" after rank 1's SIGKILL). Where SIGPIPE still has its default action, it is
// ignored, so that the write fails with EPIPE instead; a handler or disposition the program set
// itself is left alone.
inline void ignore_sigpipe() {
  struct sigaction now {};
  if (::sigaction(SIGPIPE, nullptr, &now) == 0 && !(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
}

// MPI_Init_thread(MPI_THREAD_MULTIPLE) unless MPI is up already; returns true if this call initialised it.
inline bool mpi_ensure_initialized(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  TRAINKIT_CHECK(!finalized, usage_error, "trainkit::dist::mpi", "MPI has already been finalized");
  int provided = MPI_THREAD_SINGLE;
  bool here = false;
  if (!initialized) {
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    TRAINKIT_CHECK(rc == MPI_SUCCESS, dist_error, "trainkit::dist::mpi",
                   "MPI_Init_thread failed: " << mpi_error_string(rc));
    here = true;
  } else {
    MPI_Query_thread(&provided);
  }
  // A communication thread (data_parallel) calls MPI from a thread other than main: at least
  // SERIALIZED is needed, and our own calls are then serialised through mpi_process::lock().
  TRAINKIT_CHECK(provided >= MPI_THREAD_SERIALIZED, dist_error, "trainkit::dist::mpi",
                 "MPI provides thread level " << provided << "; trainkit needs MPI_THREAD_SERIALIZED ("
                                              << MPI_THREAD_SERIALIZED << ") or MPI_THREAD_MULTIPLE ("
                                              << MPI_THREAD_MULTIPLE
                                              << "): initialise MPI with MPI_Init_thread");
  mpi_process::get().thread_level = provided;
  static const bool sigpipe_checked = (ignore_sigpipe(), true);  // once per process, not per communicator
  (void)sigpipe_checked;
  return here;
}

// The duplicated communicator and what every work of it shares.
struct mpi_comm_state {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm probe_comm = MPI_COMM_NULL;  // the liveness probe after a timeout (its own tag space)
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{30000};
  std::vector<std::string> hosts;  // every rank's host, pid and MPI_COMM_WORLD rank, gathered at construction
  std::vector<long> pids;
  std::vector<int> world_ranks;
  // The probe runs over the whole world (a sub-communicator's survivors may be blocked in another
  // one): the state of the first communicator congruent to MPI_COMM_WORLD, when this is not it.
  std::shared_ptr<mpi_comm_state> world;
  std::mutex probe_mutex;  // one probe per world state; later callers get its result
  bool probed = false;
  std::string probe_text;
  static constexpr int probe_token = 1;  // what a probe sends (outlives every send)
  bool probe_all_waiting = false;  // every peer's probe was there at once: this rank was the late one
  std::vector<int> probe_in;       // what it receives

  /// "rank 2 (host h, pid 123)", by world rank.
  std::string who(int r) const {
    const bool known = r >= 0 && static_cast<std::size_t>(r) < world_ranks.size();
    std::string s = "rank " + std::to_string(known ? world_ranks[static_cast<std::size_t>(r)] : r);
    if (r >= 0 && static_cast<std::size_t>(r) < hosts.size())
      s += " (host " + hosts[r] + ", pid " + std::to_string(pids[r]) + ")";
    return s;
  }

  /// After a timeout: every survivor sends "alive" to every other rank and waits up to `window`
  /// for theirs; returns the ranks that did not answer (dead, stalled, or not waiting for the
  /// same collective). Once per communicator (it is broken afterwards). The sends are freed at
  /// once; the receives from silent ranks are cancelled.
  std::vector<int> probe_silent_ranks(std::chrono::milliseconds window) {
    std::vector<int> silent;
    if (probe_comm == MPI_COMM_NULL || size <= 1) return silent;
    constexpr int tag = 0x7c1;
    probe_in.assign(static_cast<std::size_t>(size), -1);
    std::vector<MPI_Request> recv(static_cast<std::size_t>(size), MPI_REQUEST_NULL);
    {
      auto lk = mpi_process::get().lock();
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        MPI_Irecv(&probe_in[r], 1, MPI_INT, r, tag, probe_comm, &recv[r]);
        MPI_Request send = MPI_REQUEST_NULL;
        // Completes (or not) on its own: the buffer is a constant that lives as long as the process.
        if (MPI_Isend(&probe_token, 1, MPI_INT, r, tag, probe_comm, &send) == MPI_SUCCESS) MPI_Request_free(&send);
      }
    }
    bool first = true;
    probe_all_waiting = false;
    poll_until(
        [&] {
          bool all = true;
          auto lk = mpi_process::get().lock();
          for (int r = 0; r < size; ++r) {
            if (recv[r] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            if (MPI_Test(&recv[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) all = false;
          }
          if (first && all) probe_all_waiting = true;  // every peer had probed before us
          first = false;
          return all;
        },
        window);
    auto lk = mpi_process::get().lock();
    for (int r = 0; r < size; ++r)
      if (r != rank && recv[r] != MPI_REQUEST_NULL) {
        silent.push_back(r);
        // A stalled rank may probe later: cancel the receive so that nothing writes into
        // probe_in after this state is gone.
        MPI_Cancel(&recv[r]);
        MPI_Request_free(&recv[r]);
      }
    return silent;
  }
  std::atomic<bool> broken{false};
  std::mutex broken_mutex;
  std::string broken_reason;

  std::vector<int> failed_ranks;  // what the probe found silent (under broken_mutex)
  bool was_late = false;          // the probe found every peer waiting: this rank was the late one

  void mark_broken(const std::string& reason) {
    std::lock_guard<std::mutex> lk(broken_mutex);
    if (!broken.exchange(true)) broken_reason = reason;
  }
  // A probe asked for a failure seen on another transport (NCCL: `from_other_transport`) that found
  // silent ranks leaves this communicator broken and the process unhealthy: no collective of this
  // communicator failed or was abandoned, so nothing else would keep MPI_Comm_free and
  // MPI_Finalize from waiting for the dead peer (both survivors hung in MPI_Finalize under load).
  // After a timeout of this communicator's own collective, that collective marks it broken (with
  // its own message) and its abandoned request decides about MPI_Finalize: a stalled peer that
  // catches up completes it, and MPI_Finalize is safe again.
  void record_probe(std::vector<int> silent, bool late, bool from_other_transport) {
    if (!silent.empty() && from_other_transport) {
      std::ostringstream os;
      os << "rank(s)";
      for (int r : silent) os << ' ' << r;
      os << " did not answer the liveness probe after another transport timed out";
      mark_broken(os.str());
      mpi_process::get().error_seen = true;
    }
    std::lock_guard<std::mutex> lk(broken_mutex);
    if (failed_ranks.empty() && !was_late) {
      failed_ranks = std::move(silent);
      was_late = late;
    }
  }
  /// Probes (probe_silent_ranks), records the result for failed_ranks(), and says who is missing:
  /// "rank 2 (host h, pid p) did not answer within 500 ms - dead or stalled; this is rank 0 (...)".
  std::string probe_and_describe(std::chrono::milliseconds window, bool from_other_transport) {
    if (world) {  // over the world, by world ranks; recorded here in this communicator's ranks
      std::string text = world->probe_and_describe(window, from_other_transport);
      std::vector<int> silent_world;
      bool late = false;
      {
        std::lock_guard<std::mutex> lk(world->broken_mutex);
        silent_world = world->failed_ranks;
        late = world->was_late;
      }
      std::vector<int> silent;
      for (int r = 0; r < size; ++r)
        if (std::find(silent_world.begin(), silent_world.end(), world_ranks[static_cast<std::size_t>(r)]) !=
            silent_world.end())
          silent.push_back(r);
      record_probe(silent, late, from_other_transport);
      return text;
    }
    std::lock_guard<std::mutex> once(probe_mutex);
    if (probed) return probe_text;
    probed = true;
    const std::vector<int> silent = probe_silent_ranks(window);
    std::ostringstream os;
    if (silent.empty() && probe_all_waiting) {
      os << "every other rank had already given up on it and probed - this rank was the late one";
    } else if (silent.empty()) {
      os << "every rank answered a probe afterwards (a slow peer)";
    } else {
      for (std::size_t i = 0; i < silent.size(); ++i) os << (i ? ", " : "") << who(silent[i]);
      os << " did not answer within " << window.count() << " ms - dead or stalled";
    }
    os << "; this is " << who(rank);
    record_probe(silent, silent.empty() && probe_all_waiting, from_other_transport);
    probe_text = os.str();
    return probe_text;
  }
  std::string reason() {
    std::lock_guard<std::mutex> lk(broken_mutex);
    return broken_reason;
  }

  mpi_comm_state() = default;
  mpi_comm_state(const mpi_comm_state&) = delete;
  mpi_comm_state& operator=(const mpi_comm_state&) = delete;
  ~mpi_comm_state() {
    int finalized = 1;
    MPI_Finalized(&finalized);
    // A broken communicator may still have requests in flight towards a dead peer: leave it to the
    // process's end rather than risk blocking in MPI_Comm_free.
    if (comm != MPI_COMM_NULL && !finalized && !broken) {
      auto lk = mpi_process::get().lock();
      MPI_Comm_free(&comm);
      if (probe_comm != MPI_COMM_NULL) MPI_Comm_free(&probe_comm);
    }
  }
};

// The world-congruent communicator state whose probe every other communicator uses (weak: a job
// that drops it falls back to probing each communicator alone).
inline std::weak_ptr<mpi_comm_state>& world_probe_state() {
  static std::weak_ptr<mpi_comm_state> w;
  return w;
}
inline std::mutex& world_probe_mutex() {
  static std::mutex m;
  return m;
}

// Work that completes locally after the transfer (avg divides by the world size).
using mpi_post_fn = void (*)(void* data, std::size_t count, int world_size);

template <class T>
void mpi_divide(void* data, std::size_t count, int world_size) {
  T* p = static_cast<T*>(data);
  for (std::size_t i = 0; i < count; ++i) p[i] = finish<T>(reduce_op::avg, to_compute(p[i]), world_size);
}

class mpi_work final : public work_state {
 public:
  mpi_work(std::shared_ptr<mpi_comm_state> c, const collective_desc& desc) : c_(std::move(c)), desc_(desc) {}

  ~mpi_work() override {
    // A request still in flight is given up to MPI (MPI_Request_free on a collective is not
    // allowed, so it is simply left to the process's end).
  }

  MPI_Request* request() noexcept { return &req_; }
  void set_post(mpi_post_fn f, void* data, std::size_t count) noexcept {
    post_ = f;
    post_data_ = data;
    post_count_ = count;
  }
  std::vector<unsigned char>& scratch() noexcept { return scratch_; }

  bool done() override {
    if (state_ == status::pending) test();
    return state_ != status::pending;
  }

  void wait() override {
    if (state_ == status::pending) {
      const bool settled = poll_until(
          [&] {
            test();
            if (state_ == status::pending && c_->broken) {
              abandon();
              fail("the communicator failed meanwhile: " + c_->reason());
            }
            return state_ != status::pending;
          },
          c_->timeout);
      if (!settled) {
        // Who is missing: the survivors are all timing out about now; ask them.
        std::ostringstream os;
        os << "timed out after " << c_->timeout.count() << " ms waiting for " << mpi_call()
           << " to complete: " << c_->probe_and_describe(probe_window(c_->timeout), false)
           << "; the communicator cannot be used any more";
        c_->mark_broken(os.str());
        abandon();
        fail(os.str());
      }
    }
    if (state_ == status::failed) throw dist_error(error_);
  }

  std::string mpi_call() const {
    switch (desc_.kind) {
      case collective_kind::allreduce:
        return "MPI_Iallreduce";
      case collective_kind::broadcast:
        return "MPI_Ibcast";
      case collective_kind::allgather:
        return "MPI_Iallgather";
      case collective_kind::reduce_scatter:
        return "MPI_Ireduce_scatter_block";
      case collective_kind::alltoall:
        return "MPI_Ialltoall";
      case collective_kind::barrier:
        return "MPI_Ibarrier";
    }
    return "MPI";
  }

  std::string message(std::string_view reason) const {
    return failure_message("mpi", desc_, c_->rank, c_->size, c_->timeout, reason);
  }

 private:
  enum class status { pending, done, failed };

  void test() {
    int flag = 0;
    int rc = MPI_SUCCESS;
    {
      auto lk = mpi_process::get().lock();
      rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) {
      const std::string reason = mpi_call() + " failed: " + mpi_error_string(rc);
      c_->mark_broken(reason);
      mpi_process::get().error_seen = true;
      fail(reason);
      return;
    }
    if (!flag) return;
    if (post_ != nullptr) post_(post_data_, post_count_, c_->size);
    state_ = status::done;
    scratch_.clear();
    scratch_.shrink_to_fit();
  }

  // Hands a request that will not complete in time to mpi_process (with the scratch copy it reads),
  // which checks at the end whether MPI_Finalize is safe.
  void abandon() {
    mpi_process::get().abandon(req_, std::make_shared<std::vector<unsigned char>>(std::move(scratch_)));
    req_ = MPI_REQUEST_NULL;
  }

  void fail(const std::string& reason) {
    state_ = status::failed;
    error_ = message(reason);
  }

  std::shared_ptr<mpi_comm_state> c_;
  collective_desc desc_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  mpi_post_fn post_ = nullptr;
  void* post_data_ = nullptr;
  std::size_t post_count_ = 0;
  std::vector<unsigned char> scratch_;  // a copy of an input that overlaps the output (MPI forbids aliasing)
  status state_ = status::pending;
  std::string error_;
};

inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace detail

/// RAII guard for MPI itself: initialises MPI with MPI_THREAD_MULTIPLE unless it is initialised
/// already, and finalises it on destruction if it initialised it. After a communicator failure
/// MPI_Finalize is skipped unless the failure has healed (see healthy()): it would wait for a dead
/// peer forever; the process then ends without it (mpirun reports that, and the job fails).
class mpi_environment {
 public:
  mpi_environment() : mpi_environment(nullptr, nullptr) {}
  mpi_environment(int& argc, char**& argv) : mpi_environment(&argc, &argv) {}
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized && healthy()) MPI_Finalize();
  }

  /// The thread level MPI provides (MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE).
  [[nodiscard]] int thread_level() const noexcept { return detail::mpi_process::get().thread_level; }
  /// Whether this guard initialised MPI (and so finalises it).
  [[nodiscard]] bool owns() const noexcept { return owns_; }
  /// False when an MPI call of trainkit's failed, or a collective given up after its timeout has
  /// still not completed after waiting up to `grace` for it (a dead peer): MPI_Finalize and any
  /// further collective over the same ranks would then block. True when a timed-out peer was only
  /// late and has caught up.
  [[nodiscard]] static bool healthy(std::chrono::milliseconds grace = std::chrono::milliseconds(1000)) {
    return detail::mpi_process::get().settle(grace);
  }

 private:
  mpi_environment(int* argc, char*** argv) : owns_(detail::mpi_ensure_initialized(argc, argv)) {}
  bool owns_ = false;
};

/// Ends the job after this rank's own error (a bad flag, a full disk, a damaged file), once the
/// error is printed: the other ranks must not wait for it until their timeout, nor this rank in
/// MPI_Finalize for peers still inside a collective. Under tools/trainkit-run (TRAINKIT_RUN_ADDR
/// set) the process exits with `code` at once and the launcher ends the other ranks and gives the
/// job that status; under a bare launcher, MPI_Abort(MPI_COMM_WORLD, code) ends every rank (the
/// job's status is then the launcher's).
[[noreturn]] inline void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (std::getenv("TRAINKIT_RUN_ADDR") == nullptr && initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

/// A communicator over MPI. It works on its own duplicate of the given communicator (default
/// MPI_COMM_WORLD, initialising MPI with MPI_THREAD_MULTIPLE if nobody has), so its traffic never
/// mixes with the program's, and sets MPI_ERRORS_RETURN on it: every MPI error becomes a dist_error
/// carrying MPI_Error_string. Collectives are MPI's non-blocking ones (MPI_Iallreduce, MPI_Ibcast,
/// MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall, MPI_Ibarrier); wait() polls MPI_Test and
/// gives up after the timeout: a dead or stalled peer raises dist_error on every survivor, never a
/// hang. After a failure the communicator is broken for good (plain MPI cannot revoke a collective):
/// later calls throw at once, and the program should end.
///
/// One thread at a time issues and waits on one mpi object (MPI requires every rank to issue
/// collectives on a communicator in the same order). Counts are limited to INT_MAX per call.
class mpi {
 public:
  using options = mpi_options;
  using environment = mpi_environment;

  /// Ranks of MPI_COMM_WORLD.
  explicit mpi(mpi_options opt = {}) : mpi(MPI_COMM_WORLD, opt) {}

  /// Ranks of `comm` (collective over comm: MPI_Comm_dup).
  explicit mpi(MPI_Comm comm, mpi_options opt = {}) : state_(std::make_shared<detail::mpi_comm_state>()) {
    detail::mpi_ensure_initialized(nullptr, nullptr);
    state_->timeout = detail::timeout_from_env("trainkit::dist::mpi", opt.timeout);
    TRAINKIT_CHECK(state_->timeout.count() > 0, usage_error, "trainkit::dist::mpi",
                   "timeout must be positive, got " << state_->timeout.count() << " ms");
    auto lk = detail::mpi_process::get().lock();
    int rc = MPI_Comm_dup(comm, &state_->comm);
    TRAINKIT_CHECK(rc == MPI_SUCCESS, dist_error, "trainkit::dist::mpi",
                   "MPI_Comm_dup failed: " << detail::mpi_error_string(rc));
    rc = MPI_Comm_set_errhandler(state_->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(state_->comm, &state_->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(state_->comm, &state_->size);
    TRAINKIT_CHECK(rc == MPI_SUCCESS, dist_error, "trainkit::dist::mpi",
                   "setting up the communicator failed: " << detail::mpi_error_string(rc));
    TRAINKIT_CHECK(
        detail::mpi_float16_ops::get().error == MPI_SUCCESS, dist_error, "trainkit::dist::mpi",
        "MPI_Op_create failed: " << detail::mpi_error_string(detail::mpi_float16_ops::get().error));
    // Who is who, for the messages after a failure: every rank's host and pid.
    rc = MPI_Comm_dup(state_->comm, &state_->probe_comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(state_->probe_comm, MPI_ERRORS_RETURN);
    constexpr int name_bytes = 64;
    char mine[name_bytes + sizeof(long) + sizeof(int)] = {};
    int len = 0;
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    if (rc == MPI_SUCCESS) rc = MPI_Get_processor_name(host, &len);
    std::memcpy(mine, host, static_cast<std::size_t>(std::clamp(len, 0, name_bytes - 1)));
    const long pid = static_cast<long>(::getpid());
    std::memcpy(mine + name_bytes, &pid, sizeof pid);
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    std::memcpy(mine + name_bytes + sizeof(long), &world_rank, sizeof world_rank);
    std::vector<char> all(sizeof mine * static_cast<std::size_t>(state_->size));
    if (rc == MPI_SUCCESS) rc = MPI_Allgather(mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, state_->comm);
    TRAINKIT_CHECK(rc == MPI_SUCCESS, dist_error, "trainkit::dist::mpi",
                   "exchanging host names failed: " << detail::mpi_error_string(rc));
    for (int r = 0; r < state_->size; ++r) {
      const char* p = all.data() + sizeof mine * static_cast<std::size_t>(r);
      state_->hosts.emplace_back(p, strnlen(p, name_bytes));
      long q = 0;
      std::memcpy(&q, p + name_bytes, sizeof q);
      state_->pids.push_back(q);
      int w = 0;
      std::memcpy(&w, p + name_bytes + sizeof(long), sizeof w);
      state_->world_ranks.push_back(w);
    }
    // The first communicator congruent to MPI_COMM_WORLD probes for every other (every rank makes
    // its communicators in the same order, so every rank picks the same one).
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(state_->comm, MPI_COMM_WORLD, &cmp);
    auto& registry = detail::world_probe_state();
    std::lock_guard<std::mutex> reg(detail::world_probe_mutex());
    auto w = registry.lock();
    if (!w && (cmp == MPI_CONGRUENT || cmp == MPI_IDENT)) {
      registry = state_;
      // Every pair of ranks exchanges one message now, so that a probe after a failure never makes
      // a transport's first connection - to a peer that may be dead (Open MPI's TCP transport
      // connects lazily, and a rank of a sub-communicator may never have talked to the one that died).
      std::vector<int> out(static_cast<std::size_t>(state_->size), state_->rank), in(out.size());
      if (state_->probe_comm != MPI_COMM_NULL)
        MPI_Alltoall(out.data(), 1, MPI_INT, in.data(), 1, MPI_INT, state_->probe_comm);
    } else {
      state_->world = std::move(w);
    }
  }

  mpi(mpi&&) noexcept = default;
  mpi& operator=(mpi&&) noexcept = default;
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() = default;

  [[nodiscard]] int rank() const noexcept { return state_->rank; }
  [[nodiscard]] int size() const noexcept { return state_->size; }
  /// The timeout in force (options, or TRAINKIT_DIST_TIMEOUT_MS).
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return state_->timeout; }
  /// Changes the timeout of later waits (also of works already issued).
  void set_timeout(std::chrono::milliseconds t) {
    TRAINKIT_CHECK(t.count() > 0, usage_error, "mpi::set_timeout",
                   "timeout must be positive, got " << t.count() << " ms");
    state_->timeout = t;
  }
  /// Collective: the ranks with the same `color` as this one, ordered by `key` (MPI_Comm_split),
  /// with this communicator's timeout.
  [[nodiscard]] mpi split(int color, int key) const { return split_with([&](MPI_Comm& out) {
      return MPI_Comm_split(state_->comm, color, key, &out); }, "MPI_Comm_split"); }
  /// Collective: the ranks that share memory with this one - its host (MPI_Comm_split_type with
  /// MPI_COMM_TYPE_SHARED), in this communicator's order. compression::hierarchical builds on it.
  [[nodiscard]] mpi split_shared() const { return split_with([&](MPI_Comm& out) {
      return MPI_Comm_split_type(state_->comm, MPI_COMM_TYPE_SHARED, state_->rank, MPI_INFO_NULL, &out); },
      "MPI_Comm_split_type"); }

  /// The duplicated MPI communicator (MPI_ERRORS_RETURN set), e.g. to bootstrap NCCL.
  [[nodiscard]] MPI_Comm native_handle() const noexcept { return state_->comm; }
  /// Whether a collective of this communicator has failed (it cannot be used any more).
  [[nodiscard]] bool broken() const noexcept { return state_->broken; }
  /// After a timeout: the ranks the liveness probe found dead or stalled (empty when it found none
  /// or none ran).
  [[nodiscard]] std::vector<int> failed_ranks() const {
    std::lock_guard<std::mutex> lk(state_->broken_mutex);
    return state_->failed_ranks;
  }
  /// The liveness probe for another transport bootstrapped from this communicator (dist::nccl
  /// takes it at construction): after that transport timed out, every survivor calls it with the
  /// same window; it returns who did not answer (probe_and_describe) and records them for
  /// failed_ranks() and lowest_surviving_rank(). Once per communicator; keeps its state alive.
  [[nodiscard]] std::function<std::string(std::chrono::milliseconds)> liveness_probe() const {
    return [st = state_](std::chrono::milliseconds window) { return st->probe_and_describe(window, true); };
  }
  /// After a failure, the rank that writes the survivors' snapshot (each survivor computes the
  /// same from its probe): the lowest rank not found silent; -1 on a rank that was itself the
  /// late one (its peers gave up on it and decide without it).
  [[nodiscard]] int lowest_surviving_rank() const {
    std::lock_guard<std::mutex> lk(state_->broken_mutex);
    if (state_->was_late) return -1;
    for (int r = 0; r < state_->size; ++r)
      if (std::find(state_->failed_ranks.begin(), state_->failed_ranks.end(), r) == state_->failed_ranks.end()) return r;
    return -1;
  }

  template <dist_element T>
  work allreduce(T* data, std::size_t n, reduce_op op) {
    const auto desc = detail::collective_desc::make<T>(detail::collective_kind::allreduce, n, op);
    if (n == 0) return {};
    auto w = start(desc, n);
    if (op == reduce_op::avg) w->set_post(&detail::mpi_divide<T>, data, n);
    return launch(w, [&] {
      return MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), detail::mpi_datatype<T>(),
                            detail::mpi_op<T>(op), state_->comm, w->request());
    });
  }

  template <dist_element T>
  work broadcast(T* data, std::size_t n, int root) {
    TRAINKIT_CHECK(root >= 0 && root < size(), usage_error, "mpi::broadcast",
                   "root " << root << " is not a rank of a communicator of size " << size());
    const auto desc =
        detail::collective_desc::make<T>(detail::collective_kind::broadcast, n, reduce_op::sum, root);
    if (n == 0) return {};
    auto w = start(desc, n);
    return launch(w, [&] {
      return MPI_Ibcast(data, static_cast<int>(n), detail::mpi_datatype<T>(), root, state_->comm,
                        w->request());
    });
  }

  template <dist_element T>
  work allgather(const T* in, std::size_t n, T* out) {
    const auto desc = detail::collective_desc::make<T>(detail::collective_kind::allgather, n);
    if (n == 0) return {};
    auto w = start(desc, n);
    const std::size_t p = static_cast<std::size_t>(size());
    const void* send = in;
    if (in == out + static_cast<std::size_t>(rank()) * n) {
      send = MPI_IN_PLACE;  // the rank's own chunk is already in place
    } else if (detail::overlaps(in, n * sizeof(T), out, p * n * sizeof(T))) {
      send = copy_input(*w, in, n);
    }
    return launch(w, [&] {
      return MPI_Iallgather(send, static_cast<int>(n), detail::mpi_datatype<T>(), out, static_cast<int>(n),
                            detail::mpi_datatype<T>(), state_->comm, w->request());
    });
  }

  template <dist_element T>
  work reduce_scatter(const T* in, T* out, std::size_t n_per_rank, reduce_op op) {
    const auto desc =
        detail::collective_desc::make<T>(detail::collective_kind::reduce_scatter, n_per_rank, op);
    if (n_per_rank == 0) return {};
    const std::size_t p = static_cast<std::size_t>(size());
    auto w = start(desc, n_per_rank * p);
    if (op == reduce_op::avg) w->set_post(&detail::mpi_divide<T>, out, n_per_rank);
    const void* send = in;
    if (detail::overlaps(in, p * n_per_rank * sizeof(T), out, n_per_rank * sizeof(T)))
      send = copy_input(*w, in, p * n_per_rank);
    return launch(w, [&] {
      return MPI_Ireduce_scatter_block(send, out, static_cast<int>(n_per_rank), detail::mpi_datatype<T>(),
                                       detail::mpi_op<T>(op), state_->comm, w->request());
    });
  }

  template <dist_element T>
  work alltoall(const T* in, T* out, std::size_t n_per_rank) {
    const auto desc = detail::collective_desc::make<T>(detail::collective_kind::alltoall, n_per_rank);
    if (n_per_rank == 0) return {};
    const std::size_t p = static_cast<std::size_t>(size());
    auto w = start(desc, n_per_rank * p);
    const void* send = in;
    if (detail::overlaps(in, p * n_per_rank * sizeof(T), out, p * n_per_rank * sizeof(T)))
      send = copy_input(*w, in, p * n_per_rank);
    return launch(w, [&] {
      return MPI_Ialltoall(send, static_cast<int>(n_per_rank), detail::mpi_datatype<T>(), out,
                           static_cast<int>(n_per_rank), detail::mpi_datatype<T>(), state_->comm,
                           w->request());
    });
  }

  work barrier() {
    auto w = start(detail::collective_desc{}, 0);
    return launch(w, [&] { return MPI_Ibarrier(state_->comm, w->request()); });
  }

  /// Collective: throws dist_error on every rank when `hash` differs between ranks, naming `what` and
  /// the ranks that differ (data_parallel checks its parameter list with it).
  void check_same(std::uint64_t hash, std::string_view what) { check_consistent(*this, hash, what); }
  /// Collective: the same for a list (one hash per parameter, say); names the first differing index.
  void check_same(const std::vector<std::uint64_t>& hashes, std::string_view what) {
    check_consistent(*this, hashes, what);
  }

 private:
  template <class Split>
  mpi split_with(Split split, const char* what) const {
    MPI_Comm out = MPI_COMM_NULL;
    int rc = MPI_SUCCESS;
    {
      auto lk = detail::mpi_process::get().lock();
      rc = split(out);
    }
    TRAINKIT_CHECK(rc == MPI_SUCCESS && out != MPI_COMM_NULL, dist_error, "trainkit::dist::mpi",
                   what << " failed on rank " << state_->rank << ": " << detail::mpi_error_string(rc));
    mpi r(out, mpi_options{.timeout = state_->timeout});
    MPI_Comm_free(&out);
    return r;
  }

  std::shared_ptr<detail::mpi_work> start(const detail::collective_desc& desc, std::size_t total) {
    auto w = std::make_shared<detail::mpi_work>(state_, desc);
    if (state_->broken) throw dist_error(w->message("the communicator failed earlier: " + state_->reason()));
    TRAINKIT_CHECK(total <= static_cast<std::size_t>(INT_MAX), usage_error, "trainkit::dist::mpi",
                   desc.str() << ": " << total << " elements exceed MPI's int count limit " << INT_MAX
                              << "; split the buffer");
    return w;
  }

  template <class Call>
  work launch(const std::shared_ptr<detail::mpi_work>& w, Call&& call) {
    int rc = MPI_SUCCESS;
    {
      auto lk = detail::mpi_process::get().lock();
      rc = call();
    }
    if (rc != MPI_SUCCESS) {
      const std::string reason = w->mpi_call() + " failed: " + detail::mpi_error_string(rc);
      state_->mark_broken(reason);
      detail::mpi_process::get().error_seen = true;
      throw dist_error(w->message(reason));
    }
    return work(w);
  }

  template <class T>
  static const void* copy_input(detail::mpi_work& w, const T* in, std::size_t count) {
    auto& s = w.scratch();
    s.resize(count * sizeof(T));
    std::memcpy(s.data(), in, count * sizeof(T));
    return s.data();
  }

  std::shared_ptr<detail::mpi_comm_state> state_;
};

}  // namespace trainkit::dist
