// cuda_kernel_count.cu - kernels launched per Linear forward + backward on the GPU, counted by CUPTI's
// kernel activity records (every kernel: trainkit's own and cuBLASLt's):
//   linear_bf16_kernels   nn::linear(1024, 1024) with bias under amp::mixed_bf16 (torch.autocast bf16)
//   linear_fp32_kernels   the same in fp32
// "Per Linear" is the difference between a stack of 3 and a stack of 2 such layers, each run forward
// and backward (seeded with ones) after two warm-up runs: the input's cast, the seed and the
// first/last layer's extra work cancel, what is left is what one layer inside a network costs.
// benchmarks/compare_pytorch_cuda.py counts PyTorch's the same way (torch.profiler); gpu-check
// requires trainkit's bf16 count to be at most PyTorch AMP's.
//
//   build/benchmarks/bench_cuda_kernel_count
//
// One JSON line per count. Exit code 77 without a CUDA device.
#include <cupti.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include <trainkit/cuda.cuh>

#include "machine.cuh"  // start_gpu_benchmark: the CPU and GPU in the output

namespace tk = trainkit;
namespace nn = trainkit::nn;
using tk::cuda;
using tk::index_t;

namespace {

std::atomic<long> kernels{0};

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  constexpr std::size_t bytes = 1 << 20;
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, bytes));
  *size = bytes;
  *max_records = 0;
}
void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) ++kernels;
  std::free(buffer);
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "bench_cuda_kernel_count: %s failed: %s\n", what, text ? text : "?");
  std::exit(1);
}

/// Kernels `run` launches (after two untimed runs that create handles, plans and caches).
template <class F>
long count_kernels(F&& run) {
  run();
  run();
  tk::gpu::synchronize();
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  kernels = 0;
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  run();
  tk::gpu::synchronize();
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
  return kernels.load();
}

/// Kernels of forward + backward through `layers` Linear(1024, 1024) layers under policy P.
template <class P>
long stack_kernels(int layers) {
  tk::generator gen(1);
  std::vector<std::shared_ptr<nn::linear<float, cuda>>> stack;
  for (int i = 0; i < layers; ++i) stack.push_back(std::make_shared<nn::linear<float, cuda>>(1024, 1024, true, gen));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> v(256 * 1024);
  for (auto& e : v) e = nd(rng);
  const auto x = tk::tensor<float>::from_vector(v, {256, 1024}).to<cuda>();
  return count_kernels([&] {
    for (auto& l : stack) l->zero_grad();
    tk::var<float, cuda> h(x);
    {
      tk::amp::autocast<P, float, cuda> scope;
      for (auto& l : stack) h = l->forward(h);
    }
    h.backward(tk::tensor<float, cuda>::ones(h.sizes()));
  });
}

template <class P>
void report(const char* name) {
  const long three = stack_kernels<P>(3), two = stack_kernels<P>(2);
  std::printf("{\"bench\": \"%s\", \"framework\": \"trainkit\", \"kernels\": %ld, \"stack3\": %ld, \"stack2\": %ld}\n",
              name, three - two, three, two);
  std::fflush(stdout);
}

}  // namespace

int main() try {
  if (!start_gpu_benchmark()) return 77;
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  report<tk::amp::mixed_bf16>("linear_bf16_kernels");
  report<tk::amp::fp32>("linear_fp32_kernels");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda_kernel_count: %s\n", e.what());
  return 1;
}
