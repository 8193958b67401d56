// tests/cuda/test_runtime.cu - the CUDA runtime layer: error reporting, the caching allocator
// (counters, reuse, streams, stress, the out-of-memory path), transfers, streams and events.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/support.cuh"

namespace tk = trainkit;
using tk::cpu;
using tk::cuda;
using tk::index_t;
using alloc = tk::allocator<cuda>;

TEST_CASE("CUDA, cuBLAS, cuDNN and NCCL failures become runtime_failure naming the call", "[cuda][error]") {
  try {
    TRAINKIT_CUDA_CHECK(cudaMemcpy(nullptr, reinterpret_cast<void*>(1), 16, cudaMemcpyDeviceToDevice));
    FAIL("no exception");
  } catch (const tk::runtime_failure& e) {
    const std::string m = e.what();
    INFO(m);
    REQUIRE(m.find("cudaMemcpy") != std::string::npos);
    REQUIRE(m.find("failed") != std::string::npos);
  }
  // The sticky error is cleared: the next call works.
  REQUIRE_NOTHROW(TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize()));
  try {
    TRAINKIT_CUDA_CHECK_CTX(CUBLAS_STATUS_INVALID_VALUE, "gemm of sizes " << tk::to_string(tk::shape{3, 4}));
    FAIL("no exception");
  } catch (const tk::runtime_failure& e) {
    const std::string m = e.what();
    INFO(m);
    REQUIRE(m.find("CUBLAS_STATUS_INVALID_VALUE") != std::string::npos);
    REQUIRE(m.find("[3, 4]") != std::string::npos);
  }
  REQUIRE_THROWS_WITH(tk::gpu::check(CUDNN_STATUS_BAD_PARAM, "cudnnSomething"), Catch::Contains("cudnnSomething"));
#if TRAINKIT_HAS_NCCL  // built with NCCL (trainkit::nccl)
  REQUIRE_THROWS_WITH(tk::gpu::check(ncclInvalidArgument, "ncclAllReduce"), Catch::Contains("ncclAllReduce"));
#endif
}

TEST_CASE("allocator<cuda> counts bytes, caches freed blocks and reuses them", "[cuda][allocator]") {
  alloc::empty_cache();
  const auto before = alloc::stats();
  void* p = alloc::allocate(1000);
  REQUIRE(p != nullptr);
  REQUIRE(tk::gpu::detail::aligned(p, alloc::alignment));
  auto s = alloc::stats();
  REQUIRE(s.allocated == before.allocated + 1000);
  REQUIRE(s.reserved >= before.reserved + alloc::round_size(1000));
  REQUIRE(s.allocations == before.allocations + 1);
  alloc::deallocate(p, 1000);
  REQUIRE(alloc::stats().allocated == before.allocated);
  REQUIRE(alloc::stats().reserved == s.reserved);  // cached, not returned
  void* q = alloc::allocate(900);                  // the same size class
  REQUIRE(q == p);
  alloc::deallocate(q, 900);
  alloc::empty_cache();
  REQUIRE(alloc::stats().reserved == before.reserved);
  REQUIRE(alloc::allocate(0) == nullptr);
}

TEST_CASE("allocator<cuda> size classes waste at most a quarter", "[cuda][allocator]") {
  std::size_t prev = 0;
  CHECK(alloc::round_size(4097) == 5120);  // four classes per power of two: (4096, 8192] in steps of 1024
  CHECK(alloc::round_size(5120) == 5120);
  CHECK(alloc::round_size((std::size_t(1) << 21) + 1) == (std::size_t(1) << 21) + (std::size_t(1) << 18));  // eight above 1 MiB
  for (std::size_t b : {std::size_t(1), std::size_t(512), std::size_t(513), std::size_t(4097), std::size_t(1) << 20,
                        (std::size_t(1) << 20) + 1, std::size_t(123456789)}) {
    const std::size_t r = alloc::round_size(b);
    INFO(b << " -> " << r);
    REQUIRE(r >= b);
    REQUIRE(r % 512 == 0);
    REQUIRE(double(r) <= std::max(512.0, 1.25 * double(b) + 512));
    REQUIRE(r >= prev);
    prev = r;
  }
}

TEST_CASE("allocator<cuda> peak and reset_peak", "[cuda][allocator]") {
  const auto base = alloc::stats().allocated;
  alloc::reset_peak();
  {
    auto a = tk::tensor<float, cuda>::empty({1 << 20});
    auto b = tk::tensor<float, cuda>::empty({1 << 19});
    REQUIRE(alloc::stats().allocated == base + (3u << 20) * 2);
  }
  REQUIRE(alloc::stats().allocated == base);
  REQUIRE(alloc::stats().peak == base + (3u << 20) * 2);
  alloc::reset_peak();
  REQUIRE(alloc::stats().peak == base);
}

TEST_CASE("allocator<cuda> keeps blocks per stream; record_stream delays reuse", "[cuda][allocator][stream]") {
  tk::gpu::stream side;
  void* a = alloc::allocate(4096);
  alloc::deallocate(a, 4096);
  void* b = nullptr;
  {
    tk::gpu::stream_guard g(side.get());
    b = alloc::allocate(4096);  // another stream: not the block just freed on the default stream
  }
  REQUIRE(b != a);
  // A block used by `side` too: after free it is not handed out before side's work is done.
  alloc::record_stream(b, nullptr);
  {
    tk::gpu::stream_guard g(side.get());
    alloc::deallocate(b, 4096);
    side.synchronize();
    tk::gpu::synchronize();
    void* c = alloc::allocate(4096);
    REQUIRE(c == b);  // the events have completed: reusable again
    alloc::deallocate(c, 4096);
  }
  REQUIRE_THROWS_AS(alloc::record_stream(reinterpret_cast<void*>(0x10), side.get()), tk::usage_error);
}

TEST_CASE("allocator<cuda>: a block outlives a stream that used it", "[cuda][allocator][stream]") {
  // data_parallel's buckets (the gradients are views into them) are freed by ~module after its side
  // stream is gone: the free must not record an event on the destroyed stream (it crashed at exit).
  const auto before = alloc::stats();
  void* a = alloc::allocate(1 << 16);  // on the current stream, used by `side` too
  void* cached = nullptr;
  {
    tk::gpu::stream side;
    alloc::record_stream(a, side.get());
    tk::gpu::stream_guard g(side.get());
    cached = alloc::allocate(1 << 12);  // a block of side's own, cached when side goes
    alloc::deallocate(cached, 1 << 12);
  }
  alloc::deallocate(a, 1 << 16);  // side is destroyed: nothing to wait for
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  void* b = alloc::allocate(1 << 16);  // reusable at once on the current stream
  CHECK(b == a);
  alloc::deallocate(b, 1 << 16);
  CHECK(alloc::stats().allocated == before.allocated);
  // side's cached block went back to the driver with side: only the current stream's is cached
  CHECK(alloc::stats().reserved == before.reserved + alloc::round_size(1 << 16));
}

TEST_CASE("allocator<cuda> stress: random sizes from several threads", "[cuda][allocator][stress]") {
  const auto base = alloc::stats().allocated;
  auto work = [](unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> size_log(4, 24), action(0, 2);
    std::vector<std::pair<void*, std::size_t>> live;
    for (int i = 0; i < 3000; ++i) {
      if (action(rng) > 0 || live.empty()) {
        const std::size_t n = std::size_t(1) << size_log(rng);
        const std::size_t bytes = n + std::size_t(rng() % 977);
        void* p = alloc::allocate(bytes);
        TRAINKIT_CUDA_CHECK(cudaMemsetAsync(p, int(seed & 0xff), bytes, tk::gpu::current_stream()));
        live.emplace_back(p, bytes);
      } else {
        const std::size_t k = rng() % live.size();
        alloc::deallocate(live[k].first, live[k].second);
        live[k] = live.back();
        live.pop_back();
      }
      if (live.size() > 64) {
        alloc::deallocate(live.front().first, live.front().second);
        live.erase(live.begin());
      }
    }
    for (auto& [p, b] : live) alloc::deallocate(p, b);
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) threads.emplace_back(work, 100 + t);
  for (auto& t : threads) t.join();
  tk::gpu::synchronize();
  REQUIRE(alloc::stats().allocated == base);
  alloc::empty_cache();
}

TEST_CASE("allocator<cuda> out of memory: a clear error, and the allocator still works", "[cuda][allocator][oom]") {
  const std::size_t huge = std::size_t(1) << 50;  // 1 PiB
  try {
    (void)alloc::allocate(huge);
    FAIL("no exception");
  } catch (const tk::runtime_failure& e) {
    const std::string m = e.what();
    INFO(m);
    REQUIRE(m.find("out of memory") != std::string::npos);
    REQUIRE(m.find("asked for " + std::to_string(huge)) != std::string::npos);
    REQUIRE(m.find("allocated") != std::string::npos);
    REQUIRE(m.find("reserved") != std::string::npos);
  }
  // A tensor too big for the device fails the same way (through storage's allocation).
  REQUIRE_THROWS_WITH((tk::tensor<float, cuda>::empty({index_t(1) << 48})), Catch::Contains("out of memory"));
  auto t = tk::tensor<float, cuda>::ones({1000});
  REQUIRE(double(tk::sum(t).item()) == 1000.0);

  // Under a reserved limit: cached blocks are released to make room, then the limit is an OOM.
  alloc::empty_cache();
  const std::size_t reserved = alloc::stats().reserved;
  alloc::set_reserved_limit(reserved + (std::size_t(64) << 20));
  void* a = alloc::allocate(std::size_t(40) << 20);
  alloc::deallocate(a, std::size_t(40) << 20);        // cached
  void* b = alloc::allocate(std::size_t(50) << 20);   // another class: must free the cached 40 MiB first
  REQUIRE(b != nullptr);
  REQUIRE_THROWS_WITH(alloc::allocate(std::size_t(60) << 20), Catch::Contains("reserved limit"));
  alloc::deallocate(b, std::size_t(50) << 20);
  alloc::set_reserved_limit(0);
  alloc::empty_cache();
}

TEST_CASE("host <-> device transfers: small, large (staged) and odd sizes round-trip", "[cuda][transfer]") {
  std::mt19937 rng(3);
  for (index_t n : {index_t(1), index_t(1000), index_t(65537), index_t(3 * 1024 * 1024 + 7), index_t(5'000'003)}) {
    INFO("n = " << n);
    const auto x = cuda_test::random<float>({n}, rng);
    const auto d = x.to<cuda>();
    REQUIRE(cuda_test::identical(d.to<cpu>(), x));
    // device -> device, then back
    auto e = tk::tensor<float, cuda>::empty({n});
    tk::detail::transfer<cuda, cuda>::copy(e.data(), d.data(), std::size_t(n) * sizeof(float));
    REQUIRE(cuda_test::identical(e, x));
  }
  const auto h = tk::tensor<double>::from_vector({1.5, -2.0, 3.25}, {3});
  REQUIRE(h.to<cuda>().to_vector() == h.to_vector());
  REQUIRE(tk::tensor<double, cuda>::scalar(4.5).item() == 4.5);
  // Non-contiguous sources are made dense first.
  const auto m = cuda_test::random<float>({6, 5}, rng);
  REQUIRE(cuda_test::identical(m.t().to<cuda>(), m.t().contiguous()));
  REQUIRE(cuda_test::identical(m.to<cuda>().t().contiguous().to<cpu>(), m.t().contiguous()));
  tk::gpu::pinned_buffer pb(1 << 20);
  REQUIRE(pb.data() != nullptr);
}

TEST_CASE("a data_loader with pinned_memory hands out page-locked batches with the pageable contents",
          "[cuda][transfer][loader]") {
  std::mt19937 rng(5);
  const auto x = cuda_test::random<float>({40, 3, 4, 4}, rng);
  auto y = tk::tensor<std::int64_t>::empty({40});
  for (index_t i = 0; i < 40; ++i) y.data()[i] = i % 10;
  namespace data = tk::data;
  const data::loader_options o{.batch_size = 16, .num_workers = 2, .seed = 9};
  data::data_loader<data::tensor_dataset, data::distributed_sampler, tk::gpu::pinned_memory> pinned(
      data::tensor_dataset(x, y), data::distributed_sampler(40, {.seed = 3}), o);
  data::data_loader<data::tensor_dataset, data::distributed_sampler> pageable(
      data::tensor_dataset(x, y), data::distributed_sampler(40, {.seed = 3}), o);
  for (int k = 0; k < 3; ++k) {  // 16 + 16 + 8
    const auto a = pinned.next(), b = pageable.next();
    REQUIRE(tk::backend::gpu::detail::is_pinned(a.x.data()));
    REQUIRE(tk::backend::gpu::detail::is_pinned(a.y.data()));
    REQUIRE_FALSE(tk::backend::gpu::detail::is_pinned(b.x.data()));
    REQUIRE(cuda_test::identical(a.x, b.x));
    REQUIRE(a.y.to_vector() == b.y.to_vector());
    // One asynchronous DMA each; the host batch may go at once (cudaFreeHost waits for it).
    const auto dx = a.x.to<cuda>();
    REQUIRE(cuda_test::identical(dx.to<cpu>(), b.x));
  }
}

TEST_CASE("streams and events order work; the current stream is per thread", "[cuda][stream]") {
  REQUIRE(tk::gpu::current_stream() == nullptr);
  tk::gpu::stream s1, s2;
  tk::gpu::event start(true), stop(true), ready;
  auto x = tk::tensor<float, cuda>::empty({1 << 22});
  {
    tk::gpu::stream_guard g(s1.get());
    REQUIRE(tk::gpu::current_stream() == s1.get());
    std::thread other([] { REQUIRE(tk::gpu::current_stream() == nullptr); });
    other.join();
    start.record();
    tk::fill_(x, 2.0f);
    ready.record();
    stop.record();
  }
  REQUIRE(tk::gpu::current_stream() == nullptr);
  ready.wait(s2.get());  // s2 waits for the fill on s1
  auto y = tk::tensor<float, cuda>::empty({1});
  {
    tk::gpu::stream_guard g(s2.get());
    auto r = tk::sum(x);
    tk::copy_(y, r.view({1}));
    s2.synchronize();
  }
  REQUIRE(double(y.item()) == 2.0 * double(1 << 22));
  stop.synchronize();
  REQUIRE(stop.query());
  REQUIRE(tk::gpu::event::elapsed_ms(start, stop) >= 0.0f);
  REQUIRE(s1.query());
  const auto& info = tk::gpu::current_device_info();
  REQUIRE(info.multiprocessors > 0);
  REQUIRE(tk::gpu::device_count() >= 1);
}
