// tests/cuda/test_ddp.cu - data_parallel on cuda: the device-generic check of
// tests/parallel/dp_generic.hpp (gradients are bucket views, the ranks agree, the result matches
// one process on the whole batch) through the three ways a GPU job reduces - nccl at world size 1,
// and thread_group ranks sharing the GPU through pinned staging (host communicators) - and the
// device quantized allreduce byte for byte against the host one; a late device communicator
// (collectives on their own stream behind a gate) for the ordering and "no host wait" of the
// side-stream path.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cuda/support.cuh"
#include "parallel/dp_generic.hpp"

namespace tk = trainkit;
namespace dist = tk::dist;
namespace compression = tk::compression;
namespace parallel = tk::parallel;
using tk::cpu;
using tk::cuda;
using tk::index_t;
using namespace trainkit_test::dp;

// Ranks that share one GPU (which NCCL refuses) drive the device-buffer paths through thread_group
// staged in pinned memory.
using staged_group = dist::host_staged<dist::thread_group>;

namespace {

void check_results(const std::vector<generic_result>& got, const param_values& ref) {
  for (const auto& g : got) {
    CHECK(g.problem == "");
    CHECK(compare(g.params, ref) == "");
    CHECK(g.params == got[0].params);  // the ranks agree bit for bit
  }
}

}  // namespace

TEST_CASE("data_parallel<cuda>: thread ranks sharing the GPU (pinned staging) match one process", "[cuda][ddp]") {
  tk::gpu::settings().allow_tf32 = false;
  const int steps = 4;
  const index_t b = 3;
  for (int world : {1, 2}) {
    INFO("world " << world);
    const auto ref = generic_reference(world, steps, b);
    std::vector<generic_result> got(static_cast<std::size_t>(world));
    dist::thread_group::run(world, [&](dist::thread_group& comm) {
      tk::gpu::set_device(0);
      got[static_cast<std::size_t>(comm.rank())] =
          generic_shard<cuda>(comm, steps, b, {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40});
    });
    check_results(got, ref);
  }
}

TEST_CASE("data_parallel<cuda>: on device buffers (side stream, no host wait) match one process", "[cuda][ddp]") {
  tk::gpu::settings().allow_tf32 = false;
  const int steps = 4;
  const index_t b = 3;
#if TRAINKIT_HAS_NCCL
  SECTION("nccl, world size 1") {
    const auto ref = generic_reference(1, steps, b);
    std::vector<generic_result> got(1);
    dist::thread_group::run(1, [&](dist::thread_group& boot) {
      dist::nccl comm(boot, 0);
      got[0] = generic_shard<cuda>(comm, steps, b, {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40});
    });
    check_results(got, ref);
  }
#endif
  SECTION("two thread ranks through a device-buffer communicator") {
    const auto ref = generic_reference(2, steps, b);
    std::vector<generic_result> got(2);
    dist::thread_group::run(2, [&](dist::thread_group& tg) {
      tk::gpu::set_device(0);
      staged_group comm(tg);
      got[static_cast<std::size_t>(tg.rank())] =
          generic_shard<cuda>(comm, steps, b, {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40});
    });
    check_results(got, ref);
  }
}

namespace {

// The compressed allreduce of `in` (per rank) on the host and on the device, twice (the second
// call uses the residuals of the first): the results and the residuals, bit for bit.
template <class C>
void compare_allreduce(int world, index_t n) {
  std::vector<std::vector<float>> in(static_cast<std::size_t>(world));
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : in) {
    v.resize(static_cast<std::size_t>(n));
    for (auto& x : v) x = nd(rng) * (rng() % 7 == 0 ? 100.0f : 1.0f);
  }
  std::vector<std::vector<float>> host(world), device(world);
  std::vector<compression::compression_state> host_state(world), device_state(world);
  dist::thread_group::run(world, [&](dist::thread_group& tg) {
    const auto r = static_cast<std::size_t>(tg.rank());
    C c;
    std::vector<float> x = in[r];
    for (int k = 0; k < 2; ++k) compression::compressed_allreduce(tg, c, x.data(), n, 0, dist::reduce_op::avg);
    host[r] = x;
    host_state[r] = c.state();
  });
  dist::thread_group::run(world, [&](dist::thread_group& tg) {
    const auto r = static_cast<std::size_t>(tg.rank());
    tk::gpu::set_device(0);
    tk::gpu::stream s;
    tk::gpu::stream_guard sg(s.get());
    staged_group comm(tg);
    C c;
    auto fb = std::make_shared<compression::device_feedback>();
    c.feedback().attach(fb);
    compression::device_compress_workspace ws;
    auto x = tk::tensor<float>::from_vector(in[r], {n}).template to<cuda>();
    for (int k = 0; k < 2; ++k) compression::compressed_allreduce_device(comm, c, *fb, x.data(), n, 0, dist::reduce_op::avg, ws);
    device[r] = x.template to<cpu>().to_vector();
    device_state[r] = c.state();
  });
  for (int r = 0; r < world; ++r) {
    INFO(C::name << ", world " << world << ", n " << n << ", rank " << r);
    const auto& h = host[static_cast<std::size_t>(r)];
    const auto& d = device[static_cast<std::size_t>(r)];
    REQUIRE(h.size() == d.size());
    CHECK(std::memcmp(h.data(), d.data(), h.size() * sizeof(float)) == 0);
    const auto& hs = host_state[static_cast<std::size_t>(r)];
    const auto& ds = device_state[static_cast<std::size_t>(r)];
    REQUIRE(hs.size() == ds.size());
    for (std::size_t i = 0; i < hs.size(); ++i) {
      CHECK(hs[i].first == ds[i].first);
      const auto a = hs[i].second.to_vector(), bb = ds[i].second.to_vector();
      REQUIRE(a.size() == bb.size());
      CHECK(std::memcmp(a.data(), bb.data(), a.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("the device quantized allreduce sends and returns the host's bytes", "[cuda][ddp][compression]") {
  for (int world : {2, 3}) {
    for (index_t n : {index_t(1), index_t(1000), index_t(70000)}) {
      compare_allreduce<compression::fp16>(world, n);
      compare_allreduce<compression::bf16>(world, n);
      compare_allreduce<compression::int8>(world, n);
      compare_allreduce<compression::sign_1bit>(world, n);
    }
  }
}

TEST_CASE("data_parallel<cuda>: int8 residuals live on the device and round-trip through state()", "[cuda][ddp]") {
  dist::thread_group::run(2, [&](dist::thread_group& tg) {
    tk::gpu::set_device(0);
    staged_group comm(tg);
    generic_shard<cuda, compression::int8>(comm, 2, 3);
  });
  // Resumed policies: load_state before data_parallel moves them to the device and back.
  compression::int8 c;
  compression::compression_state s{{"worker.0", tk::tensor<float>::from_vector({1, 2, 3}, {3})}};
  c.load_state(s);
  auto fb = std::make_shared<compression::device_feedback>();
  c.feedback().attach(fb);
  c.load_state(s);
  const auto back = c.state();
  REQUIRE(back.size() == 1);
  CHECK(back[0].second.to_vector() == std::vector<float>{1, 2, 3});
}

namespace {

// A few steps of data_parallel over `comm`, then teardown in the order asked: data_parallel before
// the model (the gradients - bucket views - are freed after its side stream is gone) or the model
// before data_parallel. Every DDP program crashed at exit in the first order.
template <class Compression, class Comm>
void steps_then_teardown(Comm& comm, bool ddp_first) {
  using dvar = tk::autograd::var<float, cuda>;
  auto m = make_mlp_on<cuda>(7);
  auto ddp = std::make_unique<parallel::data_parallel<Comm, Compression, float, cuda>>(
      comm, *m, parallel::data_parallel_options{.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40});
  for (int s = 0; s < 2; ++s) {
    auto [x, y] = batch(s, 3);
    tk::autograd::mse_loss(m->forward(dvar(x.to<cuda>())), dvar(y.to<cuda>())).backward();
    ddp->finish();
  }
  if (ddp_first) {
    ddp.reset();
    m.reset();
  } else {
    m.reset();
    ddp.reset();
  }
  tk::allocator<cuda>::empty_cache();
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

}  // namespace

TEST_CASE("data_parallel<cuda>: teardown in either order", "[cuda][ddp][teardown]") {
  for (bool ddp_first : {true, false}) {
    INFO((ddp_first ? "data_parallel, then the model" : "the model, then data_parallel"));
    dist::thread_group::run(2, [&](dist::thread_group& tg) {
      tk::gpu::set_device(0);
      staged_group comm(tg);
      steps_then_teardown<compression::none>(comm, ddp_first);
      steps_then_teardown<compression::int8>(comm, ddp_first);
    });
#if TRAINKIT_HAS_NCCL
    dist::thread_group::run(1, [&](dist::thread_group& boot) {
      dist::nccl comm(boot, 0);
      steps_then_teardown<compression::none>(comm, ddp_first);
      steps_then_teardown<compression::int8>(comm, ddp_first);
    });
#endif
  }
}

TEST_CASE("dist::host_staged passes host buffers to its host communicator", "[cuda][ddp]") {
  // data_parallel's model check allgathers host vectors: they were copied as if on the device.
  dist::thread_group::run(2, [&](dist::thread_group& tg) {
    tk::gpu::set_device(0);
    staged_group comm(tg);
    std::vector<std::int64_t> in{tg.rank() + 1, 10}, out(4);
    comm.allgather(in.data(), 2, out.data()).wait();
    REQUIRE(out == std::vector<std::int64_t>{1, 10, 2, 10});
    auto d = tk::tensor<std::int64_t, cuda>::empty({2});
    REQUIRE_THROWS_AS(comm.allgather(d.data(), 2, out.data()), tk::usage_error);  // one of each
  });
}

// Not in an anonymous namespace: nvcc warns of the collectives data_parallel never calls.
namespace late_test {

/// Spins until *gate (mapped pinned memory, written by the host) is nonzero.
__global__ void late_gate_kernel(const volatile int* gate) {
  while (*gate == 0) __nanosleep(1000);
}

template <class T>
struct peer_inputs {
  const T* p[8];
};

template <class T>
__global__ void late_sum_kernel(T* out, peer_inputs<T> in, int w, std::size_t n, T scale) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    T s = in.p[0][i];
    for (int j = 1; j < w; ++j) s += in.p[j][i];
    out[i] = s * scale;
  }
}

void late_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw tk::runtime_failure(std::string("late_device_comm: ") + what + ": " + cudaGetErrorString(e));
}

// A device-buffer communicator whose collectives are really late, the way NCCL's are across
// nodes: each runs on the communicator's own stream after the caller's stream's work, behind a
// gate kernel that spins until the host opens it; the ranks (threads sharing the GPU) read each
// other's staged inputs on the device, ordered by events, and the caller's stream waits for the
// result. Nothing here waits on the host for the device, so a data_parallel step that returns while
// the gate is closed did not wait either. Host buffers (the model check) go to the thread group.
class late_device_comm {
 public:
  late_device_comm(dist::thread_group& tg, const int* device_gate) : tg_(&tg), gate_(device_gate) {
    late_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  late_device_comm(const late_device_comm&) = delete;
  late_device_comm& operator=(const late_device_comm&) = delete;
  // The caller makes sure (a barrier of the group) that no peer still reads this rank's inputs.
  ~late_device_comm() {
    (void)cudaDeviceSynchronize();
    for (void* p : scratch_) (void)cudaFree(p);
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    (void)cudaStreamDestroy(stream_);
  }

  int rank() const { return tg_->rank(); }
  int size() const { return tg_->size(); }
  dist::work barrier() { return tg_->barrier(); }

  template <dist::dist_element T>
  dist::work allreduce(T* data, std::size_t n, dist::reduce_op op) {
    if (!tk::gpu::detail::is_device_memory(data)) return tg_->allreduce(data, n, op);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (op != dist::reduce_op::sum && op != dist::reduce_op::avg)
        throw tk::usage_error("late_device_comm: allreduce takes sum and avg");
      const auto peers = exchange(data, n);
      peer_inputs<T> in{};
      for (int j = 0; j < size(); ++j) in.p[j] = peers[static_cast<std::size_t>(j)];
      if (n > 0) {
        late_sum_kernel<T><<<64, 256, 0, stream_>>>(data, in, size(), n,
                                                    op == dist::reduce_op::avg ? T(1) / T(size()) : T(1));
        late_check(cudaGetLastError(), "late_sum_kernel");
      }
      return complete();
    } else {
      throw tk::usage_error("late_device_comm: device allreduce of float and double only");
    }
  }
  template <dist::dist_element T>
  dist::work broadcast(T* data, std::size_t n, int root) {
    if (!tk::gpu::detail::is_device_memory(data)) return tg_->broadcast(data, n, root);
    const auto peers = exchange(data, n);
    if (rank() != root) copy(data, peers[static_cast<std::size_t>(root)], n);
    return complete();
  }
  template <dist::dist_element T>
  dist::work allgather(const T* in, std::size_t n, T* out) {
    if (!tk::gpu::detail::is_device_memory(in)) return tg_->allgather(in, n, out);
    const auto peers = exchange(in, n);
    for (int j = 0; j < size(); ++j) copy(out + std::size_t(j) * n, peers[static_cast<std::size_t>(j)], n);
    return complete();
  }
  template <dist::dist_element T>
  dist::work alltoall(const T* in, T* out, std::size_t n) {
    if (!tk::gpu::detail::is_device_memory(in)) return tg_->alltoall(in, out, n);
    const auto peers = exchange(in, n * std::size_t(size()));
    for (int j = 0; j < size(); ++j)
      copy(out + std::size_t(j) * n, peers[static_cast<std::size_t>(j)] + std::size_t(rank()) * n, n);
    return complete();
  }
  template <dist::dist_element T>
  dist::work reduce_scatter(const T* in, T* out, std::size_t n, dist::reduce_op op) {
    if (!tk::gpu::detail::is_device_memory(in)) return tg_->reduce_scatter(in, out, n, op);
    throw tk::usage_error("late_device_comm: no device reduce_scatter (data_parallel does not use one)");
  }

 private:
  cudaEvent_t new_event() {
    cudaEvent_t e = nullptr;
    late_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    events_.push_back(e);
    return e;
  }
  template <class T>
  void copy(T* to, const T* from, std::size_t n) {
    if (n > 0) late_check(cudaMemcpyAsync(to, from, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }
  // On this communicator's stream, after the caller's stream's work and the gate: `in` copied to a
  // fresh device block (stream-ordered, no synchronisation); returns every rank's block, each
  // ready on this stream. The blocks live until the communicator does, so no collective overwrites
  // what a slower peer is still reading.
  template <class T>
  std::vector<const T*> exchange(const T* in, std::size_t n) {
    const cudaEvent_t after = new_event();
    late_check(cudaEventRecord(after, tk::gpu::current_stream()), "cudaEventRecord");
    late_check(cudaStreamWaitEvent(stream_, after, 0), "cudaStreamWaitEvent");
    late_gate_kernel<<<1, 1, 0, stream_>>>(gate_);
    late_check(cudaGetLastError(), "late_gate_kernel");
    void* block = nullptr;
    late_check(cudaMallocAsync(&block, std::max<std::size_t>(n, 1) * sizeof(T), stream_), "cudaMallocAsync");
    scratch_.push_back(block);
    copy(static_cast<T*>(block), in, n);
    const cudaEvent_t ready = new_event();
    late_check(cudaEventRecord(ready, stream_), "cudaEventRecord");
    // The host rendezvous (as NCCL's enqueue is one): every rank's block and ready event.
    const std::int64_t mine[2] = {reinterpret_cast<std::int64_t>(block), reinterpret_cast<std::int64_t>(ready)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size()));
    tg_->allgather(mine, 2, all.data()).wait();
    std::vector<const T*> peers;
    for (int j = 0; j < size(); ++j) {
      const auto jj = 2 * static_cast<std::size_t>(j);
      if (j != rank()) late_check(cudaStreamWaitEvent(stream_, reinterpret_cast<cudaEvent_t>(all[jj + 1]), 0),
                                  "cudaStreamWaitEvent (a peer's input)");
      peers.push_back(reinterpret_cast<const T*>(all[jj]));
    }
    return peers;
  }
  // The caller's stream waits for what this collective enqueued; nothing is left for the host.
  dist::work complete() {
    const cudaEvent_t done = new_event();
    late_check(cudaEventRecord(done, stream_), "cudaEventRecord");
    late_check(cudaStreamWaitEvent(tk::gpu::current_stream(), done, 0), "cudaStreamWaitEvent");
    return {};
  }

  dist::thread_group* tg_;
  const int* gate_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> scratch_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace late_test
using late_test::late_device_comm;

namespace trainkit::dist {
template <>
inline constexpr bool device_buffers<late_test::late_device_comm> = true;
}  // namespace trainkit::dist

namespace {

// Rank tg.rank()'s shard of `steps` data_parallel SGD steps over a late_device_comm, batches on the
// device beforehand; the gate is closed for the steps after `open_steps` (by rank 0, between two
// barriers). Returns whether this rank's gated steps returned while the gate was still closed.
template <class Compression>
bool late_shard(dist::thread_group& tg, int* host_gate, const int* device_gate, int steps, int open_steps, index_t b,
                param_values& params) {
  using dvar = tk::autograd::var<float, cuda>;
  tk::gpu::set_device(0);
  const int world = tg.size(), r = tg.rank();
  bool returned_gated = true;
  {
    late_device_comm comm(tg, device_gate);
    auto m = make_mlp_on<cuda>(r == 0 ? 7 : 50 + static_cast<std::uint64_t>(r));
    parallel::data_parallel<late_device_comm, Compression, float, cuda> ddp(
        comm, *m, {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40});
    tk::optim::sgd<float, cuda> opt(m->parameters(), {.lr = lr, .momentum = momentum});
    std::vector<std::pair<tk::tensor<float, cuda>, tk::tensor<float, cuda>>> batches;
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = batch(s, world * b);
      batches.emplace_back(x.slice(0, r * b, (r + 1) * b).contiguous().to<cuda>(),
                           y.slice(0, r * b, (r + 1) * b).contiguous().to<cuda>());
    }
    auto step = [&](int s) {
      opt.zero_grad(s % 2 == 0);
      const auto& [x, y] = batches[static_cast<std::size_t>(s)];
      tk::autograd::mse_loss(m->forward(dvar(x)), dvar(y)).backward();
      ddp.finish();
      opt.step();
    };
    for (int s = 0; s < open_steps; ++s) step(s);  // warm-up: cached blocks, handles
    tk::gpu::synchronize();
    tg.barrier().wait();
    if (r == 0) reinterpret_cast<volatile int*>(host_gate)[0] = 0;
    tg.barrier().wait();
    for (int s = open_steps; s < steps; ++s) step(s);
    returned_gated = reinterpret_cast<volatile int*>(host_gate)[0] == 0;
    tg.barrier().wait();
    if (r == 0) reinterpret_cast<volatile int*>(host_gate)[0] = 1;
    params.clear();
    for (const auto& p : m->parameters()) params.push_back(p.value().to<cpu>().to_vector());
    tg.barrier().wait();  // no peer still reads this rank's staged inputs
  }
  return returned_gated;
}

}  // namespace

TEST_CASE("data_parallel<cuda>: a late device collective (own stream, gated) keeps the order and no host wait",
          "[cuda][ddp][sync]") {
  // Ranks at world size 2 take the side-stream path (world size 1 issues nothing). A step that
  // waited on the host for the device would block behind the closed gate until the watchdog opens
  // it after 20 s, and fail; a step that did not order the optimizer after the collective would
  // differ from one process.
  tk::gpu::settings().allow_tf32 = false;
  const int steps = 6, open_steps = 2;
  const index_t b = 3;
  int* gate = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&gate), sizeof(int), cudaHostAllocMapped) == cudaSuccess);
  reinterpret_cast<volatile int*>(gate)[0] = 1;
  int* dgate = nullptr;
  REQUIRE(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dgate), gate, 0) == cudaSuccess);
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!finished.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    reinterpret_cast<volatile int*>(gate)[0] = 1;
  });
  std::vector<param_values> none(2), int8(2), int8_staged(2);
  std::vector<char> gated_none(2, 0), gated_int8(2, 0);
  dist::thread_group::run(2, [&](dist::thread_group& tg) {
    const auto r = static_cast<std::size_t>(tg.rank());
    gated_none[r] = late_shard<compression::none>(tg, gate, dgate, steps, open_steps, b, none[r]);
    gated_int8[r] = late_shard<compression::int8>(tg, gate, dgate, steps, open_steps, b, int8[r]);
    tk::gpu::set_device(0);
    staged_group comm(tg);
    int8_staged[r] = generic_shard<cuda, compression::int8>(comm, steps, b, {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40}).params;
  });
  finished = true;
  watchdog.join();
  REQUIRE(cudaFreeHost(gate) == cudaSuccess);
  const auto ref = generic_reference(2, steps, b);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(gated_none[r] != 0);
    CHECK(gated_int8[r] != 0);
    CHECK(compare(none[r], ref) == "");
    CHECK(none[r] == none[0]);
    CHECK(int8[r] == int8_staged[r]);  // the late path sends the bytes the staged one does
  }
}
