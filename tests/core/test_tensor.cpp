// Tensor views, broadcasting elementwise ops, reductions and matmul on the CPU.
#include <catch2/catch.hpp>

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "trainkit/trainkit.hpp"

using namespace trainkit;

namespace {
tensor<double> iota(shape s) {
  std::vector<double> v(static_cast<std::size_t>(numel(s)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(i);
  return tensor<double>::from_vector(v, s);
}
tensor<float> random_f(shape s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(static_cast<std::size_t>(numel(s)));
  for (auto& x : v) x = nd(rng);
  return tensor<float>::from_vector(v, s);
}
}  // namespace

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

TEST_CASE("broadcasting elementwise ops", "[tensor][elementwise]") {
  auto a = iota({2, 3});
  auto b = tensor<double>::from_vector({10, 20, 30}, {3});
  auto c = a + b;
  REQUIRE(c.at({1, 2}) == 5 + 30);
  auto col = tensor<double>::from_vector({1, 2}, {2, 1});
  auto d = a * col;
  REQUIRE(d.at({1, 1}) == 4 * 2);
  REQUIRE((a - 1.0).at({0, 0}) == -1);
  REQUIRE((2.0 / (a + 1.0)).at({0, 1}) == 1);
  REQUIRE(exp(a).at({0, 1}) == Approx(std::exp(1.0)));
  REQUIRE(relu(a - 2.0).at({0, 0}) == 0);
  REQUIRE(sigmoid(tensor<double>::from_vector({-1000, 0, 1000})).to_vector() == std::vector<double>{0, 0.5, 1});
  REQUIRE(gelu(tensor<double>::from_vector({1.0})).item() == Approx(0.8413447460685429));
  // Non-contiguous operands.
  auto t = a.t();  // [3, 2]
  auto s = t + t;
  REQUIRE(s.at({2, 1}) == 2 * a.at({1, 2}));
  // In place with broadcast source.
  auto x = a.clone();
  add_(x, b, 2.0);
  REQUIRE(x.at({1, 0}) == 3 + 20);
  REQUIRE_THROWS_AS(add_(b, a), shape_error);
  REQUIRE_THROWS_AS(a + tensor<double>::zeros({4}), shape_error);
  REQUIRE_THROWS_WITH(a + tensor<double>::zeros({4}), Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
  // Large tensor (parallel path) matches serial math.
  auto big = random_f({300, 257}, 1);
  auto bb = big * big;
  auto v = big.to_vector(), w = bb.to_vector();
  for (std::size_t i = 0; i < v.size(); i += 97) REQUIRE(w[i] == v[i] * v[i]);
  auto bt = big.t() * 2.0;
  REQUIRE(bt.at({256, 299}) == 2 * big.at({299, 256}));
}

TEST_CASE("casts between element types", "[tensor][dtype]") {
  auto a = tensor<float>::from_vector({1.5f, -2.25f, 65504.f, 1e-8f});
  auto h = cast<half>(a);
  auto back = cast<float>(h);
  REQUIRE(back.to_vector()[0] == 1.5f);
  REQUIRE(back.to_vector()[2] == 65504.f);
  // OpenBLAS's cblas.h declares a global ::bfloat16 typedef, so qualify ours.
  auto bf = cast<trainkit::bfloat16>(a);
  REQUIRE(cast<float>(bf).to_vector()[1] == -2.25f);
  auto i = cast<int>(tensor<double>::from_vector({2.7, -1.2}));
  REQUIRE(i.to_vector() == std::vector<int>{2, -1});
  // half arithmetic computes in float and rounds once
  auto hs = h + h;
  REQUIRE(float(hs.to_vector()[0]) == 3.0f);
}

TEST_CASE("reductions", "[tensor][reduce]") {
  auto a = iota({2, 3, 4});
  REQUIRE(sum(a).item() == 276);
  REQUIRE(mean(a).item() == Approx(11.5));
  auto s0 = sum(a, {0});
  REQUIRE(s0.sizes() == shape{3, 4});
  REQUIRE(s0.at({2, 3}) == 11 + 23);
  auto s12 = sum(a, {1, 2}, true);
  REQUIRE(s12.sizes() == shape{2, 1, 1});
  REQUIRE(s12.at({1, 0, 0}) == (12 + 23) * 12 / 2);
  auto sneg = sum(a, {-1});
  REQUIRE(sneg.at({1, 2}) == 20 + 21 + 22 + 23);
  REQUIRE(amax(a, {1}).at({1, 0}) == 20);
  REQUIRE(amin(a).item() == 0);
  // Integers fold from the type's limits (an int has no infinity); NaN wins in floats.
  const auto neg = tensor<std::int64_t>::from_vector({-5, -7, std::numeric_limits<std::int64_t>::max(), -6}, {2, 2});
  REQUIRE(amax(neg, {1}).to_vector() == std::vector<std::int64_t>{-5, std::numeric_limits<std::int64_t>::max()});
  REQUIRE(amin(neg).item() == -7);
  const auto with_nan = tensor<float>::from_vector({1, std::numeric_limits<float>::quiet_NaN(), 3}, {3});
  REQUIRE(std::isnan(amax(with_nan).item()));
  REQUIRE(std::isnan(amin(with_nan).item()));
  auto t = tensor<float>::from_vector({1, 5, 5, 2, 9, 0}, {2, 3});
  REQUIRE(argmax(t, 1).to_vector() == std::vector<std::int64_t>{1, 1});  // first max wins
  REQUIRE(argmax(t, 0).to_vector() == std::vector<std::int64_t>{1, 1, 0});
  REQUIRE(argmin(t, 1).to_vector() == std::vector<std::int64_t>{0, 2});
  auto [mv, mi] = max(t, 1, true);
  REQUIRE(mv.sizes() == shape{2, 1});
  REQUIRE(mi.at({1, 0}) == 1);
  // Reduction over a transposed view.
  auto tt = a.transpose(0, 2);  // [4, 3, 2]
  REQUIRE(sum(tt, {2}).at({3, 1}) == a.at({0, 1, 3}) + a.at({1, 1, 3}));
  // Large single-output reduction (parallel partial sums) is exact for integers in double.
  auto big = iota({1000, 300});
  REQUIRE(sum(big).item() == 299999.0 * 300000.0 / 2);
  REQUIRE(argmax(big.flatten(), 0).item() == 299999);
  // sum_to reverses broadcasting.
  auto g = tensor<double>::ones({2, 3, 4});
  auto r = sum_to(g, {3, 1});
  REQUIRE(r.sizes() == shape{3, 1});
  REQUIRE(r.at({0, 0}) == 8);
  REQUIRE_THROWS_AS(sum(a, {3}), index_error);
  REQUIRE_THROWS_AS(argmax(tensor<float>::zeros({0}), 0), shape_error);
  REQUIRE_THROWS_AS(sum_to(g, {5}), shape_error);
}

TEST_CASE("matmul", "[tensor][linalg]") {
  auto a = random_f({5, 7}, 2), b = random_f({7, 3}, 3);
  auto c = matmul(a, b);
  REQUIRE(c.sizes() == shape{5, 3});
  for (index_t i = 0; i < 5; ++i)
    for (index_t j = 0; j < 3; ++j) {
      double ref = 0;
      for (index_t k = 0; k < 7; ++k) ref += double(a.at({i, k})) * b.at({k, j});
      REQUIRE(c.at({i, j}) == Approx(ref).margin(1e-5));
    }
  SECTION("transposed operands go straight to GEMM") {
    auto at = a.t().contiguous().t();  // same values, column-major layout
    REQUIRE_FALSE(at.is_contiguous());
    auto c2 = matmul(at, b);
    for (index_t i = 0; i < 5; ++i) REQUIRE(c2.at({i, 2}) == Approx(c.at({i, 2})));
    auto sl = random_f({5, 14}, 4).slice(1, 0, 14, 2);  // column stride 2: needs a copy
    auto c3 = matmul(sl, b);
    REQUIRE(c3.sizes() == shape{5, 3});
  }
  SECTION("batched with broadcasting, and vectors") {
    auto x = random_f({2, 1, 5, 7}, 5), y = random_f({3, 7, 4}, 6);
    auto z = matmul(x, y);
    REQUIRE(z.sizes() == shape{2, 3, 5, 4});
    auto ref = matmul(x.select(0, 1).select(0, 0), y.select(0, 2));
    for (index_t i = 0; i < 5; ++i) REQUIRE(z.at({1, 2, i, 3}) == Approx(ref.at({i, 3})));
    auto v = random_f({7}, 7);
    REQUIRE(matmul(a, v).sizes() == shape{5});
    REQUIRE(matmul(v, b).sizes() == shape{3});
    REQUIRE(matmul(v, v).dim() == 0);
    auto x3 = random_f({4, 5, 7}, 8);
    auto folded = matmul(x3, b);
    REQUIRE(folded.sizes() == shape{4, 5, 3});
    REQUIRE(folded.at({3, 4, 2}) == Approx(matmul(x3.select(0, 3), b).at({4, 2})));
  }
  SECTION("matches cblas_sgemm bit for bit") {
    auto p = random_f({64, 96}, 9), q = random_f({96, 80}, 10);
    auto r = matmul(p, q);
    std::vector<float> ref(64 * 80);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 64, 80, 96, 1.f, p.data(), 96, q.data(), 80, 0.f,
                ref.data(), 80);
    REQUIRE(r.to_vector() == ref);
  }
  SECTION("half and double") {
    auto ah = cast<half>(a), bh = cast<half>(b);
    auto ch = cast<float>(matmul(ah, bh));
    for (index_t i = 0; i < 5; ++i) REQUIRE(ch.at({i, 1}) == Approx(c.at({i, 1})).epsilon(2e-2).margin(2e-2));
    auto ad = cast<double>(a), bd = cast<double>(b);
    REQUIRE(cast<float>(matmul(ad, bd)).at({4, 2}) == Approx(c.at({4, 2})).epsilon(1e-5));
  }
  REQUIRE_THROWS_AS(matmul(a, a), shape_error);
  REQUIRE_THROWS_WITH(matmul(a, a), Catch::Contains("[5, 7]"));
  REQUIRE_THROWS_AS(matmul(random_f({2, 5, 7}, 1), random_f({3, 7, 2}, 1)), shape_error);
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
