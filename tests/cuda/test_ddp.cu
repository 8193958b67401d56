// tests/cuda/test_ddp.cu - data_parallel on cuda: the device-generic check of
// tests/parallel/dp_generic.hpp (gradients are bucket views, the ranks agree, the result matches
// one process on the whole batch) through the three ways a GPU job reduces - nccl at world size 1,
// and thread_group ranks sharing the GPU through pinned staging (host communicators) - and the
// device quantized allreduce byte for byte against the host one.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/support.cuh"
#include "parallel/dp_generic.hpp"

namespace tk = trainkit;
namespace dist = tk::dist;
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
  std::vector<dist::compression_state> host_state(world), device_state(world);
  dist::thread_group::run(world, [&](dist::thread_group& tg) {
    const auto r = static_cast<std::size_t>(tg.rank());
    C c;
    std::vector<float> x = in[r];
    for (int k = 0; k < 2; ++k) dist::compressed_allreduce(tg, c, x.data(), n, 0, dist::reduce_op::avg);
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
    auto fb = std::make_shared<dist::device_feedback>();
    c.feedback().attach(fb);
    dist::device_compress_workspace ws;
    auto x = tk::tensor<float>::from_vector(in[r], {n}).template to<cuda>();
    for (int k = 0; k < 2; ++k) dist::compressed_allreduce_device(comm, c, *fb, x.data(), n, 0, dist::reduce_op::avg, ws);
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
      compare_allreduce<dist::fp16>(world, n);
      compare_allreduce<dist::bf16>(world, n);
      compare_allreduce<dist::int8>(world, n);
      compare_allreduce<dist::sign_1bit>(world, n);
    }
  }
}

TEST_CASE("data_parallel<cuda>: int8 residuals live on the device and round-trip through state()", "[cuda][ddp]") {
  dist::thread_group::run(2, [&](dist::thread_group& tg) {
    tk::gpu::set_device(0);
    staged_group comm(tg);
    generic_shard<cuda, dist::int8>(comm, 2, 3);
  });
  // Resumed policies: load_state before data_parallel moves them to the device and back.
  dist::int8 c;
  dist::compression_state s{{"worker.0", tk::tensor<float>::from_vector({1, 2, 3}, {3})}};
  c.load_state(s);
  auto fb = std::make_shared<dist::device_feedback>();
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
      steps_then_teardown<dist::none>(comm, ddp_first);
      steps_then_teardown<dist::int8>(comm, ddp_first);
    });
#if TRAINKIT_HAS_NCCL
    dist::thread_group::run(1, [&](dist::thread_group& boot) {
      dist::nccl comm(boot, 0);
      steps_then_teardown<dist::none>(comm, ddp_first);
      steps_then_teardown<dist::int8>(comm, ddp_first);
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
