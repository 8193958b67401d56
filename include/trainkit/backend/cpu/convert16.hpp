// trainkit/backend/cpu/convert16.hpp - float <-> half on contiguous runs with the CPU's F16C
// instructions (8 values per instruction), for the host elementwise loop.
//
// half's own conversions (core/half.hpp) are integer code that must agree with the device bit for
// bit; a compiler cannot vectorise their branches, and the mixed-precision ops convert every
// operand: with them an fp16 step spent half its time rounding. VCVTPS2PH with an immediate
// round-to-nearest-even and VCVTPH2PS give the same bits (IEEE 754 conversions: ties to even,
// subnormals kept, overflow to infinity, a NaN quieted with its sign and top payload bits - what
// round_to_narrow does), whatever MXCSR says; a signalling half NaN is widened by half's own code. The F16C functions carry a target attribute and are
// chosen at run time (every x86-64 CPU since 2012 has F16C); elsewhere the scalar loop runs.
// bfloat16's conversions are branch-free already and vectorise as they are.
#pragma once

#include <cstdint>
#include <type_traits>

#include "trainkit/core/assign.hpp"   // cast_fn, assign_fn
#include "trainkit/core/functors.hpp"  // functors::round_to
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/shape.hpp"  // index_t
#include "trainkit/backend/cpu/cpu_features.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define TRAINKIT_CPU_F16C_DISPATCH 1
#include <immintrin.h>
#else
#define TRAINKIT_CPU_F16C_DISPATCH 0
#endif
#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>  // the bfloat16 rounding
#endif

namespace trainkit::backend::cpu_convert {

#if TRAINKIT_CPU_F16C_DISPATCH
/// This CPU has F16C and AVX, the OS saves the YMM registers, and the ISA limit allows AVX
/// (cpu_features.hpp: clang's __builtin_cpu_supports knows no "f16c").
inline bool has_f16c() noexcept { return cpu_features::current().f16c; }
/// This CPU has AVX2 and the ISA limit allows it (the 8-lane bf16 loops below).
inline bool has_avx2() noexcept { return cpu_features::current().avx2; }

__attribute__((target("avx,f16c"))) inline void f32_to_f16_f16c(const float* in, std::uint16_t* out, index_t n) {
  index_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) out[i] = half(in[i]).bits();
}

/// VCVTPH2PS quiets a signalling NaN; half's own widening keeps every NaN's bits (the device's
/// does too), so a group of 8 holding a NaN (rare: one compare per group) takes the scalar loop.
__attribute__((target("avx,f16c"))) inline void f16_to_f32_f16c(const std::uint16_t* in, float* out, index_t n) {
  index_t i = 0;
  const __m128i magnitude = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, magnitude), inf)) != 0) {
      for (index_t k = i; k < i + 8; ++k) out[k] = static_cast<float>(half::from_bits(in[k]));
      continue;
    }
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(half::from_bits(in[i]));
}

/// relu of float values and the half copy of the input (relu_keeping_half), 8 at a time. MAXPS
/// returns its second operand for a NaN: relu(NaN) = 0, as `x > 0 ? x : 0`.
__attribute__((target("avx,f16c"))) inline void relu_keep_f16_f16c(const float* x, float* y, std::uint16_t* saved,
                                                                    index_t n) {
  index_t i = 0;
  const __m256 zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, _mm256_max_ps(v, zero));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(saved + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) {
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    saved[i] = half(x[i]).bits();
  }
}

/// relu's gradient from the half copy of its input: out = saved > 0 ? g : 0, 8 at a time.
__attribute__((target("avx,f16c"))) inline void relu_backward_f16_f16c(const float* g, const std::uint16_t* saved,
                                                                        float* out, index_t n) {
  index_t i = 0;
  const __m256 zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(saved + i)));
    _mm256_storeu_ps(out + i, _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ), _mm256_loadu_ps(g + i)));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(half::from_bits(saved[i])) > 0.0f ? g[i] : 0.0f;
}

/// float -> nearest half -> float, 8 at a time.
__attribute__((target("avx,f16c"))) inline void round_f32_f16_f16c(const float* in, float* out, index_t n) {
  index_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(in + i),
                                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  for (; i < n; ++i) out[i] = static_cast<float>(half(in[i]));
}
#endif

#if defined(__SSE2__) && !defined(__CUDACC__)
/// bfloat16's own rule on 4 floats' bits (round to nearest even, a NaN quieted with its sign and
/// top payload): the bfloat16 in the top 16 bits of each lane, the low 16 bits not yet cleared.
inline __m128i bf16_round_high_sse2(__m128i u) {
  const __m128i one = _mm_set1_epi32(1), bias = _mm_set1_epi32(0x7fff), quiet = _mm_set1_epi32(0x00400000);
  const __m128i magnitude = _mm_set1_epi32(0x7fffffff), inf = _mm_set1_epi32(0x7f800000);
  const __m128i rounded = _mm_add_epi32(u, _mm_add_epi32(bias, _mm_and_si128(_mm_srli_epi32(u, 16), one)));
  const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, magnitude), inf);
  return _mm_or_si128(_mm_and_si128(nan, _mm_or_si128(u, quiet)), _mm_andnot_si128(nan, rounded));
}
/// The bfloat16 bits of two bf16_round_high_sse2 results, 8 in order: each sign-extended from its 16
/// bits, which a signed saturating pack then keeps exactly.
inline __m128i bf16_pack_sse2(__m128i a, __m128i b) {
  return _mm_packs_epi32(_mm_srai_epi32(a, 16), _mm_srai_epi32(b, 16));
}

/// float -> bfloat16 by bfloat16's own rule, 8 at a time with SSE2 - the compiler leaves the scalar
/// rule unvectorised, having no 32 -> 16-bit narrowing before SSE4.1: here each result is
/// sign-extended from its 16 bits, which a signed saturating pack then keeps exactly.
inline void f32_to_bf16_sse2(const float* in, std::uint16_t* out, index_t n) {
  index_t i = 0;
  const auto round4 = [](const float* p) { return bf16_round_high_sse2(_mm_castps_si128(_mm_loadu_ps(p))); };
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), bf16_pack_sse2(round4(in + i), round4(in + i + 4)));
  for (; i < n; ++i) out[i] = bfloat16(in[i]).bits();
}
/// float -> bfloat16 -> float by the same rule, 4 at a time with SSE2 (no narrowing needed: the
/// rounded value's top 16 bits stay where they are).
inline void round_f32_bf16_sse2(const float* in, float* out, index_t n) {
  index_t i = 0;
  const __m128i high = _mm_set1_epi32(static_cast<int>(0xffff0000u));
  for (; i + 4 <= n; i += 4)
    _mm_storeu_ps(out + i, _mm_castsi128_ps(_mm_and_si128(bf16_round_high_sse2(_mm_castps_si128(_mm_loadu_ps(in + i))), high)));
  for (; i < n; ++i) out[i] = static_cast<float>(bfloat16(in[i]));
}
/// relu_keeping_bfloat16 8 at a time: saved = bf16(x), y = relu(saved). MAXPS returns its second
/// operand for a NaN or two zeros: relu(NaN) = +0 and relu(-0) = +0, as `r > 0 ? r : 0`.
inline void relu_keep_bf16_sse2(const float* x, float* y, std::uint16_t* saved, index_t n) {
  index_t i = 0;
  const __m128i high = _mm_set1_epi32(static_cast<int>(0xffff0000u));
  const __m128 zero = _mm_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m128i a = bf16_round_high_sse2(_mm_castps_si128(_mm_loadu_ps(x + i)));
    const __m128i b = bf16_round_high_sse2(_mm_castps_si128(_mm_loadu_ps(x + i + 4)));
    _mm_storeu_ps(y + i, _mm_max_ps(_mm_castsi128_ps(_mm_and_si128(a, high)), zero));
    _mm_storeu_ps(y + i + 4, _mm_max_ps(_mm_castsi128_ps(_mm_and_si128(b, high)), zero));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(saved + i), bf16_pack_sse2(a, b));
  }
  for (; i < n; ++i) {
    bfloat16 s;
    functors::relu_keeping_bfloat16{}(y[i], s, x[i]);
    saved[i] = s.bits();
  }
}
/// out = x rounded to bfloat16 values, kept as float, and keep = their bfloat16 bits, 8 at a time.
inline void round_keep_bf16_sse2(const float* x, float* out, std::uint16_t* keep, index_t n) {
  index_t i = 0;
  const __m128i high = _mm_set1_epi32(static_cast<int>(0xffff0000u));
  for (; i + 8 <= n; i += 8) {
    const __m128i a = bf16_round_high_sse2(_mm_castps_si128(_mm_loadu_ps(x + i)));
    const __m128i b = bf16_round_high_sse2(_mm_castps_si128(_mm_loadu_ps(x + i + 4)));
    _mm_storeu_ps(out + i, _mm_castsi128_ps(_mm_and_si128(a, high)));
    _mm_storeu_ps(out + i + 4, _mm_castsi128_ps(_mm_and_si128(b, high)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(keep + i), bf16_pack_sse2(a, b));
  }
  for (; i < n; ++i) {
    keep[i] = bfloat16(x[i]).bits();
    out[i] = static_cast<float>(bfloat16::from_bits(keep[i]));
  }
}
/// y = (bfloat16 values v) * a + b - a multiply, then an add, as the scalar `v * a + b` - rounded to
/// bfloat16 values, kept as float, 4 at a time.
inline void affine_bf16_round_sse2(const std::uint16_t* v, float a, float b, float* y, index_t n) {
  index_t i = 0;
  const __m128i high = _mm_set1_epi32(static_cast<int>(0xffff0000u));
  const __m128 va = _mm_set1_ps(a), vb = _mm_set1_ps(b);
  for (; i + 4 <= n; i += 4) {
    // Interleaving zeros below each bfloat16 widens it: its bits become a float's top 16.
    const __m128i w = _mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + i)));
    const __m128 r = _mm_add_ps(_mm_mul_ps(_mm_castsi128_ps(w), va), vb);
    _mm_storeu_ps(y + i, _mm_castsi128_ps(_mm_and_si128(bf16_round_high_sse2(_mm_castps_si128(r)), high)));
  }
  for (; i < n; ++i) y[i] = static_cast<float>(bfloat16(static_cast<float>(bfloat16::from_bits(v[i])) * a + b));
}
#if TRAINKIT_CPU_F16C_DISPATCH
// The same two loops 8 lanes wide, for CPUs with AVX2 (chosen at run time: batch norm's rounding
// passes are bound by these instructions, not by memory).
// NaN lanes are found by an unordered compare and taken by a blend: 7 instructions where the integer
// compare and an and/andnot/or select took 11, which matters where the rounding runs on data already
// in L1 (the optimizer's block of rounded gradient) and the loop is bound by instructions.
__attribute__((target("avx2"))) inline __m256i bf16_round_high_avx2(__m256i u) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x00400000);
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
  const __m256 v = _mm256_castsi256_ps(u);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_or_si256(u, quiet)), nan));
}
/// The 8 bfloat16 bits of a bf16_round_high_avx2 result, in order (packs works per 128-bit lane:
/// quadwords 0 and 2 hold them).
__attribute__((target("avx2"))) inline __m128i bf16_pack_avx2(__m256i a) {
  const __m256i t = _mm256_srai_epi32(a, 16);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32(t, t), 0x08));
}
/// 8 bfloat16 values as floats (their bits become a float's top 16).
__attribute__((target("avx2"))) inline __m256 bf16_widen_avx2(const std::uint16_t* v) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v))), 16));
}
/// f32_to_bf16_sse2 16 lanes at a time (one pack and one permute put the 16 results in order).
__attribute__((target("avx2"))) inline void f32_to_bf16_avx2(const float* in, std::uint16_t* out, index_t n) {
  index_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_srai_epi32(bf16_round_high_avx2(_mm256_castps_si256(_mm256_loadu_ps(in + i))), 16);
    const __m256i b = _mm256_srai_epi32(bf16_round_high_avx2(_mm256_castps_si256(_mm256_loadu_ps(in + i + 8))), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
  }
  f32_to_bf16_sse2(in + i, out + i, n - i);
}
/// bfloat16 -> float (exact: the bits move to a float's top 16), 8 at a time.
__attribute__((target("avx2"))) inline void bf16_to_f32_avx2(const std::uint16_t* in, float* out, index_t n) {
  index_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, bf16_widen_avx2(in + i));
  for (; i < n; ++i) out[i] = static_cast<float>(bfloat16::from_bits(in[i]));
}
__attribute__((target("avx2"))) inline void round_keep_bf16_avx2(const float* x, float* out, std::uint16_t* keep,
                                                                  index_t n) {
  index_t i = 0;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (; i + 8 <= n; i += 8) {
    const __m256i a = bf16_round_high_avx2(_mm256_castps_si256(_mm256_loadu_ps(x + i)));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_and_si256(a, high)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(keep + i), bf16_pack_avx2(a));
  }
  round_keep_bf16_sse2(x + i, out + i, keep + i, n - i);
}
/// 8 floats rounded to bfloat16 values (nearest even, NaN kept quiet), as floats.
__attribute__((target("avx2"))) inline __m256 bf16_round_values_avx2(__m256 v) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  return _mm256_castsi256_ps(_mm256_and_si256(bf16_round_high_avx2(_mm256_castps_si256(v)), high));
}
/// out = O(A(a) + B(b)), where A, B and O round to bfloat16 values when their flag is set.
template <bool RA, bool RB, bool RO>
__attribute__((target("avx2"))) inline index_t add_rounding_bf16_avx2(const float* a, const float* b, float* out,
                                                                       index_t n) {
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);
    if constexpr (RA) va = bf16_round_values_avx2(va);
    if constexpr (RB) vb = bf16_round_values_avx2(vb);
    __m256 r = _mm256_add_ps(va, vb);
    if constexpr (RO) r = bf16_round_values_avx2(r);
    _mm256_storeu_ps(out + i, r);
  }
  return i;
}
__attribute__((target("avx2"))) inline void affine_bf16_round_avx2(const std::uint16_t* v, float a, float b, float* y,
                                                                    index_t n) {
  index_t i = 0;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_add_ps(_mm256_mul_ps(bf16_widen_avx2(v + i), va), vb);
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_and_si256(bf16_round_high_avx2(_mm256_castps_si256(r)), high)));
  }
  affine_bf16_round_sse2(v + i, a, b, y + i, n - i);
}
__attribute__((target("avx2"))) inline void relu_keep_bf16_avx2(const float* x, float* y, std::uint16_t* saved,
                                                                 index_t n) {
  index_t i = 0;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256 zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256i a = bf16_round_high_avx2(_mm256_castps_si256(_mm256_loadu_ps(x + i)));
    _mm256_storeu_ps(y + i, _mm256_max_ps(_mm256_castsi256_ps(_mm256_and_si256(a, high)), zero));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(saved + i), bf16_pack_avx2(a));
  }
  relu_keep_bf16_sse2(x + i, y + i, saved + i, n - i);
}
/// batch norm's input gradient a * g + c * v + k (two multiplies, then two adds left to right, as
/// the scalar expression), v bfloat16, rounded to bfloat16 values kept as float, 8 at a time.
__attribute__((target("avx2"))) inline void bn_gradient_bf16_round_avx2(const float* g, const std::uint16_t* v,
                                                                         float a, float c, float k, float* dx,
                                                                         index_t n) {
  index_t i = 0;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c), vk = _mm256_set1_ps(k);
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_add_ps(
        _mm256_add_ps(_mm256_mul_ps(va, _mm256_loadu_ps(g + i)), _mm256_mul_ps(vc, bf16_widen_avx2(v + i))), vk);
    _mm256_storeu_ps(dx + i, _mm256_castsi256_ps(_mm256_and_si256(bf16_round_high_avx2(_mm256_castps_si256(r)), high)));
  }
  for (; i < n; ++i) {
    const float x = static_cast<float>(bfloat16::from_bits(v[i]));
    dx[i] = static_cast<float>(bfloat16(a * g[i] + c * x + k));
  }
}
__attribute__((target("avx2"))) inline void round_f32_bf16_avx2(const float* in, float* out, index_t n) {
  index_t i = 0;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_and_si256(
                                  bf16_round_high_avx2(_mm256_castps_si256(_mm256_loadu_ps(in + i))), high)));
  round_f32_bf16_sse2(in + i, out + i, n - i);
}
#endif
#define TRAINKIT_CPU_SSE2_BF16 1
#else
#define TRAINKIT_CPU_SSE2_BF16 0
#endif

/// out[0, n) = in[0, n) rounded to bfloat16 (8 at a time where SSE2 is there).
inline void round_to_bfloat16(const float* in, bfloat16* out, index_t n) {
#if TRAINKIT_CPU_SSE2_BF16
#if TRAINKIT_CPU_F16C_DISPATCH
  if (has_avx2()) return f32_to_bf16_avx2(in, reinterpret_cast<std::uint16_t*>(out), n);
#endif
  f32_to_bf16_sse2(in, reinterpret_cast<std::uint16_t*>(out), n);
#else
  for (index_t i = 0; i < n; ++i) out[i] = bfloat16(in[i]);
#endif
}

/// out[0, n) = in[0, n) as float (exact; 8 at a time with AVX2).
inline void widen_bfloat16(const bfloat16* in, float* out, index_t n) {
#if TRAINKIT_CPU_SSE2_BF16 && TRAINKIT_CPU_F16C_DISPATCH
  if (has_avx2()) return bf16_to_f32_avx2(reinterpret_cast<const std::uint16_t*>(in), out, n);
#endif
  for (index_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

/// out[0, n) = in[0, n) rounded to bfloat16 values, kept as float (4 at a time where SSE2 is there).
inline void round_to_bfloat16_values(const float* in, float* out, index_t n) {
#if TRAINKIT_CPU_SSE2_BF16
#if TRAINKIT_CPU_F16C_DISPATCH
  if (has_avx2()) return round_f32_bf16_avx2(in, out, n);
#endif
  round_f32_bf16_sse2(in, out, n);
#else
  for (index_t i = 0; i < n; ++i) out[i] = static_cast<float>(bfloat16(in[i]));
#endif
}

/// rows rows of cols floats, ld apart, rounded to bfloat16 values in place (the CPU asked once).
inline void round_rows_to_bfloat16_values(float* x, index_t ld, index_t rows, index_t cols) {
#if TRAINKIT_CPU_SSE2_BF16
#if TRAINKIT_CPU_F16C_DISPATCH
  if (has_avx2()) {
    for (index_t r = 0; r < rows; ++r) round_f32_bf16_avx2(x + r * ld, x + r * ld, cols);
    return;
  }
#endif
  for (index_t r = 0; r < rows; ++r) round_f32_bf16_sse2(x + r * ld, x + r * ld, cols);
#else
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) x[r * ld + c] = static_cast<float>(bfloat16(x[r * ld + c]));
#endif
}

/// out = x rounded to bfloat16 values and keep = their bits (8 at a time where SSE2 is there).
inline void round_keeping_bfloat16(const float* x, float* out, bfloat16* keep, index_t n) {
#if TRAINKIT_CPU_SSE2_BF16
#if TRAINKIT_CPU_F16C_DISPATCH
  if (has_avx2()) return round_keep_bf16_avx2(x, out, reinterpret_cast<std::uint16_t*>(keep), n);
#endif
  round_keep_bf16_sse2(x, out, reinterpret_cast<std::uint16_t*>(keep), n);
#else
  for (index_t i = 0; i < n; ++i) {
    keep[i] = bfloat16(x[i]);
    out[i] = static_cast<float>(keep[i]);
  }
#endif
}
/// functors::add_rounding_bfloat16 f over n elements: out = round_out(round_a(a) + round_b(b)),
/// round_* to bfloat16 values (nearest even) where f says so - a sum that reads a GEMM result whose
/// rounding was deferred rounds it on the way (8 at a time with AVX2).
inline void add_rounding_bfloat16(const functors::add_rounding_bfloat16& f, const float* a, const float* b,
                                  float* out, index_t n) {
  index_t i = 0;
#if TRAINKIT_CPU_SSE2_BF16 && TRAINKIT_CPU_F16C_DISPATCH
  if (has_avx2()) {
    switch ((f.round_a ? 4 : 0) | (f.round_b ? 2 : 0) | (f.round_out ? 1 : 0)) {
      case 0: i = add_rounding_bf16_avx2<false, false, false>(a, b, out, n); break;
      case 1: i = add_rounding_bf16_avx2<false, false, true>(a, b, out, n); break;
      case 2: i = add_rounding_bf16_avx2<false, true, false>(a, b, out, n); break;
      case 3: i = add_rounding_bf16_avx2<false, true, true>(a, b, out, n); break;
      case 4: i = add_rounding_bf16_avx2<true, false, false>(a, b, out, n); break;
      case 5: i = add_rounding_bf16_avx2<true, false, true>(a, b, out, n); break;
      case 6: i = add_rounding_bf16_avx2<true, true, false>(a, b, out, n); break;
      default: i = add_rounding_bf16_avx2<true, true, true>(a, b, out, n); break;
    }
  }
#endif
  for (; i < n; ++i) f(out[i], a[i], b[i]);
}

/// y = v * a + b rounded to bfloat16 values, v bfloat16 (4 at a time where SSE2 is there).
inline void affine_rounded_to_bfloat16(const bfloat16* v, float a, float b, float* y, index_t n) {
#if TRAINKIT_CPU_SSE2_BF16
#if TRAINKIT_CPU_F16C_DISPATCH
  if (has_avx2()) return affine_bf16_round_avx2(reinterpret_cast<const std::uint16_t*>(v), a, b, y, n);
#endif
  affine_bf16_round_sse2(reinterpret_cast<const std::uint16_t*>(v), a, b, y, n);
#else
  for (index_t i = 0; i < n; ++i) y[i] = static_cast<float>(bfloat16(static_cast<float>(v[i]) * a + b));
#endif
}

/// dx = a * g + c * v + k rounded to bfloat16 values, v bfloat16 (batch norm's input gradient on
/// the widened bf16 route; 8 at a time with AVX2).
inline void bn_gradient_rounded_to_bfloat16(const float* g, const bfloat16* v, float a, float c, float k, float* dx,
                                            index_t n) {
#if TRAINKIT_CPU_SSE2_BF16 && TRAINKIT_CPU_F16C_DISPATCH
  if (has_avx2())
    return bn_gradient_bf16_round_avx2(g, reinterpret_cast<const std::uint16_t*>(v), a, c, k, dx, n);
#endif
  for (index_t i = 0; i < n; ++i) dx[i] = static_cast<float>(bfloat16(a * g[i] + c * static_cast<float>(v[i]) + k));
}

/// The element loop f over n contiguous values has a bulk form here (a float/half conversion).
template <class F, class... P>
inline constexpr bool has_bulk = false;
template <>
inline constexpr bool has_bulk<trainkit::detail::cast_fn<half, float>, half, const float> = true;
template <>
inline constexpr bool has_bulk<trainkit::detail::cast_fn<bfloat16, float>, bfloat16, const float> = true;
template <>
inline constexpr bool has_bulk<trainkit::detail::cast_fn<float, half>, float, const half> = true;
template <>
inline constexpr bool has_bulk<trainkit::detail::assign_fn<functors::round_to<half>, float, float>, float,
                               const float> = true;
#if TRAINKIT_CPU_SSE2_BF16
template <>
inline constexpr bool has_bulk<trainkit::detail::assign_fn<functors::round_to<bfloat16>, float, float>, float,
                               const float> = true;
#endif

template <>
inline constexpr bool has_bulk<functors::relu_keeping_half, float, half, float> = true;
#if TRAINKIT_CPU_SSE2_BF16
template <>
inline constexpr bool has_bulk<functors::relu_keeping_bfloat16, float, bfloat16, float> = true;
#endif
template <>
inline constexpr bool has_bulk<trainkit::detail::assign_fn<functors::relu_backward, float, float, half>, float,
                               const float, const half> = true;

template <>
inline constexpr bool has_bulk<functors::add_rounding_bfloat16, float, float, float> = true;

/// The three-operand bulk loops: relu with its half or bfloat16 copy, and its gradient from the
/// half copy; a sum rounding its operands or result to bfloat16 values.
template <class F, class A, class B, class C>
void run_bulk(F& f, index_t n, A* a, B* b, C* c) {
  if constexpr (std::is_same_v<F, functors::add_rounding_bfloat16>) {
    add_rounding_bfloat16(f, b, c, a, n);
    return;
  } else if constexpr (std::is_same_v<F, functors::relu_keeping_bfloat16>) {
#if TRAINKIT_CPU_SSE2_BF16
#if TRAINKIT_CPU_F16C_DISPATCH
    if (has_avx2()) return relu_keep_bf16_avx2(c, a, reinterpret_cast<std::uint16_t*>(b), n);
#endif
    relu_keep_bf16_sse2(c, a, reinterpret_cast<std::uint16_t*>(b), n);
#else
    for (index_t i = 0; i < n; ++i) f(a[i], b[i], c[i]);
#endif
    return;
  } else {
#if TRAINKIT_CPU_F16C_DISPATCH
    if (has_f16c()) {
      if constexpr (std::is_same_v<F, functors::relu_keeping_half>)
        relu_keep_f16_f16c(c, a, reinterpret_cast<std::uint16_t*>(b), n);
      else
        relu_backward_f16_f16c(b, reinterpret_cast<const std::uint16_t*>(c), a, n);
      return;
    }
#endif
    for (index_t i = 0; i < n; ++i) f(a[i], b[i], c[i]);
  }
}

/// Runs f over out[0, n), in[0, n) in bulk where the CPU allows, else element by element.
template <class F, class Out, class In>
void run_bulk(F& f, index_t n, Out* out, In* in) {
  if constexpr (std::is_same_v<Out, bfloat16>) {
    round_to_bfloat16(in, out, n);
#if TRAINKIT_CPU_SSE2_BF16
  } else if constexpr (std::is_same_v<F, trainkit::detail::assign_fn<functors::round_to<bfloat16>, float, float>>) {
    round_to_bfloat16_values(in, out, n);
#endif
  } else {
#if TRAINKIT_CPU_F16C_DISPATCH
    if (has_f16c()) {
      if constexpr (std::is_same_v<Out, half>)
        f32_to_f16_f16c(in, reinterpret_cast<std::uint16_t*>(out), n);
      else if constexpr (std::is_same_v<In, const half>)
        f16_to_f32_f16c(reinterpret_cast<const std::uint16_t*>(in), out, n);
      else
        round_f32_f16_f16c(in, out, n);
      return;
    }
#endif
    for (index_t i = 0; i < n; ++i) f(out[i], in[i]);
  }
}

}  // namespace trainkit::backend::cpu_convert
