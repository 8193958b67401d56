// train_step with the no-op policies (fp32, no_scaling, store_all, no_parallel) against the
// hand-written loop it replaces, on the same MLP 784-512-512-10 and batch 128: the same work, so
// the ratio must be 1 within noise. Also train_step reporting to training_metrics (the monitoring
// overhead per step, target <= 1 %). Each variant runs 5 repetitions; the ratios of the medians
// are printed at the end. On a shared machine two step timings differ by more than 1 % from run to
// run, so the monitoring cost is also measured directly: one training_metrics::observe() (what
// train_step adds per step) timed alone, as a share of the step's median time.
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainkit/core/seed.hpp"
#include "trainkit/monitor/monitor.hpp"
#include "trainkit/train/train.hpp"
#include "trainkit/trainkit.hpp"

#include "inputs.hpp"  // random_input, random_labels

namespace {
namespace tk = trainkit;
namespace nn = trainkit::nn;
using tk::index_t;

using bench::random_input;
using bench::random_labels;
std::shared_ptr<nn::sequential<float>> make_mlp() {
  tk::set_seed(1);
  return nn::make_sequential(std::make_shared<nn::linear<>>(784, 512), std::make_shared<nn::relu<>>(),
                             std::make_shared<nn::linear<>>(512, 512), std::make_shared<nn::relu<>>(),
                             std::make_shared<nn::linear<>>(512, 10));
}
const auto x = random_input({128, 784});
const auto y = random_labels(128);

void bm_hand_loop(benchmark::State& st) {
  auto model = make_mlp();
  tk::optim::sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  for (auto _ : st) {
    auto loss = tk::autograd::cross_entropy((*model)(tk::var<float>(x)), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.item());
  }
}

void bm_train_step(benchmark::State& st) {
  auto model = make_mlp();
  tk::optim::sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  tk::train::train_step step(*model, opt);  // fp32, no_scaling, store_all, no_parallel
  for (auto _ : st) {
    auto r = step(x, [&](const tk::var<float>& out) { return tk::autograd::cross_entropy(out, y); });
    benchmark::DoNotOptimize(r.loss);
  }
}

void bm_train_step_metrics(benchmark::State& st) {
  auto model = make_mlp();
  tk::optim::sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  tk::monitor::registry reg;
  tk::monitor::training_metrics metrics(reg);
  tk::train::train_step step(*model, opt, {.metrics = &metrics});
  for (auto _ : st) {
    auto r = step(x, [&](const tk::var<float>& out) { return tk::autograd::cross_entropy(out, y); });
    benchmark::DoNotOptimize(r.loss);
  }
}

void bm_metrics_observe(benchmark::State& st) {
  tk::monitor::registry reg;
  tk::monitor::training_metrics metrics(reg);
  double loss = 2.0;
  for (auto _ : st) {
    metrics.observe({.seconds = 0.004, .samples = 128, .loss = loss, .learning_rate = 0.01, .loss_scale = 1.0});
    loss *= 0.999;
  }
}

/// Console output as usual, and the median real time of each benchmark (in seconds) kept for the ratios.
class median_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs)
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median")
        medians[r.run_name.function_name] = r.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(r.time_unit);
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> medians;
};
}  // namespace

BENCHMARK(bm_hand_loop)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(bm_train_step)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(bm_train_step_metrics)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(bm_metrics_observe)->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  median_reporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  const auto& m = rep.medians;
  if (m.count("bm_hand_loop") && m.count("bm_train_step"))
    std::printf("train_step (no-op policies) / hand-written loop: %.3f (medians)\n",
                m.at("bm_train_step") / m.at("bm_hand_loop"));
  if (m.count("bm_train_step") && m.count("bm_train_step_metrics"))
    std::printf("monitoring overhead per step: %+.2f %%\n",
                100.0 * (m.at("bm_train_step_metrics") / m.at("bm_train_step") - 1.0));
  if (m.count("bm_train_step") && m.count("bm_metrics_observe"))
    std::printf("monitoring cost per step, measured alone: %.3f us = %.4f %% of a step\n",
                m.at("bm_metrics_observe") * 1e6, 100.0 * m.at("bm_metrics_observe") / m.at("bm_train_step"));
  return 0;
}
