// trainkit/compression/detail/kernels.hpp - the per-element math of gradient compression as
// TRAINKIT_HD functors (a CUDA backend calls the same ones from its kernels), and the host loops
// over blocks that use them.
//
// Wire layout: block after block, each block self-contained, so the encoding of a run of k blocks is
// the k blocks' encodings one after the other (the quantized allreduce encodes and decodes tiles of
// a chunk independently):
//   fp16, bf16:        one 16-bit value per element (a block is one element)
//   int8_block<B>:     per block: fp32 scale, B int8 values                 (4 + B bytes)
//   sign_1bit<B>:      per block: fp32 scale, B/8 bytes of sign bits        (4 + B/8 bytes;
//                      bit j of byte k = element 8k + j of the block)
// Scales and 16-bit values are read and written with memcpy: a block starts at any byte offset.
// The loops are written so that the compiler vectorizes them with baseline SSE2 (no -march).
#pragma once

#include <cstdint>  // std::int8_t, std::uint8_t, std::uint16_t, std::uint32_t
#include <cstring>  // std::memcpy

#include "trainkit/config.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"   // trainkit::detail::bit_cast (host and device)
#include "trainkit/core/shape.hpp"  // index_t
#include "trainkit/core/wait_governor.hpp"  // start_wait_governor

// The int8 and 1-bit host loops take AVX2 where the CPU has it (8 lanes; the same operations in
// the same order as the portable loops, so the same bytes and residuals), chosen at run time.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define TRAINKIT_COMPRESS_AVX2 1
#include <immintrin.h>
#include "trainkit/backend/cpu/cpu_features.hpp"
#else
#define TRAINKIT_COMPRESS_AVX2 0
#endif

namespace trainkit::compression::detail {

// ---- functors -----------------------------------------------------------------------------------

/// The one NaN the codecs write and decode to (0x7fc00000). Arithmetic on a NaN gives the operand's
/// payload on an x86 CPU and the canonical 0x7fffffff on a GPU, so wherever a codec may produce a
/// NaN it selects this pattern instead: host and device bytes stay identical.
TRAINKIT_HD inline float compress_nan() { return trainkit::detail::bit_cast<float>(std::uint32_t(0x7fc00000u)); }
/// v, or compress_nan() where v is a NaN.
TRAINKIT_HD inline float compress_fixed_nan(float v) { return v != v ? compress_nan() : v; }

/// float -> IEEE half bits, round to nearest even, exactly what trainkit::half(float) gives, in a
/// few integer operations (F. Giesen's float_to_half_fast3_rtne). Finite values beyond fp16's range
/// saturate to +-65504 (an overflow to inf would poison the error-feedback residual); inf and NaN
/// pass through (NaN as the quiet NaN 0x7e00).
struct compress_fp16_encode_fn {
  TRAINKIT_HD std::uint16_t operator()(float f) const {
    std::uint32_t x = trainkit::detail::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = x & 0x80000000u;
    x ^= sign;
    std::uint32_t o;
    if (x > 0x7f800000u) {
      o = 0x7e00u;  // NaN
    } else if (x == 0x7f800000u) {
      o = 0x7c00u;  // inf
    } else if (x > 0x477fe000u) {
      o = 0x7bffu;  // finite, rounds beyond 65504: saturate
    } else if (x < 0x38800000u) {
      // Below 2^-14: a subnormal half (or 0). Adding 0.5 aligns the mantissa so that float's own
      // rounding does the round-to-nearest-even.
      const float t = trainkit::detail::bit_cast<float>(x) + 0.5f;
      o = trainkit::detail::bit_cast<std::uint32_t>(t) - 0x3f000000u;
    } else {
      const std::uint32_t odd = (x >> 13) & 1u;
      x += 0xc8000fffu + odd;  // rebias the exponent (15 - 127) << 23, round half to even
      o = x >> 13;
    }
    return static_cast<std::uint16_t>(o | (sign >> 16));
  }
};
/// IEEE half bits -> float, exact (F. Giesen's half_to_float).
struct compress_fp16_decode_fn {
  TRAINKIT_HD float operator()(std::uint16_t h) const {
    constexpr std::uint32_t shifted_exp = 0x7c00u << 13;
    std::uint32_t o = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
    const std::uint32_t exp = shifted_exp & o;
    o += (127u - 15u) << 23;
    if (exp == shifted_exp) {
      o += (128u - 16u) << 23;  // inf, NaN
    } else if (exp == 0) {
      o += 1u << 23;  // subnormal: renormalise through a float subtraction
      o = trainkit::detail::bit_cast<std::uint32_t>(trainkit::detail::bit_cast<float>(o) -
                                                    trainkit::detail::bit_cast<float>(113u << 23));
    }
    o |= static_cast<std::uint32_t>(h & 0x8000u) << 16;
    return trainkit::detail::bit_cast<float>(o);
  }
};
struct compress_bf16_encode_fn {
  TRAINKIT_HD std::uint16_t operator()(float x) const { return bfloat16(x).bits(); }
};
struct compress_bf16_decode_fn {
  TRAINKIT_HD float operator()(std::uint16_t b) const { return static_cast<float>(bfloat16::from_bits(b)); }
};

/// The int8 scale of a block from its max |x|: symmetric, 127 levels each side. A block with a
/// non-finite value gets a NaN scale, so it decodes to NaN and the loss scaler still sees it; a
/// block below 1e-30 (127 / absmax would overflow) is sent as zeros - error feedback keeps it.
struct compress_int8_scale_fn {
  TRAINKIT_HD float operator()(float absmax, bool finite) const {
    return !finite ? compress_nan() : (absmax < 1e-30f ? 0.0f : absmax / 127.0f);
  }
};

/// x -> round-to-nearest-even(x * inv_scale) for a finite block with inv_scale = 127 / absmax (or 0):
/// |x * inv_scale| <= 127 (1 + 2^-23), which rounds into [-127, 127], so no clamp is needed. The
/// rounding adds and subtracts 1.5 * 2^23 (exact for |v| < 2^22): it vectorizes without SSE4.1's
/// roundps and gives the same result on a GPU.
struct compress_int8_quantize_fn {
  float inv_scale;
  TRAINKIT_HD std::int8_t operator()(float x) const {
    constexpr float magic = 12582912.0f;  // 1.5 * 2^23
#if defined(__CUDA_ARCH__)
    // nvcc would contract x * inv_scale + magic into one FMA (one rounding instead of the host's
    // two): the intrinsics round each step like the host does, so the bytes agree.
    return static_cast<std::int8_t>(static_cast<int>(__fsub_rn(__fadd_rn(__fmul_rn(x, inv_scale), magic), magic)));
#else
    return static_cast<std::int8_t>(static_cast<int>((x * inv_scale + magic) - magic));
#endif
  }
};
struct compress_int8_dequantize_fn {
  float scale;
  TRAINKIT_HD float operator()(std::int8_t q) const { return compress_fixed_nan(static_cast<float>(q) * scale); }
};

/// One sign bit: set for x >= 0 (a zero decodes to +scale, which is 0 for an all-zero block).
struct compress_sign_bit_fn {
  TRAINKIT_HD std::uint8_t operator()(float x) const { return x >= 0.0f ? 1 : 0; }
};
struct compress_sign_decode_fn {
  float scale;  // mean |x| of the block
  TRAINKIT_HD float operator()(int bit) const {  // vectorizes
    return compress_fixed_nan(scale * static_cast<float>(2 * bit - 1));
  }
};
/// A 1-bit block's scale: mean |x| (the sum taken in the host's order), compress_nan() for a NaN.
struct compress_sign_scale_fn {
  TRAINKIT_HD float operator()(float abssum, index_t B) const {
    return compress_fixed_nan(abssum / static_cast<float>(B));
  }
};

/// The new error-feedback residual: what was meant minus what was sent; 0 where that is not finite,
/// so one overflowing step (skipped by the loss scaler) does not poison every later one.
struct compress_residual_fn {
  TRAINKIT_HD float operator()(float meant, float sent) const {
    const float r = meant - sent;
    return (r - r == 0.0f) ? r : 0.0f;  // r - r is NaN exactly when r is inf or NaN
  }
};

// ---- host loops ---------------------------------------------------------------------------------

/// Runs below this many elements are done on the calling thread (no OpenMP team).
inline constexpr index_t compress_parallel_threshold = index_t(1) << 16;

/// body(i) for i in [0, n): over OpenMP threads when work (elements) reaches the threshold, else a
/// plain loop - an `omp parallel if (false)` still costs a team start, too much for the small tiles
/// the quantized allreduce works in.
template <class Body>
void compress_for(index_t n, [[maybe_unused]] index_t work, Body body) {
#if TRAINKIT_HAS_OPENMP
  if (work >= compress_parallel_threshold) {
    ::trainkit::detail::start_wait_governor();
#pragma omp parallel for schedule(static)
    for (index_t i = 0; i < n; ++i) body(i);
    return;
  }
#endif
  for (index_t i = 0; i < n; ++i) body(i);
}

inline float compress_load_scale(const std::uint8_t* p) {
  float s;
  std::memcpy(&s, p, sizeof s);
  return s;
}
inline void compress_store_scale(std::uint8_t* p, float s) { std::memcpy(p, &s, sizeof s); }

template <class Fn>
void compress_encode_16bit(const float* x, index_t n, std::uint8_t* out, Fn fn) {
  compress_for(n, n, [&](index_t i) {
    const std::uint16_t b = fn(x[i]);
    std::memcpy(out + 2 * i, &b, 2);
  });
}
template <class Fn>
void compress_decode_16bit(const std::uint8_t* in, index_t n, float* out, Fn fn) {
  compress_for(n, n, [&](index_t i) {
    std::uint16_t b;
    std::memcpy(&b, in + 2 * i, 2);
    out[i] = fn(b);
  });
}

/// Max |x| of a block and whether all of it is finite. The max is taken over the bit patterns of
/// |x| as integers (the same order for non-negative floats, and inf and NaN compare above every
/// finite value): an integer reduction, which the compiler vectorizes without -ffast-math.
inline float compress_block_absmax(const float* x, index_t B, bool& finite) {
  std::int32_t m = 0;
  for (index_t i = 0; i < B; ++i) {
    const std::int32_t b = trainkit::detail::bit_cast<std::int32_t>(x[i]) & 0x7fffffff;
    m = b > m ? b : m;
  }
  finite = m < 0x7f800000;
  return trainkit::detail::bit_cast<float>(m);
}
/// Sum of |x| of a block: eight partial sums side by side (without -ffast-math the compiler may not
/// reorder one float reduction, but it vectorizes eight).
inline float compress_block_abssum(const float* x, index_t B) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const index_t whole = B - B % 8;  // (a separate tail bound: GCC 12 misreads `for (; i < B; ++i)` after the
                                    // eight-wide loop as overflowing once B is a known constant)
  for (index_t i = 0; i < whole; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += x[i + j] < 0.0f ? -x[i + j] : x[i + j];
  for (index_t i = whole; i < B; ++i) s[0] += x[i] < 0.0f ? -x[i] : x[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

#if TRAINKIT_COMPRESS_AVX2
/// compress_block_absmax on 8 lanes (B a multiple of 8): the same integer maximum.
__attribute__((target("avx2"))) inline float compress_block_absmax_avx2(const float* x, index_t B, bool& finite) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  for (index_t i = 0; i < B; i += 8)
    m = _mm256_max_epi32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), magnitude));
  __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  const std::int32_t mi = _mm_cvtsi128_si32(h);
  finite = mi < 0x7f800000;
  return trainkit::detail::bit_cast<float>(mi);
}

/// compress_int8_quantize_fn's rounding on 8 lanes, as float: (x * inv + 1.5 * 2^23) - 1.5 * 2^23,
/// each step rounded (the empty asm keeps a compiler from fusing the multiply and the add into
/// one FMA under -mfma, as the portable loop is not either).
__attribute__((target("avx2"))) inline __m256 compress_int8_round_avx2(__m256 x, __m256 inv) {
  __m256 t = _mm256_mul_ps(x, inv);
  __asm__("" : "+x"(t));
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  return _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
}

/// The residual of 8 lanes, x - r * scale, 0 where not finite (compress_residual_fn; r * scale is
/// the dequantized value: r is the integer q as a float and the scale is finite and positive).
__attribute__((target("avx2"))) inline void compress_int8_residual_avx2(__m256 x, __m256 r, __m256 scale, float* out) {
  const __m256 d = _mm256_sub_ps(x, _mm256_mul_ps(r, scale));
  const __m256 finite = _mm256_cmp_ps(_mm256_sub_ps(d, d), _mm256_setzero_ps(), _CMP_EQ_OQ);
  _mm256_storeu_ps(out, _mm256_and_ps(d, finite));
}

/// One int8 block with a positive scale: q (and, with Residual, the residual), 32 lanes at a time
/// (packed to bytes and put back in order with one permute), then 8.
template <bool Residual>
__attribute__((target("avx2"))) inline void compress_int8_block_avx2(const float* x, index_t B, float absmax, float scale,
                                                                     std::int8_t* q, float* residual) {
  const __m256 inv = _mm256_set1_ps(127.0f / absmax), s = _mm256_set1_ps(scale);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  index_t i = 0;
  for (; i + 32 <= B; i += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 xk = _mm256_loadu_ps(x + i + 8 * k);
      const __m256 r = compress_int8_round_avx2(xk, inv);
      if constexpr (Residual) compress_int8_residual_avx2(xk, r, s, residual + i + 8 * k);
      v[k] = _mm256_cvttps_epi32(r);
    }
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(bytes, order));
  }
  for (; i < B; i += 8) {
    const __m256 xk = _mm256_loadu_ps(x + i);
    const __m256 r = compress_int8_round_avx2(xk, inv);
    if constexpr (Residual) compress_int8_residual_avx2(xk, r, s, residual + i);
    const __m256i v = _mm256_cvttps_epi32(r);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(w, w));
  }
}

/// n decoded int8 values (Add: added to out), compress_int8_dequantize_fn on 8 lanes: the product,
/// and compress_nan() where it is a NaN.
template <bool Add>
__attribute__((target("avx2"))) inline void compress_int8_dequantize_avx2(const std::int8_t* q, index_t B, float scale,
                                                                          float* out) {
  const __m256 s = _mm256_set1_ps(scale), nan = _mm256_set1_ps(compress_nan());
  for (index_t i = 0; i < B; i += 8) {
    const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
    __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(v), s);
    y = _mm256_blendv_ps(y, nan, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    if constexpr (Add) y = _mm256_add_ps(_mm256_loadu_ps(out + i), y);
    _mm256_storeu_ps(out + i, y);
  }
}

/// compress_block_abssum on 8 lanes: lane j is the portable loop's s[j] (|x| by clearing the sign
/// bit, which differs from x < 0 ? -x : x only in a NaN's sign, and a NaN sum's scale is
/// compress_nan() either way), summed in the same order.
__attribute__((target("avx2"))) inline float compress_block_abssum_avx2(const float* x, index_t B) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 acc = _mm256_setzero_ps();
  for (index_t i = 0; i < B; i += 8) acc = _mm256_add_ps(acc, _mm256_and_ps(_mm256_loadu_ps(x + i), magnitude));
  alignas(32) float s[8];
  _mm256_store_ps(s, acc);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/// One 1-bit block: the scale, the sign bytes (one compare and movemask per 8) and, with Residual,
/// x - (x >= 0 ? scale : -scale) (scale * (2 bit - 1), exact), 0 where not finite or where the
/// scale is a NaN (as compress_residual_fn gives for x - NaN).
template <bool Residual>
__attribute__((target("avx2"))) inline void compress_sign_block_avx2(const float* x, index_t B, std::uint8_t* out,
                                                                     float* residual) {
  const float scale = compress_sign_scale_fn{}(compress_block_abssum_avx2(x, B), B);
  compress_store_scale(out, scale);
  const bool nan = scale != scale;
  const __m256 zero = _mm256_setzero_ps(), s = _mm256_set1_ps(scale);
  const __m256 neg = _mm256_xor_ps(s, _mm256_set1_ps(-0.0f));
  for (index_t k = 0; k < B / 8; ++k) {
    const __m256 xk = _mm256_loadu_ps(x + 8 * k);
    const __m256 bit = _mm256_cmp_ps(xk, zero, _CMP_GE_OQ);
    out[4 + k] = static_cast<std::uint8_t>(_mm256_movemask_ps(bit));
    if constexpr (Residual) {
      if (nan) {
        _mm256_storeu_ps(residual + 8 * k, zero);
        continue;
      }
      const __m256 d = _mm256_sub_ps(xk, _mm256_blendv_ps(neg, s, bit));
      const __m256 finite = _mm256_cmp_ps(_mm256_sub_ps(d, d), zero, _CMP_EQ_OQ);
      _mm256_storeu_ps(residual + 8 * k, _mm256_and_ps(d, finite));
    }
  }
}
#endif

/// Whether the loops over blocks of B take the AVX2 forms: B a multiple of 8 and the CPU has AVX2
/// within the ISA limit (TRAINKIT_MAX_CPU_ISA).
inline bool compress_blocks_avx2([[maybe_unused]] index_t B) {
#if TRAINKIT_COMPRESS_AVX2
  return B % 8 == 0 && backend::cpu_features::current().avx2;
#else
  return false;
#endif
}

/// int8_block<B> on n elements (a multiple of B); with Residual, residual[i] = x[i] - decoded[i]
/// (compress_residual_fn) in the same pass over the block (the worker and server sides of error
/// feedback without a separate decode).
template <bool Residual>
void compress_int8_blocks(const float* x, index_t n, index_t B, std::uint8_t* out, [[maybe_unused]] float* residual) {
  const bool avx2 = compress_blocks_avx2(B);
  compress_for(n / B, n, [&](index_t b) {
    const float* xb = x + b * B;
    std::uint8_t* ob = out + b * (4 + B);
    auto* q = reinterpret_cast<std::int8_t*>(ob + 4);
    float* rb = Residual ? residual + b * B : nullptr;
    bool finite = true;
#if TRAINKIT_COMPRESS_AVX2
    const float m = avx2 ? compress_block_absmax_avx2(xb, B, finite) : compress_block_absmax(xb, B, finite);
#else
    const float m = compress_block_absmax(xb, B, finite);
#endif
    const float scale = compress_int8_scale_fn{}(m, finite);
    compress_store_scale(ob, scale);
    const compress_int8_dequantize_fn deq{scale};
    if (!(scale > 0.0f)) {  // zero, tiny or non-finite (NaN scale): nothing to quantize
      std::memset(q, 0, static_cast<std::size_t>(B));
      if constexpr (Residual)  // x for a tiny block; 0 for a non-finite one (x - NaN)
        for (index_t i = 0; i < B; ++i) rb[i] = compress_residual_fn{}(xb[i], deq(0));
      return;
    }
#if TRAINKIT_COMPRESS_AVX2
    if (avx2) return compress_int8_block_avx2<Residual>(xb, B, m, scale, q, rb);
#endif
    const compress_int8_quantize_fn quant{127.0f / m};
    for (index_t i = 0; i < B; ++i) {
      q[i] = quant(xb[i]);
      if constexpr (Residual) rb[i] = compress_residual_fn{}(xb[i], deq(q[i]));
    }
  });
}
inline void compress_encode_int8(const float* x, index_t n, index_t B, std::uint8_t* out) {
  compress_int8_blocks<false>(x, n, B, out, nullptr);
}
inline void compress_encode_int8_residual(const float* x, index_t n, index_t B, std::uint8_t* out, float* residual) {
  compress_int8_blocks<true>(x, n, B, out, residual);
}

/// Decoded int8 blocks into out (Add: acc[i] += decoded, the server's sum over the ranks without a
/// separate pass).
template <bool Add>
void compress_int8_decode_blocks(const std::uint8_t* in, index_t n, index_t B, float* out) {
  const bool avx2 = compress_blocks_avx2(B);
  compress_for(n / B, n, [&](index_t b) {
    const std::uint8_t* ib = in + b * (4 + B);
    const float scale = compress_load_scale(ib);
    const auto* q = reinterpret_cast<const std::int8_t*>(ib + 4);
    float* ob = out + b * B;
#if TRAINKIT_COMPRESS_AVX2
    if (avx2) return compress_int8_dequantize_avx2<Add>(q, B, scale, ob);
#endif
    (void)avx2;
    const compress_int8_dequantize_fn deq{scale};
    for (index_t i = 0; i < B; ++i) {
      if constexpr (Add)
        ob[i] += deq(q[i]);
      else
        ob[i] = deq(q[i]);
    }
  });
}
inline void compress_decode_int8(const std::uint8_t* in, index_t n, index_t B, float* out) {
  compress_int8_decode_blocks<false>(in, n, B, out);
}
inline void compress_decode_add_int8(const std::uint8_t* in, index_t n, index_t B, float* acc) {
  compress_int8_decode_blocks<true>(in, n, B, acc);
}

/// The sign bits of x[0, 8): bit j set when x[j] >= 0 (compress_sign_bit_fn: NaN 0, -0 1). With
/// SSE2 two compares and two movemasks instead of eight compares, shifts and ors: packing was the
/// largest part of 1-bit encoding.
inline unsigned compress_sign_byte(const float* x) {
#if TRAINKIT_HAS_SSE2
  const __m128 zero = _mm_setzero_ps();
  const int lo = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x), zero));
  const int hi = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x + 4), zero));
  return static_cast<unsigned>(lo | (hi << 4));
#else
  unsigned byte = 0;
  for (int j = 0; j < 8; ++j) byte |= static_cast<unsigned>(compress_sign_bit_fn{}(x[j])) << j;
  return byte;
#endif
}

/// For every byte of sign bits, its eight values 2 * bit - 1 (+-1): decoding multiplies a row by
/// the block's scale, which vectorizes where extracting bit j of a byte (a variable shift) does
/// not. scale * (+-1) is exact, so this is compress_sign_decode_fn bit for bit.
struct compress_sign_table {
  alignas(64) float v[256][8];
};
constexpr compress_sign_table make_compress_sign_table() {
  compress_sign_table t{};
  for (int b = 0; b < 256; ++b)
    for (int j = 0; j < 8; ++j) t.v[b][j] = ((b >> j) & 1) ? 1.0f : -1.0f;
  return t;
}
inline constexpr compress_sign_table compress_sign_lut = make_compress_sign_table();

/// out[j] = scale * pm[j] (Add: out[j] += scale * pm[j]) for j < 8. GCC 12 leaves the plain loop
/// scalar (four instructions an element), hence the SSE2 form: the same operations in the same
/// order, four lanes at a time.
template <bool Add>
inline void compress_sign_row(float* out, const float* pm, float scale) {
  scale = compress_fixed_nan(scale);  // x86 then passes this NaN on, as compress_sign_decode_fn does
#if TRAINKIT_HAS_SSE2
  const __m128 s = _mm_set1_ps(scale);
  __m128 a = _mm_mul_ps(s, _mm_load_ps(pm)), b = _mm_mul_ps(s, _mm_load_ps(pm + 4));
  if constexpr (Add) {
    a = _mm_add_ps(_mm_loadu_ps(out), a);
    b = _mm_add_ps(_mm_loadu_ps(out + 4), b);
  }
  _mm_storeu_ps(out, a);
  _mm_storeu_ps(out + 4, b);
#else
  for (int j = 0; j < 8; ++j) {
    if constexpr (Add)
      out[j] += scale * pm[j];
    else
      out[j] = scale * pm[j];
  }
#endif
}

/// sign_1bit<B> on n elements (a multiple of B; B a multiple of 8); with Residual, the residual in
/// the same pass (see compress_int8_blocks).
template <bool Residual>
void compress_sign_blocks(const float* x, index_t n, index_t B, std::uint8_t* out, [[maybe_unused]] float* residual) {
  const bool avx2 = compress_blocks_avx2(B);
  compress_for(n / B, n, [&](index_t b) {
    const float* xb = x + b * B;
    std::uint8_t* ob = out + b * (4 + B / 8);
    float* rb = Residual ? residual + b * B : nullptr;
#if TRAINKIT_COMPRESS_AVX2
    if (avx2) return compress_sign_block_avx2<Residual>(xb, B, ob, rb);
#endif
    (void)avx2;
    const float scale = compress_sign_scale_fn{}(compress_block_abssum(xb, B), B);
    compress_store_scale(ob, scale);
    for (index_t k = 0; k < B / 8; ++k) ob[4 + k] = static_cast<std::uint8_t>(compress_sign_byte(xb + 8 * k));
    if constexpr (Residual) {
      const compress_sign_decode_fn dec{scale};
      for (index_t i = 0; i < B; ++i) rb[i] = compress_residual_fn{}(xb[i], dec(compress_sign_bit_fn{}(xb[i])));
    }
  });
}
inline void compress_encode_sign(const float* x, index_t n, index_t B, std::uint8_t* out) {
  compress_sign_blocks<false>(x, n, B, out, nullptr);
}
inline void compress_encode_sign_residual(const float* x, index_t n, index_t B, std::uint8_t* out, float* residual) {
  compress_sign_blocks<true>(x, n, B, out, residual);
}
inline void compress_decode_sign(const std::uint8_t* in, index_t n, index_t B, float* out) {
  const index_t nb = n / B;
  compress_for(nb, n, [&](index_t b) {
    const std::uint8_t* ib = in + b * (4 + B / 8);
    const compress_sign_decode_fn dec{compress_load_scale(ib)};
    float* ob = out + b * B;
    for (index_t k = 0; k < B / 8; ++k) {
      compress_sign_row<false>(ob + 8 * k, compress_sign_lut.v[ib[4 + k]], dec.scale);
    }
  });
}

/// acc[i] += decoded signs.
inline void compress_decode_add_sign(const std::uint8_t* in, index_t n, index_t B, float* acc) {
  const index_t nb = n / B;
  compress_for(nb, n, [&](index_t b) {
    const std::uint8_t* ib = in + b * (4 + B / 8);
    const compress_sign_decode_fn dec{compress_load_scale(ib)};
    float* ob = acc + b * B;
    for (index_t k = 0; k < B / 8; ++k) {
      compress_sign_row<true>(ob + 8 * k, compress_sign_lut.v[ib[4 + k]], dec.scale);
    }
  });
}

/// acc[i] += x[i].
inline void compress_accumulate(const float* x, index_t n, float* acc) {
  compress_for(n, n, [&](index_t i) { acc[i] += x[i]; });
}

/// residual[i] = meant[i] - sent[i] (compress_residual_fn) for i < n.
inline void compress_update_residual(const float* meant, const float* sent, index_t n, float* residual) {
  compress_for(n, n, [&](index_t i) { residual[i] = compress_residual_fn{}(meant[i], sent[i]); });
}

}  // namespace trainkit::compression::detail
