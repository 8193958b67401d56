// trainkit/dist/nccl.cuh - a communicator over NCCL: one rank per CUDA device, collectives
// on a CUDA stream. CUDA code: include it from a .cu file; link NCCL (-lnccl) and the CUDA runtime.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>  // std::clamp
#include <atomic>
#include <cstring>
#include <chrono>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"  // the current stream collectives are ordered against
#include "trainkit/backend/cuda/transfer.cuh"  // is_device_memory
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/dist/concepts.hpp"
#include "trainkit/dist/detail/collective.hpp"
#include "trainkit/dist/detail/element.hpp"
#include "trainkit/dist/detail/poll.hpp"
#include "trainkit/dist/detail/timeout_env.hpp"
#include "trainkit/dist/local_device.cuh"
#include "trainkit/dist/nccl_fwd.hpp"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"

namespace trainkit::backend::gpu {
/// NCCL statuses become runtime_failure like the CUDA ones (backend/cuda/error.cuh).
inline void check(ncclResult_t r, std::string_view call, const std::string& context = {}) {
  if (r == ncclSuccess) [[likely]]
    return;
  detail::throw_status(call, ncclGetErrorString(r), {}, context);
}
namespace detail {
constexpr bool ok(ncclResult_t r) noexcept { return r == ncclSuccess; }  // TRAINKIT_CUDA_CHECK on NCCL calls
}  // namespace detail
}  // namespace trainkit::backend::gpu

namespace trainkit::dist {

namespace detail {

template <dist_element T>
constexpr ncclDataType_t nccl_datatype() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return ncclFloat64;
  else if constexpr (std::is_same_v<T, half>)
    return ncclFloat16;  // trainkit::half has __half's bits
  else if constexpr (std::is_same_v<T, bfloat16>)
    return ncclBfloat16;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return ncclInt8;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return ncclUint8;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return ncclInt32;
  else
    return ncclInt64;
}
static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2, "16-bit floats must travel as NCCL's 16-bit types");

constexpr ncclRedOp_t nccl_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::avg:
      return ncclAvg;  // integers: sum, then divide (truncating)
    case reduce_op::max:
      return ncclMax;
    case reduce_op::min:
      return ncclMin;
  }
  return ncclSum;
}

// Makes `device` current for a scope and restores the caller's device after it.
class cuda_device_guard {
 public:
  explicit cuda_device_guard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      const cudaError_t e = cudaSetDevice(device);
      TRAINKIT_CHECK(e == cudaSuccess, dist_error, "trainkit::dist::nccl",
                     "cudaSetDevice(" << device << ") failed: " << cudaGetErrorString(e));
      switched_ = true;
    }
  }
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;
  ~cuda_device_guard() {
    if (switched_ && previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// The NCCL communicator, its stream, and what every work of it shares.
struct nccl_state {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  int device = 0;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{30000};
  std::int32_t* barrier_word = nullptr;  // device memory the barrier's 1-element allreduce works on
  cudaEvent_t order = nullptr;           // recorded on the caller's stream, waited on by `stream`
  void* staging = nullptr;               // device copy of host buffers (staged collectives)
  std::size_t staging_bytes = 0;
  void* host_staging = nullptr;          // pinned host copy of them: the copies stay asynchronous
  std::size_t host_staging_bytes = 0;
  std::atomic<bool> broken{false};
  std::mutex m;
  std::string broken_reason;
  /// The bootstrap's liveness probe (mpi::liveness_probe), when it has one: after a timeout it
  /// names the ranks that are gone (NCCL itself cannot tell).
  std::function<std::string(std::chrono::milliseconds)> probe;

  /// After a timeout: who is missing, from the bootstrap's probe ("" without one).
  std::string probe_peers() {
    if (!probe) return {};
    try {
      return "; " + probe(probe_window(timeout));
    } catch (const std::exception& e) {
      return std::string("; the liveness probe failed: ") + e.what();
    }
  }

  nccl_state() = default;
  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;
  ~nccl_state() {
    if (device < 0) return;
    cudaSetDevice(device);  // best effort: a destructor cannot report
    if (comm != nullptr) {
      if (broken)
        ncclCommAbort(comm);  // already aborted, or never usable: frees without waiting
      else
        ncclCommDestroy(comm);
    }
    if (barrier_word != nullptr) cudaFree(barrier_word);
    if (staging != nullptr) cudaFree(staging);
    if (host_staging != nullptr) cudaFreeHost(host_staging);
    if (order != nullptr) cudaEventDestroy(order);
    if (own_stream && stream != nullptr) cudaStreamDestroy(stream);
  }

  std::string last_error() const {
    const char* s = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    return s != nullptr && *s != '\0' ? std::string(" (") + s + ")" : std::string();
  }

  // Aborts the communicator (once): every pending NCCL kernel of it ends, and so does every wait.
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lk(m);
    if (broken.exchange(true)) return;
    broken_reason = reason;
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  }

  std::string reason() {
    std::lock_guard<std::mutex> lk(m);
    return broken_reason;
  }

  // Polls a non-blocking communicator until the call that returned `rc` has been enqueued (or
  // failed); on timeout or error the communicator is aborted and the reason returned ("" = fine).
  std::string settle(ncclResult_t rc, std::string_view call, std::chrono::steady_clock::time_point deadline) {
    while (rc == ncclInProgress) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::ostringstream os;
        os << call << " still in progress after " << timeout.count()
           << " ms (a peer may have died or stalled)" << probe_peers() << "; the NCCL communicator was aborted";
        abort(os.str());
        return os.str();
      }
      std::this_thread::yield();
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &async);
      rc = q != ncclSuccess ? q : async;
    }
    if (rc == ncclSuccess) return {};
    std::string reason = std::string(call) + " failed: " + ncclGetErrorString(rc) + last_error();
    abort(reason);
    return reason;
  }
};

class nccl_work final : public work_state {
 public:
  nccl_work(std::shared_ptr<nccl_state> s, const collective_desc& desc, cudaEvent_t event)
      : s_(std::move(s)), desc_(desc), event_(event) {}
  ~nccl_work() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }

  bool done() override {
    if (state_ == status::pending) poll();
    return state_ != status::pending;
  }

  void wait() override {
    if (state_ == status::pending) {
      const bool settled = poll_until(
          [&] {
            poll();
            return state_ != status::pending;
          },
          s_->timeout);
      if (!settled) {
        std::ostringstream os;
        os << "timed out after " << s_->timeout.count() << " ms waiting for the collective's CUDA event "
           << "(a peer may have died or stalled)" << s_->probe_peers()
           << "; the NCCL communicator was aborted (ncclCommAbort)";
        s_->abort(os.str());
        fail(os.str());
      }
    }
    if (state_ == status::failed) throw dist_error(error_);
  }

  std::string message(std::string_view reason) const {
    return failure_message("nccl", desc_, s_->rank, s_->size, s_->timeout, reason);
  }

 private:
  enum class status { pending, done, failed };

  void poll() {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaSuccess) {
      state_ = status::done;
      return;
    }
    if (e != cudaErrorNotReady) {
      const std::string reason = std::string("cudaEventQuery failed: ") + cudaGetErrorString(e);
      s_->abort(reason);
      fail(reason);
      return;
    }
    if (s_->broken) {
      fail("the communicator failed meanwhile: " + s_->reason());
      return;
    }
    // A peer's failure shows up as an asynchronous NCCL error (e.g. a network error) before any timeout.
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(s_->comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      const std::string reason =
          std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async) + s_->last_error();
      s_->abort(reason);
      fail(reason);
    }
  }

  void fail(const std::string& reason) {
    state_ = status::failed;
    error_ = message(reason);
  }

  std::shared_ptr<nccl_state> s_;
  collective_desc desc_;
  cudaEvent_t event_ = nullptr;
  status state_ = status::pending;
  std::string error_;
};

}  // namespace detail

/// A communicator over NCCL: rank r drives CUDA device `device`; collectives run on one CUDA stream
/// (its own non-blocking stream, or one given), in issue order, ordered against the caller's current
/// stream (backend::gpu::current_stream()) both ways: a collective starts after the work that stream
/// has enqueued so far (it waits on an event of it), and work enqueued there afterwards waits for the
/// collective - so `loss.backward(); comm.allreduce(g, n, avg); opt.step();` needs no wait() and no
/// host synchronisation. work::wait() blocks the host until the collective has completed (and is how
/// a timeout or a peer's failure is noticed). Host buffers are accepted too, for small control
/// messages: they are staged through device memory and the call returns complete.
///
/// Set-up: rank 0 creates the NCCL unique id and broadcasts it over a bootstrap communicator (mpi, or
/// thread_group for one process driving several GPUs); the NCCL communicator is created in NCCL's
/// non-blocking mode so that set-up, too, gives up after the timeout instead of hanging. Failure: a
/// collective whose event has not completed within the timeout, or an NCCL/CUDA error, aborts the NCCL
/// communicator (ncclCommAbort) and throws dist_error; the communicator cannot be used afterwards.
/// barrier() is a 1-element allreduce; alltoall is grouped ncclSend/ncclRecv. NCCL refuses two ranks
/// on one device: that error comes back as dist_error from the constructor.
class nccl {
 public:
  using options = nccl_options;

  /// Collective over `bootstrap` (any communicator: mpi across processes, thread_group within one):
  /// this rank drives CUDA device `device`; `stream` = nullptr: a new non-blocking stream.
  template <communicator Bootstrap>
  nccl(Bootstrap& bootstrap, int device, nccl_options opt = {}, cudaStream_t stream = nullptr)
      : s_(std::make_shared<detail::nccl_state>()) {
    s_->device = -1;  // nothing to clean up until the device is set
    s_->rank = bootstrap.rank();
    s_->size = bootstrap.size();
    s_->timeout = detail::timeout_from_env("trainkit::dist::nccl", opt.timeout);
    if constexpr (requires { bootstrap.liveness_probe(); }) s_->probe = bootstrap.liveness_probe();
    ncclUniqueId id{};
    std::string local_error;
    if (s_->rank == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      if (rc != ncclSuccess) local_error = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(rc);
    }
    // The id travels even when rank 0 failed (all zeros), so that no rank waits for a broadcast that
    // never comes; a second broadcast tells everyone whether rank 0 succeeded.
    std::uint8_t ok = local_error.empty() ? 1 : 0;
    bootstrap.broadcast(&ok, 1, 0).wait();
    bootstrap.broadcast(reinterpret_cast<std::uint8_t*>(&id), sizeof(id), 0).wait();
    TRAINKIT_CHECK(ok == 1, dist_error, "trainkit::dist::nccl",
                   "rank " << s_->rank << ": "
                           << (local_error.empty() ? "rank 0 could not create the NCCL id" : local_error));
    init(id, device, stream);
  }

  /// Collective over `bootstrap`, on the device of this process's local rank (OMPI_COMM_WORLD_LOCAL_RANK,
  /// SLURM_LOCALID, LOCAL_RANK: dist::select_local_device(), which also makes it current).
  template <communicator Bootstrap>
  explicit nccl(Bootstrap& bootstrap, nccl_options opt = {}) : nccl(bootstrap, select_local_device(), opt) {}

  nccl(nccl&&) noexcept = default;
  nccl& operator=(nccl&&) noexcept = default;
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  ~nccl() = default;

  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  [[nodiscard]] int size() const noexcept { return s_->size; }
  [[nodiscard]] int device() const noexcept { return s_->device; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_->stream; }
  [[nodiscard]] ncclComm_t native_handle() const noexcept { return s_->comm; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return s_->timeout; }
  void set_timeout(std::chrono::milliseconds t) {
    TRAINKIT_CHECK(t.count() > 0, usage_error, "nccl::set_timeout",
                   "timeout must be positive, got " << t.count() << " ms");
    s_->timeout = t;
  }
  /// Whether the communicator has been aborted (it cannot be used any more).
  [[nodiscard]] bool broken() const noexcept { return s_->broken; }

  template <dist_element T>
  work allreduce(T* data, std::size_t n, reduce_op op) {
    const auto desc = detail::collective_desc::make<T>(detail::collective_kind::allreduce, n, op);
    if (n == 0) return {};
    return run(desc, "ncclAllReduce", data, n * sizeof(T), data, n * sizeof(T), [&](const void* in, void* out) {
      return ncclAllReduce(in, out, n, detail::nccl_datatype<T>(), detail::nccl_op(op), s_->comm, s_->stream);
    });
  }

  template <dist_element T>
  work broadcast(T* data, std::size_t n, int root) {
    TRAINKIT_CHECK(root >= 0 && root < size(), usage_error, "nccl::broadcast",
                   "root " << root << " is not a rank of a communicator of size " << size());
    const auto desc =
        detail::collective_desc::make<T>(detail::collective_kind::broadcast, n, reduce_op::sum, root);
    if (n == 0) return {};
    return run(desc, "ncclBroadcast", data, n * sizeof(T), data, n * sizeof(T), [&](const void* in, void* out) {
      return ncclBroadcast(in, out, n, detail::nccl_datatype<T>(), root, s_->comm, s_->stream);
    });
  }

  template <dist_element T>
  work allgather(const T* in, std::size_t n, T* out) {
    const auto desc = detail::collective_desc::make<T>(detail::collective_kind::allgather, n);
    if (n == 0) return {};
    const std::size_t w = static_cast<std::size_t>(size());
    return run(desc, "ncclAllGather", in, n * sizeof(T), out, w * n * sizeof(T), [&](const void* i, void* o) {
      return ncclAllGather(i, o, n, detail::nccl_datatype<T>(), s_->comm, s_->stream);
    });
  }

  template <dist_element T>
  work reduce_scatter(const T* in, T* out, std::size_t n_per_rank, reduce_op op) {
    const auto desc =
        detail::collective_desc::make<T>(detail::collective_kind::reduce_scatter, n_per_rank, op);
    if (n_per_rank == 0) return {};
    const std::size_t w = static_cast<std::size_t>(size());
    return run(desc, "ncclReduceScatter", in, w * n_per_rank * sizeof(T), out, n_per_rank * sizeof(T),
               [&](const void* i, void* o) {
                 return ncclReduceScatter(i, o, n_per_rank, detail::nccl_datatype<T>(), detail::nccl_op(op),
                                          s_->comm, s_->stream);
               });
  }

  template <dist_element T>
  work alltoall(const T* in, T* out, std::size_t n_per_rank) {
    const auto desc = detail::collective_desc::make<T>(detail::collective_kind::alltoall, n_per_rank);
    if (n_per_rank == 0) return {};
    const std::size_t bytes = static_cast<std::size_t>(size()) * n_per_rank * sizeof(T);
    return run(desc, "ncclSend/ncclRecv (alltoall)", in, bytes, out, bytes, [&](const void* vi, void* vo) {
      const T* i = static_cast<const T*>(vi);
      T* o = static_cast<T*>(vo);
      ncclResult_t rc = ncclGroupStart();
      for (int peer = 0; peer < size() && rc == ncclSuccess; ++peer) {
        const std::size_t off = static_cast<std::size_t>(peer) * n_per_rank;
        rc = ncclSend(i + off, n_per_rank, detail::nccl_datatype<T>(), peer, s_->comm, s_->stream);
        if (rc == ncclSuccess)
          rc = ncclRecv(o + off, n_per_rank, detail::nccl_datatype<T>(), peer, s_->comm, s_->stream);
      }
      const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after an error
      return rc != ncclSuccess ? rc : end;
    });
  }

  work barrier() {
    return launch(detail::collective_desc{}, "ncclAllReduce (barrier)", [&] {
      return ncclAllReduce(s_->barrier_word, s_->barrier_word, 1, ncclInt32, ncclSum, s_->comm, s_->stream);
    });
  }

  /// Whether p is memory the device can use (device or managed); host buffers are staged.
  static bool on_device(const void* p) { return backend::gpu::detail::is_device_memory(p); }

 private:
  void init(const ncclUniqueId& id, int device, cudaStream_t stream) {
    const auto deadline = std::chrono::steady_clock::now() + s_->timeout;
    detail::cuda_device_guard guard(device);
    s_->device = device;
    auto cuda_check = [&](cudaError_t e, const char* call) {
      TRAINKIT_CHECK(
          e == cudaSuccess, dist_error, "trainkit::dist::nccl",
          call << " failed on rank " << s_->rank << " (device " << device << "): " << cudaGetErrorString(e));
    };
    if (stream == nullptr) {
      cuda_check(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      s_->own_stream = true;
    } else {
      s_->stream = stream;
    }
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&s_->barrier_word), sizeof(std::int32_t)), "cudaMalloc");
    cuda_check(cudaMemset(s_->barrier_word, 0, sizeof(std::int32_t)), "cudaMemset");
    cuda_check(cudaEventCreateWithFlags(&s_->order, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // set-up and every call return at once; we poll, with the timeout
    const ncclResult_t rc = ncclCommInitRankConfig(&s_->comm, s_->size, id, s_->rank, &config);
    const std::string failure = s_->settle(rc, "ncclCommInitRankConfig", deadline);
    if (!failure.empty()) {
      std::ostringstream os;
      os << "trainkit::dist::nccl: set-up on rank " << s_->rank << " of " << s_->size << " (device " << device
         << ", timeout " << s_->timeout.count() << " ms): " << failure;
      throw dist_error(os.str());
    }
  }

  // A collective on buffers in[0, in_bytes) and out[0, out_bytes) (the same for in-place ones).
  // Device buffers: enqueued on stream() after the work the caller's current stream has enqueued
  // so far, and the current stream waits for the collective in turn: no host wait. Host buffers
  // (small control messages: model checks, found_inf): copied through a pinned host buffer and a
  // device buffer, and the call returns complete. Every copy on the stream is from or to pinned
  // memory, so none blocks the host (a pageable copy would wait for the collective, out of reach of
  // the timeout); the host waits on an event after the copy back, polled under the timeout.
  template <class Call>
  work run(const detail::collective_desc& desc, std::string_view name, const void* in, std::size_t in_bytes,
           void* out, std::size_t out_bytes, Call&& call) {
    const bool device_in = on_device(in), device_out = on_device(out);
    if (device_in && device_out) return launch(desc, name, [&] { return call(in, out); });
    TRAINKIT_CHECK(device_in == device_out, usage_error, "trainkit::dist::nccl",
                   name << ": one buffer is in device memory and the other in host memory");
    detail::cuda_device_guard guard(s_->device);
    const bool in_place = in == out;
    const std::size_t need = in_place ? out_bytes : in_bytes + out_bytes;
    auto cuda_check = [&](cudaError_t e, const char* what) {
      if (e == cudaSuccess) return;
      const std::string reason = std::string(what) + " failed (staging a host buffer): " + cudaGetErrorString(e);
      s_->abort(reason);
      throw dist_error(detail::failure_message("nccl", desc, s_->rank, s_->size, s_->timeout, reason));
    };
    // Grows a staging buffer (device: cudaMalloc, host: cudaMallocHost) to `need` bytes.
    auto grow = [&](void*& p, std::size_t& bytes, bool host) {
      if (bytes >= need) return;
      if (p != nullptr) cuda_check(host ? cudaFreeHost(p) : cudaFree(p), host ? "cudaFreeHost" : "cudaFree");
      p = nullptr;
      bytes = 0;
      cuda_check(host ? cudaMallocHost(&p, need) : cudaMalloc(&p, need), host ? "cudaMallocHost" : "cudaMalloc");
      bytes = need;
    };
    grow(s_->staging, s_->staging_bytes, false);
    grow(s_->host_staging, s_->host_staging_bytes, true);
    auto* din = static_cast<std::uint8_t*>(s_->staging);
    auto* dout = in_place ? din : din + in_bytes;
    auto* hin = static_cast<std::uint8_t*>(s_->host_staging);
    auto* hout = in_place ? hin : hin + in_bytes;
    std::memcpy(hin, in, in_bytes);
    cuda_check(cudaMemcpyAsync(din, hin, in_bytes, cudaMemcpyHostToDevice, s_->stream), "cudaMemcpyAsync");
    work w = launch(desc, name, [&] { return call(din, dout); }, false);
    cuda_check(cudaMemcpyAsync(hout, dout, out_bytes, cudaMemcpyDeviceToHost, s_->stream), "cudaMemcpyAsync");
    work done = launch(desc, name, [] { return ncclSuccess; }, false);  // an event after the copy back
    done.wait();  // polled under the timeout: a dead peer aborts the communicator and throws here
    w.wait();
    std::memcpy(out, hout, out_bytes);
    return {};
  }

  template <class Call>
  work launch(const detail::collective_desc& desc, std::string_view name, Call&& call, bool order = true) {
    detail::cuda_device_guard guard(s_->device);
    auto message = [&](std::string_view reason) {
      return detail::failure_message("nccl", desc, s_->rank, s_->size, s_->timeout, reason);
    };
    if (s_->broken) throw dist_error(message("the communicator failed earlier: " + s_->reason()));
    const cudaStream_t caller = backend::gpu::current_stream();
    order = order && caller != s_->stream;
    if (order) {  // the collective starts after what the caller's stream has enqueued so far
      cudaError_t e = cudaEventRecord(s_->order, caller);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(s_->stream, s_->order, 0);
      if (e != cudaSuccess) {
        const std::string reason = std::string("ordering after the current stream failed: ") + cudaGetErrorString(e);
        s_->abort(reason);
        throw dist_error(message(reason));
      }
    }
    const std::string failure = s_->settle(call(), name, std::chrono::steady_clock::now() + s_->timeout);
    if (!failure.empty()) throw dist_error(message(failure));
    cudaEvent_t event = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(event, s_->stream);
    if (e == cudaSuccess && order) e = cudaStreamWaitEvent(caller, event, 0);  // ... and the caller's after it
    if (e != cudaSuccess) {
      if (event != nullptr) cudaEventDestroy(event);
      const std::string reason =
          std::string("recording the completion event failed: ") + cudaGetErrorString(e);
      s_->abort(reason);
      throw dist_error(message(reason));
    }
    return work(std::make_shared<detail::nccl_work>(s_, desc, event));
  }

  std::shared_ptr<detail::nccl_state> s_;
};

template <>
inline constexpr bool device_buffers<nccl> = true;

}  // namespace trainkit::dist
