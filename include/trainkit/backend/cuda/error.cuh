// trainkit/backend/cuda/error.cuh - every CUDA, cuBLAS(Lt) and cuDNN status (NCCL's: dist/nccl.cuh) becomes a
// trainkit::runtime_failure that names the call, the context it ran in (shapes, sizes) and the
// library's own error string. CUDA code: include it from a .cu file (through <trainkit/cuda.cuh>).
#pragma once

#include <cublasLt.h>        // cublasStatus_t, cublasLtGetStatusName/String
#include <cuda_runtime.h>    // cudaError_t, cudaGetErrorName/String
#include <cudnn.h>           // cudnnStatus_t, cudnnGetErrorString, cudnnGetLastErrorString

#include <sstream>
#include <string>
#include <string_view>

#include "trainkit/core/error.hpp"

namespace trainkit::backend::gpu {

namespace detail {
[[noreturn]] inline void throw_status(std::string_view call, std::string_view status, std::string_view text,
                                      const std::string& context) {
  std::ostringstream os;
  os << call << " failed: " << status;
  if (!text.empty()) os << " (" << text << ")";
  if (!context.empty()) os << "; " << context;
  throw runtime_failure("cuda: " + os.str());
}
}  // namespace detail

/// Throws runtime_failure("cuda: <call> failed: <name> (<description>); <context>") unless e is
/// cudaSuccess. The sticky last error of a failed launch is cleared first, so that the next call
/// does not report it again.
inline void check(cudaError_t e, std::string_view call, const std::string& context = {}) {
  if (e == cudaSuccess) [[likely]]
    return;
  (void)cudaGetLastError();
  detail::throw_status(call, cudaGetErrorName(e), cudaGetErrorString(e), context);
}

/// cuBLAS and cuBLASLt share cublasStatus_t.
inline void check(cublasStatus_t s, std::string_view call, const std::string& context = {}) {
  if (s == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  detail::throw_status(call, cublasLtGetStatusName(s), cublasLtGetStatusString(s), context);
}

/// cuDNN: the status string, plus cuDNN's own last-error message when it left one.
inline void check(cudnnStatus_t s, std::string_view call, const std::string& context = {}) {
  if (s == CUDNN_STATUS_SUCCESS) [[likely]]
    return;
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof last);
  detail::throw_status(call, cudnnGetErrorString(s), last, context);
}


/// After a kernel launch: a bad configuration (too many threads, too much shared memory) shows
/// up here; faults inside the kernel surface at the next synchronising call.
inline void check_launch(std::string_view kernel, const std::string& context = {}) {
  check(cudaGetLastError(), kernel, context);
}

}  // namespace trainkit::backend::gpu

/// TRAINKIT_CUDA_CHECK(call) - runs a CUDA/cuBLAS/cuDNN/NCCL call and throws runtime_failure
/// naming it (its source text) when it does not succeed.
#define TRAINKIT_CUDA_CHECK(call) ::trainkit::backend::gpu::check((call), #call)

/// TRAINKIT_CUDA_CHECK_CTX(call, msg << streamed << values) - the same, with a context message
/// (shapes, sizes) built only on failure.
#define TRAINKIT_CUDA_CHECK_CTX(call, msg)                                     \
  do {                                                                         \
    const auto trainkit_cuda_status_ = (call);                                 \
    if (!::trainkit::backend::gpu::detail::ok(trainkit_cuda_status_)) {        \
      std::ostringstream trainkit_cuda_os_;                                    \
      trainkit_cuda_os_ << msg;                                                \
      ::trainkit::backend::gpu::check(trainkit_cuda_status_, #call, trainkit_cuda_os_.str()); \
    }                                                                          \
  } while (0)

namespace trainkit::backend::gpu::detail {
constexpr bool ok(cudaError_t e) noexcept { return e == cudaSuccess; }
constexpr bool ok(cublasStatus_t s) noexcept { return s == CUBLAS_STATUS_SUCCESS; }
constexpr bool ok(cudnnStatus_t s) noexcept { return s == CUDNN_STATUS_SUCCESS; }
}  // namespace trainkit::backend::gpu::detail
