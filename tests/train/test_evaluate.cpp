// tests/train/test_evaluate.cpp - train::accuracy and train::count_correct against a hand count:
// a linear classifier with known weights, batch sizes that do and do not divide N, the range
// overload (a vector of batches, a data_loader), the mixed-precision forward, eval mode during the
// evaluation and the previous mode afterwards, and the shape checks.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "trainkit/trainkit.hpp"

using namespace trainkit;
using Catch::Matchers::Contains;

namespace {

constexpr index_t n_samples = 7, n_features = 2, n_classes = 3;

/// logits = [x0, x1, -x0 - x1] (no bias), then a dropout that would scramble them in training mode.
std::shared_ptr<nn::sequential<float>> classifier() {
  auto fc = std::make_shared<nn::linear<float>>(n_features, n_classes);
  const float w[] = {1, 0, 0, 1, -1, -1};  // [3, 2], row-major
  auto wt = fc->weight().value();
  for (int i = 0; i < 6; ++i) wt.data()[i] = w[i];
  auto bt = fc->bias().value();
  fill_(bt, 0.0f);
  return nn::make_sequential(fc, std::make_shared<nn::dropout<float>>(0.9));
}

struct labelled {
  tensor<float> x;           // [7, 2]
  tensor<std::int64_t> y;    // [7]
  std::int64_t correct = 0;  // by hand
};

/// Inputs with clear margins (exact in bfloat16) and labels that are right for some rows only.
labelled data_set() {
  const float xs[n_samples][2] = {{2, 0.5}, {0.25, 3}, {-1, -2}, {1.5, 1}, {-0.5, 0.75}, {4, -1}, {-3, 0.5}};
  const std::int64_t ys[n_samples] = {0, 1, 2, 1, 2, 0, 0};
  labelled d{tensor<float>::empty({n_samples, n_features}), tensor<std::int64_t>::empty({n_samples})};
  for (index_t i = 0; i < n_samples; ++i) {
    d.x.data()[2 * i] = xs[i][0];
    d.x.data()[2 * i + 1] = xs[i][1];
    d.y.data()[i] = ys[i];
    const float logit[3] = {xs[i][0], xs[i][1], -xs[i][0] - xs[i][1]};
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < 3; ++c)
      if (logit[c] > logit[best]) best = c;
    d.correct += best == ys[i];
  }
  return d;
}

}  // namespace

TEST_CASE("accuracy counts the rows classified as labelled, for any batch size", "[train][evaluate]") {
  auto model = classifier();
  const auto d = data_set();
  REQUIRE(d.correct == 4);  // rows 0, 1, 2 and 5: the count the library must reproduce
  for (index_t batch : {1, 2, 3, 7, 1000}) {
    CAPTURE(batch);
    const auto c = train::count_correct(*model, d.x, d.y, train::plain_forward{}, batch);
    REQUIRE(c.correct == d.correct);
    REQUIRE(c.total == n_samples);
    REQUIRE(train::accuracy(*model, d.x, d.y, train::plain_forward{}, batch) == Approx(4.0 / 7.0));
  }
  REQUIRE(train::accuracy(*model, d.x, d.y) == Approx(4.0 / 7.0));
  // Under a mixed-precision forward: the same predictions (the margins are exact in bfloat16).
  REQUIRE(train::count_correct(*model, d.x, d.y, amp::module_forward<amp::mixed_bf16>{}, 3).correct ==
          d.correct);
  // No samples: 0, not a division by zero.
  REQUIRE(train::accuracy(*model, d.x.slice(0, 0, 0), d.y.slice(0, 0, 0)) == 0.0);
}

TEST_CASE("accuracy runs in eval mode without a graph and restores the previous mode", "[train][evaluate]") {
  auto model = classifier();
  const auto d = data_set();
  bool seen_training = true, seen_grad = true;
  struct spy {
    bool* training;
    bool* grad;
    var<float> operator()(nn::sequential<float>& m, const var<float>& x) const {
      *training = m.is_training();
      *grad = autograd::is_grad_enabled();
      return m(x);
    }
  };
  REQUIRE(model->is_training());
  // With dropout(0.9) active most logits would be zeroed; in eval mode the count is exact.
  REQUIRE(train::count_correct(*model, d.x, d.y, spy{&seen_training, &seen_grad}, 3).correct == d.correct);
  REQUIRE_FALSE(seen_training);
  REQUIRE_FALSE(seen_grad);
  REQUIRE(model->is_training());
  REQUIRE((*model)[1]->is_training());  // the children too
  REQUIRE(autograd::is_grad_enabled());

  model->eval();
  REQUIRE(train::count_correct(*model, d.x, d.y).correct == d.correct);
  REQUIRE_FALSE(model->is_training());  // was in eval mode: stays there

  // The mode comes back when the forward throws.
  model->train();
  auto throwing = [](nn::sequential<float>&, const var<float>&) -> var<float> { throw value_error("boom"); };
  REQUIRE_THROWS_AS(train::count_correct(*model, d.x, d.y, throwing), value_error);
  REQUIRE(model->is_training());
  REQUIRE(autograd::is_grad_enabled());
}

TEST_CASE("accuracy over a range of batches: a vector of batches, a data_loader", "[train][evaluate]") {
  auto model = classifier();
  const auto d = data_set();

  std::vector<data::batch<float>> batches;
  for (index_t i = 0; i < n_samples; i += 3) {
    const index_t end = i + 3 < n_samples ? i + 3 : n_samples;
    batches.push_back({d.x.slice(0, i, end).contiguous(), d.y.slice(0, i, end).contiguous()});
  }
  const auto c = train::count_correct(*model, batches);
  REQUIRE(c.correct == d.correct);
  REQUIRE(c.total == n_samples);

  // A shuffling loader with a batch size that does not divide N, and worker threads: the same count.
  data::data_loader loader(data::tensor_dataset(d.x, d.y), data::shuffled_sampler(n_samples, 5),
                           {.batch_size = 3, .num_workers = 2});
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);
    REQUIRE(train::accuracy(*model, loader) == Approx(4.0 / 7.0));
    REQUIRE_FALSE(loader.has_next());  // the pass is consumed
  }
  REQUIRE(train::count_correct(*model, loader).total == 0);  // a finished pass yields nothing
  REQUIRE(model->is_training());
}

TEST_CASE("accuracy checks that inputs and labels go together", "[train][evaluate]") {
  auto model = classifier();
  const auto d = data_set();
  REQUIRE_THROWS_WITH(train::accuracy(*model, d.x, d.y.slice(0, 0, n_samples - 1)),
                      Contains("train::accuracy") && Contains("labels [6]"));
  REQUIRE_THROWS_WITH(train::accuracy(*model, d.x, d.y, train::plain_forward{}, 0),
                      Contains("batch must be >= 1"));
  REQUIRE(model->is_training());
}

TEST_CASE("evaluate gives the accuracy and the mean loss per sample, for any batch size", "[train][evaluate]") {
  auto model = classifier();
  const auto d = data_set();
  // The mean cross entropy by hand, in double: logsumexp(logits) - logits[label] per row.
  double expected = 0;
  for (index_t i = 0; i < n_samples; ++i) {
    const double a = d.x.data()[2 * i], b = d.x.data()[2 * i + 1];
    const double logit[3] = {a, b, -a - b};
    const double lse = std::log(std::exp(logit[0]) + std::exp(logit[1]) + std::exp(logit[2]));
    expected += lse - logit[d.y.data()[i]];
  }
  expected /= double(n_samples);
  auto ce = [](const var<float>& logits, const tensor<std::int64_t>& y) { return autograd::cross_entropy(logits, y); };
  for (index_t batch : {1, 2, 3, 7}) {
    CAPTURE(batch);
    const auto r = train::evaluate(*model, d.x, d.y, ce, train::plain_forward{}, batch);
    CHECK(r.correct == d.correct);
    CHECK(r.total == n_samples);
    CHECK(r.mean_loss() == Approx(expected).epsilon(1e-6));
  }
  model->train();
  const auto r = train::evaluate(*model, d.x, d.y, ce);
  CHECK(model->is_training());  // restored
  CHECK(r.accuracy() == Approx(double(d.correct) / double(n_samples)));
  CHECK(std::isnan(train::eval_result{}.mean_loss()));
  CHECK_THROWS_WITH(train::evaluate(*model, d.x, d.y, [](const var<float>& l, const tensor<std::int64_t>&) { return l; }),
                    Contains("the loss must be one number"));
}
