// bench_allreduce - the allreduce of an fp32 gradient buffer (1 MiB to 256 MiB) through each gradient
// compression policy, over MPI: fp32 (the communicator's own MPI_Iallreduce), fp16, bf16, int8 and
// 1-bit (quantize -> alltoall -> fp32 sum -> re-quantize -> allgather -> dequantize, error feedback
// included). Quantization is part of the measured time.
//
//   mpirun -np 2 build/benchmarks/bench_allreduce                      (loopback: shared memory)
//   benchmarks/allreduce_netns.sh build/benchmarks/bench_allreduce     (two netns, veth at 1/10 Gbit/s)
//
// Every rank runs every benchmark with a fixed iteration count (the ranks must issue the same
// collectives); an iteration's time is the slowest rank's, from a barrier to its own end. Rank 0
// prints Google Benchmark's table (counters: bytes each rank sent, algorithm bandwidth) and then the
// speed-up of each policy over fp32 per size. Flags after the benchmark ones:
//   --sizes=1,4,16,25,64,256     buffer sizes in MiB
//   --timeout-ms=600000          communicator timeout (a slow shaped link needs a long one)
//   --link=1gbit                 the rate of each host's link (allreduce_netns.sh passes it; also
//                                TRAINKIT_BENCH_LINK): a table of each policy's share of the lower
//                                bound its bytes set, (bytes leaving a host) / rate
//   --hierarchical               also fp32, int8 and 1-bit through compression::hierarchical (hosts found by
//                                MPI_COMM_TYPE_SHARED: fp32 inside a host, compressed between hosts),
//                                and a table of hierarchical int8 against flat int8 and flat fp32
//                                (benchmarks/allreduce_netns.sh with RANKS_PER_HOST=2)
#include <benchmark/benchmark.h>

#include "cpu_context.hpp"  // the CPU in the output

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainkit/compression/codecs.hpp"
#include "trainkit/compression/hierarchical.hpp"
#include "trainkit/dist/mpi.hpp"
#include "trainkit/compression/quantized_allreduce.hpp"

namespace dist = trainkit::dist;
namespace compression = trainkit::compression;
using trainkit::index_t;

namespace {

std::unique_ptr<dist::mpi> comm;
std::unique_ptr<compression::hierarchical<dist::mpi>> hier;
std::map<std::string, double> sent_bytes;  // per rank and call, by benchmark name

/// "1gbit", "10gbit", "100mbit" in bits per second; 0 for "" (no link given).
double link_bits_per_second(const std::string& rate) {
  if (rate.empty()) return 0;
  std::size_t used = 0;
  const double v = std::stod(rate, &used);
  const std::string unit = rate.substr(used);
  if (unit == "gbit") return v * 1e9;
  if (unit == "mbit") return v * 1e6;
  throw std::invalid_argument("bench_allreduce: --link must be <N>gbit or <N>mbit, got '" + rate + "'");
}

/// The ranks on this rank's host (MPI_COMM_TYPE_SHARED: one per network-namespace host too).
int ranks_per_host() {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int n = 1;
  MPI_Comm_size(local, &n);
  MPI_Comm_free(&local);
  return n;
}

template <class C, class Comm = dist::mpi>
void bench(benchmark::State& state, index_t n, const std::string& key, Comm& ar = *comm) {
  std::vector<float> grad(static_cast<std::size_t>(n)), buf(grad.size());
  std::mt19937 gen(static_cast<unsigned>(comm->rank()) + 1);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  for (auto& g : grad) g = d(gen);
  C c;
  compression::compress_workspace ws;
  // One untimed call: page in the buffers and the residuals.
  buf = grad;
  compression::compressed_allreduce(ar, c, buf.data(), n, 0, dist::reduce_op::avg, &ws);
  const std::uint64_t bytes_before = c.bytes_sent();
  for (auto _ : state) {
    std::copy(grad.begin(), grad.end(), buf.begin());
    comm->barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    compression::compressed_allreduce(ar, c, buf.data(), n, 0, dist::reduce_op::avg, &ws);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    comm->allreduce(&secs, 1, dist::reduce_op::max).wait();  // the slowest rank's time
    state.SetIterationTime(secs);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["sent_MiB"] = static_cast<double>(c.bytes_sent() - bytes_before) / iters / (1 << 20);
  sent_bytes[key] = static_cast<double>(c.bytes_sent() - bytes_before) / iters;
  state.counters["algbw"] =
      benchmark::Counter(static_cast<double>(n) * 4 * iters, benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

// Rank 0: the console table plus the mean time of every run, for the ratios; other ranks: silent.
class recording_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs)
      if (r.run_type == Run::RT_Iteration) seconds[r.run_name.function_name] = r.GetAdjustedRealTime() * 1e-3;  // ms -> s
  }
  std::map<std::string, double> seconds;
};
class silent_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

std::string name(std::string_view policy, long mib) {
  return "allreduce/" + std::string(policy) + "/" + std::to_string(mib) + "MiB";
}

template <class C>
void add(long mib, bool hierarchical = false) {
  const index_t n = static_cast<index_t>(mib) * (1 << 20) / 4;
  const int iterations = mib >= 64 ? 3 : (mib >= 16 ? 5 : 20);
  const std::string policy = (hierarchical ? "hier-" : "") + std::string(C::name);
  benchmark::RegisterBenchmark(name(policy, mib).c_str(),
                               [n, hierarchical, key = name(policy, mib)](benchmark::State& s) {
                                 if (hierarchical)
                                   bench<C>(s, n, key, *hier);
                                 else
                                   bench<C>(s, n, key);
                               })
      ->Iterations(iterations)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  dist::mpi::environment env(argc, argv);
  std::vector<long> sizes = {1, 4, 16, 25, 64, 256};
  long timeout_ms = 600000;
  std::string link = std::getenv("TRAINKIT_BENCH_LINK") ? std::getenv("TRAINKIT_BENCH_LINK") : "";
  bool hierarchical = false;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--sizes=", 0) == 0) {
      sizes.clear();
      std::stringstream ss(a.substr(8));
      for (std::string x; std::getline(ss, x, ',');) sizes.push_back(std::stol(x));
    } else if (a.rfind("--timeout-ms=", 0) == 0) {
      timeout_ms = std::stol(a.substr(13));
    } else if (a.rfind("--link=", 0) == 0) {
      link = a.substr(7);
    } else if (a == "--hierarchical") {
      hierarchical = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  const double link_bps = link_bits_per_second(link);
  comm = std::make_unique<dist::mpi>(dist::mpi_options{.timeout = std::chrono::milliseconds(timeout_ms)});
  if (comm->size() < 2) {
    std::printf("bench_allreduce: run it with at least 2 ranks (mpirun -np 2 ...); one rank sends nothing\n");
    return 0;
  }
  if (hierarchical) {
    hier = std::make_unique<compression::hierarchical<dist::mpi>>(compression::hierarchical<dist::mpi>::by_host(
        dist::mpi(dist::mpi_options{.timeout = std::chrono::milliseconds(timeout_ms)})));
    if (comm->rank() == 0)
      std::printf("hierarchical: %d host(s) x %d rank(s)\n", hier->hosts(), hier->ranks_per_host());
  }
  for (long mib : sizes) {
    add<compression::none>(mib);
    add<compression::fp16>(mib);
    add<compression::bf16>(mib);
    add<compression::int8>(mib);
    add<compression::sign_1bit>(mib);
    if (hierarchical) {
      add<compression::none>(mib, true);
      add<compression::int8>(mib, true);
      add<compression::sign_1bit>(mib, true);
    }
  }
  benchmark::Initialize(&rest_argc, rest.data());
  recording_reporter table;
  silent_reporter quiet;
  if (comm->rank() == 0) benchmark::RunSpecifiedBenchmarks(&table);
  else benchmark::RunSpecifiedBenchmarks(&quiet);

  if (comm->rank() == 0) {
    std::printf("\n%d ranks: speed-up over fp32 (quantization included)\n%8s %10s %8s %8s %8s %8s\n", comm->size(),
                "MiB", "fp32 ms", "fp16", "bf16", "int8", "1-bit");
    for (long mib : sizes) {
      const auto at = [&](std::string_view p) {
        const auto it = table.seconds.find(name(p, mib));
        return it == table.seconds.end() ? 0.0 : it->second;
      };
      const double base = at(compression::none::name);
      auto ratio = [&](std::string_view p) { return at(p) > 0 ? base / at(p) : 0.0; };
      std::printf("%8ld %10.2f %7.2fx %7.2fx %7.2fx %7.2fx\n", mib, base * 1e3, ratio(compression::fp16::name),
                  ratio(compression::bf16::name), ratio(compression::int8::name), ratio(compression::sign_1bit::name));
    }
  }
  const int per_host = ranks_per_host();
  if (comm->rank() == 0 && link_bps > 0) {
    // What leaves a host per call: its ranks' bytes to other hosts. Flat: each rank's sends go to
    // the W - 1 others alike, (W - L) of them on other hosts; hierarchical counts only those.
    const int w = comm->size();
    std::printf("\n%d ranks, %d per host, links of %s: time against the lower bound (bytes leaving a host / rate)\n"
                "%-24s %10s %14s %12s %8s\n",
                w, per_host, link.c_str(), "policy", "ms", "host MiB out", "bound ms", "share");
    for (const auto& [bench, secs] : table.seconds) {
      const auto it = sent_bytes.find(bench);
      if (it == sent_bytes.end() || secs <= 0) continue;
      const bool hier_run = bench.find("/hier-") != std::string::npos;
      const double cross = hier_run || w == per_host ? 1.0 : double(w - per_host) / double(w - 1);
      const double host_bytes = it->second * per_host * cross;
      const double bound = host_bytes * 8 / link_bps;
      std::printf("%-24s %10.1f %14.2f %12.1f %7.0f%%\n", bench.substr(10).c_str(), secs * 1e3,
                  host_bytes / (1 << 20), bound * 1e3, 100 * bound / secs);
    }
  }
  if (comm->rank() == 0 && hierarchical) {
    std::printf("\n%d host(s) x %d rank(s): hierarchical (fp32 inside a host, compressed between hosts)\n"
                "%8s %10s %12s %12s %14s %14s\n",
                hier->hosts(), hier->ranks_per_host(), "MiB", "h-int8 ms", "h-fp32/fp32", "h-int8/int8",
                "h-int8/fp32", "h-1bit/1bit");
    for (long mib : sizes) {
      const auto at = [&](const std::string& p) {
        const auto it = table.seconds.find(name(p, mib));
        return it == table.seconds.end() ? 0.0 : it->second;
      };
      auto speedup = [&](const std::string& base, const std::string& p) { return at(p) > 0 ? at(base) / at(p) : 0.0; };
      std::printf("%8ld %10.2f %11.2fx %11.2fx %13.2fx %13.2fx\n", mib, at("hier-int8") * 1e3,
                  speedup("none", "hier-none"), speedup("int8", "hier-int8"), speedup("none", "hier-int8"),
                  speedup("sign_1bit", "hier-sign_1bit"));
    }
  }
  benchmark::Shutdown();
  hier.reset();
  comm.reset();
  return 0;
}
