// trainkit/backend/cuda/attention.cuh - attention<cuda>: fused scaled dot-product attention on the
// GPU (contract in backend/attention.hpp). Two routes:
//  - cuDNN's fused flash attention (the cuDNN frontend graph API, backend/cuda/attention_cudnn.hpp)
//    for bf16 and fp16 operands without dropout or an explicit mask, head sizes <= 128 in multiples
//    of 8, where the code is built with trainkit::cudnn_frontend (TRAINKIT_HAS_CUDNN_FRONTEND) and
//    cuDNN supports the graph on this GPU;
//  - otherwise trainkit's own kernels: one warp per query row (forward, dQ) or key row (dK, dV),
//    the row's features spread over the lanes, the keys (queries) visited one at a time with an
//    online softmax; the backward recomputes the probabilities from the saved log-sum-exp, so no
//    T x T matrix exists in either. Every case of the contract (float, double, bf16 and fp16
//    operands, masks, causal, the Philox dropout stream bit for bit as the host draws it, strided
//    views) - the route of correctness, not of speed.
// Which route ran last is kept for the tests (attention<cuda>::last_route).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "trainkit/backend/attention.hpp"
#include "trainkit/backend/cuda/allocator.cuh"
#include "trainkit/backend/cuda/block_reduce.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/settings.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"  // bernoulli_at: the dropout stream
#include "trainkit/core/half.hpp"

#if TRAINKIT_HAS_CUDNN_FRONTEND
#include "trainkit/backend/cuda/attention_cudnn.hpp"
#include "trainkit/backend/cuda/cudnn.cuh"
#endif

namespace trainkit::backend {

namespace gpu::detail {

/// Rows (warps) per block of the attention kernels.
inline constexpr int attention_warps = 8;

template <class A>
__device__ __forceinline__ A attention_inf() {
  return std::numeric_limits<A>::infinity();
}

/// x rounded to R (void: as is), as an A.
template <class R, class A>
__device__ __forceinline__ A attention_round(A x) {
  if constexpr (std::is_void_v<R> || std::is_same_v<R, A>)
    return x;
  else
    return A(float(R(x)));
}

/// The kept-probability factor Z of element (bh, i, j): 0, or 1 / (1 - p) where the Philox stream
/// keeps it (attention_problem's rule); 1 without dropout.
template <class A>
__device__ __forceinline__ A attention_keep(const attention_problem& p, index_t bh, index_t i, index_t j, float keep,
                                            A inv_keep) {
  if (p.dropout_p <= 0) return A(1);
  const std::uint64_t e = (std::uint64_t(bh) * std::uint64_t(p.tq) + std::uint64_t(i)) * std::uint64_t(p.tk) +
                          std::uint64_t(j);
  return bernoulli_at(p.seed, p.offset, e, keep) ? inv_keep : A(0);
}

/// x . y over the first n features, from the lane's share of x (element lane + 32 t, in A) and the
/// row y; every lane gets it.
template <int CH, class G, class A>
__device__ __forceinline__ A attention_dot(const A (&x)[CH], const G* y, index_t n, int lane) {
  A s = 0;
#pragma unroll
  for (int t = 0; t < CH; ++t) {
    const index_t c = lane + 32 * t;
    if (c < n) s += x[t] * A(y[c]);
  }
  return group_allreduce<32>(s, sum_op{}, static_cast<A*>(nullptr));
}

/// scale * q_i . k_j + mask(b, h, i, j) from the lane's share of one of q_i and k_j (x, already in
/// A) and the other's row y; every lane gets it.
template <int CH, class G, class A>
__device__ __forceinline__ A attention_score(const attention_problem& p, const A (&x)[CH], const G* y,
                                             const attention_mask<A>& mask, index_t b, index_t h, index_t i, index_t j,
                                             int lane) {
  A s = attention_dot<CH>(x, y, p.d, lane);
  s *= A(p.scale);
  if (mask.p != nullptr) s += mask.p[b * mask.sb + h * mask.sh + i * mask.sq + j * mask.sk];
  return s;
}

/// The lane's share of a row of n features (element lane + 32 t), in A.
template <int CH, class G, class A>
__device__ __forceinline__ void attention_load(const G* row, index_t n, int lane, A (&r)[CH]) {
#pragma unroll
  for (int t = 0; t < CH; ++t) {
    const index_t c = lane + 32 * t;
    r[t] = c < n ? A(row[c]) : A(0);
  }
}

/// Forward: one warp per query row (bh, i); the online softmax over its keys.
template <int CH, class R, class G, class A>
__global__ void __launch_bounds__(32 * attention_warps)
    attention_forward_kernel(attention_problem p, attention_view<const G> q, attention_view<const G> k,
                             attention_view<const G> v, attention_mask<A> mask, attention_view<G> out, A* lse) {
  const int lane = int(threadIdx.x) % 32;
  const index_t row = index_t(blockIdx.x) * attention_warps + int(threadIdx.x) / 32;
  if (row >= p.batch * p.heads * p.tq) return;
  const index_t bh = row / p.tq, i = row % p.tq, b = bh / p.heads, h = bh % p.heads;
  A qr[CH], acc[CH];
  attention_load<CH>(q.at(b, h) + i * q.st, p.d, lane, qr);
#pragma unroll
  for (int t = 0; t < CH; ++t) acc[t] = 0;
  const float keep = float(1.0 - p.dropout_p);
  const A inv_keep = p.dropout_p < 1 ? A(1.0 / (1.0 - p.dropout_p)) : A(0);
  A m = -attention_inf<A>(), l = 0;
  const index_t j_end = p.causal ? (i + 1 < p.tk ? i + 1 : p.tk) : p.tk;
  const G* kb = k.at(b, h);
  const G* vb = v.at(b, h);
  for (index_t j = 0; j < j_end; ++j) {
    const A s = attention_score<CH>(p, qr, kb + j * k.st, mask, b, h, i, j, lane);
    const A mx = max_op{}(m, s);  // a NaN score is skipped here and poisons the sum, as on the host
    if (mx == -attention_inf<A>()) continue;  // every key so far hidden
    const A rescale = dexp(m - mx);  // 0 while m is -inf
    const A e = dexp(s - mx);
    l = l * rescale + e;
    m = mx;
    const A pz = attention_round<R>(e * attention_keep<A>(p, bh, i, j, keep, inv_keep));
    const G* vj = vb + j * v.st;
#pragma unroll
    for (int t = 0; t < CH; ++t) {
      const index_t c = lane + 32 * t;
      acc[t] = acc[t] * rescale + (c < p.dv ? pz * A(vj[c]) : A(0));
    }
  }
  const bool empty = l == A(0);
  const A inv = empty ? A(0) : A(1) / l;
  G* o = out.at(b, h) + i * out.st;
#pragma unroll
  for (int t = 0; t < CH; ++t) {
    const index_t c = lane + 32 * t;
    if (c < p.dv) o[c] = G(attention_round<R>(acc[t] * inv));
  }
  if (lane == 0) lse[row] = empty ? attention_inf<A>() : m + dlog(l);
}

/// Backward, queries: one warp per query row; D_i = rowsum(dO_i O_i) (kept for the key pass) and
/// dQ_i = scale sum_j dS_ij K_j with dS = P (Z dP - D), dP = dO_i V_j^T.
template <int CH, class R, class G, class A>
__global__ void __launch_bounds__(32 * attention_warps)
    attention_backward_q_kernel(attention_problem p, attention_view<const G> q, attention_view<const G> k,
                                attention_view<const G> v, attention_mask<A> mask, attention_view<const G> out,
                                const A* lse, attention_view<const G> dout, A* drow, A* dq) {
  const int lane = int(threadIdx.x) % 32;
  const index_t row = index_t(blockIdx.x) * attention_warps + int(threadIdx.x) / 32;
  if (row >= p.batch * p.heads * p.tq) return;
  const index_t bh = row / p.tq, i = row % p.tq, b = bh / p.heads, h = bh % p.heads;
  A qr[CH], gr[CH], acc[CH];
  attention_load<CH>(q.at(b, h) + i * q.st, p.d, lane, qr);
  attention_load<CH>(dout.at(b, h) + i * dout.st, p.dv, lane, gr);
  A di;
  {
    A orow[CH];
    attention_load<CH>(out.at(b, h) + i * out.st, p.dv, lane, orow);
    di = 0;
#pragma unroll
    for (int t = 0; t < CH; ++t) di += gr[t] * orow[t], acc[t] = 0;
    di = group_allreduce<32>(di, sum_op{}, static_cast<A*>(nullptr));
  }
  if (lane == 0) drow[row] = di;
  const A lr = lse[row];
  const float keep = float(1.0 - p.dropout_p);
  const A inv_keep = p.dropout_p < 1 ? A(1.0 / (1.0 - p.dropout_p)) : A(0);
  const index_t j_end = lr == attention_inf<A>() ? 0 : p.causal ? (i + 1 < p.tk ? i + 1 : p.tk) : p.tk;
  const G* kb = k.at(b, h);
  const G* vb = v.at(b, h);
  for (index_t j = 0; j < j_end; ++j) {
    const G* kj = kb + j * k.st;
    const A pr = dexp(attention_score<CH>(p, qr, kj, mask, b, h, i, j, lane) - lr);
    const A dp = attention_dot<CH>(gr, vb + j * v.st, p.dv, lane);
    const A ds = attention_round<R>(pr * (attention_keep<A>(p, bh, i, j, keep, inv_keep) * dp - di));
#pragma unroll
    for (int t = 0; t < CH; ++t) {
      const index_t c = lane + 32 * t;
      if (c < p.d) acc[t] += ds * A(kj[c]);
    }
  }
  A* dqi = dq + row * p.d;
#pragma unroll
  for (int t = 0; t < CH; ++t) {
    const index_t c = lane + 32 * t;
    if (c < p.d) dqi[c] = acc[t] * A(p.scale);
  }
}

/// Backward, keys: one warp per key row (bh, j), over the queries that see it:
/// dV_j = sum_i (P Z)_ij dO_i, dK_j = scale sum_i dS_ij Q_i.
template <int CH, class R, class G, class A>
__global__ void __launch_bounds__(32 * attention_warps)
    attention_backward_kv_kernel(attention_problem p, attention_view<const G> q, attention_view<const G> k,
                                 attention_view<const G> v, attention_mask<A> mask, const A* lse,
                                 attention_view<const G> dout, const A* drow, A* dk, A* dv) {
  const int lane = int(threadIdx.x) % 32;
  const index_t row = index_t(blockIdx.x) * attention_warps + int(threadIdx.x) / 32;
  if (row >= p.batch * p.heads * p.tk) return;
  const index_t bh = row / p.tk, j = row % p.tk, b = bh / p.heads, h = bh % p.heads;
  A kr[CH], vr[CH], ak[CH], av[CH];
  attention_load<CH>(k.at(b, h) + j * k.st, p.d, lane, kr);
  attention_load<CH>(v.at(b, h) + j * v.st, p.dv, lane, vr);
#pragma unroll
  for (int t = 0; t < CH; ++t) ak[t] = 0, av[t] = 0;
  const float keep = float(1.0 - p.dropout_p);
  const A inv_keep = p.dropout_p < 1 ? A(1.0 / (1.0 - p.dropout_p)) : A(0);
  const G* qb = q.at(b, h);
  const G* gb = dout.at(b, h);
  const A* lb = lse + bh * p.tq;
  const A* db = drow + bh * p.tq;
  for (index_t i = p.causal ? j : 0; i < p.tq; ++i) {
    const A lr = lb[i];
    if (lr == attention_inf<A>()) continue;  // a row hidden from every key: no gradient
    const G* qi = qb + i * q.st;
    const G* gi = gb + i * dout.st;
    const A pr = dexp(attention_score<CH>(p, kr, qi, mask, b, h, i, j, lane) - lr);
    const A dp = attention_dot<CH>(vr, gi, p.dv, lane);
    const A z = attention_keep<A>(p, bh, i, j, keep, inv_keep);
    const A pz = attention_round<R>(pr * z);
    const A ds = attention_round<R>(pr * (z * dp - db[i]));
#pragma unroll
    for (int t = 0; t < CH; ++t) {
      const index_t c = lane + 32 * t;
      if (c < p.dv) av[t] += pz * A(gi[c]);
      if (c < p.d) ak[t] += ds * A(qi[c]);
    }
  }
  A* dkj = dk + row * p.d;
  A* dvj = dv + row * p.dv;
#pragma unroll
  for (int t = 0; t < CH; ++t) {
    const index_t c = lane + 32 * t;
    if (c < p.d) dkj[c] = ak[t] * A(p.scale);
    if (c < p.dv) dvj[c] = av[t];
  }
}

/// out[i] = float(in[i]) for i < n (cuDNN's 16-bit gradients into the contract's fp32 arrays).
template <class G>
__global__ void __launch_bounds__(block_threads) attention_widen_kernel(const G* in, index_t n, float* out) {
  for (index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x; i < n; i += index_t(gridDim.x) * block_threads)
    out[i] = float(in[i]);
}

/// f(std::integral_constant<int, CH>) with CH the feature chunks per lane for the problem's heads:
/// 2 (heads up to 64, the common size) or 8 (up to 256) - two instantiations per type keep the
/// build time in bounds.
template <class F>
void attention_chunks(const attention_problem& p, F&& f) {
  const index_t n = p.d > p.dv ? p.d : p.dv;
  TRAINKIT_CHECK(n <= 256, usage_error, "scaled_dot_product_attention",
                 "head sizes up to 256 on CUDA; got d " << p.d << ", dv " << p.dv);
  if (n <= 64) f(std::integral_constant<int, 2>{});
  else f(std::integral_constant<int, 8>{});
}

}  // namespace gpu::detail

/// The two routes of attention<cuda>.
enum class cuda_attention_route { none, own, cudnn };

template <>
struct attention<cuda> {
  /// dq, dk and dv dense, [B, H, T, features] (what cuDNN's backward writes; the input's layout,
  /// as the CPU's backward takes it, is not taken here yet).
  static constexpr bool strided_gradients = false;
  /// The gradients are A values as the products left them: a 16-bit caller rounds them.
  static constexpr bool rounds_gradients = false;

  /// The route the last forward or backward of this thread took (for tests and benchmarks).
  static cuda_attention_route& last_route() {
    thread_local cuda_attention_route r = cuda_attention_route::none;
    return r;
  }

  template <class R = void, class G, class A>
  static void forward(const attention_problem& p, attention_view<const G> q, attention_view<const G> k,
                      attention_view<const G> v, const attention_mask<A>& mask, attention_view<G> out, A* lse) {
    check_types<R, G, A>();
    if (p.batch * p.heads * p.tq == 0) return;
#if TRAINKIT_HAS_CUDNN_FRONTEND
    if constexpr (cudnn_types<G, A>())
      if (mask.p == nullptr && gpu::settings().cudnn_attention) {
        namespace ca = gpu::cudnn_attention;
        const ca::operand o = operand_of(out);
        cudnnHandle_t h = gpu::detail::cudnn();
        // The backward's upstream gradient is not known yet: the pair is found for a gradient in
        // the output's layout (the usual case: the gradient of a merged-head view).
        if (const ca::plan* pl = plan_for<G>(h, p, q, k, v, o, o)) {
          gpu::detail::scratch<> ws{std::size_t(ca::forward_workspace(*pl))};
          ca::forward(*pl, h, operand_of(q), operand_of(k), operand_of(v), out.p, lse, ws.p);
          last_route() = cuda_attention_route::cudnn;
          return;
        }
      }
#endif
    last_route() = cuda_attention_route::own;
    namespace d = gpu::detail;
    const index_t rows = p.batch * p.heads * p.tq;
    d::attention_chunks(p, [&](auto ch) {
      d::attention_forward_kernel<decltype(ch)::value, R, G, A>
          <<<d::grid_for(rows, d::attention_warps), 32 * d::attention_warps, 0, gpu::current_stream()>>>(
              p, q, k, v, mask, out, lse);
    });
    gpu::check_launch("attention_forward_kernel");
  }

  template <class R = void, class G, class A>
  static void backward(const attention_problem& p, attention_view<const G> q, attention_view<const G> k,
                       attention_view<const G> v, const attention_mask<A>& mask, attention_view<const G> out,
                       const A* lse, attention_view<const G> dout, attention_view<A> dq_view,
                       attention_view<A> dk_view, attention_view<A> dv_view) {
    check_types<R, G, A>();
    namespace d = gpu::detail;
    const index_t qrows = p.batch * p.heads * p.tq, krows = p.batch * p.heads * p.tk;
    auto dense = [&](const attention_view<A>& x, index_t t, index_t f) {
      return (x.st == f || t <= 1) && (x.sh == t * f || p.heads <= 1) && (x.sb == p.heads * t * f || p.batch <= 1);
    };
    TRAINKIT_CHECK(dense(dq_view, p.tq, p.d) && dense(dk_view, p.tk, p.d) && dense(dv_view, p.tk, p.dv), usage_error,
                   "attention<cuda>::backward", "dq, dk and dv must be dense [batch, heads, tokens, features] (strided_gradients)");
    A* dq = dq_view.p;
    A* dk = dk_view.p;
    A* dv = dv_view.p;
    cudaStream_t s = gpu::current_stream();
    if (qrows == 0 || krows == 0) {  // no query or no key: every gradient is 0
      if (qrows > 0) gpu::check(cudaMemsetAsync(dq, 0, sizeof(A) * std::size_t(qrows * p.d), s), "cudaMemsetAsync");
      if (krows > 0) {
        gpu::check(cudaMemsetAsync(dk, 0, sizeof(A) * std::size_t(krows * p.d), s), "cudaMemsetAsync");
        gpu::check(cudaMemsetAsync(dv, 0, sizeof(A) * std::size_t(krows * p.dv), s), "cudaMemsetAsync");
      }
      return;
    }
#if TRAINKIT_HAS_CUDNN_FRONTEND
    if constexpr (cudnn_types<G, A>())
      if (mask.p == nullptr && gpu::settings().cudnn_attention) {
        namespace ca = gpu::cudnn_attention;
        cudnnHandle_t h = gpu::detail::cudnn();
        if (const ca::plan* pl = plan_for<G>(h, p, q, k, v, operand_of(out), operand_of(dout))) {
          const index_t nq = qrows * p.d, nk = krows * p.d, nv = krows * p.dv;
          const index_t padded = (nq + 7) / 8 * 8 + (nk + 7) / 8 * 8 + nv;  // each part 16-byte aligned
          gpu::detail::scratch<G> grads{std::size_t(padded)};
          G* dq16 = grads.p;
          G* dk16 = dq16 + (nq + 7) / 8 * 8;
          G* dv16 = dk16 + (nk + 7) / 8 * 8;
          {
            gpu::detail::scratch<> ws{std::size_t(ca::backward_workspace(*pl))};
            ca::backward(*pl, h, operand_of(q), operand_of(k), operand_of(v), operand_of(out), lse,
                         operand_of(dout), dq16, dk16, dv16, ws.p);
          }
          widen(dq16, nq, dq, s);
          widen(dk16, nk, dk, s);
          widen(dv16, nv, dv, s);
          last_route() = cuda_attention_route::cudnn;
          return;
        }
      }
#endif
    last_route() = cuda_attention_route::own;
    gpu::detail::scratch<A> rows{std::size_t(qrows)};  // D = rowsum(dO O), from the query pass to the key pass
    A* drow = rows.p;
    d::attention_chunks(p, [&](auto ch) {
      constexpr int CH = decltype(ch)::value;
      d::attention_backward_q_kernel<CH, R, G, A><<<d::grid_for(qrows, d::attention_warps), 32 * d::attention_warps, 0, s>>>(
          p, q, k, v, mask, out, lse, dout, drow, dq);
      gpu::check_launch("attention_backward_q_kernel");
      d::attention_backward_kv_kernel<CH, R, G, A>
          <<<d::grid_for(krows, d::attention_warps), 32 * d::attention_warps, 0, s>>>(p, q, k, v, mask, lse, dout,
                                                                                       drow, dk, dv);
      gpu::check_launch("attention_backward_kv_kernel");
    });
  }

 private:
#if TRAINKIT_HAS_CUDNN_FRONTEND
  template <class V>
  static gpu::cudnn_attention::operand operand_of(const V& x) {
    return {x.p, x.sb, x.sh, x.st};
  }
  template <class G>
  static const gpu::cudnn_attention::plan* plan_for(cudnnHandle_t h, const attention_problem& p,
                                                    attention_view<const G> q,
                                                    attention_view<const G> k, attention_view<const G> v,
                                                    const gpu::cudnn_attention::operand& out,
                                                    const gpu::cudnn_attention::operand& dout) {
    return gpu::cudnn_attention::find(std::is_same_v<G, bfloat16>, p, operand_of(q), operand_of(k), operand_of(v), out,
                                      dout, gpu::current_device(), gpu::settings().deterministic, h);
  }
  template <class G>
  static void widen(const G* in, index_t n, float* out, cudaStream_t s) {
    namespace d = gpu::detail;
    if (n == 0) return;
    const unsigned blocks = std::min(d::grid_for(n, d::block_threads), 4096u);
    d::attention_widen_kernel<G><<<blocks, d::block_threads, 0, s>>>(in, n, out);
    gpu::check_launch("attention_widen_kernel");
  }
#endif

  template <class R, class G, class A>
  static constexpr void check_types() {
    static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "attention<cuda>: sums in float or double");
    static_assert(std::is_same_v<G, A> ||
                      ((std::is_same_v<G, bfloat16> || std::is_same_v<G, half>) && std::is_same_v<A, float>),
                  "attention<cuda>: operands of the accumulator's type, or bfloat16 / half with float sums");
    static_assert(std::is_void_v<R> || std::is_same_v<R, A> || std::is_same_v<R, bfloat16> || std::is_same_v<R, half>,
                  "attention<cuda>: rounding to bfloat16 or half, or none");
    static_assert(std::is_same_v<G, A> || std::is_same_v<R, G>, "attention<cuda>: 16-bit operands round to their type");
  }
  /// Whether cuDNN's fused attention takes these types (16-bit operands, fp32 statistics).
  template <class G, class A>
  static constexpr bool cudnn_types() {
    return (std::is_same_v<G, bfloat16> || std::is_same_v<G, half>) && std::is_same_v<A, float>;
  }
};

}  // namespace trainkit::backend
