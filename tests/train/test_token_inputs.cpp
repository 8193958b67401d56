// tests/train/test_token_inputs.cpp - int64 token ids through the training stack: train_step on a
// token model (embedding first) equals the hand-written loop bit for bit; recomputation over a
// segmented token model gives the store_all gradients bit for bit; bf16 autocast reaches its
// linears; an id out of range is an index_error naming it, through the step; evaluate and accuracy
// count per token, over tensors and over a data_loader of token windows; a small model learns a
// repeating text.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainkit/trainkit.hpp"

using namespace trainkit;
using Catch::Matchers::Contains;
namespace ag = trainkit::autograd;

namespace token_test {

/// embedding -> linear -> gelu -> linear: logits [B, T, vocab] for ids [B, T].
class tiny_lm : public nn::module<float> {
 public:
  tiny_lm(index_t vocab, index_t dim, std::uint64_t seed) {
    generator g(seed);
    emb_ = register_module("emb", std::make_shared<nn::embedding<float>>(vocab, dim, g));
    hidden_ = register_module("hidden", std::make_shared<nn::linear<float>>(dim, dim, true, g));
    act_ = register_module("act", std::make_shared<nn::gelu<float>>());
    head_ = register_module("head", std::make_shared<nn::linear<float>>(dim, vocab, true, g));
  }
  using nn::module<float>::forward;
  var_type embed(const tensor<std::int64_t>& ids) { return (*emb_)(ids); }
  std::vector<nn::module<float>*> segments() { return {hidden_.get(), act_.get(), head_.get()}; }
  var_type forward(const tensor<std::int64_t>& ids) {
    var_type h = embed(ids);
    for (auto* m : segments()) h = m->forward(h);
    return h;
  }

 private:
  std::shared_ptr<nn::embedding<float>> emb_;
  std::shared_ptr<nn::linear<float>> hidden_, head_;
  std::shared_ptr<nn::gelu<float>> act_;
};
static_assert(train::token_model<tiny_lm>);
static_assert(checkpoint::segmented_token_module<tiny_lm>);

constexpr index_t vocab = 7, dim = 16, batch = 4, context = 6;

/// The next-token loss of logits [B, T, V] against labels [B, T].
ag::var<float> lm_loss(const ag::var<float>& logits, const tensor<std::int64_t>& y) {
  return ag::cross_entropy(ag::reshape(logits, {-1, vocab}), y.reshape({-1}));
}

/// Windows of a repeating sequence 0 1 2 3 4 5 6 0 1 ... (each id predicts the next).
data::token_windows windows() {
  auto t = tensor<std::int64_t>::empty({200});
  for (index_t i = 0; i < 200; ++i) t.data()[i] = (i * 3) % vocab;
  return data::token_windows(t, context);
}

std::vector<data::batch<std::int64_t>> some_batches(int n) {
  const auto w = windows();
  data::data_loader loader(w, data::distributed_sampler(w.size(), {.seed = 5}), {.batch_size = batch});
  loader.set_epoch(0);
  std::vector<data::batch<std::int64_t>> out;
  for (auto& b : loader) {
    if (int(out.size()) == n) break;
    out.push_back(b);
  }
  return out;
}

std::vector<std::vector<float>> params_of(nn::module<float>& m) {
  std::vector<std::vector<float>> out;
  for (auto& p : m.parameters()) out.push_back(p.value().to_vector());
  return out;
}

TEST_CASE("train_step on token ids is the hand-written loop, bit for bit", "[train][tokens]") {
  const auto data = some_batches(5);
  tiny_lm a(vocab, dim, 9), b(vocab, dim, 9);
  optim::adamw<float> opt_a(a.parameters(), {.lr = 1e-2}), opt_b(b.parameters(), {.lr = 1e-2});
  train::train_step step(a, opt_a);
  for (const auto& batch_ : data) {
    const auto r = step(batch_.x, [&](const ag::var<float>& out) { return lm_loss(out, batch_.y); });
    opt_b.zero_grad();
    const auto loss = lm_loss(b.forward(batch_.x), batch_.y);
    loss.backward();
    opt_b.step();
    CHECK(r.loss == Approx(loss.item()).epsilon(0));
  }
  CHECK(params_of(a) == params_of(b));
}

TEST_CASE("train_step on token ids: recomputation gives the store_all gradients bit for bit; bf16 reaches the "
          "linears",
          "[train][tokens][checkpoint]") {
  const auto data = some_batches(1);
  auto grads = [&](auto recompute) {
    tiny_lm m(vocab, dim, 11);
    optim::sgd<float> opt(m.parameters(), {.lr = 0.1});
    train::train_step<tiny_lm, optim::sgd<float>, amp::fp32, amp::no_scaling, decltype(recompute)> step(
        m, opt, {}, {}, recompute);
    step(data[0].x, [&](const ag::var<float>& out) { return lm_loss(out, data[0].y); });
    std::vector<std::vector<float>> g;
    for (auto& p : m.parameters()) g.push_back(p.grad().to_vector());
    return g;
  };
  const auto stored = grads(checkpoint::store_all{});
  CHECK(grads(checkpoint::every_n{1}) == stored);
  CHECK(grads(checkpoint::sqrt_segments{}) == stored);

  tiny_lm m(vocab, dim, 12);
  optim::adamw<float> opt(m.parameters(), {.lr = 1e-2});
  train::train_step<tiny_lm, optim::adamw<float>, amp::mixed_bf16> step(m, opt);
  const auto before = ag::autocast_op_count();
  const auto r = step(data[0].x, [&](const ag::var<float>& out) { return lm_loss(out, data[0].y); });
  CHECK(ag::autocast_op_count() > before);
  CHECK(std::isfinite(r.loss));
}

TEST_CASE("train_step on token ids: an id out of range is an index_error naming it", "[train][tokens]") {
  tiny_lm m(vocab, dim, 13);
  optim::sgd<float> opt(m.parameters(), {.lr = 0.1});
  train::train_step step(m, opt);
  auto x = tensor<std::int64_t>::zeros({2, 3});
  x.data()[4] = vocab;  // one past the table
  const auto y = tensor<std::int64_t>::zeros({2, 3});
  try {
    step(x, [&](const ag::var<float>& out) { return lm_loss(out, y); });
    FAIL("no error");
  } catch (const index_error& e) {
    CHECK_THAT(std::string(e.what()), Contains("embedding") && Contains("7"));
  }
}

TEST_CASE("evaluate and accuracy on token ids count per token, over tensors and a data_loader", "[train][tokens]") {
  tiny_lm m(vocab, dim, 14);
  const auto w = windows();
  data::data_loader loader(w, data::distributed_sampler(w.size(), {.shuffle = false}), {.batch_size = 5});
  // By hand: every window's logits, argmax per token, mean cross-entropy per token.
  double loss_sum = 0;
  std::int64_t correct = 0, tokens = 0;
  {
    ag::no_grad ng;
    for (index_t i = 0; i < w.size(); ++i) {
      auto x = tensor<std::int64_t>::empty({1, context}), y = tensor<std::int64_t>::empty({1, context});
      w.get(i, x.data(), y.data());
      const auto logits = ag::reshape(m.forward(x), {context, vocab});
      loss_sum += double(ag::cross_entropy(logits, y.reshape({context})).item()) * context;
      const auto pred = argmax(logits.value(), 1).to_vector();
      for (index_t t = 0; t < context; ++t) correct += pred[std::size_t(t)] == y.data()[t];
      tokens += context;
    }
  }
  loader.set_epoch(0);
  const auto r = train::evaluate(m, loader, [](const auto& logits, const auto& y) { return ag::cross_entropy(logits, y); });
  CHECK(r.total == tokens);
  CHECK(r.correct == correct);
  CHECK(r.mean_loss() == Approx(loss_sum / double(tokens)).epsilon(1e-5));
  // The tensor overload: x [N, T] int64, y [N, T].
  auto xs = tensor<std::int64_t>::empty({w.size(), context}), ys = tensor<std::int64_t>::empty({w.size(), context});
  for (index_t i = 0; i < w.size(); ++i) w.get(i, xs.data() + i * context, ys.data() + i * context);
  const auto counts = train::count_correct(m, xs, ys, train::plain_forward{}, 7);
  CHECK(counts.total == tokens);
  CHECK(counts.correct == correct);
  CHECK(train::accuracy(m, xs, ys, amp::module_forward<amp::mixed_bf16>{}) >= 0.0);
  // Labels that do not go with the logits are named.
  try {
    train::accuracy(m, xs, ys.slice(1, 0, 3));
    FAIL("no error");
  } catch (const shape_error& e) {
    CHECK_THAT(std::string(e.what()), Contains("logits") && Contains("labels [33, 3]") && Contains("[33, 6, 7]"));
  }
}

TEST_CASE("a token model learns a repeating text through train_step and the loader", "[train][tokens]") {
  tiny_lm m(vocab, dim, 15);
  optim::adamw<float> opt(m.parameters(), {.lr = 3e-2});
  train::train_step step(m, opt);
  const auto w = windows();
  data::data_loader loader(w, data::distributed_sampler(w.size(), {.seed = 1}), {.batch_size = batch});
  for (std::uint64_t e = 0; e < 6; ++e) {
    loader.set_epoch(e);
    for (auto& b : loader) step(b.x, [&](const ag::var<float>& out) { return lm_loss(out, b.y); });
  }
  loader.set_epoch(0);
  const auto r = train::evaluate(m, loader, [](const auto& logits, const auto& y) { return ag::cross_entropy(logits, y); });
  INFO("loss " << r.mean_loss() << " accuracy " << r.accuracy());
  CHECK(r.accuracy() == 1.0);  // each id determines the next
  CHECK(r.mean_loss() < 0.1);
}

}  // namespace token_test
