// The backward engine: accumulation, ordering, hooks, retain_graph, no_grad, errors.
#include <catch2/catch.hpp>

#include <optional>

#include "trainkit/trainkit.hpp"

using namespace trainkit;
using V = autograd::var<double>;
using T = tensor<double>;

TEST_CASE("gradients accumulate over paths and over backward calls", "[autograd]") {
  V x(T::from_vector({1, 2, 3}), true);
  auto y = autograd::sum(x * x + x * 3.0);  // dy/dx = 2x + 3
  y.backward();
  REQUIRE(x.grad().to_vector() == std::vector<double>{5, 7, 9});
  auto z = autograd::sum(x * 2.0);
  z.backward();  // accumulates like PyTorch
  REQUIRE(x.grad().to_vector() == std::vector<double>{7, 9, 11});
  x.zero_grad();
  REQUIRE_FALSE(x.grad().defined());
}

TEST_CASE("a var used twice in one op gets both contributions", "[autograd]") {
  V x(T::from_vector({3}), true);
  auto y = autograd::sum(x * x);
  y.backward();
  REQUIRE(x.grad().item() == 6);
  // the grad must not alias anything: later accumulation must not change other leaves
  V a(T::from_vector({1, 1}), true), b(T::from_vector({1, 1}), true);
  autograd::sum(a + b).backward();
  autograd::sum(a * 5.0).backward();
  REQUIRE(a.grad().to_vector() == std::vector<double>{6, 6});
  REQUIRE(b.grad().to_vector() == std::vector<double>{1, 1});
}

TEST_CASE("backward twice needs retain_graph", "[autograd]") {
  V x(T::from_vector({2}), true);
  auto y = autograd::sum(autograd::exp(x));
  y.backward(T(), true);
  y.backward();
  REQUIRE(x.grad().item() == Approx(2 * std::exp(2.0)));
  REQUIRE_THROWS_AS(y.backward(), usage_error);
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("second time"));
}

TEST_CASE("saved tensors are freed after backward", "[autograd][memory]") {
  const auto base = allocator<cpu>::stats().allocated;
  V x(T::from_vector(std::vector<double>(1000, 1.0)), true);
  {
    // Only the graph holds tanh(2x) and tanh(3x) (saved by tanh and mul).
    auto y = autograd::sum(autograd::tanh(x * 2.0) * autograd::tanh(x * 3.0));
    const auto during = allocator<cpu>::stats().allocated;
    REQUIRE(during >= base + 3 * 8000);
    y.backward();
    // Freed: both saved activations; added: x.grad.
    REQUIRE(allocator<cpu>::stats().allocated <= during - 8000);
  }
  REQUIRE(allocator<cpu>::stats().allocated <= base + 2 * 8000 + 64);  // x and x.grad
}

TEST_CASE("non-scalar outputs need an explicit gradient", "[autograd]") {
  V x(T::from_vector({1, 2}), true);
  auto y = x * 3.0;
  REQUIRE_THROWS_AS(y.backward(), usage_error);
  REQUIRE_THROWS_AS(y.backward(T::ones({3})), shape_error);
  y.backward(T::from_vector({1, 10}));
  REQUIRE(x.grad().to_vector() == std::vector<double>{3, 30});
}

TEST_CASE("no_grad records nothing; detach cuts the graph", "[autograd]") {
  V x(T::from_vector({1, 2}), true);
  {
    no_grad g;
    auto y = x * 2.0;
    REQUIRE_FALSE(y.requires_grad());
    REQUIRE(y.is_leaf());
    {
      autograd::enable_grad e;
      REQUIRE((x * 2.0).requires_grad());
    }
  }
  REQUIRE(autograd::is_grad_enabled());
  auto d = (x * 2.0).detach();
  REQUIRE_FALSE(d.requires_grad());
  auto z = autograd::sum(d * x);
  z.backward();
  REQUIRE(x.grad().to_vector() == std::vector<double>{2, 4});
  V c(T::from_vector({1.0}));
  REQUIRE_THROWS_AS(autograd::sum(c * 2.0).backward(), usage_error);
}

TEST_CASE("leaf hooks see and may replace the gradient; post hooks fire once per backward", "[autograd][hooks]") {
  V w(T::from_vector({1, 2, 3}), true);
  std::vector<double> seen;
  int post_calls = 0;
  w.register_hook([&](const T& g) {
    seen = g.to_vector();
    return g * 2.0;  // doubled
  });
  w.register_post_accumulate_hook([&](T& g) {
    ++post_calls;
    REQUIRE(g.sizes() == shape{3});
  });
  // w is used on two paths; the leaf still receives one summed gradient and fires once.
  auto y = autograd::sum(w * 1.0 + w * 2.0);
  y.backward();
  REQUIRE(seen == std::vector<double>{3, 3, 3});
  REQUIRE(w.grad().to_vector() == std::vector<double>{6, 6, 6});
  REQUIRE(post_calls == 1);
  V nl = w * 2.0;
  REQUIRE_THROWS_AS(nl.register_hook([](const T& g) { return g; }), usage_error);
}

TEST_CASE("retain_grad keeps a non-leaf gradient", "[autograd]") {
  V x(T::from_vector({1, 2}), true);
  auto h = x * 3.0;
  h.retain_grad();
  autograd::sum(h * h).backward();
  REQUIRE(h.grad().to_vector() == std::vector<double>{6, 12});
}

TEST_CASE("deep graphs do not overflow the stack", "[autograd]") {
  // Backward walks the ops without recursion, and so does the teardown of the graph (node::~node),
  // with or without a backward first. Released by recursion, each node's destructor running its
  // successor's, a chain of 20000 overflowed an 8 MiB stack at -O0 under ASan and 300000 at -O2.
#if defined(__SANITIZE_ADDRESS__)
  constexpr int depth = 100000;  // 7 s at -O0 under ASan
#else
  constexpr int depth = 300000;
#endif
  SECTION("a chain, backward, then torn down") {
    V x(T::from_vector({1.0}), true);
    V y = x;
    for (int i = 0; i < depth; ++i) y = y * 1.0;
    autograd::sum(y).backward();
    REQUIRE(x.grad().item() == 1.0);
  }
  SECTION("each op reading the previous result twice (two edges to one node), torn down without a backward") {
    V x(T::from_vector({1.0}), true);
    V y = x;
    for (int i = 0; i < depth; ++i) y = y + y * 0.0;
    REQUIRE(y.value().item() == 1.0);
  }
}

TEST_CASE("a leaf keeps the gradient its consumer made, without a copy", "[autograd][memory]") {
  // PyTorch's AccumulateGrad steals a gradient nobody else holds; so does accumulate_grad. The
  // engine must hand the tensor on as its only owner (node::apply_flow moves it out of the
  // grad_flow): a copy here cost a pass over every parameter's gradient in every step.
  for (const bool mixed : {false, true}) {
    INFO((mixed ? "under mixed_bf16" : "fp32"));
    autograd::var<float> w(tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}), true);
    autograd::var<float> x(tensor<float>::from_vector({1, -1, 2}, {1, 3}));
    const float* arrived = nullptr;
    w.register_hook([&](const tensor<float>& g) {
      arrived = g.data();
      return tensor<float>();  // keep g
    });
    {
      std::optional<amp::autocast<amp::mixed_bf16>> scope;
      if (mixed) scope.emplace();
      autograd::sum(autograd::linear(x, w)).backward();
    }
    REQUIRE(arrived != nullptr);
    CHECK(w.grad().data() == arrived);
  }
}
