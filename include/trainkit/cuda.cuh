// trainkit/cuda.cuh - the CUDA backend: include it (after or instead of <trainkit/trainkit.hpp>)
// from a .cu file compiled by nvcc, and link trainkit::cuda (CUDA runtime, cuBLAS/cuBLASLt, cuDNN,
// NCCL). Everything of trainkit then works on tensor<T, cuda> and var<T, cuda>:
//
//   auto x = tensor<float>::from_vector(v, {n, 784}).to<cuda>();   // host -> device
//   auto model = nn::make_sequential(std::make_shared<nn::linear<float, cuda>>(784, 10));
//   auto loss = autograd::cross_entropy((*model)(var<float, cuda>(x)), labels_on_device);
//   loss.backward();                                                 // kernels, cuBLASLt, cuDNN
//
// What it adds (one kernel family or its plumbing per header in backend/cuda/):
//   error.cuh        TRAINKIT_CUDA_CHECK / gpu::check: every status -> runtime_failure
//   stream.cuh       devices, gpu::stream, gpu::event, the current stream (gpu::stream_guard),
//                    gpu::host_syncs() (host synchronisations so far)
//   device_error.cuh errors found by kernels (bad class/embedding indices), raised at the next
//                    host read or by gpu::check_device_errors()
//   settings.cuh     gpu::settings(): allow_tf32, deterministic, cudnn_benchmark, workspace limits
//   allocator.cuh    allocator<cuda>: caching, stream-aware; stats(), empty_cache(), record_stream()
//   transfer.cuh     host <-> device copies through pinned staging buffers; gpu::pinned_buffer
//   elementwise.cuh  elementwise<cuda>: the strided N-ary kernel behind map/apply_/copy_/optimizers
//   reduce.cuh       reduce<cuda>: sum/mean/amax/argmax/found_inf...
//   blas.cuh         blas<cuda>: GEMM through cuBLASLt (fp32/TF32, fp16, bf16, fp64); native_gemm<cuda, half/bfloat16>
//   convolution.cuh  convolution<cuda> through cuDNN; im2col<cuda>
//   pool.cuh norm.cuh softmax.cuh dropout.cuh gather.cuh   the other nn kernel families
//   multi_tensor.cuh multi_tensor<cuda>: unscaling, the total norm and clipping over all gradients
//   block_reduce.cuh warp/block reductions of the row-wise kernels
// and, beside their owners (CUDA code that is not a kernel family):
//   compression/codecs.cuh  gradient-compression codecs on device buffers
//   compression/quantized_allreduce.cuh   the compressed allreduce on device buffers, residuals on the device
//   dist/host_staged.cuh   a host communicator (mpi) on device buffers through pinned memory
//   dist/nccl.cuh      dist::nccl, the NCCL communicator (when NCCL is there: trainkit::nccl)
//   parallel/cuda.cuh  data_parallel<..., cuda>: buckets reduced on a side stream
#pragma once

#if !defined(__CUDACC__)
#error "<trainkit/cuda.cuh> is CUDA code: include it from a .cu file compiled by nvcc (CPU-only code needs only <trainkit/trainkit.hpp>)"
#endif

#include "trainkit/trainkit.hpp"

#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/cuda/device_error.cuh"
#include "trainkit/backend/cuda/settings.cuh"
#include "trainkit/backend/cuda/allocator.cuh"
#include "trainkit/backend/cuda/transfer.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/elementwise.cuh"
#include "trainkit/backend/cuda/reduce.cuh"
#include "trainkit/backend/cuda/blas.cuh"
#include "trainkit/backend/cuda/cudnn.cuh"
#include "trainkit/backend/cuda/convolution.cuh"
#include "trainkit/backend/cuda/pool.cuh"
#include "trainkit/backend/cuda/block_reduce.cuh"
#include "trainkit/backend/cuda/norm.cuh"
#include "trainkit/backend/cuda/softmax.cuh"
#include "trainkit/backend/cuda/attention.cuh"
#include "trainkit/backend/cuda/dropout.cuh"
#include "trainkit/backend/cuda/gather.cuh"
#include "trainkit/backend/cuda/multi_tensor.cuh"
#include "trainkit/compression/codecs.cuh"
#include "trainkit/compression/quantized_allreduce.cuh"
#include "trainkit/dist/local_device.cuh"
#include "trainkit/dist/host_staged.cuh"
#if defined(TRAINKIT_HAS_NCCL) && TRAINKIT_HAS_NCCL  // trainkit::nccl defines it
#include "trainkit/dist/nccl.cuh"
#endif
#include "trainkit/parallel/cuda.cuh"

namespace trainkit {
/// The CUDA backend's user-facing utilities (streams, events, settings, checks) under a short name.
namespace gpu = backend::gpu;
}  // namespace trainkit
