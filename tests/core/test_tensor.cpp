// Tensors on the CPU: construction, metadata, views, the allocator's accounting and cache, storage.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "trainkit/trainkit.hpp"

#include "ops/ops_util.hpp"  // iota

using namespace trainkit;
using trainkit_test::ops::iota;


TEST_CASE("tensor construction and metadata", "[tensor]") {
  auto z = tensor<float>::zeros({2, 3});
  REQUIRE(z.sizes() == shape{2, 3});
  REQUIRE(z.strides() == shape{3, 1});
  REQUIRE(z.numel() == 6);
  REQUIRE(z.is_contiguous());
  for (float v : z.to_vector()) REQUIRE(v == 0.f);
  auto o = tensor<int>::full({4}, 7);
  for (int v : o.to_vector()) REQUIRE(v == 7);
  REQUIRE(tensor<float>::scalar(2.5f).item() == 2.5f);
  REQUIRE_FALSE(tensor<float>().defined());
  auto e = tensor<float>::zeros({0, 5});
  REQUIRE(e.numel() == 0);
  REQUIRE(e.defined());
  REQUIRE_THROWS_AS(tensor<float>::from_vector({1, 2, 3}, {2, 2}), shape_error);
  REQUIRE_THROWS_WITH(tensor<float>::from_vector({1, 2, 3}, {2, 2}), Catch::Contains("[2, 2]"));
}

TEST_CASE("views share storage and index correctly", "[tensor][views]") {
  auto a = iota({2, 3, 4});
  SECTION("view and reshape") {
    auto v = a.view({6, 4});
    REQUIRE(v.shares_storage_with(a));
    REQUIRE(v.at({5, 3}) == 23);
    REQUIRE(a.view({-1, 2}).sizes() == shape{12, 2});
    REQUIRE_THROWS_AS(a.view({5, 5}), shape_error);
    REQUIRE_THROWS_WITH(a.view({5, 5}), Catch::Contains("24 elements"));
    auto t = a.transpose(0, 2);
    REQUIRE_THROWS_AS(t.view({24}), shape_error);
    auto r = t.reshape({24});  // copies: not contiguous
    REQUIRE_FALSE(r.shares_storage_with(a));
    REQUIRE(r.to_vector()[1] == a.at({1, 0, 0}));
  }
  SECTION("transpose and permute") {
    auto t = a.transpose(0, 2);
    REQUIRE(t.sizes() == shape{4, 3, 2});
    REQUIRE_FALSE(t.is_contiguous());
    REQUIRE(t.at({3, 2, 1}) == a.at({1, 2, 3}));
    auto p = a.permute({2, 0, 1});
    REQUIRE(p.sizes() == shape{4, 2, 3});
    REQUIRE(p.at({1, 1, 2}) == a.at({1, 2, 1}));
    auto c = p.contiguous();
    REQUIRE(c.is_contiguous());
    REQUIRE(c.at({1, 1, 2}) == a.at({1, 2, 1}));
    REQUIRE_THROWS_AS(a.permute({0, 0, 1}), shape_error);
    REQUIRE_THROWS_AS(a.transpose(0, 3), index_error);
  }
  SECTION("slice and select") {
    auto s = a.slice(2, 1, 4, 2);  // columns 1, 3
    REQUIRE(s.sizes() == shape{2, 3, 2});
    REQUIRE(s.at({1, 2, 1}) == a.at({1, 2, 3}));
    auto neg = a.slice(1, -2, 100);
    REQUIRE(neg.sizes() == shape{2, 2, 4});
    REQUIRE(neg.at({0, 0, 0}) == a.at({0, 1, 0}));
    auto sel = a.select(1, 2);
    REQUIRE(sel.sizes() == shape{2, 4});
    REQUIRE(sel.at({1, 3}) == a.at({1, 2, 3}));
    REQUIRE_THROWS_AS(a.select(0, 2), index_error);
  }
  SECTION("expand, squeeze, unsqueeze, flatten") {
    auto b = iota({3, 1});
    auto e = b.expand({2, 3, 4});
    REQUIRE(e.sizes() == shape{2, 3, 4});
    REQUIRE(e.strides()[0] == 0);
    REQUIRE(e.at({1, 2, 3}) == 2);
    REQUIRE_THROWS_AS(b.expand({2, 4, 4}), shape_error);
    REQUIRE(b.squeeze(1).sizes() == shape{3});
    REQUIRE_THROWS_AS(b.squeeze(0), shape_error);
    REQUIRE(b.unsqueeze(0).sizes() == shape{1, 3, 1});
    REQUIRE(a.flatten(1).sizes() == shape{2, 12});
    REQUIRE(a.flatten().sizes() == shape{24});
  }
  SECTION("clone is deep") {
    auto c = a.clone();
    c.at({0, 0, 0}) = 100;
    REQUIRE(a.at({0, 0, 0}) == 0);
  }
}

TEST_CASE("memory accounting counts live bytes and the peak", "[tensor][allocator]") {
  const auto before = allocator<cpu>::stats().allocated;
  allocator<cpu>::reset_peak();
  {
    auto t = tensor<float>::empty({1024});
    REQUIRE(allocator<cpu>::stats().allocated == before + 4096);
    auto v = t.view({32, 32});  // a view allocates nothing
    REQUIRE(allocator<cpu>::stats().allocated == before + 4096);
  }
  REQUIRE(allocator<cpu>::stats().allocated == before);
  REQUIRE(allocator<cpu>::stats().peak >= before + 4096);
}

TEST_CASE("the host allocator keeps freed blocks of 64 KiB and more for the same size", "[tensor][allocator]") {
  using A = allocator<cpu>;
  A::empty_cache();
  const std::size_t big = std::size_t(1) << 20;
  void* a = A::allocate(big);
  A::deallocate(a, big);
  if (A::cached_bytes() == 0) {
    WARN("the host block cache is off here (a sanitizer build, or TRAINKIT_CPU_CACHE_MB=0)");
    return;
  }
  CHECK(A::cached_bytes() == big);
  CHECK(A::stats().reserved == A::stats().allocated + big);
  const auto before = A::stats().allocated;
  void* b = A::allocate(big - 100);  // the same 4 KiB-rounded size: the same block
  CHECK(b == a);
  CHECK(A::cached_bytes() == 0);
  CHECK(A::stats().allocated == before + big - 100);  // what was asked for is what is counted
  reinterpret_cast<unsigned char*>(b)[big - 101] = 1;    // all of it is usable
  A::deallocate(b, big - 100);
  void* small = A::allocate(1000);  // below 64 KiB: straight to operator new and back
  A::deallocate(small, 1000);
  CHECK(A::cached_bytes() == big);
  A::empty_cache();
  CHECK(A::cached_bytes() == 0);
  CHECK(A::stats().reserved == A::stats().allocated);
}

namespace {
int released_calls = 0;
std::size_t released_bytes = 0;
}  // namespace

TEST_CASE("storage adopts memory with its own release function, called once, uncounted", "[tensor][storage]") {
  released_calls = 0;
  const auto before = allocator<cpu>::stats().allocated;
  {
    auto* p = new float[6]{1, 2, 3, 4, 5, 6};
    auto st = std::make_shared<storage<float, cpu>>(p, 6, [](void* q, std::size_t bytes) noexcept {
      delete[] static_cast<float*>(q);
      ++released_calls;
      released_bytes = bytes;
    });
    auto t = tensor<float>::from_storage(st, {2, 3}, {3, 1}, 0);
    st.reset();
    CHECK(allocator<cpu>::stats().allocated == before);  // not the allocator's memory
    auto v = t.transpose(0, 1).contiguous();             // views and copies work as usual
    CHECK(v.to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
    auto u = t;  // shares the storage
    t = tensor<float>();
    CHECK(released_calls == 0);
    CHECK(u.data()[5] == 6.0f);
  }
  CHECK(released_calls == 1);
  CHECK(released_bytes == 6 * sizeof(float));
}
