// Snapshot write and load of a 100 MB model (25M fp32 parameters in 20 tensors): write = build the
// snapshot from the module's state dict, checksum, temp file, fsync, rename, fsync the directory;
// load = read, verify the CRC, copy into the module. The directory is $TRAINKIT_BENCH_DIR or
// /tmp (the fsync cost depends on that file system: measure where the snapshots will go).
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "trainkit/io/io.hpp"
#include "trainkit/trainkit.hpp"

namespace {
namespace tk = trainkit;
namespace fs = std::filesystem;

/// 20 linear layers of 1250 x 1000 weights: 25M parameters, 100 MB (plus the small biases).
std::shared_ptr<tk::nn::sequential<float>> big_model() {
  auto s = std::make_shared<tk::nn::sequential<float>>();
  for (int i = 0; i < 20; ++i) s->push_back(std::make_shared<tk::nn::linear<float>>(1000, 1250));
  return s;
}
fs::path bench_dir() {
  const char* d = std::getenv("TRAINKIT_BENCH_DIR");
  fs::path p = fs::path(d ? d : "/tmp") / "trainkit-bench-snapshots";
  fs::create_directories(p);
  return p;
}
double model_bytes(const tk::nn::module<float>& m) { return 4.0 * static_cast<double>(m.num_parameters()); }

void bm_snapshot_write(benchmark::State& st) {
  auto model = big_model();
  const auto path = bench_dir() / "write.tks";
  for (auto _ : st) {
    tk::io::snapshot snap;
    tk::io::save_state(snap, "model", *model);
    snap.write(path, {.sync = st.range(0) != 0});
  }
  st.counters["bytes/s"] = benchmark::Counter(
      model_bytes(*model), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
  fs::remove(path);
}

void bm_snapshot_load(benchmark::State& st) {
  auto model = big_model();
  const auto path = bench_dir() / "load.tks";
  {
    tk::io::snapshot snap;
    tk::io::save_state(snap, "model", *model);
    snap.write(path);
  }
  for (auto _ : st) {
    const auto snap = tk::io::snapshot::read(path);
    tk::io::load_state(snap, "model", *model);
  }
  st.counters["bytes/s"] = benchmark::Counter(
      model_bytes(*model), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
  fs::remove(path);
}
}  // namespace

// Argument: 1 = fsync (the default of snapshot::write), 0 = no fsync (the page-cache cost alone).
BENCHMARK(bm_snapshot_write)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(bm_snapshot_load)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK_MAIN();
