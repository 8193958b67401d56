// trainkit/backend/cpu/attention.hpp - fused scaled dot-product attention on the host: for each
// (batch, head) a tile of 64 queries meets the keys 64 at a time; scores and products are GEMMs
// (blas<cpu>, one thread each inside the parallel loop), the softmax is online (running max and
// sum, the output rescaled as the max grows), so memory is O(T d) and no T x T matrix exists.
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
#include <limits>
#include <type_traits>
#include <vector>

#include "trainkit/backend/attention.hpp"
#include "trainkit/backend/cpu/blas.hpp"
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
  if constexpr (std::is_same_v<T, float>)
    if (has_avx2_fma()) return row_max_avx2(s, n, m);
#endif
  for (index_t c = 0; c < n; ++c) m = std::max(m, s[c]);
  return m;
}
template <class T>
T attention_exp_shift_sum(T* s, index_t n, T m) {
#if TRAINKIT_CPU_VECTOR_MATH
  if constexpr (std::is_same_v<T, float>)
    if (has_avx2_fma()) return exp_shift_sum_avx2(s, n, m);
#endif
  T sum = 0;
  for (index_t c = 0; c < n; ++c) sum += (s[c] = std::exp(s[c] - m));
  return sum;
}
}  // namespace detail

template <>
struct attention<cpu> {
  static constexpr index_t block_q = 64, block_k = 64;

  template <class T>
  static void forward(const attention_problem& p, const T* q, const T* k, const T* v, const attention_mask<T>& mask,
                      T* out, T* lse) {
    static_assert(std::is_floating_point_v<T>, "attention<cpu>: float or double");
    const index_t nq = (p.tq + block_q - 1) / block_q, items = p.batch * p.heads * nq;
    run(items, double(p.tq) * double(p.tk) * double(p.d + p.dv), [&](auto&& for_items) {
      std::vector<T> s(std::size_t(block_q * block_k)), acc(std::size_t(block_q * p.dv)), m(block_q), l(block_q);
      for_items([&](index_t item) {
        const index_t bh = item / nq, i0 = (item % nq) * block_q, bq = std::min(block_q, p.tq - i0);
        const index_t b = bh / p.heads, h = bh % p.heads;
        const T* qi = q + (bh * p.tq + i0) * p.d;
        const T* kb = k + bh * p.tk * p.d;
        const T* vb = v + bh * p.tk * p.dv;
        std::fill(acc.begin(), acc.begin() + bq * p.dv, T(0));
        std::fill(m.begin(), m.end(), -inf<T>());
        std::fill(l.begin(), l.end(), T(0));
        const index_t j_end = p.causal ? std::min(p.tk, i0 + bq) : p.tk;  // keys past the tile's last row: masked
        for (index_t j0 = 0; j0 < j_end; j0 += block_k) {
          const index_t bk = std::min(block_k, j_end - j0);
          scores(p, mask, b, h, i0, bq, j0, bk, qi, kb + j0 * p.d, s.data());
          for (index_t r = 0; r < bq; ++r) {
            T* sr = s.data() + r * bk;
            const T mx = detail::attention_row_max(sr, bk, m[r]);
            if (mx == -inf<T>()) {  // every key so far masked from this row
              std::fill(sr, sr + bk, T(0));
              continue;
            }
            const T rescale = std::exp(m[r] - mx);  // 0 when m[r] was -inf
            const T sum = detail::attention_exp_shift_sum(sr, bk, mx);
            l[r] = l[r] * rescale + sum;
            m[r] = mx;
            if (p.dropout_p > 0) apply_dropout(p, bh, i0 + r, j0, bk, sr);
            if (rescale != T(1))
              for (T *a = acc.data() + r * p.dv, *e = a + p.dv; a != e; ++a) *a *= rescale;
          }
          blas<cpu>::gemm(false, false, bq, p.dv, bk, 1.0, s.data(), bk, vb + j0 * p.dv, p.dv, 1.0, acc.data(), p.dv);
        }
        T* oi = out + (bh * p.tq + i0) * p.dv;
        T* li = lse + bh * p.tq + i0;
        for (index_t r = 0; r < bq; ++r) {
          const bool empty = l[r] == T(0);
          const T inv = empty ? T(0) : T(1) / l[r];
          for (index_t c = 0; c < p.dv; ++c) oi[r * p.dv + c] = acc[std::size_t(r * p.dv + c)] * inv;
          li[r] = empty ? inf<T>() : m[r] + std::log(l[r]);
        }
      });
    });
  }

  template <class T>
  static void backward(const attention_problem& p, const T* q, const T* k, const T* v, const attention_mask<T>& mask,
                       const T* out, const T* lse, const T* dout, T* dq, T* dk, T* dv) {
    static_assert(std::is_floating_point_v<T>, "attention<cpu>: float or double");
    const index_t items = p.batch * p.heads;
    run(items, double(p.tq) * double(p.tk) * double(2 * p.d + 2 * p.dv), [&](auto&& for_items) {
      std::vector<T> s(std::size_t(block_q * block_k)), dp(std::size_t(block_q * block_k)), drow(std::size_t(p.tq));
      std::vector<T> z, pz;  // with dropout: the tile's Z and P Z
      if (p.dropout_p > 0) z.resize(s.size()), pz.resize(s.size());
      for_items([&](index_t bh) {
        const index_t b = bh / p.heads, h = bh % p.heads;
        const T* qb = q + bh * p.tq * p.d;
        const T* kb = k + bh * p.tk * p.d;
        const T* vb = v + bh * p.tk * p.dv;
        const T* ob = out + bh * p.tq * p.dv;
        const T* gb = dout + bh * p.tq * p.dv;
        const T* lb = lse + bh * p.tq;
        T* dqb = dq + bh * p.tq * p.d;
        T* dkb = dk + bh * p.tk * p.d;
        T* dvb = dv + bh * p.tk * p.dv;
        std::fill(dqb, dqb + p.tq * p.d, T(0));
        std::fill(dkb, dkb + p.tk * p.d, T(0));
        std::fill(dvb, dvb + p.tk * p.dv, T(0));
        for (index_t i = 0; i < p.tq; ++i) {  // rowsum(dO * O)
          T acc = 0;
          for (index_t c = 0; c < p.dv; ++c) acc += gb[i * p.dv + c] * ob[i * p.dv + c];
          drow[std::size_t(i)] = acc;
        }
        for (index_t j0 = 0; j0 < p.tk; j0 += block_k) {
          const index_t bk = std::min(block_k, p.tk - j0);
          const index_t i_begin = p.causal ? j0 / block_q * block_q : 0;  // earlier query tiles see none of these keys
          for (index_t i0 = i_begin; i0 < p.tq; i0 += block_q) {
            const index_t bq = std::min(block_q, p.tq - i0);
            scores(p, mask, b, h, i0, bq, j0, bk, qb + i0 * p.d, kb + j0 * p.d, s.data());
            for (index_t r = 0; r < bq; ++r) {
              const T lr = lb[i0 + r];
              T* sr = s.data() + r * bk;
              if (lr == inf<T>())  // a row hidden from every key
                std::fill(sr, sr + bk, T(0));
              else
                detail::attention_exp_shift_sum(sr, bk, lr);
            }
            const bool drop = p.dropout_p > 0;
            if (drop) {
              for (index_t r = 0; r < bq; ++r) {
                T* zr = z.data() + r * bk;
                std::fill(zr, zr + bk, T(1));
                apply_dropout(p, bh, i0 + r, j0, bk, zr);
              }
              for (index_t e = 0; e < bq * bk; ++e) pz[std::size_t(e)] = s[std::size_t(e)] * z[std::size_t(e)];
            }
            // dV_j += (P Z)^T dO_i;  dP = dO_i V_j^T (then Z dP)
            blas<cpu>::gemm(true, false, bk, p.dv, bq, 1.0, drop ? pz.data() : s.data(), bk, gb + i0 * p.dv, p.dv, 1.0,
                            dvb + j0 * p.dv, p.dv);
            blas<cpu>::gemm(false, true, bq, bk, p.dv, 1.0, gb + i0 * p.dv, p.dv, vb + j0 * p.dv, p.dv, 0.0, dp.data(), bk);
            if (drop)
              for (index_t e = 0; e < bq * bk; ++e) dp[std::size_t(e)] *= z[std::size_t(e)];
            for (index_t r = 0; r < bq; ++r) {
              const T dr = drow[std::size_t(i0 + r)];
              T* sr = s.data() + r * bk;
              const T* pr = dp.data() + r * bk;
              for (index_t c = 0; c < bk; ++c) sr[c] = sr[c] * (pr[c] - dr);  // dS, in place of P
            }
            // dQ_i += s dS K_j;  dK_j += s dS^T Q_i
            blas<cpu>::gemm(false, false, bq, p.d, bk, p.scale, s.data(), bk, kb + j0 * p.d, p.d, 1.0, dqb + i0 * p.d, p.d);
            blas<cpu>::gemm(true, false, bk, p.d, bq, p.scale, s.data(), bk, qb + i0 * p.d, p.d, 1.0, dkb + j0 * p.d, p.d);
          }
        }
      });
    });
  }

 private:
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

  /// s[bq x bk] = scale * Q_i K_j^T + mask, -inf where causal hides key j from query i.
  template <class T>
  static void scores(const attention_problem& p, const attention_mask<T>& mask, index_t b, index_t h, index_t i0,
                     index_t bq, index_t j0, index_t bk, const T* qi, const T* kj, T* s) {
    blas<cpu>::gemm(false, true, bq, bk, p.d, p.scale, qi, p.d, kj, p.d, 0.0, s, bk);
    if (mask.p != nullptr) {
      const T* mb = mask.p + b * mask.sb + h * mask.sh;
      for (index_t r = 0; r < bq; ++r) {
        const T* mr = mb + (i0 + r) * mask.sq + j0 * mask.sk;
        T* sr = s + r * bk;
        for (index_t c = 0; c < bk; ++c) sr[c] += mr[c * mask.sk];
      }
    }
    if (p.causal && j0 + bk - 1 > i0)
      for (index_t r = 0; r < bq; ++r)
        for (index_t c = std::max<index_t>(0, i0 + r + 1 - j0); c < bk; ++c) s[r * bk + c] = -inf<T>();
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
