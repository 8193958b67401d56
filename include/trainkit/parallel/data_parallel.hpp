// trainkit/parallel/data_parallel.hpp - data_parallel<Comm, Compression>: PyTorch DDP's reducer for
// trainkit modules. Every rank runs the same model on its shard of the batch; data_parallel makes
// the gradients the average over the ranks, reducing bucket by bucket while backward is still
// running (docs/architecture.md, "Data parallel"):
//
//   thread_group / mpi comm = ...;
//   data_parallel<mpi, int8> ddp(comm, *model);   // checks + broadcasts rank 0's
//   for (...) {
//     optimizer.zero_grad();
//     loss(model->forward(x), y).backward();  // hooks put gradients into buckets; full buckets
//     ddp.finish();                           //   are reduced while backward goes on; finish()
//     optimizer.step();                       //   waits, then .grad() holds the average
//   }
//
// Gradients are views into their bucket's flat buffer (PyTorch's gradient_as_bucket_view): after
// the first synced step every .grad() is a slice of a bucket, so the reduced values need no copy
// back out. A gradient that is not a view when its hook fires (zero_grad(set_to_none) dropped it)
// is copied into the bucket once and replaced by the view; with zero_grad(false) backward
// accumulates straight into the buckets.
//
// Devices: on the cpu a communication thread reduces the full buckets. On cuda (include
// <trainkit/cuda.cuh>; parallel/cuda.cuh) each bucket is reduced on a side stream that waits on
// an event recorded after the bucket's last gradient: with a communicator on device buffers (nccl)
// nothing waits on the host, and finish() only makes the current stream wait for the side stream;
// with a host communicator (mpi, thread_group) the communication thread stages each bucket through
// pinned host memory.
//
// Gradient accumulation: backward passes inside `auto g = ddp.no_sync();` only accumulate locally;
// the next backward outside it reduces the sum.
//
// A parameter whose gradient hook did not fire in a synced step (not used by this rank's forward)
// contributes its current .grad() - zero when it has none - and gets the reduced value like every
// other parameter, so ranks that take different branches still issue the same collectives (PyTorch's
// find_unused_parameters, without its extra pass). After finish() every parameter that requires
// grad has a defined .grad().
#pragma once

#include <algorithm>           // std::clamp
#include <chrono>              // steady_clock: communication time
#include <condition_variable>  // the communication thread's queue
#include <cstddef>
#include <cstdint>
#include <cstring>    // std::memcpy (descriptions in the mismatch report)
#include <deque>      // the queue of full buckets
#include <exception>  // std::exception_ptr: a failed allreduce reaches finish()
#include <memory>     // std::shared_ptr/weak_ptr: hooks outlive nothing they point to
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>  // std::is_same_v
#include <utility>
#include <vector>

#include "trainkit/autograd/var.hpp"
#include "trainkit/core/device.hpp"
#include "trainkit/ops/elementwise.hpp"  // copy_, zero_
#include "trainkit/core/error.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/dist/bucket.hpp"
#include "trainkit/dist/check_consistent.hpp"  // hash_bytes, hash_combine, check_consistent
#include "trainkit/compression/codecs.hpp"
#include "trainkit/dist/any_rank.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/compression/quantized_allreduce.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::parallel {

/// How data_parallel reduces a full bucket on a device: `device_reduction<D>::state<Core>` keeps
/// what that needs (cuda: the side stream, events, staging) and is called by the shared logic:
///   on_thread                 whether the communication thread runs reduce(), or launch() does all
///   bucket_ready(core, b)     backward thread: bucket b's last gradient has been written
///   launch(core, b)           backward thread, when !on_thread: start reducing bucket b
///   reduce(core, b)           communication thread, when on_thread: reduce bucket b
///   finish(core)              backward thread, after every bucket is reduced or launched
/// cpu is defined here; cuda in parallel/cuda.cuh.
template <class Device>
struct device_reduction;

namespace detail {
template <class Device>
concept device_reduction_defined = requires { sizeof(device_reduction<Device>); };
/// Whether a device_reduction state measures the stats itself (GPU time) instead of host time.
template <class State>
inline constexpr bool timed_on_device = requires { requires State::timed_on_device; };
}  // namespace detail

/// cpu: the communication thread reduces each bucket in place.
template <>
struct device_reduction<cpu> {
  template <class Core>
  struct state {
    static constexpr bool on_thread = true;
    explicit state(Core&) {}
    void bucket_ready(Core&, std::size_t) {}
    void launch(Core&, std::size_t) {}
    void reduce(Core& c, std::size_t b) { c.reduce_host(b, c.flat[b].data(), c.flat[b].numel()); }
    void finish(Core&) {}
  };
};

/// Settings of data_parallel.
struct data_parallel_options {
  std::size_t bucket_cap_bytes = std::size_t(25) << 20;       // every bucket after the first
  std::size_t first_bucket_cap_bytes = std::size_t(1) << 20;  // the first (last layers): starts early
  /// Reduce each bucket as soon as it is full, during backward. false: everything in finish() - the
  /// baseline that shows what overlapping hides.
  bool overlap = true;
  /// Broadcast the buffers (BatchNorm running statistics) from rank 0 at construction, like the
  /// parameters. sync_buffers() does it again on request.
  bool broadcast_buffers = true;
};

/// What data_parallel has done so far (figures for logs and the monitor). On cuda with nccl the
/// times are GPU time (see data_parallel::stats()).
struct data_parallel_stats {
  std::uint64_t steps = 0;            // synced finish() calls
  std::uint64_t buckets_reduced = 0;  // allreduces run
  std::uint64_t bytes_sent = 0;       // put on the wire by this rank
  double comm_seconds = 0;            // the communication thread's busy time (quantization included)
  double exposed_seconds = 0;         // time finish() waited: communication backward did not hide
  /// comm_seconds as a share of a training time of step_seconds in total.
  double comm_share(double step_seconds) const { return step_seconds > 0 ? comm_seconds / step_seconds : 0.0; }
  double exposed_share(double step_seconds) const {
    return step_seconds > 0 ? exposed_seconds / step_seconds : 0.0;
  }
};

/// Data-parallel training over a communicator: parameter and buffer broadcast from rank 0 at
/// construction (after checking that every rank holds the same parameter list), gradient buckets
/// reduced through the compression policy on a communication thread while backward runs, and
/// finish() to wait and write the averages into .grad(). Not copyable or movable (the parameters'
/// hooks refer to it); destroying it joins the communication thread.
/// \tparam Comm a communicator (thread_group, mpi); it must outlive this object
/// \tparam Compression a gradient_compression policy (none by default)
/// \tparam T the parameters' element type (lossy compression needs float)
/// \tparam Device cpu, or cuda (include <trainkit/cuda.cuh>: parallel/cuda.cuh defines how)
template <dist::communicator Comm, compression::gradient_compression Compression = compression::none, class T = float, class Device = cpu>
class data_parallel {
  static_assert(detail::device_reduction_defined<Device>,
                "data_parallel<..., cuda>: include <trainkit/cuda.cuh> (parallel/cuda.cuh) from a .cu file for the "
                "CUDA reduction");
  static_assert(std::is_same_v<T, float> || !Compression::lossy,
                "data_parallel: lossy gradient compression works on float parameters only");

 public:
  using var_type = autograd::var<T, Device>;
  using tensor_type = tensor<T, Device>;
  using named_parameters = std::vector<std::pair<std::string, var_type>>;
  using named_buffers = std::vector<std::pair<std::string, tensor_type>>;

  /// RAII scope in which backward only accumulates gradients locally (no communication);
  /// the first synced backward after it reduces the accumulated sum.
  class no_sync_guard {
   public:
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    ~no_sync_guard() {
      std::lock_guard lk(*mu_);
      *sync_ = previous_;
    }

   private:
    friend class data_parallel;
    no_sync_guard(std::mutex* mu, bool* sync) : mu_(mu), sync_(sync) {
      std::lock_guard lk(*mu_);
      previous_ = *sync_;
      *sync_ = false;
    }
    std::mutex* mu_;
    bool* sync_;
    bool previous_ = true;
  };

  /// Collective. A model is anything with named_parameters() and named_buffers() (nn::module).
  template <class Model>
    requires requires(const Model& m) {
      { m.named_parameters() } -> std::convertible_to<named_parameters>;
      { m.named_buffers() } -> std::convertible_to<named_buffers>;
    }
  data_parallel(Comm& comm, const Model& model, data_parallel_options opts = {}, Compression compression = {})
      : data_parallel(comm, model.named_parameters(), model.named_buffers(), opts, std::move(compression)) {}

  /// Collective, on explicit lists of (name, parameter) and (name, buffer).
  data_parallel(Comm& comm, named_parameters params, named_buffers buffers, data_parallel_options opts = {},
                Compression compression = {})
      : core_(std::make_shared<core>(comm, std::move(params), std::move(buffers), opts, std::move(compression))) {
    core_->check_same_model();
    core_->broadcast_from_root(true, opts.broadcast_buffers);
    core_->plan();
    core_->start();
    for (std::size_t i = 0; i < core_->params.size(); ++i) {
      auto& v = core_->params[i].second;
      if (!v.requires_grad()) continue;
      v.register_post_accumulate_hook([w = std::weak_ptr<core>(core_), i](tensor_type& g) {
        if (auto c = w.lock()) c->on_ready(i, g);
      });
    }
  }

  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;
  ~data_parallel() { core_->stop(); }

  /// After backward, before the optimizer step: reduces what is left, waits for every bucket,
  /// writes the average over the ranks into every parameter's .grad(). Rethrows (dist_error) what
  /// the communication thread caught. Inside no_sync() it does nothing.
  void finish() { core_->finish(); }

  /// Backward passes in this scope accumulate locally: `{ auto g = ddp.no_sync(); loss.backward(); }`.
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(&core_->mu, &core_->sync); }

  /// Collective: broadcasts the buffers from rank 0 again (BatchNorm running statistics before an
  /// evaluation or a snapshot). Call it between steps.
  void sync_buffers() {
    core_->require_idle("sync_buffers");
    core_->broadcast_from_root(false, true);
  }

  /// Collective: the loss scaler's found_inf OR-ed over the ranks. Call it between finish() and the
  /// next backward.
  bool found_inf(bool local) {
    core_->require_idle("found_inf");
    return dist::any_rank(core_->comm, local);
  }

  /// The figures so far. On cuda with a device-buffer communicator they are GPU time (the buckets'
  /// spans on the side stream; the compute stream's stall in finish() as exposed), counted once
  /// their events have completed - up to a step behind.
  data_parallel_stats stats() const {
    std::lock_guard lk(core_->mu);
    data_parallel_stats s = core_->stats;
    s.bytes_sent = core_->compression.bytes_sent();
    return s;
  }
  /// The policy with its error-feedback state (state()/load_state() for snapshots); touch it
  /// between steps only.
  Compression& compression() noexcept { return core_->compression; }
  const Compression& compression() const noexcept { return core_->compression; }
  const dist::bucket_plan& buckets() const noexcept { return core_->layout; }
  /// Bucket b's flat buffer: every gradient of the bucket is a view into it after a synced step.
  const tensor_type& bucket_buffer(std::size_t b) const {
    TRAINKIT_CHECK(b < core_->flat.size(), usage_error, "data_parallel::bucket_buffer",
                   "bucket " << b << " of " << core_->flat.size());
    return core_->flat[b];
  }
  const data_parallel_options& options() const noexcept { return core_->opts; }
  int rank() const { return core_->comm.rank(); }
  int size() const { return core_->comm.size(); }

 private:
  using clock = std::chrono::steady_clock;

  // Everything the hooks and the communication thread share; hooks hold it weakly.
  struct core {
    using value_type = T;
    using compression_type = Compression;
    Comm& comm;
    named_parameters params;
    named_buffers buffers;
    data_parallel_options opts;
    Compression compression;
    dist::bucket_plan layout;
    std::vector<tensor_type> flat;  // one buffer per bucket
    std::vector<tensor_type> slot;  // per parameter: its view into its bucket's buffer

    // Step state of the thread that runs backward (hooks and finish()).
    std::vector<bool> ready;
    std::vector<std::size_t> pending;  // per bucket: parameters not ready yet
    std::size_t next_launch = 0;

    // Shared with the communication thread, under mu.
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::size_t> queue;
    std::size_t completed = 0;
    bool stopping = false;
    bool sync = true;
    std::exception_ptr failure;
    data_parallel_stats stats;
    std::thread worker;
    compression::compress_workspace ws;  // used by the communication thread only
    // The device's part (declared last: it is made from, and destroyed before, the rest).
    using device_state = typename device_reduction<Device>::template state<core>;
    std::unique_ptr<device_state> dev;

    core(Comm& c, named_parameters p, named_buffers b, data_parallel_options o, Compression comp)
        : comm(c), params(std::move(p)), buffers(std::move(b)), opts(o), compression(std::move(comp)) {}
    core(const core&) = delete;
    core& operator=(const core&) = delete;
    ~core() {
      stop();  // also when the constructor of data_parallel failed half-way
      dev.reset();
    }

    // ---- construction -----------------------------------------------------------------------
    static std::uint64_t entry_hash(std::string_view kind, const std::string& name, const shape& s, bool grad) {
      std::uint64_t h = dist::hash_bytes(kind.data(), kind.size());
      h = dist::hash_bytes(name.data(), name.size(), h);
      h = dist::hash_combine(h, s.size());
      for (index_t d : s) h = dist::hash_combine(h, static_cast<std::uint64_t>(d));
      return dist::hash_combine(h, grad ? 1 : 0);
    }
    std::string describe(std::size_t i) const {
      std::ostringstream os;
      if (i < params.size()) {
        const auto& [n, v] = params[i];
        os << "parameter '" << n << "' " << trainkit::to_string(v.sizes()) << (v.requires_grad() ? "" : " (no grad)");
      } else if (i - params.size() < buffers.size()) {
        const auto& [n, t] = buffers[i - params.size()];
        os << "buffer '" << n << "' " << trainkit::to_string(t.sizes());
      } else {
        os << "nothing (the list ends)";
      }
      return os.str();
    }

    // Every rank must hold the same parameters and buffers in the same order, or the buckets (and
    // the broadcasts) would not match and the ranks would deadlock. On a mismatch every rank throws
    // the same dist_error, which names the first entry that differs on each rank.
    void check_same_model() {
      const int w = comm.size();
      std::vector<std::uint64_t> hashes;
      for (const auto& [n, v] : params) hashes.push_back(entry_hash("p", n, v.sizes(), v.requires_grad()));
      for (const auto& [n, t] : buffers) hashes.push_back(entry_hash("b", n, t.sizes(), false));
      // Settings that change which collectives run must agree too.
      std::uint64_t settings = dist::hash_bytes(Compression::name.data(), Compression::name.size());
      settings = dist::hash_combine(settings, static_cast<std::uint64_t>(Compression::block));
      settings = dist::hash_combine(settings, opts.bucket_cap_bytes);
      settings = dist::hash_combine(settings, opts.first_bucket_cap_bytes);
      settings = dist::hash_combine(settings, opts.broadcast_buffers ? 1 : 0);
      settings = dist::hash_combine(settings, sizeof(T));
      dist::check_consistent(comm, settings, "data_parallel: the settings (compression policy, dist::bucket caps, "
                                       "broadcast_buffers, element type)");
      if (w == 1) return;

      std::int64_t count = static_cast<std::int64_t>(hashes.size());
      std::vector<std::int64_t> counts(static_cast<std::size_t>(w));
      comm.allgather(&count, 1, counts.data()).wait();
      std::size_t m = hashes.size();
      bool same_count = true;
      for (auto c : counts) {
        m = std::min(m, static_cast<std::size_t>(c));
        same_count = same_count && c == count;
      }
      std::vector<std::int64_t> mine(m), all(m * static_cast<std::size_t>(w));
      for (std::size_t i = 0; i < m; ++i) mine[i] = static_cast<std::int64_t>(hashes[i]);
      comm.allgather(mine.data(), m, all.data()).wait();
      std::size_t first = m;  // the first index where some rank differs from rank 0
      for (std::size_t i = 0; i < m && first == m; ++i)
        for (int r = 1; r < w; ++r)
          if (all[static_cast<std::size_t>(r) * m + i] != all[i]) {
            first = i;
            break;
          }
      if (first == m && same_count) return;

      // Every rank describes its entry `first` in a fixed-size record, so the report is the same
      // everywhere (and no rank is left waiting in a collective the others skipped).
      constexpr std::size_t rec = 256;
      std::string d = describe(first);
      d.resize(rec - 1, ' ');
      std::vector<std::uint8_t> desc(rec, 0), descs(rec * static_cast<std::size_t>(w));
      std::memcpy(desc.data(), d.data(), d.size());
      comm.allgather(desc.data(), rec, descs.data()).wait();
      std::ostringstream os;
      os << "data_parallel: the ranks hold different models (the gradient buckets would not match): entry #"
         << first << " of the parameter+buffer list is";
      for (int r = 0; r < w; ++r) {
        std::string s(reinterpret_cast<const char*>(descs.data() + static_cast<std::size_t>(r) * rec), rec - 1);
        s.erase(s.find_last_not_of(' ') + 1);
        os << (r ? ";" : "") << " on rank " << r << ": " << s;
      }
      os << ". Entries per rank (parameters then buffers):";
      for (int r = 0; r < w; ++r) os << " rank " << r << ": " << counts[static_cast<std::size_t>(r)];
      throw dist::dist_error(os.str());
    }

    template <class Tensor>
    void broadcast_tensor(Tensor& t) {
      if (t.numel() == 0) return;
      if constexpr (!std::is_same_v<Device, cpu> && !dist::device_buffers<Comm>) {
        // A host communicator and device tensors: through a host copy.
        auto h = t.template to<cpu>();
        comm.broadcast(h.data(), static_cast<std::size_t>(h.numel()), 0).wait();
        copy_(t, h.template to<Device>());
      } else if (t.is_contiguous()) {
        comm.broadcast(t.data(), static_cast<std::size_t>(t.numel()), 0).wait();
      } else {
        auto c = t.contiguous();
        comm.broadcast(c.data(), static_cast<std::size_t>(c.numel()), 0).wait();
        copy_(t, c);
      }
    }
    void broadcast_from_root(bool parameters, bool bufs) {
      if (comm.size() == 1) return;
      if (parameters)
        for (auto& [n, v] : params) broadcast_tensor(v.value());
      if (bufs)
        for (auto& [n, t] : buffers) broadcast_tensor(t);
    }

    void plan() {
      std::vector<index_t> numels;
      std::vector<bool> skip;
      for (const auto& [n, v] : params) {
        numels.push_back(v.numel());
        skip.push_back(!v.requires_grad());
      }
      layout = dist::plan_buckets(numels, sizeof(T), {opts.bucket_cap_bytes, opts.first_bucket_cap_bytes}, skip);
      flat.clear();
      for (const auto& b : layout.buckets) flat.push_back(tensor_type::zeros({b.numel}));
      slot.assign(params.size(), tensor_type());
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (skip[i]) continue;
        const auto& b = layout.buckets[layout.bucket_of[i]];
        const index_t off = b.offsets[layout.slot_of[i]];
        slot[i] = flat[layout.bucket_of[i]].slice(0, off, off + numels[i]).view(params[i].second.sizes());
        // A gradient the parameter already holds becomes its view (the values move into the bucket).
        auto& v = params[i].second;
        if (v.grad().defined()) adopt(i, v.grad());
      }
      ready.assign(params.size(), false);
      dev = std::make_unique<device_state>(*this);
      reset_step();
    }
    // Parameter i's gradient becomes its bucket view, holding g (nothing to copy when g is the view).
    bool is_view(std::size_t i, const tensor_type& g) const {
      return g.defined() && g.data() == slot[i].data() && g.sizes() == slot[i].sizes() &&
             g.strides() == slot[i].strides();
    }
    void adopt(std::size_t i, const tensor_type* g) {
      if (g != nullptr && is_view(i, *g)) return;
      if (g != nullptr && g->defined())
        copy_(slot[i], *g);
      else
        zero_(slot[i]);
      params[i].second.set_grad(slot[i]);
    }
    void adopt(std::size_t i, const tensor_type& g) { adopt(i, &g); }
    void reset_step() {
      std::fill(ready.begin(), ready.end(), false);
      pending.assign(layout.buckets.size(), 0);
      for (std::size_t b = 0; b < layout.buckets.size(); ++b) pending[b] = layout.buckets[b].params.size();
      next_launch = 0;
      std::lock_guard lk(mu);
      completed = 0;
    }

    // ---- the communication thread -------------------------------------------------------------
    void start() {
      if constexpr (device_state::on_thread) worker = std::thread([this] { run(); });
    }
    void stop() {
      {
        std::lock_guard lk(mu);
        stopping = true;
      }
      cv.notify_all();
      if (worker.joinable()) worker.join();
    }
    void run() {
      std::unique_lock lk(mu);
      for (;;) {
        cv.wait(lk, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, nothing left
        const std::size_t b = queue.front();
        queue.pop_front();
        const bool skip = failure != nullptr;  // after a failure the peers are gone: do not wait again
        lk.unlock();
        std::exception_ptr err;
        const auto t0 = clock::now();
        if (!skip) {
          try {
            reduce(b);
          } catch (...) {
            err = std::current_exception();
          }
        }
        const double dt = std::chrono::duration<double>(clock::now() - t0).count();
        lk.lock();
        if (err && !failure) failure = err;
        stats.comm_seconds += dt;
        if (!skip) ++stats.buckets_reduced;
        ++completed;
        cv.notify_all();
      }
    }

    void reduce(std::size_t b) { dev->reduce(*this, b); }
    // The allreduce of bucket b's n values at `data`, host memory, on the communication thread.
    void reduce_host(std::size_t b, T* data, index_t n) {
      if constexpr (std::is_same_v<T, float>) {
        compression::compressed_allreduce(comm, compression, data, n, b, dist::reduce_op::avg, &ws);
      } else {  // double (lossless only): the communicator's own allreduce
        if (n > 0 && comm.size() > 1) comm.allreduce(data, static_cast<std::size_t>(n), dist::reduce_op::avg).wait();
        compression.counter().add(compression::compressed_allreduce_bytes<compression::none>(n, comm.size()) / 4 * sizeof(T));
      }
    }

    // ---- the backward side -----------------------------------------------------------------------
    bool syncing() {
      std::lock_guard lk(mu);
      return sync;
    }
    // Hooks do nothing inside no_sync() and after a failure (finish() reports that one).
    bool collecting() {
      std::lock_guard lk(mu);
      return sync && !failure;
    }
    void launch_ready() {
      std::size_t first = next_launch;
      while (next_launch < pending.size() && pending[next_launch] == 0) ++next_launch;
      if (first == next_launch) return;
      for (std::size_t b = first; b < next_launch; ++b) dev->bucket_ready(*this, b);
      if constexpr (device_state::on_thread) {
        {
          std::lock_guard lk(mu);
          for (std::size_t b = first; b < next_launch; ++b) queue.push_back(b);
        }
        cv.notify_all();
      } else {
        for (std::size_t b = first; b < next_launch; ++b) launch_direct(b);
      }
    }
    // Reduction without the communication thread (cuda with nccl): launched from here, counted as done.
    void launch_direct(std::size_t b) {
      std::exception_ptr err;
      {
        std::lock_guard lk(mu);
        if (failure) err = failure;
      }
      const auto t0 = clock::now();
      if (!err) {
        try {
          dev->launch(*this, b);
        } catch (...) {
          err = std::current_exception();
        }
      }
      std::lock_guard lk(mu);
      if (err && !failure) failure = err;
      if constexpr (!detail::timed_on_device<device_state>) stats.comm_seconds += std::chrono::duration<double>(clock::now() - t0).count();
      if (!err) ++stats.buckets_reduced;
      ++completed;
    }
    void mark_ready(std::size_t i, const tensor_type* g) {
      adopt(i, g);
      ready[i] = true;
      --pending[layout.bucket_of[i]];
    }
    void on_ready(std::size_t i, tensor_type& g) {
      if (!collecting()) return;
      TRAINKIT_CHECK(!ready[i], usage_error, "data_parallel",
                     "the gradient of parameter '"
                         << params[i].first
                         << "' was marked ready twice in one step: call finish() after each synced backward "
                            "(or run the extra backward passes inside no_sync())");
      mark_ready(i, &g);
      if (opts.overlap) launch_ready();
    }

    void require_idle(const char* what) {
      const bool mid_step = std::any_of(ready.begin(), ready.end(), [](bool r) { return r; });
      TRAINKIT_CHECK(!mid_step, usage_error, std::string("data_parallel::") + what,
                     "called between a synced backward and finish()");
    }

    void finish() {
      if (!syncing()) return;
      {
        std::lock_guard lk(mu);
        if (failure) std::rethrow_exception(failure);
      }
      // Parameters whose hook did not fire contribute what they hold (see the top of this file).
      for (std::size_t i = 0; i < params.size(); ++i)
        if (params[i].second.requires_grad() && !ready[i]) mark_ready(i, &params[i].second.grad());
      launch_ready();
      const auto t0 = clock::now();
      std::exception_ptr err;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return completed == layout.buckets.size(); });
        if constexpr (!detail::timed_on_device<device_state>)
          stats.exposed_seconds += std::chrono::duration<double>(clock::now() - t0).count();
        ++stats.steps;
        err = failure;
      }
      if (!err) {
        try {
          dev->finish(*this);  // cuda: the current stream waits for the side stream
        } catch (...) {
          err = std::current_exception();
        }
      }
      reset_step();
      if (err) std::rethrow_exception(err);
      // Every .grad() is its bucket view (mark_ready made it so): the averages are in place.
    }
  };

  std::shared_ptr<core> core_;
};

}  // namespace trainkit::parallel
