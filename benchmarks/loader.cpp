// data_loader throughput and the share of a training step spent waiting on data.
//
//   bm_loader_fashion_mnist/workers:W  one epoch of the real Fashion-MNIST training set (60000
//       images, normalised by load_mnist, no transform), shuffled, batch 128, W = 0, 1, 2 worker
//       threads; counter samples/s.
//   bm_loader_cifar10/workers:W        one epoch of a synthetic CIFAR-10 batch file (10000 random
//       records in the exact binary format, written to a temporary directory when first needed and
//       read with load_cifar10) through the standard augmentation: random_crop 32 pad 4,
//       random_horizontal_flip, normalize(cifar10_mean, cifar10_std); batch 128; samples/s.
//   bm_cnn_data_wait/workers:W         30 training steps (batch 128) of the Fashion-MNIST CNN of
//       examples/fashion_mnist_cnn.cpp (SGD nesterov momentum) fed by the loader; the time inside
//       loader.next() and the whole step are timed separately: data_wait_share = wait / total
//       (goal: <= 0.02 with workers), step_ms = total per step, wait_ms = wait per step. W = 0
//       (each batch built in next(), in the training thread) is the baseline.
// Every benchmark uses real time: the workers' CPU time is not the main thread's. The loaders
// keep going across iterations; set_epoch starts a fresh shuffled pass when one is done.
//
//   OMP_NUM_THREADS=2 build/benchmarks/bench_loader --benchmark_min_time=0.5
//
// Fashion-MNIST is read from /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist)
// or $TRAINKIT_FASHION_MNIST; without it those benchmarks are skipped with an error. The CIFAR-10
// file (30 MB) goes to a new directory in $TMPDIR (or /tmp), removed at exit.
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output

#include <unistd.h>  // getpid

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // std::getenv
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>  // std::runtime_error
#include <string>
#include <system_error>
#include <vector>

#include "trainkit/trainkit.hpp"

#define FASHION_MNIST_CNN_MODEL_ONLY
#include "../examples/fashion_mnist_cnn.cpp"  // example::fashion_cnn(), the model of the CNN example

namespace {
namespace tk = trainkit;
namespace nn = trainkit::nn;
namespace td = trainkit::data;
namespace fs = std::filesystem;
using tk::index_t;
using clock_type = std::chrono::steady_clock;

constexpr index_t batch_size = 128;

/// A loaded data set, or why it could not be loaded (the benchmarks using it are then skipped).
struct loaded {
  std::optional<td::dataset> data;
  std::string error;
};

/// The Fashion-MNIST training split, normalised; loaded once, on first use.
const loaded& fashion_mnist() {
  static const loaded d = [] {
    const char* env = std::getenv("TRAINKIT_FASHION_MNIST");
    const std::string dir = env && *env ? env : "/usr/share/datasets/fashion-mnist";
    loaded r;
    try {
      r.data = td::load_mnist(dir, td::split::train,
                              {.mean = td::fashion_mnist_mean, .stddev = td::fashion_mnist_std});
    } catch (const std::exception& e) {
      r.error = "Fashion-MNIST training set not readable in '" + dir +
                "' (install Debian's dataset-fashion-mnist or set TRAINKIT_FASHION_MNIST): " + e.what();
    }
    return r;
  }();
  return d;
}

/// The temporary directory holding the synthetic CIFAR-10 file; main() removes it.
fs::path& cifar_dir() {
  static fs::path p;
  return p;
}

/// Writes test_batch.bin (10000 records: label byte + 3072 random pixel bytes) to a fresh temporary
/// directory and reads it back with load_cifar10 (which validates the record count and labels).
loaded make_cifar10() {
  loaded r;
  try {
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);
    if (ec) base = "/tmp";
    cifar_dir() = base / ("trainkit-bench-loader-" + std::to_string(::getpid()));
    fs::create_directories(cifar_dir());
    const fs::path file = cifar_dir() / "test_batch.bin";
    {
      std::mt19937 rng(1);
      std::uniform_int_distribution<int> byte(0, 255), label(0, 9);
      std::vector<char> rec(td::cifar10_record_bytes);
      std::ofstream out(file, std::ios::binary | std::ios::trunc);
      for (index_t i = 0; i < td::cifar10_records_per_file; ++i) {
        rec[0] = static_cast<char>(label(rng));
        for (std::size_t j = 1; j < rec.size(); ++j) rec[j] = static_cast<char>(byte(rng));
        out.write(rec.data(), static_cast<std::streamsize>(rec.size()));
      }
      out.close();
      if (!out) throw std::runtime_error("cannot write '" + file.string() + "'");
    }
    r.data = td::load_cifar10(cifar_dir(), td::split::test, {.records_per_file = td::cifar10_records_per_file});
  } catch (const std::exception& e) {
    r.error = std::string("cannot write or read the synthetic CIFAR-10 file: ") + e.what();
  }
  return r;
}

const loaded& cifar10() {
  static const loaded d = make_cifar10();
  return d;
}

td::any_transform cifar10_augment() {
  return td::compose(
      td::random_crop({.height = 32, .width = 32, .padding = 4}), td::random_horizontal_flip(),
      td::normalize({.mean = {td::cifar10_mean.begin(), td::cifar10_mean.end()},
                     .stddev = {td::cifar10_std.begin(), td::cifar10_std.end()}}));
}

/// Batch number k of the loader's stream across epochs: next(), after set_epoch(e + 1) when the
/// pass is done.
td::batch<float> next_batch(td::data_loader<td::tensor_dataset>& loader) {
  if (!loader.has_next()) loader.set_epoch(loader.epoch() + 1);
  return loader.next();
}

/// One full epoch per iteration.
void run_epochs(benchmark::State& st, const loaded& d, td::any_transform transform) {
  if (!d.data) {
    st.SkipWithError(d.error.c_str());
    return;
  }
  const td::tensor_dataset ds(*d.data);
  td::data_loader<td::tensor_dataset> loader(
      ds, td::shuffled_sampler(ds.size(), 1),
      {.batch_size = batch_size, .num_workers = st.range(0), .seed = 1, .transform = std::move(transform)});
  std::uint64_t epoch = 0;
  double samples = 0;
  for (auto _ : st) {
    loader.set_epoch(epoch++);
    for (auto& b : loader) {
      benchmark::DoNotOptimize(b.x.data());
      samples += static_cast<double>(b.x.size(0));
    }
  }
  st.counters["samples/s"] = benchmark::Counter(samples, benchmark::Counter::kIsRate);
}

void bm_loader_fashion_mnist(benchmark::State& st) { run_epochs(st, fashion_mnist(), {}); }
void bm_loader_cifar10(benchmark::State& st) { run_epochs(st, cifar10(), cifar10_augment()); }

/// The CNN of examples/fashion_mnist_cnn.cpp.
std::shared_ptr<nn::sequential<float>> fashion_cnn() { return example::fashion_cnn(); }

/// steps_per_iteration training steps per iteration, after a few untimed warm-up steps.
void bm_cnn_data_wait(benchmark::State& st) {
  constexpr int steps_per_iteration = 30, warmup_steps = 3;
  const loaded& d = fashion_mnist();
  if (!d.data) {
    st.SkipWithError(d.error.c_str());
    return;
  }
  tk::set_seed(1);
  auto model = fashion_cnn();
  tk::optim::sgd opt(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  const td::tensor_dataset ds(*d.data);
  td::data_loader<td::tensor_dataset> loader(
      ds, td::shuffled_sampler(ds.size(), 1),
      {.batch_size = batch_size, .num_workers = st.range(0), .drop_last = true, .seed = 1});

  double wait_s = 0, total_s = 0;
  auto step = [&](bool timed) {
    const auto t0 = clock_type::now();
    td::batch<float> b = next_batch(loader);
    const auto t1 = clock_type::now();
    auto loss = tk::autograd::cross_entropy((*model)(tk::var<float>(b.x)), b.y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.value().data());
    const auto t2 = clock_type::now();
    if (timed) {
      wait_s += std::chrono::duration<double>(t1 - t0).count();
      total_s += std::chrono::duration<double>(t2 - t0).count();
    }
  };
  for (int i = 0; i < warmup_steps; ++i) step(false);
  std::int64_t steps = 0;
  for (auto _ : st) {
    for (int i = 0; i < steps_per_iteration; ++i) step(true);
    steps += steps_per_iteration;
  }
  const double n = static_cast<double>(steps);
  st.counters["data_wait_share"] = total_s > 0 ? wait_s / total_s : 0.0;
  st.counters["step_ms"] = 1e3 * total_s / n;
  st.counters["wait_ms"] = 1e3 * wait_s / n;
  st.counters["samples/s"] = benchmark::Counter(n * batch_size, benchmark::Counter::kIsRate);
}
}  // namespace

BENCHMARK(bm_loader_fashion_mnist)->ArgName("workers")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_loader_cifar10)->ArgName("workers")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_cnn_data_wait)->ArgName("workers")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!cifar_dir().empty()) {
    std::error_code ec;
    fs::remove_all(cifar_dir(), ec);
  }
  return 0;
}
