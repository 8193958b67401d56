// cuda_bandwidth.cu - memory bandwidth of the elementwise and reduction kernels on 256 MiB fp32
// tensors, against the H200's 4.8 TB/s and against cudaMemcpy's device-to-device copy measured in
// the same run (the practical ceiling).
//
//   build/benchmarks/bench_cuda_bandwidth [--iters 20] [--mib 256] [--peak-gbps 4800]
//
// Bytes counted: what the op must read and write (a + b -> out: 3 tensors). Each line is a JSON
// object {"bench", "ms", "gbps", "of_peak", "of_copy"}; a table follows on stderr. Exit code 77
// without a CUDA device.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <trainkit/cuda.cuh>

#include "machine.cuh"  // start_gpu_benchmark (the CPU and GPU in the output), flag, time_steps

namespace tk = trainkit;
using tk::cuda;
using tk::index_t;

namespace {

struct result {
  std::string name;
  double ms, gbps;
};

}  // namespace

int main(int argc, char** argv) try {
  if (!start_gpu_benchmark()) return 77;
  const int iters = int(flag(argc, argv, "--iters", 20));
  const double mib = flag(argc, argv, "--mib", 256), peak = flag(argc, argv, "--peak-gbps", 4800);
  const index_t n = index_t(mib * double(1 << 20) / 4);
  const double tensor_bytes = double(n) * 4;

  auto a = tk::tensor<float, cuda>::full({n}, 1.5f);
  auto b = tk::tensor<float, cuda>::full({n}, 0.25f);
  auto out = tk::tensor<float, cuda>::empty({n});
  auto out16 = tk::tensor<tk::bfloat16, cuda>::empty({n});
  const index_t cols = 4096, rows = n / cols;
  const auto a2 = a.view({rows, cols});

  std::vector<result> results;
  auto run = [&](const std::string& name, double bytes, const std::function<void()>& op) {
    const double ms = time_steps(3, iters, op);  // the mean of iters runs after 3 warm-ups, by CUDA events
    results.push_back({name, ms, bytes / (ms * 1e-3) / 1e9});
  };

  run("cudaMemcpy_d2d", 2 * tensor_bytes, [&] {
    TRAINKIT_CUDA_CHECK(cudaMemcpyAsync(out.data(), a.data(), std::size_t(tensor_bytes), cudaMemcpyDeviceToDevice,
                                        tk::gpu::current_stream()));
  });
  run("copy_", 2 * tensor_bytes, [&] { tk::copy_(out, a); });
  run("fill_", tensor_bytes, [&] { tk::fill_(out, 3.0f); });
  run("mul_scalar_inplace", 2 * tensor_bytes, [&] { tk::mul_(out, 1.0001); });
  run("add(a,b)", 3 * tensor_bytes, [&] { out = a + b; });
  run("exp(a)", 2 * tensor_bytes, [&] { out = tk::exp(a); });
  run("gelu(a)", 2 * tensor_bytes, [&] { out = tk::gelu(a); });
  run("add_(out,a,alpha)", 3 * tensor_bytes, [&] { tk::add_(out, a, 0.5); });
  run("cast_bf16", tensor_bytes * 1.5, [&] { out16 = tk::cast<tk::bfloat16>(a); });
  run("sum_all", tensor_bytes, [&] { (void)tk::sum(a); });
  run("amax_all", tensor_bytes, [&] { (void)tk::amax(a); });
  run("sum_rows[.,4096]", tensor_bytes, [&] { (void)tk::sum(a2, {1}); });
  run("sum_cols[.,4096]", tensor_bytes, [&] { (void)tk::sum(a2, {0}); });
  run("argmax_rows[.,4096]", tensor_bytes, [&] { (void)tk::argmax(a2, 1); });

  const double copy_gbps = results[0].gbps;
  std::fprintf(stderr, "%-22s %10s %10s %8s %8s\n", "bench", "ms", "GB/s", "of peak", "of copy");
  for (const auto& r : results) {
    std::printf("{\"bench\": \"%s\", \"mib\": %.0f, \"ms\": %.4f, \"gbps\": %.1f, \"of_peak\": %.3f, \"of_copy\": %.3f}\n",
                r.name.c_str(), mib, r.ms, r.gbps, r.gbps / peak, r.gbps / copy_gbps);
    std::fprintf(stderr, "%-22s %10.4f %10.1f %7.1f%% %7.1f%%\n", r.name.c_str(), r.ms, r.gbps, 100 * r.gbps / peak,
                 100 * r.gbps / copy_gbps);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda_bandwidth: %s\n", e.what());
  return 1;
}
