// trainkit/backend/cpu/attention.hpp - fused scaled dot-product attention on the host: for each
// (batch, head) a tile of 64 queries meets the keys 64 at a time on OpenBLAS (against copies of
// K^T and V^T), 128 and 256 on oneDNN (bf16 operands; fp32 where measured faster: tile_plan);
// scores and products are GEMMs (one thread each inside the parallel loop), the softmax is online
// (running max and sum, the output rescaled as the max grows; exp on AVX-512 or AVX2 lanes), so
// memory is O(T d) and no T x T matrix exists.
// The backward (flash attention 2) recomputes each tile's probabilities from the saved log-sum-exp:
//   P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)), dQ += s dS K, dK += s dS^T Q
// With dropout, the kept probabilities P Z (Z = 0 or 1 / (1 - p), regenerated from the Philox
// stream per tile) multiply V, the row sums stay those of P, and the backward is
//   dV += (P Z)^T dO, dS = P (Z dP - rowsum(dO O)).
// Work is split over (batch, head, query tile) forward and over (batch, head) backward (a head's
// dK and dV are summed over every query tile, so one thread owns the head).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>  // std::snprintf: route keys
#include <limits>
#include <type_traits>
#include <vector>

#include "trainkit/backend/attention.hpp"
#include "trainkit/backend/cpu/blas.hpp"
#include "trainkit/backend/cpu/convert16.hpp"  // the bf16 tiles
#include "trainkit/backend/cpu/measured_route.hpp"  // fp32_on_onednn
#include "trainkit/backend/cpu/onednn_gemm.hpp"  // the tiles' GEMMs
#include "trainkit/config.hpp"
#include "trainkit/core/generator.hpp"  // bernoulli_at: the dropout stream
#include "trainkit/core/wait_governor.hpp"  // start_wait_governor

// The fp32 rows' exp and max take AVX2 + FMA where the CPU has them (chosen at run time; the
// polynomial in backend/cpu/vector_math.hpp).
#include "trainkit/backend/cpu/vector_math.hpp"

namespace trainkit::backend {

namespace detail {
#if TRAINKIT_CPU_VECTOR_MATH
/// s[c] = exp(s[c] - m) for c < n; returns their sum.
[[gnu::target("avx2,fma")]] inline float exp_shift_sum_avx2(float* s, index_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  index_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + c), vm));
    _mm256_storeu_ps(s + c, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum_avx2(acc);
  for (; c < n; ++c) sum += (s[c] = std::exp(s[c] - m));
  return sum;
}

/// exp_shift_sum_avx2 on 16 lanes: the same values; the sum's order differs.
[[gnu::target("avx512f,avx512dq")]] inline float exp_shift_sum_avx512(float* s, index_t n, float m) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  index_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + c), vm));
    _mm512_storeu_ps(s + c, e);
    acc = _mm512_add_ps(acc, e);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  float sum = 0;
  for (float x : lanes) sum += x;
  for (; c < n; ++c) sum += (s[c] = std::exp(s[c] - m));
  return sum;
}

/// row_max_avx2 on 16 lanes.
[[gnu::target("avx512f")]] inline float row_max_avx512(const float* s, index_t n, float m) {
  __m512 acc = _mm512_set1_ps(m);
  index_t c = 0;
  for (; c + 16 <= n; c += 16)
    acc = _mm512_maskz_max_ps(0xffff, _mm512_loadu_ps(s + c), acc);  // NaN: acc kept (all-lanes maskz: see exp_avx512)
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  for (float x : lanes) m = std::max(m, x);
  for (; c < n; ++c) m = std::max(m, s[c]);
  return m;
}

/// max(m, s[0..n)) (a NaN in s is skipped, as std::max(m, NaN) does).
[[gnu::target("avx2,fma")]] inline float row_max_avx2(const float* s, index_t n, float m) {
  __m256 acc = _mm256_set1_ps(m);
  index_t c = 0;
  for (; c + 8 <= n; c += 8) acc = _mm256_max_ps(_mm256_loadu_ps(s + c), acc);  // NaN: acc kept
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float x : lanes) m = std::max(m, x);
  for (; c < n; ++c) m = std::max(m, s[c]);
  return m;
}
#endif

/// The rows of a score tile: max, and exp(s - m) in place with its sum.
template <class T>
T attention_row_max(const T* s, index_t n, T m) {
#if TRAINKIT_CPU_VECTOR_MATH
  if constexpr (std::is_same_v<T, float>) {
    if (has_avx512()) return row_max_avx512(s, n, m);
    if (has_avx2_fma()) return row_max_avx2(s, n, m);
  }
#endif
  for (index_t c = 0; c < n; ++c) m = std::max(m, s[c]);
  return m;
}
template <class T>
T attention_exp_shift_sum(T* s, index_t n, T m) {
#if TRAINKIT_CPU_VECTOR_MATH
  if constexpr (std::is_same_v<T, float>) {
    if (has_avx512()) return exp_shift_sum_avx512(s, n, m);
    if (has_avx2_fma()) return exp_shift_sum_avx2(s, n, m);
  }
#endif
  T sum = 0;
  for (index_t c = 0; c < n; ++c) sum += (s[c] = std::exp(s[c] - m));
  return sum;
}
}  // namespace detail

template <>
struct attention<cpu> {
  /// dq, dk and dv in any layout whose features are contiguous (autograd gives them their input's).
  static constexpr bool strided_gradients = true;
  /// With R narrower than A and G = A, each head's dq, dk and dv are rounded to R as its backward
  /// ends, while they are in cache (on the CPU's widened bf16 route this was three passes of their own).
  static constexpr bool rounds_gradients = true;

  /// How a call's tiles run: the query and key tile sizes, and whether the tiles run on oneDNN.
  struct tile_plan {
    index_t block_q = 64, block_k = 64;
    bool onednn = false;
    /// Whether the products that take K or V transposed (the scores Q K^T, dP = dO V^T) read copies
    /// of K^T and V^T instead: on OpenBLAS. It takes row-major A B^T as its column-major "tn"
    /// product, whose small-matrix kernel it refuses for a 64 x 64 output, so each such tile went
    /// through the packing path - 40 % of a T = 1024 forward + backward in sgemm_tn and its copies on
    /// an AVX-512 Xeon. A head's copy costs one pass over T x d. oneDNN reads the layout as it is.
    bool transposes() const { return !onednn; }
  };

  /// The plan for operands G: 64 x 64 on OpenBLAS (its small-matrix kernels, which skip the
  /// packing, stop at about 64^3 multiply-adds: 128 x 128 tiles were 7-10 % slower on an AVX-512
  /// Xeon), with copies of K^T and V^T; 128 x 256 on oneDNN (bf16 operands always; fp32 where
  /// measured faster, fp32_on_onednn), whose fixed cost per call weighs on a 64^3 product (bf16
  /// there 1.2-1.3x faster at T = 1024: 84 against 106 ms forward + backward with AMX).
  template <class G, class A>
  static tile_plan plan(bool onednn_fp32) {
    const bool onednn = !std::is_same_v<G, A> || onednn_fp32;
    return onednn ? tile_plan{128, 256, true} : tile_plan{64, 64, false};
  }

  /// R: the compute type to round P, dS and the outputs to (void: none); G: the operands' type
  /// (A, or bfloat16 multiplied by oneDNN's bf16 kernels into fp32); A: scores and accumulators.
  template <class R = void, class G, class A>
  static void forward(const attention_problem& p, attention_view<const G> q, attention_view<const G> k,
                      attention_view<const G> v, const attention_mask<A>& mask, attention_view<G> out, A* lse) {
    check_types<R, G, A>();
    std::vector<G> o;  // a trial's output, dense [B, H, Tq, dv], and log-sum-exp
    std::vector<A> l;
    const bool onednn = fp32_on_onednn<R, G, A>("forward", p, q, k, v, mask, [&](const tile_plan& t, const attention_problem& trial) {
      if (o.empty()) o.resize(std::size_t(p.batch * p.heads * p.tq * p.dv)), l.resize(std::size_t(p.batch * p.heads * p.tq));
      forward_tiles<R>(t, trial, q, k, v, mask, attention_view<G>{o.data(), p.heads * p.tq * p.dv, p.tq * p.dv, p.dv},
                       l.data());
    });
    forward_tiles<R>(plan<G, A>(onednn), p, q, k, v, mask, out, lse);
  }

  template <class R = void, class G, class A>
  static void backward(const attention_problem& p, attention_view<const G> q, attention_view<const G> k,
                       attention_view<const G> v, const attention_mask<A>& mask, attention_view<const G> out,
                       const A* lse, attention_view<const G> dout, attention_view<A> dq, attention_view<A> dk,
                       attention_view<A> dv) {
    check_types<R, G, A>();
    std::vector<A> g;  // a trial's dq, dk and dv, dense
    const bool onednn = fp32_on_onednn<R, G, A>("backward", p, q, k, v, mask, [&](const tile_plan& t, const attention_problem& trial) {
      const index_t nq = p.batch * p.heads * p.tq * p.d, nk = p.batch * p.heads * p.tk * p.d;
      if (g.empty()) g.resize(std::size_t(nq + nk + p.batch * p.heads * p.tk * p.dv));
      auto dense = [&](A* at, index_t t, index_t f) { return attention_view<A>{at, p.heads * t * f, t * f, f}; };
      backward_tiles<R>(t, trial, q, k, v, mask, out, lse, dout, dense(g.data(), p.tq, p.d),
                        dense(g.data() + nq, p.tk, p.d), dense(g.data() + nq + nk, p.tk, p.dv));
    });
    backward_tiles<R>(plan<G, A>(onednn), p, q, k, v, mask, out, lse, dout, dq, dk, dv);
  }

 private:
  template <class R, class G, class A>
  static void forward_tiles(const tile_plan& t, const attention_problem& p, attention_view<const G> q,
                            attention_view<const G> k, attention_view<const G> v, const attention_mask<A>& mask,
                            attention_view<G> out, A* lse) {
    const index_t block_q = t.block_q, block_k = t.block_k;
    const index_t nq = (p.tq + block_q - 1) / block_q, items = p.batch * p.heads * nq;
    // K^T of every head, [d x tk] each, where the scores take it (tile_plan::transposes()).
    std::vector<G> kt(t.transposes() ? std::size_t(p.batch * p.heads * p.d * p.tk) : 0);
    if (t.transposes())
      run(p.batch * p.heads, double(p.tk) * double(p.d), [&](auto&& for_items) {
        for_items([&](index_t bh) { transpose(k.at(bh / p.heads, bh % p.heads), k.st, p.tk, p.d, kt.data() + bh * p.d * p.tk); });
      });
    run(items, double(p.tq) * double(p.tk) * double(p.d + p.dv), [&](auto&& for_items) {
      std::vector<A> s(std::size_t(block_q * block_k)), acc(std::size_t(block_q * p.dv)), m(block_q), l(block_q);
      std::vector<G> sg(converts<R, G, A>() ? s.size() : 0);  // P as the P V product takes it
      for_items([&](index_t item) {
        const index_t bh = item / nq, i0 = (item % nq) * block_q, bq = std::min(block_q, p.tq - i0);
        const index_t b = bh / p.heads, h = bh % p.heads;
        const G* qi = q.at(b, h) + i0 * q.st;
        const key_tiles<G> keys = t.transposes() ? key_tiles<G>{kt.data() + bh * p.d * p.tk, p.tk, true}
                                                     : key_tiles<G>{k.at(b, h), k.st, false};
        const G* vb = v.at(b, h);
        std::fill(acc.begin(), acc.begin() + bq * p.dv, A(0));
        std::fill(m.begin(), m.end(), -inf<A>());
        std::fill(l.begin(), l.end(), A(0));
        const index_t j_end = p.causal ? std::min(p.tk, i0 + bq) : p.tk;  // keys past the tile's last row: masked
        for (index_t j0 = 0; j0 < j_end; j0 += block_k) {
          const index_t bk = std::min(block_k, j_end - j0);
          scores(t, p, mask, b, h, i0, bq, j0, bk, qi, q.st, keys, s.data());
          for (index_t r = 0; r < bq; ++r) {
            A* sr = s.data() + r * bk;
            const A mx = detail::attention_row_max(sr, bk, m[r]);
            if (mx == -inf<A>()) {  // every key so far masked from this row
              std::fill(sr, sr + bk, A(0));
              continue;
            }
            const A rescale = std::exp(m[r] - mx);  // 0 when m[r] was -inf
            const A sum = detail::attention_exp_shift_sum(sr, bk, mx);
            l[r] = l[r] * rescale + sum;
            m[r] = mx;
            if (p.dropout_p > 0) apply_dropout(p, bh, i0 + r, j0, bk, sr);
            if (rescale != A(1))
              for (A *a = acc.data() + r * p.dv, *e = a + p.dv; a != e; ++a) *a *= rescale;
          }
          tile_gemm(t.onednn, false, false, bq, p.dv, bk, 1.0, operand<R>(s.data(), sg.data(), bq * bk), bk, vb + j0 * v.st, v.st,
                    1.0, acc.data(), p.dv);
        }
        G* oi = out.at(b, h) + i0 * out.st;
        A* li = lse + bh * p.tq + i0;
        for (index_t r = 0; r < bq; ++r) {
          const bool empty = l[r] == A(0);
          const A inv = empty ? A(0) : A(1) / l[r];
          for (index_t c = 0; c < p.dv; ++c) oi[r * out.st + c] = narrow<R, G>(acc[std::size_t(r * p.dv + c)] * inv);
          li[r] = empty ? inf<A>() : m[r] + std::log(l[r]);
        }
      });
    });
  }

  template <class R, class G, class A>
  static void backward_tiles(const tile_plan& t, const attention_problem& p, attention_view<const G> q,
                             attention_view<const G> k, attention_view<const G> v, const attention_mask<A>& mask,
                             attention_view<const G> out, const A* lse, attention_view<const G> dout,
                             attention_view<A> dq, attention_view<A> dk, attention_view<A> dv) {
    const index_t block_q = t.block_q, block_k = t.block_k;
    const index_t items = p.batch * p.heads;
    run(items, double(p.tq) * double(p.tk) * double(2 * p.d + 2 * p.dv), [&](auto&& for_items) {
      std::vector<A> s(std::size_t(block_q * block_k)), dp(std::size_t(block_q * block_k)), drow(std::size_t(p.tq));
      std::vector<A> z, pz;  // with dropout: the tile's Z and P Z
      if (p.dropout_p > 0) z.resize(s.size()), pz.resize(s.size());
      std::vector<G> sg(converts<R, G, A>() ? s.size() : 0);  // P Z, then dS, as their products take them
      // This head's K^T and V^T, [d x tk] and [dv x tk], where the products take them (tile_plan::transposes()).
      std::vector<G> kt(t.transposes() ? std::size_t(p.d * p.tk) : 0), vt(t.transposes() ? std::size_t(p.dv * p.tk) : 0);
      for_items([&](index_t bh) {
        const index_t b = bh / p.heads, h = bh % p.heads;
        const G* qb = q.at(b, h);
        const G* kb = k.at(b, h);
        const G* vb = v.at(b, h);
        const G* ob = out.at(b, h);
        const G* gb = dout.at(b, h);
        const A* lb = lse + bh * p.tq;
        A* dqb = dq.at(b, h);
        A* dkb = dk.at(b, h);
        A* dvb = dv.at(b, h);
        const index_t ldq = dq.st, ldk = dk.st, ldv = dv.st;
        // Each gradient row is written by its first product (beta 0) and summed into by the rest;
        // rows no product reaches are zeroed (a fill of them all first was 4 % of an attention
        // layer's time once the rows lay apart, [B, T, H, d]).
        auto zero = [](A* x, index_t ld, index_t rows, index_t cols) {
          for_rows(x, ld, rows, cols, [](A* r, index_t n) { std::fill(r, r + n, A(0)); });
        };
        if (p.tk == 0) zero(dqb, ldq, p.tq, p.d);
        if (t.transposes()) {
          transpose(kb, k.st, p.tk, p.d, kt.data());
          transpose(vb, v.st, p.tk, p.dv, vt.data());
        }
        const key_tiles<G> keys = t.transposes() ? key_tiles<G>{kt.data(), p.tk, true} : key_tiles<G>{kb, k.st, false};
        for (index_t i = 0; i < p.tq; ++i) {  // rowsum(dO * O)
          A acc = 0;
          for (index_t c = 0; c < p.dv; ++c) acc += A(gb[i * dout.st + c]) * A(ob[i * out.st + c]);
          drow[std::size_t(i)] = acc;
        }
        for (index_t j0 = 0; j0 < p.tk; j0 += block_k) {
          const index_t bk = std::min(block_k, p.tk - j0);
          const index_t i_begin = p.causal ? j0 / block_q * block_q : 0;  // earlier query tiles see none of these keys
          if (i_begin >= p.tq) {  // no query sees these keys
            zero(dkb + j0 * ldk, ldk, bk, p.d);
            zero(dvb + j0 * ldv, ldv, bk, p.dv);
          }
          const double first_k = j0 == 0 ? 0.0 : 1.0;  // beta of dQ_i's product: 0 at the first key tile
          for (index_t i0 = i_begin; i0 < p.tq; i0 += block_q) {
            const double first_q = i0 == i_begin ? 0.0 : 1.0;  // beta of dK_j's and dV_j's: 0 at their first query tile
            const index_t bq = std::min(block_q, p.tq - i0);
            scores(t, p, mask, b, h, i0, bq, j0, bk, qb + i0 * q.st, q.st, keys, s.data());
            for (index_t r = 0; r < bq; ++r) {
              const A lr = lb[i0 + r];
              A* sr = s.data() + r * bk;
              if (lr == inf<A>())  // a row hidden from every key
                std::fill(sr, sr + bk, A(0));
              else
                detail::attention_exp_shift_sum(sr, bk, lr);
            }
            const bool drop = p.dropout_p > 0;
            if (drop) {
              for (index_t r = 0; r < bq; ++r) {
                A* zr = z.data() + r * bk;
                std::fill(zr, zr + bk, A(1));
                apply_dropout(p, bh, i0 + r, j0, bk, zr);
              }
              for (index_t e = 0; e < bq * bk; ++e) pz[std::size_t(e)] = s[std::size_t(e)] * z[std::size_t(e)];
            }
            // dV_j += (P Z)^T dO_i;  dP = dO_i V_j^T (then Z dP)
            tile_gemm(t.onednn, true, false, bk, p.dv, bq, 1.0, operand<R>(drop ? pz.data() : s.data(), sg.data(), bq * bk), bk,
                      gb + i0 * dout.st, dout.st, first_q, dvb + j0 * ldv, ldv);
            if (t.transposes())
              tile_gemm(t.onednn, false, false, bq, bk, p.dv, 1.0, gb + i0 * dout.st, dout.st, vt.data() + j0, p.tk, 0.0, dp.data(),
                        bk);
            else
              tile_gemm(t.onednn, false, true, bq, bk, p.dv, 1.0, gb + i0 * dout.st, dout.st, vb + j0 * v.st, v.st, 0.0,
                        dp.data(), bk);
            if (drop)
              for (index_t e = 0; e < bq * bk; ++e) dp[std::size_t(e)] *= z[std::size_t(e)];
            for (index_t r = 0; r < bq; ++r) {
              const A dr = drow[std::size_t(i0 + r)];
              A* sr = s.data() + r * bk;
              const A* pr = dp.data() + r * bk;
              for (index_t c = 0; c < bk; ++c) sr[c] = sr[c] * (pr[c] - dr);  // dS, in place of P
            }
            // dQ_i += s dS K_j;  dK_j += s dS^T Q_i
            const G* ds = operand<R>(s.data(), sg.data(), bq * bk);
            tile_gemm(t.onednn, false, false, bq, p.d, bk, p.scale, ds, bk, kb + j0 * k.st, k.st, first_k, dqb + i0 * ldq,
                      ldq);
            tile_gemm(t.onednn, true, false, bk, p.d, bq, p.scale, ds, bk, qb + i0 * q.st, q.st, first_q, dkb + j0 * ldk,
                      ldk);
          }
        }
        if constexpr (std::is_same_v<G, A> && converts<R, G, A>()) {  // rounds_gradients
          round_rows<R>(dqb, ldq, p.tq, p.d);
          round_rows<R>(dkb, ldk, p.tk, p.d);
          round_rows<R>(dvb, ldv, p.tk, p.dv);
        }
      });
    });
  }

  template <class T>
  static constexpr T inf() {
    return std::numeric_limits<T>::infinity();
  }

  /// row[c] *= Z(b, h, i, j0 + c) for c < bk: 0, or 1 / (1 - p) where the Philox stream keeps it
  /// (attention_problem's rule; one Philox block per four consecutive elements of the stream).
  template <class T>
  static void apply_dropout(const attention_problem& p, index_t bh, index_t i, index_t j0, index_t bk, T* row) {
    const float keep = float(1.0 - p.dropout_p);
    const T scale = T(1.0 / (1.0 - p.dropout_p));
    const std::uint64_t first = (std::uint64_t(bh) * std::uint64_t(p.tq) + std::uint64_t(i)) * std::uint64_t(p.tk) +
                                std::uint64_t(j0);
    std::uint64_t block = ~std::uint64_t(0);
    philox_result words{};
    for (index_t c = 0; c < bk; ++c) {
      const std::uint64_t e = first + std::uint64_t(c);
      if (e / 4 != block) block = e / 4, words = philox_block(p.seed, p.offset + block);
      row[c] = uniform_float(words.v[e % 4]) < keep ? row[c] * scale : T(0);
    }
  }

  /// A head's keys as the scores take them: K [tk x d] rows ld apart, or K^T [d x tk] (transposed).
  template <class G>
  struct key_tiles {
    const G* p;
    index_t ld;
    bool transposed;
  };

  /// s[bq x bk] = scale * Q_i K_j^T + mask, -inf where causal hides key j from query i.
  template <class G, class A>
  static void scores(const tile_plan& t, const attention_problem& p, const attention_mask<A>& mask, index_t b, index_t h, index_t i0,
                     index_t bq, index_t j0, index_t bk, const G* qi, index_t ldq, const key_tiles<G>& keys, A* s) {
    if (keys.transposed)
      tile_gemm(t.onednn, false, false, bq, bk, p.d, p.scale, qi, ldq, keys.p + j0, keys.ld, 0.0, s, bk);
    else
      tile_gemm(t.onednn, false, true, bq, bk, p.d, p.scale, qi, ldq, keys.p + j0 * keys.ld, keys.ld, 0.0, s, bk);
    if (mask.p != nullptr) {
      const A* mb = mask.p + b * mask.sb + h * mask.sh;
      for (index_t r = 0; r < bq; ++r) {
        const A* mr = mb + (i0 + r) * mask.sq + j0 * mask.sk;
        A* sr = s + r * bk;
        for (index_t c = 0; c < bk; ++c) sr[c] += mr[c * mask.sk];
      }
    }
    if (p.causal && j0 + bk - 1 > i0)
      for (index_t r = 0; r < bq; ++r)
        for (index_t c = std::max<index_t>(0, i0 + r + 1 - j0); c < bk; ++c) s[r * bk + c] = -inf<A>();
  }

  template <class R, class G, class A>
  static constexpr void check_types() {
    static_assert(std::is_floating_point_v<A>, "attention<cpu>: scores and sums in float or double");
    static_assert(std::is_same_v<G, A> || (std::is_same_v<G, bfloat16> && std::is_same_v<A, float>),
                  "attention<cpu>: operands of the accumulator's type, or bfloat16 with float sums");
    static_assert(std::is_void_v<R> || std::is_same_v<R, A> || std::is_same_v<R, bfloat16> || std::is_same_v<R, half>,
                  "attention<cpu>: rounding to bfloat16 or half, or none");
    static_assert(!std::is_same_v<G, bfloat16> || std::is_same_v<R, bfloat16>, "attention<cpu>: bf16 operands round to bf16");
  }

  /// Whether a score tile is converted before it is multiplied (rounded, or narrowed to G).
  template <class R, class G, class A>
  static constexpr bool converts() {
    return !std::is_same_v<G, A> || !(std::is_void_v<R> || std::is_same_v<R, A>);
  }

  /// The n scores s as the next product takes them: s itself, or buf holding them rounded to R
  /// (as A values, or narrowed to G).
  template <class R, class G, class A>
  static const G* operand(const A* s, G* buf, index_t n) {
    if constexpr (!converts<R, G, A>()) {
      (void)buf, (void)n;
      return s;
    } else if constexpr (std::is_same_v<G, bfloat16>) {
      cpu_convert::round_to_bfloat16(s, buf, n);
      return buf;
    } else if constexpr (std::is_same_v<R, bfloat16> && std::is_same_v<A, float>) {
      cpu_convert::round_to_bfloat16_values(s, buf, n);
      return buf;
    } else {
      for (index_t e = 0; e < n; ++e) buf[e] = G(R(s[e]));
      return buf;
    }
  }

  /// f(row, cols) for each of rows rows of cols elements, ld apart (one call when they are dense).
  template <class T, class F>
  static void for_rows(T* x, index_t ld, index_t rows, index_t cols, F&& f) {
    if (ld == cols) return f(x, rows * cols);
    for (index_t r = 0; r < rows; ++r) f(x + r * ld, cols);
  }

  /// rows rows of cols A elements, ld apart, rounded to R's values in place.
  template <class R, class A>
  static void round_rows(A* x, index_t ld, index_t rows, index_t cols) {
    if constexpr (std::is_same_v<R, bfloat16> && std::is_same_v<A, float>) {
      if (ld == cols) cols *= rows, rows = 1;  // one call when they are dense
      cpu_convert::round_rows_to_bfloat16_values(x, ld, rows, cols);
    } else {
      for_rows(x, ld, rows, cols, [](A* r, index_t n) {
        for (index_t c = 0; c < n; ++c) r[c] = A(R(r[c]));
      });
    }
  }

  /// x [rows x cols], rows ld apart, transposed into out [cols x rows], 8 x 8 blocks at a time.
  template <class G>
  static void transpose(const G* x, index_t ld, index_t rows, index_t cols, G* out) {
    constexpr index_t blk = 8;
    for (index_t r0 = 0; r0 < rows; r0 += blk)
      for (index_t c0 = 0; c0 < cols; c0 += blk) {
        const index_t re = std::min(rows, r0 + blk), ce = std::min(cols, c0 + blk);
        for (index_t r = r0; r < re; ++r)
          for (index_t c = c0; c < ce; ++c) out[c * rows + r] = x[r * ld + c];
      }
  }

  /// x rounded to R (void: as is) as a G.
  template <class R, class G, class A>
  static G narrow(A x) {
    if constexpr (std::is_void_v<R> || std::is_same_v<R, A>)
      return G(x);
    else
      return G(R(x));
  }

  /// C (A) = alpha op(A) op(B) + beta C for the tiles: bfloat16 operands through oneDNN's bf16
  /// kernels with fp32 results (64 x 64 x 64: 2.8-3.2 us on the AVX512-BF16 EPYC, against
  /// OpenBLAS sgemm's 4.6-6.2 us); float through oneDNN's fp32 matmul where the plan says so, else
  /// (and double) through blas<cpu> (OpenBLAS inside the parallel loop).
  template <class G, class A>
  static void tile_gemm(bool onednn, bool ta, bool tb, index_t m, index_t n, index_t k, double alpha, const G* a,
                        index_t lda, const G* b, index_t ldb, double beta, A* c, index_t ldc) {
    if constexpr (std::is_same_v<G, A>) {
#if TRAINKIT_HAS_ONEDNN
      if constexpr (std::is_same_v<A, float>)
        if (onednn && onednn_gemm<G, A>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
#endif
      (void)onednn;
      blas<cpu>::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {
      (void)onednn;
#if TRAINKIT_HAS_ONEDNN
      if (onednn_gemm<G, A>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
#endif
      // No bf16 kernel after all: widen the two operands (exact) and multiply in fp32.
      auto widen = [](const G* x, index_t rows, index_t cols, index_t ld) {
        std::vector<A> w(std::size_t(rows * cols));
        for (index_t i = 0; i < rows; ++i) cpu_convert::widen_bfloat16(x + i * ld, w.data() + i * cols, cols);
        return w;
      };
      const auto wa = widen(a, ta ? k : m, ta ? m : k, lda), wb = widen(b, tb ? n : k, tb ? k : n, ldb);
      blas<cpu>::gemm(ta, tb, m, n, k, alpha, wa.data(), ta ? m : k, wb.data(), tb ? k : n, beta, c, ldc);
    }
  }

  /// Whether a pass's fp32 tiles (G = A = float) run on oneDNN's fp32 matmul in 128 x 256 tiles
  /// rather than on OpenBLAS in 64 x 64 ones: the route forced (TRAINKIT_CPU_GEMM=onednn|openblas),
  /// else the faster of the two for this pass, shape, layout and thread count on this machine -
  /// trial(plan, problem without dropout) runs the pass into scratch outputs - measured at its
  /// first call and kept in the route file (backend/cpu/measured_route.hpp: the routes sum in
  /// another order, so a choice must hold for the whole training). Forward and backward choose
  /// apart: on a 2-core AVX-512 Xeon oneDNN's forward was 1.2-1.4x faster on [4, 8, T, 64] heads
  /// (T = 256, 1024, causal or not), its backward as fast without a mask and slower with a causal one.
  template <class R, class G, class A, class Trial>
  static bool fp32_on_onednn(const char* pass, const attention_problem& p, attention_view<const G> q,
                             attention_view<const G> k, attention_view<const G> v, const attention_mask<A>& mask,
                             Trial&& trial) {
#if TRAINKIT_HAS_ONEDNN
    if constexpr (std::is_same_v<G, float> && std::is_same_v<A, float>) {
      const cpu_gemm_route forced = get_cpu_gemm_route();
      if (forced != cpu_gemm_route::automatic) return forced == cpu_gemm_route::onednn;
      // Small problems (under 2^20 multiply-adds in all) stay on OpenBLAS unmeasured.
      const double work = double(p.batch * p.heads) * double(p.tq) * double(p.tk) * double(p.d + p.dv);
      if (!detail::may_measure() || work < blas<cpu>::parallel_grain) return false;
      char key[224];
      std::snprintf(key, sizeof key,
                    "sdpa fp32 %s b%lld h%lld tq%lld tk%lld d%lld dv%lld c%d m%d r%d ld%lld,%lld,%lld t%d", pass,
                    (long long)p.batch, (long long)p.heads, (long long)p.tq, (long long)p.tk, (long long)p.d,
                    (long long)p.dv, int(p.causal), int(mask.p != nullptr), int(!std::is_void_v<R>), (long long)q.st,
                    (long long)k.st, (long long)v.st, detail::route_threads());
      return detail::route_table::get().choose(key, [&](bool onednn) {
        attention_problem without_dropout = p;
        without_dropout.dropout_p = 0;
        trial(plan<G, A>(onednn), without_dropout);
        return true;
      });
    }
#endif
    (void)pass, (void)p, (void)q, (void)k, (void)v, (void)mask, (void)trial;
    return false;
  }

  /// body(for_items): for_items(f) calls f(item) for this thread's share of [0, items) - over
  /// OpenMP threads when the work (multiply-adds) is worth a parallel region, each thread keeping
  /// the scratch body allocated.
  template <class Body>
  static void run(index_t items, double work, Body&& body) {
#if TRAINKIT_HAS_OPENMP
    if (items > 1 && work * double(items) >= blas<cpu>::parallel_grain && !omp_in_parallel()) {
      ::trainkit::detail::start_wait_governor();
#pragma omp parallel
      body([&](auto&& f) {
#pragma omp for schedule(dynamic, 1)
        for (index_t i = 0; i < items; ++i) f(i);
      });
      return;
    }
#endif
    (void)work;
    body([&](auto&& f) {
      for (index_t i = 0; i < items; ++i) f(i);
    });
  }
};

}  // namespace trainkit::backend
