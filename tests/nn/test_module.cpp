// tests/nn/test_module.cpp - module registration and dotted naming (PyTorch's names and orders),
// state dict round trips and load errors, train/eval propagation, zero_grad, weight tying.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "optim/matchers.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using tk_test::what_contains;

namespace {

/// The model of the torch snippet below, whose key lists the tests compare with:
///   class Block(nn.Module):
///     def __init__(self):
///       super().__init__()
///       self.scale = nn.Parameter(torch.ones(3))
///       self.register_buffer("counter", torch.zeros(1))
///       self.register_buffer("cache", torch.zeros(2), persistent=False)
///       self.features = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU())
///       self.head = nn.Linear(4, 3)
class block : public nn::module<float> {
 public:
  explicit block(generator& gen = default_generator()) {
    scale = &register_parameter("scale", tensor<float>::ones({3}));
    register_buffer("counter", tensor<float>::zeros({1}));
    register_buffer("cache", tensor<float>::zeros({2}), /*persistent=*/false);
    features = register_module(
        "features", nn::make_sequential(
                        std::make_shared<nn::conv2d<float>>(1, 2, 3, nn::conv2d_options{}, gen),
                        std::make_shared<nn::batch_norm2d<float>>(2), std::make_shared<nn::relu<float>>()));
    head = register_module("head", std::make_shared<nn::linear<float>>(4, 3, true, gen));
  }
  std::string_view type_name() const override { return "block"; }
  var_type forward(const var_type& x) override {
    return head->forward(autograd::flatten(features->forward(x), 1)) * *scale;
  }
  var_type* scale;
  std::shared_ptr<nn::sequential<float>> features;
  std::shared_ptr<nn::linear<float>> head;
};

template <class P>
std::vector<std::string> names(const P& pairs) {
  std::vector<std::string> r;
  for (const auto& [n, v] : pairs) r.push_back(n);
  return r;
}

}  // namespace

TEST_CASE("names and orders are PyTorch's", "[nn][module]") {
  block b;
  CHECK(names(b.state_dict()) ==
        std::vector<std::string>{"scale", "counter", "features.0.weight", "features.0.bias",
                                 "features.1.weight", "features.1.bias", "features.1.running_mean",
                                 "features.1.running_var", "features.1.num_batches_tracked", "head.weight",
                                 "head.bias"});
  CHECK(names(b.named_parameters()) ==
        std::vector<std::string>{"scale", "features.0.weight", "features.0.bias", "features.1.weight",
                                 "features.1.bias", "head.weight", "head.bias"});
  CHECK(names(b.named_buffers()) == std::vector<std::string>{"counter", "cache", "features.1.running_mean",
                                                             "features.1.running_var",
                                                             "features.1.num_batches_tracked"});
  CHECK(names(b.named_modules()) ==
        std::vector<std::string>{"", "features", "features.0", "features.1", "features.2", "head"});
  CHECK(names(b.named_children()) == std::vector<std::string>{"features", "head"});
  CHECK(names(b.named_parameters(false)) == std::vector<std::string>{"scale"});

  const auto ps = b.parameters();
  REQUIRE(ps.size() == 7);
  CHECK(ps[0].same(*b.scale));
  CHECK(ps[5].same(b.head->weight()));
  for (const auto& p : ps) CHECK(p.requires_grad());
  CHECK(b.num_parameters() == 3 + 2 * 9 + 2 + 2 + 2 + 12 + 3);
}

TEST_CASE("dotted lookups", "[nn][module]") {
  block b;
  CHECK(b.submodule("features.1")->type_name() == "batch_norm2d");
  CHECK(b.submodule("head").get() == b.head.get());
  CHECK(b.parameter("features.0.weight").sizes() == shape{2, 1, 3, 3});
  CHECK(b.parameter("features.0.weight").same(b.features->named_parameters()[0].second));
  CHECK(b.buffer("features.1.running_var").to_vector() == std::vector<float>{1.0f, 1.0f});
  CHECK_THROWS_MATCHES(b.submodule("features.7"), usage_error, what_contains({"no child named '7'"}));
  CHECK_THROWS_MATCHES(b.parameter("head.gamma"), usage_error, what_contains({"head.gamma"}));
  CHECK_THROWS_MATCHES(b.buffer("nothing"), usage_error, what_contains({"nothing"}));
}

TEST_CASE("registration checks names", "[nn][module]") {
  nn::module<float> m;
  m.register_parameter("w", tensor<float>::zeros({2}));
  CHECK_THROWS_MATCHES(m.register_parameter("w", tensor<float>::zeros({2})), usage_error,
                       what_contains({"'w'"}));
  CHECK_THROWS_MATCHES(m.register_buffer("w", tensor<float>::zeros({2})), usage_error,
                       what_contains({"'w'"}));
  CHECK_THROWS_MATCHES(m.register_module("w", std::make_shared<nn::relu<float>>()), usage_error,
                       what_contains({"'w'"}));
  CHECK_THROWS_MATCHES(m.register_parameter("a.b", tensor<float>::zeros({2})), usage_error,
                       what_contains({"'.'"}));
  CHECK_THROWS_MATCHES(m.register_buffer("", tensor<float>::zeros({2})), usage_error,
                       what_contains({"empty"}));
  CHECK_THROWS_MATCHES(m.register_module("c", std::shared_ptr<nn::relu<float>>()), usage_error,
                       what_contains({"null"}));
  CHECK_THROWS_MATCHES(m.forward(var<float>(tensor<float>::zeros({1}))), usage_error,
                       what_contains({"no single-input forward"}));
  CHECK_FALSE(m.register_parameter("frozen", tensor<float>::zeros({1}), false).requires_grad());
}

TEST_CASE("state dict tensors alias the module; load_state_dict copies in place", "[nn][module]") {
  generator g1(1), g2(2);
  block a(g1), b(g2);
  const auto sa = a.state_dict();
  CHECK(sa[2].second.shares_storage_with(a.parameter("features.0.weight").value()));
  CHECK(b.state_dict()[2].second.to_vector() != sa[2].second.to_vector());

  const var<float> w_before = b.parameter("features.0.weight");
  const auto res = b.load_state_dict(sa);
  CHECK(res.missing_keys.empty());
  CHECK(res.unexpected_keys.empty());
  const auto sb = b.state_dict();
  REQUIRE(sb.size() == sa.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(sb[i].second.to_vector() == sa[i].second.to_vector());
    CHECK_FALSE(sb[i].second.shares_storage_with(sa[i].second));
  }
  // The same var (an optimizer holding it sees the loaded values).
  CHECK(b.parameter("features.0.weight").same(w_before));
  CHECK(w_before.value().to_vector() == a.parameter("features.0.weight").value().to_vector());

  // Loading a module's own state dict is a no-op, and clone_state_dict makes a real snapshot.
  auto snapshot = nn::clone_state_dict(sa);
  a.load_state_dict(a.state_dict());
  fill_(a.parameter("scale").value(), 5.0f);
  CHECK(snapshot[0].second.to_vector() == std::vector<float>{1, 1, 1});
  a.load_state_dict(snapshot);
  CHECK(a.parameter("scale").value().to_vector() == std::vector<float>{1, 1, 1});
}

TEST_CASE("load_state_dict errors name the keys and shapes, and change nothing", "[nn][module]") {
  block b;
  const auto before = nn::clone_state_dict(b.state_dict());
  auto unchanged = [&] {
    const auto now = b.state_dict();
    for (std::size_t i = 0; i < now.size(); ++i)
      CHECK(now[i].second.to_vector() == before[i].second.to_vector());
  };
  generator g(9);
  block other(g);
  SECTION("shape mismatch") {
    auto sd = nn::clone_state_dict(other.state_dict());
    sd[9].second = tensor<float>::zeros({3, 5});  // head.weight is [3, 4]
    CHECK_THROWS_MATCHES(b.load_state_dict(sd), shape_error,
                         what_contains({"'head.weight'", "[3, 5]", "[3, 4]"}));
    CHECK_THROWS_AS(b.load_state_dict(sd, /*strict=*/false), shape_error);  // as torch: even when not strict
    unchanged();
  }
  SECTION("missing and unexpected keys") {
    auto sd = nn::clone_state_dict(other.state_dict());
    sd.erase(sd.begin() + 6);  // features.1.running_mean
    sd.emplace_back("head.gamma", tensor<float>::zeros({3}));
    sd.emplace_back("extra", tensor<float>::zeros({1}));
    CHECK_THROWS_MATCHES(b.load_state_dict(sd), value_error,
                         what_contains({"block", "missing key(s): 'features.1.running_mean'",
                                        "unexpected key(s): 'head.gamma', 'extra'"}));
    unchanged();
    const auto res = b.load_state_dict(sd, /*strict=*/false);
    CHECK(res.missing_keys == std::vector<std::string>{"features.1.running_mean"});
    CHECK(res.unexpected_keys == std::vector<std::string>{"head.gamma", "extra"});
    CHECK(b.state_dict()[9].second.to_vector() ==
          other.state_dict()[9].second.to_vector());  // the rest loaded
    CHECK(b.buffer("features.1.running_mean").to_vector() == before[6].second.to_vector());
  }
  SECTION("duplicate keys") {
    auto sd = nn::clone_state_dict(other.state_dict());
    sd.push_back(sd[0]);
    CHECK_THROWS_MATCHES(b.load_state_dict(sd), value_error, what_contains({"'scale'", "more than once"}));
    unchanged();
  }
}

TEST_CASE("non-persistent buffers are not in the state dict", "[nn][module]") {
  block b;
  for (const auto& [k, v] : b.state_dict()) CHECK(k != "cache");
  CHECK(b.buffer("cache").numel() == 2);
}

TEST_CASE("train and eval propagate to every descendant", "[nn][module]") {
  block b;
  auto all = [&](bool want) {
    for (const auto& [n, m] : b.named_modules()) {
      INFO(n);
      CHECK(m->is_training() == want);
    }
  };
  all(true);
  b.eval();
  all(false);
  b.train();
  all(true);
  b.features->eval();
  CHECK(b.is_training());
  CHECK_FALSE(b.submodule("features.1")->is_training());
  CHECK(b.head->is_training());
}

TEST_CASE("zero_grad drops or zeroes every gradient", "[nn][module]") {
  block b;
  auto y = b.forward(var<float>(tensor<float>::ones({2, 1, 3, 4})));  // conv: [2, 2, 1, 2] -> 4 features
  autograd::sum(y).backward();
  for (const auto& p : b.parameters()) CHECK(p.grad().defined());
  b.zero_grad(false);
  for (const auto& p : b.parameters()) {
    REQUIRE(p.grad().defined());
    for (float v : p.grad().to_vector()) CHECK(v == 0.0f);
  }
  b.zero_grad();
  for (const auto& p : b.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("a shared parameter is listed once, saved under both names", "[nn][module]") {
  auto enc = std::make_shared<nn::linear<float>>(3, 3);
  auto dec = std::make_shared<nn::module<float>>();
  dec->register_parameter("weight", enc->weight());
  nn::module<float> m;
  m.register_module("enc", enc);
  m.register_module("dec", dec);
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"enc.weight", "enc.bias"});
  CHECK(names(m.state_dict()) == std::vector<std::string>{"enc.weight", "enc.bias", "dec.weight"});
  CHECK_THROWS_AS(dec->register_parameter("other", autograd::mul(enc->weight(), 2.0)),
                  usage_error);  // not a leaf
}

TEST_CASE("sequential names its children 0, 1, ... and chains forward", "[nn][module][sequential]") {
  generator g(3);
  auto l1 = std::make_shared<nn::linear<double>>(2, 3, true, g);
  auto l2 = std::make_shared<nn::linear<double>>(3, 1, false, g);
  nn::sequential<double> s{l1, std::make_shared<nn::relu<double>>(), l2};
  CHECK(s.size() == 3);
  CHECK(names(s.state_dict()) == std::vector<std::string>{"0.weight", "0.bias", "2.weight"});
  CHECK(s[0].get() == l1.get());
  CHECK_THROWS_AS(s[3], index_error);
  var<double> x(tensor<double>::from_vector({1.0, -2.0, 0.5, 3.0}, {2, 2}));
  const auto want = l2->forward(autograd::relu(l1->forward(x))).value().to_vector();
  CHECK(s.forward(x).value().to_vector() == want);
  CHECK(s(x).value().to_vector() == want);
  s.push_back(std::make_shared<nn::tanh<double>>());
  CHECK(names(s.named_children()).back() == "3");
  CHECK_THROWS_AS(s.push_back(nullptr), usage_error);

  nn::sequential<double> with_embedding{std::make_shared<nn::embedding<double>>(4, 2)};
  CHECK_THROWS_MATCHES(with_embedding.forward(x), usage_error, what_contains({"embedding"}));
}
