// trainkit/dist/thread_group.hpp - a communicator whose ranks are threads of one process.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>  // std::memcpy: broadcast, allgather, alltoall are plain copies between ranks' buffers
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/dist/detail/collective.hpp"
#include "trainkit/dist/detail/element.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::dist {

/// Options of a thread_group.
struct thread_group_options {
  /// How long wait() waits for the other ranks to arrive at a collective before it gives up,
  /// aborts the group and throws dist_error (on every waiting rank).
  std::chrono::milliseconds timeout{60000};
};

namespace detail {

// One collective of a thread_group, shared by the ranks that issue it (sequence number = key).
struct tg_slot {
  enum class status { pending, ready, running, done, failed };
  collective_desc desc;
  std::vector<const void*> in;  // per rank
  std::vector<void*> out;       // per rank
  std::vector<char> arrived;    // per rank
  int arrivals = 0;
  status state = status::pending;
  void (*exec)(tg_slot&, int) noexcept = nullptr;
  std::string error;  // why it failed
};

// State shared by the handles of one group. One mutex: collectives are rendezvous points anyway, and
// the data movement itself runs outside it.
struct tg_shared {
  int size = 1;
  thread_group_options options;
  std::mutex m;
  std::condition_variable cv;
  std::map<std::uint64_t, std::shared_ptr<tg_slot>> slots;
  std::uint64_t next_exec = 0;  // the next sequence number to execute: execution follows issue order
  bool executing = false;       // one thread at a time moves data, so collectives never overlap
  bool aborted = false;
  std::string abort_reason;

  // Marks the group broken: every collective that has not started moving data fails with `reason`;
  // later calls throw at once. The first reason is kept.
  void abort_locked(const std::string& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    for (auto& [seq, s] : slots)
      if (s->state == tg_slot::status::pending || s->state == tg_slot::status::ready) {
        s->state = tg_slot::status::failed;
        s->error = reason;
      }
    cv.notify_all();
  }

  // Executes ready collectives in sequence order. Collectives become ready in sequence order (a rank
  // issues #k before #k+1, so the last arrival at #k+1 happens after every arrival at #k); whoever
  // makes one ready runs it, unless another thread is already running the queue, which then picks it up.
  void run_ready(std::unique_lock<std::mutex>& lk) {
    if (executing) return;
    executing = true;
    for (;;) {
      auto it = slots.find(next_exec);
      if (it == slots.end() || it->second->state != tg_slot::status::ready) break;
      std::shared_ptr<tg_slot> s = it->second;
      s->state = tg_slot::status::running;
      lk.unlock();
      s->exec(*s, size);
      lk.lock();
      s->state = tg_slot::status::done;
      slots.erase(next_exec);
      ++next_exec;
      cv.notify_all();
    }
    executing = false;
  }
};

// Rank-order reduction of the ranks' inputs (at `in_offset`) into the outputs (at `out_offset`) of every
// rank (only < 0) or of rank `only`, in blocks: a block of every input is read before any output of it
// is written, so in place is safe (out[r] may equal in[r] + in_offset).
template <class T>
void tg_reduce(const tg_slot& s, std::size_t in_offset, std::size_t out_offset, std::size_t count, int p,
               int only) noexcept {
  using C = dist_compute_t<T>;
  constexpr std::size_t block = 1024;
  const reduce_op op = s.desc.op;
  C acc[block];
  for (std::size_t b = 0; b < count; b += block) {
    const std::size_t m = std::min(block, count - b);
    const T* src0 = static_cast<const T*>(s.in[0]) + in_offset + b;
    for (std::size_t i = 0; i < m; ++i) acc[i] = to_compute(src0[i]);
    for (int r = 1; r < p; ++r) {
      const T* src = static_cast<const T*>(s.in[static_cast<std::size_t>(r)]) + in_offset + b;
      for (std::size_t i = 0; i < m; ++i) acc[i] = combine<T>(op, acc[i], to_compute(src[i]));
    }
    for (int r = 0; r < p; ++r) {
      if (only >= 0 && r != only) continue;
      T* dst = static_cast<T*>(s.out[static_cast<std::size_t>(r)]) + out_offset + b;
      for (std::size_t i = 0; i < m; ++i) dst[i] = finish<T>(op, acc[i], p);
    }
  }
}

template <class T>
const T* tg_in(const tg_slot& s, int r) noexcept {
  return static_cast<const T*>(s.in[static_cast<std::size_t>(r)]);
}
template <class T>
T* tg_out(const tg_slot& s, int r) noexcept {
  return static_cast<T*>(s.out[static_cast<std::size_t>(r)]);
}

template <class T>
void tg_exec_allreduce(tg_slot& s, int p) noexcept {
  tg_reduce<T>(s, 0, 0, s.desc.count, p, -1);
}

template <class T>
void tg_exec_broadcast(tg_slot& s, int p) noexcept {
  const T* src = tg_in<T>(s, s.desc.root);
  for (int r = 0; r < p; ++r) {
    T* dst = tg_out<T>(s, r);
    if (dst != src) std::memcpy(dst, src, s.desc.count * sizeof(T));
  }
}

template <class T>
void tg_exec_allgather(tg_slot& s, int p) noexcept {
  const std::size_t n = s.desc.count;
  for (int j = 0; j < p; ++j) {
    const T* src = tg_in<T>(s, j);
    for (int r = 0; r < p; ++r) {
      T* dst = tg_out<T>(s, r) + static_cast<std::size_t>(j) * n;
      if (dst != src) std::memcpy(dst, src, n * sizeof(T));
    }
  }
}

template <class T>
void tg_exec_reduce_scatter(tg_slot& s, int p) noexcept {
  const std::size_t n = s.desc.count;
  for (int r = 0; r < p; ++r) tg_reduce<T>(s, static_cast<std::size_t>(r) * n, 0, n, p, r);
}

template <class T>
void tg_exec_alltoall(tg_slot& s, int p) noexcept {
  const std::size_t n = s.desc.count;
  for (int r = 0; r < p; ++r)
    for (int j = 0; j < p; ++j)
      std::memcpy(tg_out<T>(s, r) + static_cast<std::size_t>(j) * n,
                  tg_in<T>(s, j) + static_cast<std::size_t>(r) * n, n * sizeof(T));
}

inline void tg_exec_nothing(tg_slot&, int) noexcept {}

// The completion state behind a thread_group work.
class tg_work final : public work_state {
 public:
  tg_work(std::shared_ptr<tg_shared> g, std::shared_ptr<tg_slot> s, int rank)
      : g_(std::move(g)), s_(std::move(s)), rank_(rank) {}

  bool done() override {
    std::lock_guard<std::mutex> lk(g_->m);
    return s_->state == tg_slot::status::done || s_->state == tg_slot::status::failed;
  }

  void wait() override {
    std::unique_lock<std::mutex> lk(g_->m);
    const auto deadline = std::chrono::steady_clock::now() + g_->options.timeout;
    for (;;) {
      switch (s_->state) {
        case tg_slot::status::done:
          return;
        case tg_slot::status::failed:
          throw dist_error(message(s_->error));
        case tg_slot::status::ready:
        case tg_slot::status::running:
          // Every rank has arrived: the data moves now or right after the collectives before it;
          // the buffers must not be given up half-way, so no timeout here.
          g_->cv.wait(lk);
          break;
        case tg_slot::status::pending:
          if (g_->cv.wait_until(lk, deadline) == std::cv_status::timeout &&
              s_->state == tg_slot::status::pending) {
            g_->abort_locked(timeout_reason());
            throw dist_error(message(s_->error));
          }
          break;
      }
    }
  }

 private:
  std::string message(std::string_view reason) const {
    return failure_message("thread_group", s_->desc, rank_, g_->size, g_->options.timeout, reason);
  }

  std::string timeout_reason() const {
    std::ostringstream os;
    os << "timed out after " << g_->options.timeout.count() << " ms on rank " << rank_
       << " waiting for rank(s)";
    for (int r = 0; r < g_->size; ++r)
      if (!s_->arrived[static_cast<std::size_t>(r)]) os << " " << r;
    os << " to issue it (a peer stalled, died, or issued a different sequence of collectives)";
    return os.str();
  }

  std::shared_ptr<tg_shared> g_;
  std::shared_ptr<tg_slot> s_;
  int rank_;
};

}  // namespace detail

/// A communicator whose ranks are threads of one process (tests; multi-core training on one host).
/// `create(n)` makes the n handles of one group, one per rank, each used by one thread; `run(n, f)`
/// starts the threads too. A collective is a rendezvous: the last rank to issue it moves the data,
/// reading the other ranks' buffers directly (one copy), so issuing returns at once on every rank
/// but the last. Reductions run in rank order, so results are deterministic and the same on every rank.
///
/// Failure: wait() throws dist_error when the other ranks have not all issued the collective within
/// `options.timeout`; the group is then aborted, and every other pending or later collective throws
/// too. A handle is move-only (it counts the collectives its rank issued).
/// Buffer aliasing: allreduce is in place; allgather's `in` may be `out + rank()*n`, reduce_scatter's
/// `out` may be `in + rank()*n_per_rank`; other overlaps are not allowed.
class thread_group {
 public:
  using options = thread_group_options;

  /// The n handles of a new group: element r is rank r.
  static std::vector<thread_group> create(int n, thread_group_options opt = {}) {
    TRAINKIT_CHECK(n >= 1, usage_error, "thread_group::create", "world size must be >= 1, got " << n);
    TRAINKIT_CHECK(opt.timeout.count() > 0, usage_error, "thread_group::create",
                   "timeout must be positive, got " << opt.timeout.count() << " ms");
    auto g = std::make_shared<detail::tg_shared>();
    g->size = n;
    g->options = opt;
    std::vector<thread_group> out;
    out.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) out.push_back(thread_group(g, r));
    return out;
  }

  /// Runs f(thread_group&) on n threads, rank r on thread r, joins them all and rethrows the first
  /// exception any of them threw. A rank that throws aborts the group, so the others' collectives throw
  /// dist_error ("peer rank r failed: ...") instead of waiting for it.
  template <class F>
  static void run(int n, F f, thread_group_options opt = {}) {
    auto comms = create(n, opt);
    std::mutex first_mutex;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          f(comms[static_cast<std::size_t>(r)]);
        } catch (...) {
          {
            std::lock_guard<std::mutex> lk(first_mutex);
            if (!first) first = std::current_exception();
          }
          std::string what = "unknown exception";
          try {
            throw;
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          comms[static_cast<std::size_t>(r)].abort("peer rank " + std::to_string(r) + " failed: " + what);
        }
      });
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

  thread_group(thread_group&&) noexcept = default;
  thread_group& operator=(thread_group&&) noexcept = default;
  thread_group(const thread_group&) = delete;
  thread_group& operator=(const thread_group&) = delete;
  ~thread_group() = default;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return g_->size; }
  /// How long wait() waits for the other ranks (thread_group_options::timeout).
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return g_->options.timeout; }

  /// Marks the group failed: every collective that has not started and every later one throws
  /// dist_error carrying `reason`, on every rank.
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lk(g_->m);
    g_->abort_locked(reason);
  }

  template <dist_element T>
  work allreduce(T* data, std::size_t n, reduce_op op) {
    if (n == 0) return {};
    return issue(detail::collective_desc::make<T>(detail::collective_kind::allreduce, n, op), data, data,
                 &detail::tg_exec_allreduce<T>);
  }

  template <dist_element T>
  work broadcast(T* data, std::size_t n, int root) {
    TRAINKIT_CHECK(root >= 0 && root < size(), usage_error, "thread_group::broadcast",
                   "root " << root << " is not a rank of a group of size " << size());
    if (n == 0) return {};
    return issue(
        detail::collective_desc::make<T>(detail::collective_kind::broadcast, n, reduce_op::sum, root), data,
        data, &detail::tg_exec_broadcast<T>);
  }

  template <dist_element T>
  work allgather(const T* in, std::size_t n, T* out) {
    if (n == 0) return {};
    return issue(detail::collective_desc::make<T>(detail::collective_kind::allgather, n), in, out,
                 &detail::tg_exec_allgather<T>);
  }

  template <dist_element T>
  work reduce_scatter(const T* in, T* out, std::size_t n_per_rank, reduce_op op) {
    if (n_per_rank == 0) return {};
    return issue(detail::collective_desc::make<T>(detail::collective_kind::reduce_scatter, n_per_rank, op),
                 in, out, &detail::tg_exec_reduce_scatter<T>);
  }

  template <dist_element T>
  work alltoall(const T* in, T* out, std::size_t n_per_rank) {
    if (n_per_rank == 0) return {};
    return issue(detail::collective_desc::make<T>(detail::collective_kind::alltoall, n_per_rank), in, out,
                 &detail::tg_exec_alltoall<T>);
  }

  work barrier() { return issue(detail::collective_desc{}, nullptr, nullptr, &detail::tg_exec_nothing); }

 private:
  thread_group(std::shared_ptr<detail::tg_shared> g, int rank) : g_(std::move(g)), rank_(rank) {}

  work issue(const detail::collective_desc& desc, const void* in, void* out,
             void (*exec)(detail::tg_slot&, int) noexcept) {
    TRAINKIT_CHECK(desc.kind == detail::collective_kind::barrier || (in != nullptr && out != nullptr),
                   usage_error, "thread_group",
                   detail::to_string(desc.kind)
                       << ": null buffer for " << desc.count << " elements on rank " << rank_);
    const std::uint64_t seq = next_seq_++;
    std::unique_lock<std::mutex> lk(g_->m);
    if (g_->aborted)
      throw dist_error(detail::failure_message("thread_group", desc, rank_, g_->size, g_->options.timeout,
                                               g_->abort_reason));
    auto& entry = g_->slots[seq];
    if (!entry) {
      entry = std::make_shared<detail::tg_slot>();
      entry->desc = desc;
      entry->exec = exec;
      const auto p = static_cast<std::size_t>(g_->size);
      entry->in.assign(p, nullptr);
      entry->out.assign(p, nullptr);
      entry->arrived.assign(p, 0);
    } else if (!(entry->desc == desc)) {
      std::ostringstream os;
      os << "mismatched collectives: call #" << seq << " of this group is " << desc.str() << " on rank "
         << rank_ << " but " << entry->desc.str() << " on rank(s)";
      for (int r = 0; r < g_->size; ++r)
        if (entry->arrived[static_cast<std::size_t>(r)]) os << " " << r;
      g_->abort_locked(os.str());
      throw dist_error(detail::failure_message("thread_group", desc, rank_, g_->size, g_->options.timeout,
                                               g_->abort_reason));
    }
    std::shared_ptr<detail::tg_slot> s = entry;
    s->in[static_cast<std::size_t>(rank_)] = in;
    s->out[static_cast<std::size_t>(rank_)] = out;
    s->arrived[static_cast<std::size_t>(rank_)] = 1;
    if (++s->arrivals == g_->size) {
      s->state = detail::tg_slot::status::ready;
      g_->run_ready(lk);
    }
    return work(std::make_shared<detail::tg_work>(g_, std::move(s), rank_));
  }

  std::shared_ptr<detail::tg_shared> g_;
  int rank_ = 0;
  std::uint64_t next_seq_ = 0;  // collectives this rank has issued (zero-length ones excluded)
};

}  // namespace trainkit::dist
