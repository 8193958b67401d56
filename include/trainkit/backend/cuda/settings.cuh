// trainkit/backend/cuda/settings.cuh - the process-wide switches of the CUDA backend: TF32,
// deterministic algorithms, cuDNN's algorithm search and workspace limits.
//
// They are global (like torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.*) because
// they choose library algorithms, not numerics a caller composes; set them once at start-up,
// before other threads issue work.
#pragma once

#include <cstddef>

namespace trainkit::backend::gpu {

/// Switches read by the cuBLASLt and cuDNN paths at each call.
struct settings_t {
  /// fp32 GEMMs (cuBLASLt) and fp32 convolutions (cuDNN) may round their inputs to TF32 and run
  /// on tensor cores: about 8x the fp32 rate with a 10-bit mantissa. Off by default: fp32 means
  /// fp32 (PyTorch's torch.backends.cuda.matmul.allow_tf32 default).
  bool allow_tf32 = false;
  /// cuDNN uses only algorithms it reports as deterministic, and index scatter-adds run without
  /// atomics, so that a run repeats bit for bit.
  bool deterministic = false;
  /// cuDNN times every candidate algorithm once per shape (cudnnFind*AlgorithmEx) instead of
  /// taking the heuristic's first choice (torch.backends.cudnn.benchmark).
  bool cudnn_benchmark = false;
  /// Largest workspace a cuDNN convolution algorithm may ask for.
  std::size_t cudnn_workspace_limit = std::size_t(1) << 30;
  /// Batch norm of float/double with affine parameters runs through cuDNN (else our kernels).
  bool cudnn_batch_norm = true;
  /// bf16 / fp16 attention without dropout or an explicit mask runs through cuDNN's fused flash
  /// attention where the code is built with trainkit::cudnn_frontend (else trainkit's kernels).
  bool cudnn_attention = true;
  /// Workspace of each cuBLASLt handle (NVIDIA recommends 32 MiB on Hopper).
  std::size_t cublas_workspace = std::size_t(32) << 20;
};

/// The one settings object of the process.
inline settings_t& settings() noexcept {
  static settings_t s;
  return s;
}

}  // namespace trainkit::backend::gpu
