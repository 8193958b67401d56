// trainkit/backend/cuda/attention_cudnn.hpp - cuDNN's fused flash attention for attention<cuda>:
// the declarations (plain C++). The definitions are in attention_cudnn_impl.hpp, compiled once per
// program by the host compiler (attention_cudnn.cpp, which CMake's trainkit::cudnn_frontend adds to
// the targets linking it): the cuDNN frontend's headers cost about 160 s per nvcc translation unit
// and a fraction of that in one host-only one.
//
// bf16 / fp16 operands, fp32 softmax statistics (the log-sum-exp per query row, the contract's lse),
// no dropout (cuDNN draws its own Philox stream, not trainkit's) and no explicit mask; causal is
// top-left aligned as torch's is_causal. q, k, v, the output and the upstream gradient are read and
// written where they lie (cuDNN takes strides); dQ, dK and dV come out dense in the operand type.
#pragma once

#include <cudnn.h>

#include <cstdint>

#include "trainkit/backend/attention.hpp"

namespace trainkit::backend::gpu::cudnn_attention {

/// A [B, H, T, features] operand: element (b, h, t, c) at p[b sb + h sh + t st + c].
struct operand {
  const void* p = nullptr;
  index_t sb = 0, sh = 0, st = 0;
};

/// A problem's forward and backward graphs, built together (opaque).
struct plan;

/// The plan of a problem whose operands lie as given (dout: the upstream gradient's layout),
/// built at its first use on this device and kept for the process; nullptr where the problem is
/// not cuDNN's (dropout, head sizes, alignment) or cuDNN does not support it on this GPU.
/// bf16: bfloat16 operands, else half.
const plan* find(bool bf16, const attention_problem& p, const operand& q, const operand& k, const operand& v,
                 const operand& out, const operand& dout, int device, bool deterministic, cudnnHandle_t h);

/// Workspace bytes of the forward and the backward graph.
std::int64_t forward_workspace(const plan& pl);
std::int64_t backward_workspace(const plan& pl);

/// Enqueue on h's stream: out and lse ([B, H, Tq] fp32) from q, k, v.
void forward(const plan& pl, cudnnHandle_t h, const operand& q, const operand& k, const operand& v, void* out,
             float* lse, void* workspace);
/// Enqueue on h's stream: dq, dk, dv (dense [B, H, T, features] in the operand type).
void backward(const plan& pl, cudnnHandle_t h, const operand& q, const operand& k, const operand& v,
              const operand& out, const float* lse, const operand& dout, void* dq, void* dk, void* dv,
              void* workspace);

}  // namespace trainkit::backend::gpu::cudnn_attention
