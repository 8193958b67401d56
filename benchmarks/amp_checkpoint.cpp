// Training steps of one MLP under each precision policy, with and without gradient checkpointing:
// steps/s and peak activation memory side by side, plus ratios against fp32 + store_all measured
// in the same run.
//
// Model: 16 x (Linear(256, 256) + ReLU), batch 256, MSE loss, SGD; the default loss scaler of
// each policy (dynamic scaling for fp16, none for fp32 and bf16). A step is forward, scaled
// backward, unscale + step, update. peak_MiB is the allocator's peak above what parameters and
// gradients hold (gradients are kept allocated and zeroed in place), i.e. activations, saved
// tensors and temporaries. On the CPU bf16/fp16 are not expected to be faster: there is no
// native 16-bit GEMM in Debian's OpenBLAS, so the operands are rounded and widened around sgemm.
//
//   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ./bench_amp_checkpoint
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "trainkit/amp/amp.hpp"
#include "trainkit/checkpoint/checkpoint.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/sequential.hpp"
#include "trainkit/optim/sgd.hpp"
#include "trainkit/trainkit.hpp"

namespace {

using trainkit::index_t;
using fvar = trainkit::autograd::var<float>;
using ftensor = trainkit::tensor<float>;
namespace amp = trainkit::amp;
namespace ckpt = trainkit::checkpoint;

constexpr int blocks = 16;
constexpr index_t width = 256, batch = 256;

/// Peak activation bytes of each configuration, filled by the benchmarks.
std::map<std::string, double>& peaks() {
  static std::map<std::string, double> r;
  return r;
}

/// The console output plus the times of every run, for the table printed at the end.
class table_reporter : public benchmark::ConsoleReporter {
 public:
  struct times {
    double real = 0, cpu = 0;  // seconds per step
  };
  void ReportRuns(const std::vector<Run>& runs) override {
    benchmark::ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.iterations == 0) continue;
      const double n = double(r.iterations);
      times_[r.benchmark_name()] = {r.real_accumulated_time / n, r.cpu_accumulated_time / n};
    }
  }
  const std::map<std::string, times>& all() const { return times_; }

 private:
  std::map<std::string, times> times_;
};

ftensor uniform(const trainkit::shape& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(trainkit::numel(s)));
  for (auto& e : v) e = u(rng);
  return ftensor::from_vector(v, s);
}

template <class P, class R>
void bm_step(benchmark::State& st) {
  trainkit::generator init(1);
  auto net = std::make_shared<trainkit::nn::sequential<float>>();
  for (int i = 0; i < blocks; ++i) {
    net->push_back(std::make_shared<trainkit::nn::linear<float>>(width, width, true, init));
    net->push_back(std::make_shared<trainkit::nn::relu<float>>());
  }
  trainkit::optim::sgd<float> opt(net->parameters(), {.lr = 1e-3});
  amp::default_scaler_t<P> scaler;
  const fvar x(uniform({batch, width}, 2)), target(uniform({batch, width}, 3));

  auto step = [&] {
    auto y = ckpt::apply_recompute(R{}, *net, x, amp::module_forward<P>{});
    auto d = y - target;
    auto loss = trainkit::autograd::mean(d * d);
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad(false);  // keep the gradient buffers: they are not what the peak measures
  };
  step();  // allocates the gradients
  double peak = 0;
  for (auto _ : st) {
    trainkit::allocator<trainkit::cpu>::reset_peak();
    const auto base = trainkit::allocator<trainkit::cpu>::stats().allocated;
    step();
    const double p = double(trainkit::allocator<trainkit::cpu>::stats().peak - base);
    peak = p > peak ? p : peak;
  }
  st.counters["steps/s"] = benchmark::Counter(double(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["peak_MiB"] = peak / (1024.0 * 1024.0);
  peaks()["step/" + std::string(P::name) + "/" + std::string(R::name)] = peak;
}

}  // namespace

BENCHMARK(bm_step<amp::fp32, ckpt::store_all>)->Name("step/fp32/store_all")->Unit(benchmark::kMillisecond);
BENCHMARK(bm_step<amp::mixed_bf16, ckpt::store_all>)
    ->Name("step/bf16/store_all")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_step<amp::mixed_fp16, ckpt::store_all>)
    ->Name("step/fp16/store_all")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_step<amp::fp32, ckpt::sqrt_segments>)->Name("step/fp32/sqrt")->Unit(benchmark::kMillisecond);
BENCHMARK(bm_step<amp::mixed_bf16, ckpt::sqrt_segments>)
    ->Name("step/bf16/sqrt")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_step<amp::mixed_fp16, ckpt::sqrt_segments>)
    ->Name("step/fp16/sqrt")
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  table_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  // The table: each configuration against fp32 + store_all and against its own precision's
  // store_all (the cost of checkpointing). Times are per step; "cpu" is process CPU time, which
  // other load on a shared machine disturbs less than wall time.
  const auto& t = reporter.all();
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("\n%d x (Linear(%ld, %ld) + ReLU), batch %ld\n", blocks, long(width), long(width), long(batch));
  std::printf("%-22s %9s %9s %9s %11s %11s %11s %11s %11s\n", "configuration", "steps/s", "ms(cpu)",
              "peak MiB", "time/fp32", "peak/fp32", "ckpt time", "ckpt cpu", "ckpt peak");
  const std::string base = "step/fp32/store_all";
  for (const auto& [name, tm] : t) {
    const std::string own = name.substr(0, name.rfind('/')) + "/store_all";
    const auto b = t.find(base), o = t.find(own);
    const double peak = peaks()[name];
    std::printf("%-22s %9.2f %9.2f %9.2f %11.3f %11.3f %11.3f %11.3f %11.3f\n", name.c_str(), 1.0 / tm.real,
                1e3 * tm.cpu, peak / (1024.0 * 1024.0), b != t.end() ? ratio(tm.real, b->second.real) : 0.0,
                ratio(peak, peaks()[base]), o != t.end() ? ratio(tm.real, o->second.real) : 0.0,
                o != t.end() ? ratio(tm.cpu, o->second.cpu) : 0.0, ratio(peak, peaks()[own]));
  }
  std::printf(
      "ckpt time / ckpt cpu / ckpt peak: against the same precision with store_all (goal: time <= 1.4)\n");
  return 0;
}
