// trainkit/amp/cuda.cuh - mixed precision on the GPU: cuBLASLt and cuDNN take half and
// bfloat16 operands with fp32 accumulation, so the amp ops hand them their compute-type tensors
// directly instead of widening to fp32 first (amp/ops.hpp, detail::native_gemm).
#pragma once

#include "trainkit/amp/ops.hpp"
#include "trainkit/backend/cuda/blas.cuh"
#include "trainkit/backend/cuda/convolution.cuh"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"

namespace trainkit::amp::detail {
template <>
inline constexpr bool native_gemm<cuda, half> = true;
template <>
inline constexpr bool native_gemm<cuda, bfloat16> = true;
}  // namespace trainkit::amp::detail
