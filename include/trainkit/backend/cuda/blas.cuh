// trainkit/backend/cuda/blas.cuh - blas<cuda>::gemm through cuBLASLt: fp32 (TF32 when
// settings().allow_tf32), fp16 and bf16 with fp32 accumulation, fp64.
//
// Our matrices are row-major; cuBLASLt's are column-major. A row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, so every call swaps A and B and keeps the transposes.
// Each (shape, strides, type, alignment) gets one plan - descriptors plus the heuristic's first
// algorithm that fits the workspace - cached per thread and device; each stream gets its own
// workspace (work on two streams must not share one). A shape for which the heuristic has no
// algorithm runs through cublasGemmEx; the first such shape is named on stderr, once per process.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "trainkit/backend/blas.hpp"
#include "trainkit/backend/cuda/elementwise.cuh"
#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/settings.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/functors.hpp"
#include "trainkit/core/half.hpp"

namespace trainkit::backend {

/// cuBLASLt and cuDNN multiply half and bfloat16 operands themselves with fp32 accumulation.
template <>
inline constexpr bool native_gemm<cuda, half> = true;
template <>
inline constexpr bool native_gemm<cuda, bfloat16> = true;

namespace gpu::detail {

static_assert(sizeof(half) == sizeof(__half) && sizeof(bfloat16) == sizeof(__nv_bfloat16),
              "trainkit's 16-bit floats must have the layout of CUDA's");

template <class T>
constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  else if constexpr (std::is_same_v<T, half>) return CUDA_R_16F;
  else if constexpr (std::is_same_v<T, bfloat16>) return CUDA_R_16BF;
  else static_assert(::trainkit::detail::dependent_false<T>, "blas<cuda>: float, double, half or bfloat16 only");
}

struct gemm_key {
  cudaDataType_t type;
  cublasComputeType_t compute;
  bool ta, tb;
  index_t m, n, k, lda, ldb, ldc;
  int align;  // min alignment in bytes of A, B, C (16, 8, 4 or 2)
  bool operator==(const gemm_key&) const = default;
};
struct gemm_key_hash {
  std::size_t operator()(const gemm_key& k) const noexcept {
    std::size_t h = std::size_t(k.type) * 1000003u ^ std::size_t(k.compute) * 7919u;
    for (index_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc, index_t(k.ta), index_t(k.tb), index_t(k.align)})
      h = h * 1099511628211ull ^ std::hash<index_t>{}(v);
    return h;
  }
};

struct gemm_plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;  // false: cuBLASLt had none; cublasGemmEx serves this shape
  std::size_t workspace = 0;
  gemm_plan() = default;
  gemm_plan(const gemm_plan&) = delete;
  gemm_plan& operator=(const gemm_plan&) = delete;
  ~gemm_plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

/// The cuBLASLt and cuBLAS handles of one thread on one device, its plans and workspaces.
struct blas_context {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t classic = nullptr;
  std::unordered_map<gemm_key, std::unique_ptr<gemm_plan>, gemm_key_hash> plans;
  std::unordered_map<cudaStream_t, void*> workspaces;
  std::size_t workspace_size = 0;

  blas_context() {
    check(cublasLtCreate(&lt), "cublasLtCreate");
    check(cublasCreate(&classic), "cublasCreate");
    workspace_size = settings().cublas_workspace;
  }
  blas_context(const blas_context&) = delete;
  blas_context& operator=(const blas_context&) = delete;
  ~blas_context() {
    plans.clear();
    for (auto& [s, p] : workspaces) (void)cudaFree(p);
    if (classic) cublasDestroy(classic);
    if (lt) cublasLtDestroy(lt);
  }

  void* workspace(cudaStream_t s) {
    auto it = workspaces.find(s);
    if (it != workspaces.end()) return it->second;
    void* p = nullptr;
    if (workspace_size)
      TRAINKIT_CUDA_CHECK_CTX(cudaMalloc(&p, workspace_size), "cuBLASLt workspace of " << workspace_size << " bytes");
    workspaces.emplace(s, p);
    return p;
  }
};

inline blas_context& blas_for_current_device() {
  // Never destroyed: cuBLAS handles torn down after the CUDA runtime has shut down (static
  // destruction at exit) can crash, and a process ends soon after its threads anyway.
  thread_local auto* contexts = new std::unordered_map<int, blas_context*>;
  blas_context*& c = (*contexts)[current_device()];
  if (c == nullptr) c = new blas_context;
  return *c;
}

inline int alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  for (int a : {16, 8, 4}) if (v % std::uintptr_t(a) == 0) return a;
  return 2;
}

inline std::string gemm_context(const char* type, bool ta, bool tb, index_t m, index_t n, index_t k, index_t lda,
                                index_t ldb, index_t ldc) {
  std::ostringstream os;
  os << type << " gemm (row-major) C[" << m << " x " << n << "] = op(A)[" << m << " x " << k << "] op(B)[" << k
     << " x " << n << "], trans_a " << ta << ", trans_b " << tb << ", lda " << lda << ", ldb " << ldb << ", ldc " << ldc;
  return os.str();
}

/// C = beta * C (the k = 0 product), or zeros when beta is 0.
template <class T>
struct scale_by {
  double beta;
  TRAINKIT_HD void operator()(T& c) const {
    c = beta == 0.0 ? T(0.0f) : static_cast<T>(static_cast<compute_t<T>>(c) * static_cast<compute_t<T>>(beta));
  }
};

}  // namespace gpu::detail

/// GEMM on the GPU (contract in backend/blas.hpp); asynchronous on the current stream.
template <>
struct blas<cuda> {
  template <class T>
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, double beta, T* c, index_t ldc) {
    namespace g = gpu::detail;
    if (m == 0 || n == 0) return;
    if (k == 0) {
      elementwise<cuda>::for_each({m, n}, {shape{ldc, 1}}, g::scale_by<T>{beta}, c);
      return;
    }
    constexpr cudaDataType_t type = g::cuda_data_type<T>();
    const bool is_double = std::is_same_v<T, double>;
    const cublasComputeType_t compute =
        is_double ? CUBLAS_COMPUTE_64F
                  : (std::is_same_v<T, float> && gpu::settings().allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                            : CUBLAS_COMPUTE_32F);
    const int align = std::min({g::alignment_of(a), g::alignment_of(b), g::alignment_of(c)});
    g::blas_context& ctx = g::blas_for_current_device();
    const cudaStream_t st = gpu::current_stream();
    // Column-major view: C^T [n x m] = op(B)^T [n x k] op(A)^T [k x m].
    const g::gemm_key key{type, compute, trans_a, trans_b, m, n, k, lda, ldb, ldc, align};
    auto& slot = ctx.plans[key];
    if (!slot) slot = make_plan(ctx, key, dtype_name<T>().data());
    const g::gemm_plan& plan = *slot;

    const float alpha_f = float(alpha), beta_f = float(beta);
    const void* alpha_p = is_double ? static_cast<const void*>(&alpha) : static_cast<const void*>(&alpha_f);
    const void* beta_p = is_double ? static_cast<const void*>(&beta) : static_cast<const void*>(&beta_f);
    if (plan.has_algo) {
      TRAINKIT_CUDA_CHECK_CTX(cublasLtMatmul(ctx.lt, plan.desc, alpha_p, b, plan.a, a, plan.b, beta_p, c, plan.c, c,
                                             plan.c, &plan.algo, ctx.workspace(st), ctx.workspace_size, st),
                              g::gemm_context(dtype_name<T>().data(), trans_a, trans_b, m, n, k, lda, ldb, ldc));
      return;
    }
    gpu::check(cublasSetStream(ctx.classic, st), "cublasSetStream");
    gpu::check(cublasSetMathMode(ctx.classic, compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                                     : CUBLAS_DEFAULT_MATH),
               "cublasSetMathMode");
    TRAINKIT_CUDA_CHECK_CTX(cublasGemmEx(ctx.classic, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), alpha_p, b,
                                         type, int(ldb), a, type, int(lda), beta_p, c, type, int(ldc), compute,
                                         CUBLAS_GEMM_DEFAULT),
                            g::gemm_context(dtype_name<T>().data(), trans_a, trans_b, m, n, k, lda, ldb, ldc));
  }

 private:
  static std::unique_ptr<gpu::detail::gemm_plan> make_plan(gpu::detail::blas_context& ctx,
                                                           const gpu::detail::gemm_key& key, const char* type) {
    namespace g = gpu::detail;
    auto plan = std::make_unique<g::gemm_plan>();
    const cudaDataType_t scale = key.compute == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F;
    const std::string ctxs = g::gemm_context(type, key.ta, key.tb, key.m, key.n, key.k, key.lda, key.ldb, key.ldc);
    gpu::check(cublasLtMatmulDescCreate(&plan->desc, key.compute, scale), "cublasLtMatmulDescCreate", ctxs);
    // cuBLASLt's A is our B and its B our A (see the file comment).
    const cublasOperation_t op_a = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    gpu::check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
               "cublasLtMatmulDescSetAttribute(TRANSA)", ctxs);
    gpu::check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
               "cublasLtMatmulDescSetAttribute(TRANSB)", ctxs);
    const std::uint64_t m = std::uint64_t(key.m), n = std::uint64_t(key.n), k = std::uint64_t(key.k);
    gpu::check(cublasLtMatrixLayoutCreate(&plan->a, key.type, key.tb ? k : n, key.tb ? n : k, key.ldb),
               "cublasLtMatrixLayoutCreate(A)", ctxs);
    gpu::check(cublasLtMatrixLayoutCreate(&plan->b, key.type, key.ta ? m : k, key.ta ? k : m, key.lda),
               "cublasLtMatrixLayoutCreate(B)", ctxs);
    gpu::check(cublasLtMatrixLayoutCreate(&plan->c, key.type, n, m, key.ldc), "cublasLtMatrixLayoutCreate(C)", ctxs);

    struct preference {
      cublasLtMatmulPreference_t p = nullptr;
      ~preference() {
        if (p) cublasLtMatmulPreferenceDestroy(p);
      }
    } pref;
    gpu::check(cublasLtMatmulPreferenceCreate(&pref.p), "cublasLtMatmulPreferenceCreate", ctxs);
    const std::uint64_t ws = ctx.workspace_size;
    gpu::check(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
               "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", ctxs);
    const std::uint32_t align = std::uint32_t(key.align);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      gpu::check(cublasLtMatmulPreferenceSetAttribute(pref.p, attr, &align, sizeof align),
                 "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", ctxs);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx.lt, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                                            pref.p, 1, &result, &found);
    if (s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan->algo = result.algo;
      plan->workspace = result.workspaceSize;
      plan->has_algo = true;
    } else {
      static std::once_flag said;
      std::call_once(said, [&] {
        const char* compute = key.compute == CUBLAS_COMPUTE_64F              ? "fp64"
                              : key.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? "tf32"
                                                                            : "fp32";
        std::fprintf(stderr,
                     "trainkit: cuBLASLt has no algorithm for %s, %s compute, operands aligned to %d bytes "
                     "(heuristic: %s, %d found); cublasGemmEx runs it and any other such shape (said once)\n",
                     ctxs.c_str(), compute, key.align, cublasLtGetStatusName(s), found);
      });
    }
    return plan;
  }
};

}  // namespace trainkit::backend
