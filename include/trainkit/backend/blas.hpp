// trainkit/backend/blas.hpp - the GEMM every matmul, linear and convolution calls.
#pragma once

#include "trainkit/core/device.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// Per-device GEMM on row-major matrices: C = alpha * op(A) * op(B) + beta * C, where op(A) is
/// M x K and op(B) is K x N; lda/ldb/ldc are the row strides of A, B, C as stored.
/// A model provides  `template <class T>` static void gemm(bool trans_a, bool trans_b, index_t m,
///   index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b, index_t ldb,
///   float beta, T* c, index_t ldc);
template <class Device>
struct blas {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::blas has no model for this device: include its backend header");
};

/// True when Device's GEMMs and convolutions multiply T operands themselves with fp32 accumulation
/// (the mixed-precision ops then hand them T tensors); false: T operands are widened to fp32 first.
/// Each backend specialises it where it has such kernels (cpu with oneDNN: bfloat16; cuda: half and
/// bfloat16).
template <class Device, class T>
inline constexpr bool native_gemm = false;

}  // namespace trainkit::backend
