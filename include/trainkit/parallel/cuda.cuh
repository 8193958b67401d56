// trainkit/parallel/cuda.cuh - data_parallel<Comm, Compression, T, cuda>: how a full gradient bucket
// is reduced on a GPU (the shared logic is parallel/data_parallel.hpp).
//
// Every bucket has a ready event, recorded on the current (compute) stream right after its last
// gradient was written, and is reduced on the data_parallel's own side stream, which waits on that
// event - backward goes on meanwhile. Two ways, by the communicator:
//   - device buffers (nccl): backward's thread enqueues the bucket's allreduce (compressed ones on
//     the device: compression/quantized_allreduce.cuh, residuals in device memory) on the side stream at
//     once; finish() makes the compute stream wait for the side stream. No host wait anywhere; the
//     collectives' works are checked without blocking at later finish() calls, and one that has not
//     completed within the communicator's timeout is reported as dist_error.
//   - host buffers (mpi, thread_group: a GPU job without NCCL, or ranks sharing a GPU): the
//     communication thread waits for the ready event, copies the bucket to pinned host memory on the
//     side stream, runs the host allreduce (codecs, residuals on the host), and copies the result
//     back on the side stream; finish() waits for the thread, then the compute stream waits for the
//     side stream.
// The flat bucket buffers are allocated on the compute stream and used on the side stream too: the
// caching allocator is told so (record_stream), so their memory is not reused before the side
// stream is done with it.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/backend/cuda/allocator.cuh"
#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/cuda/transfer.cuh"  // pinned_buffer
#include "trainkit/dist/concepts.hpp"
#include "trainkit/compression/quantized_allreduce.cuh"
#include "trainkit/dist/reduce_op.hpp"
#include "trainkit/dist/work.hpp"
#include "trainkit/parallel/data_parallel.hpp"

namespace trainkit::parallel {

template <>
struct device_reduction<cuda> {
  template <class Core>
  struct state {
    using comm_type = std::remove_cvref_t<decltype(std::declval<Core&>().comm)>;
    using value_type = typename Core::value_type;
    /// Host communicators need the communication thread (and pinned staging).
    static constexpr bool on_thread = !dist::device_buffers<comm_type>;
    /// Without the thread, the stats are GPU time: each bucket's span on the side stream, and the
    /// compute stream's stall in finish(), measured with events and collected once they completed.
    static constexpr bool timed_on_device = !on_thread;

    explicit state(Core& c) : device(backend::gpu::current_device()), solo(c.comm.size() == 1), side(true) {
      ready.reserve(c.flat.size());
      for (std::size_t b = 0; b < c.flat.size(); ++b) {
        ready.emplace_back();
        if (c.flat[b].numel() > 0) allocator<cuda>::record_stream(c.flat[b].data(), side.get());
      }
      if constexpr (on_thread) {
        staging.resize(c.flat.size());
      } else if constexpr (std::is_same_v<value_type, float> && Core::compression_type::lossy) {
        residuals = std::make_shared<compression::device_feedback>();
        // Residuals a restored policy brought along move to the device with the first allreduce.
        const auto restored = c.compression.state();
        c.compression.feedback().attach(residuals);
        if (!restored.empty()) c.compression.load_state(restored);
        owner = &c.compression.feedback();
      }
    }
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      // The side stream may still reduce into buffers that are about to be freed: let it finish
      // (a destructor cannot report; errors here are dropped).
      (void)cudaStreamSynchronize(side.get());
      if (owner != nullptr && residuals) {
        // Keep the residuals for snapshots after data_parallel is gone: copy them to the host policy.
        try {
          const auto s = residuals->state();
          owner->attach(nullptr);
          owner->load_state(s);
        } catch (...) {
          owner->attach(nullptr);
        }
      }
    }

    // ---- backward's thread ---------------------------------------------------------------------------
    // World size 1 (solo): the average of one rank is its gradient, so nothing is recorded, issued
    // or waited for - no event, no side stream, no cross-stream dependency in the step (PyTorch's
    // DDP still runs a one-rank allreduce there); only the byte counter counts the call.
    void bucket_ready(Core&, std::size_t b) {
      if (!solo) ready[b].record(backend::gpu::current_stream());
    }

    void launch(Core& c, std::size_t b) {
      if constexpr (!on_thread) {
        if (solo) {
          issue(c, b);  // counts the call; issues nothing at world size 1
          return;
        }
        check_works(c);
        backend::gpu::device_guard dg(device);
        collect(c);
        ready[b].wait(side.get());
        backend::gpu::stream_guard sg(side.get());
        span& t = next_span(false);
        t.begin.record(side.get());
        issue(c, b);
        t.end.record(side.get());
        for (auto& w : ws.works) pending.push_back({std::move(w), std::chrono::steady_clock::now()});
        ws.works.clear();
      } else {
        (void)c;
        (void)b;
      }
    }

    // The reduction of bucket b, on the current stream, its works to ws.works; counts the bytes.
    void issue(Core& c, std::size_t b) {
      auto& flat = c.flat[b];
      if constexpr (std::is_same_v<value_type, float>) {
        compression::device_feedback& fb = residuals ? *residuals : unused_residuals;  // lossless: never touched
        compression::compressed_allreduce_device(c.comm, c.compression, fb, flat.data(), flat.numel(), b,
                                          dist::reduce_op::avg, ws);
      } else {  // double: lossless, the communicator's own allreduce
        const index_t n = flat.numel();
        if (n > 0 && c.comm.size() > 1)
          ws.works.push_back(c.comm.allreduce(flat.data(), static_cast<std::size_t>(n), dist::reduce_op::avg));
        c.compression.counter().add(compression::compressed_allreduce_bytes<compression::none>(n, c.comm.size()) / 4 *
                                    sizeof(value_type));
      }
    }

    void finish(Core& c) {
      if (solo) return;
      backend::gpu::device_guard dg(device);
      const cudaStream_t compute = backend::gpu::current_stream();
      done.record(side.get());
      if constexpr (timed_on_device) {
        span& t = next_span(true);
        t.begin.record(compute);
        done.wait(compute);
        t.end.record(compute);
        check_works(c);
        collect(c);
      } else {
        done.wait(compute);
      }
    }

    // ---- GPU time (timed_on_device) ---------------------------------------------------------------------
    struct span {
      backend::gpu::event begin{true}, end{true};
      bool exposed = false;  // the compute stream's stall in finish(), else a bucket on the side stream
    };
    span& next_span(bool exposed) {
      std::unique_ptr<span> t;
      if (!spare.empty()) {
        t = std::move(spare.back());
        spare.pop_back();
      } else {
        t = std::make_unique<span>();
      }
      t->exposed = exposed;
      spans.push_back(std::move(t));
      return *spans.back();
    }
    /// Adds the spans that have completed to the stats (without waiting for the others).
    void collect(Core& c) {
      while (!spans.empty() && spans.front()->end.query()) {
        const double s = 1e-3 * double(backend::gpu::event::elapsed_ms(spans.front()->begin, spans.front()->end));
        {
          std::lock_guard lk(c.mu);
          (spans.front()->exposed ? c.stats.exposed_seconds : c.stats.comm_seconds) += s;
        }
        spare.push_back(std::move(spans.front()));
        spans.pop_front();
      }
    }

    // ---- the communication thread (host communicators) ------------------------------------------------
    void reduce(Core& c, std::size_t b) {
      if constexpr (on_thread) {
        backend::gpu::device_guard dg(device);
        auto& flat = c.flat[b];
        const index_t n = flat.numel();
        if (n == 0 || c.comm.size() == 1) {
          c.reduce_host(b, nullptr, n);  // counts the call; sends nothing
          return;
        }
        const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(value_type);
        if (staging[b].size() < bytes) staging[b] = backend::gpu::pinned_buffer(bytes);
        auto* host = static_cast<value_type*>(staging[b].data());
        ready[b].wait(side.get());
        backend::gpu::check(cudaMemcpyAsync(host, flat.data(), bytes, cudaMemcpyDeviceToHost, side.get()),
                            "cudaMemcpyAsync (data_parallel: bucket to host)");
        side.synchronize();  // this thread's wait, not the compute stream's
        c.reduce_host(b, host, n);
        backend::gpu::check(cudaMemcpyAsync(flat.data(), host, bytes, cudaMemcpyHostToDevice, side.get()),
                            "cudaMemcpyAsync (data_parallel: bucket to device)");
        // The staging buffer is reused only by the next reduction of this bucket, which comes after
        // finish() ordered the compute stream (and so this copy) before the next backward.
      } else {
        (void)c;
        (void)b;
      }
    }

    // The nccl works issued so far: completed ones are dropped, failed ones throw, and one still
    // running after the communicator's timeout is reported (wait() aborts the communicator).
    void check_works(Core& c) {
      if constexpr (requires { c.comm.timeout(); }) {
        const auto limit = c.comm.timeout();
        while (!pending.empty()) {
          auto& [w, since] = pending.front();
          if (!w.done()) {
            if (std::chrono::steady_clock::now() - since < limit) return;
            w.wait();  // throws dist_error (the timeout has passed)
          }
          w.wait();  // complete: returns, or throws what failed
          pending.pop_front();
        }
      } else {
        while (!pending.empty() && pending.front().first.done()) {
          pending.front().first.wait();
          pending.pop_front();
        }
      }
    }

    int device;
    bool solo;  // world size 1: nothing to reduce
    backend::gpu::stream side;
    backend::gpu::event done;
    std::vector<backend::gpu::event> ready;
    std::vector<backend::gpu::pinned_buffer> staging;
    std::shared_ptr<compression::device_feedback> residuals;
    compression::device_feedback unused_residuals;  // lossless policies keep none
    compression::error_feedback* owner = nullptr;
    compression::device_compress_workspace ws;
    std::deque<std::pair<dist::work, std::chrono::steady_clock::time_point>> pending;
    std::deque<std::unique_ptr<span>> spans;  // recorded, not collected yet
    std::vector<std::unique_ptr<span>> spare;
  };
};

}  // namespace trainkit::parallel
