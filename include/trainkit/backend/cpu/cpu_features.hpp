// trainkit/backend/cpu/cpu_features.hpp - what this CPU can do (CPUID, once per process), its
// model name, and the instruction-set limit that makes a big CPU behave like a smaller one.
//
// The limit: TRAINKIT_MAX_CPU_ISA, else oneDNN's own ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA), with
// oneDNN's names (sse41, avx, avx2, avx2_vnni, avx512_core, avx512_core_vnni, avx512_core_bf16,
// avx512_core_fp16, avx512_core_amx, all; any case). One variable limits trainkit's own checks and
// oneDNN's dispatch alike (backend/cpu/onednn_context.hpp hands TRAINKIT_MAX_CPU_ISA to oneDNN), so that an
// AVX-512 machine runs the AVX2 machine's paths: `ONEDNN_MAX_CPU_ISA=avx2 ctest ...`.
#pragma once

#include <algorithm>  // std::transform
#include <array>
#include <atomic>
#include <cctype>     // std::tolower
#include <cstdlib>    // std::getenv
#include <cstdio>     // std::fprintf
#include <cstring>    // std::memcpy
#include <string>
#include <string_view>

#include "trainkit/core/error.hpp"

// CUDA translation units probe too (nvcc hands host code to the host compiler): one definition of
// these inline functions in every translation unit of a program.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TRAINKIT_CPU_X86_CPUID 1
#include <cpuid.h>
#else
#define TRAINKIT_CPU_X86_CPUID 0
#endif

namespace trainkit::backend::cpu_features {

/// oneDNN's instruction-set tiers, in order: a limit keeps its tier and the ones below.
enum class isa { sse41, avx, avx2, avx2_vnni, avx512_core, avx512_core_vnni, avx512_core_bf16, avx512_core_fp16,
                 avx512_core_amx, all };

inline constexpr std::array<std::string_view, 10> isa_names{
    "sse41", "avx", "avx2", "avx2_vnni", "avx512_core", "avx512_core_vnni", "avx512_core_bf16", "avx512_core_fp16",
    "avx512_core_amx", "all"};

inline std::string_view name(isa i) { return isa_names[std::size_t(i)]; }

/// An ISA limit's value (any case); "" -> all; anything else is a value_error naming the variable.
inline isa parse_isa(std::string_view value, std::string_view variable) {
  std::string v(value);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (v.empty()) return isa::all;
  for (std::size_t i = 0; i < isa_names.size(); ++i)
    if (v == isa_names[i]) return isa(i);
  std::string known;
  for (auto n : isa_names) known += (known.empty() ? "" : ", ") + std::string(n);
  TRAINKIT_CHECK(false, value_error, variable, "'" << value << "' is not one of " << known);
  return isa::all;
}

/// The variable that sets the limit (the first set of TRAINKIT_MAX_CPU_ISA, ONEDNN_MAX_CPU_ISA,
/// DNNL_MAX_CPU_ISA), or an empty view.
inline std::string_view limit_variable() {
  for (const char* v : {"TRAINKIT_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* s = std::getenv(v);
    if (s && *s) return v;
  }
  return {};
}

/// The limit in force, read once.
inline isa max_isa() {
  static const isa limit = [] {
    const auto var = limit_variable();
    return var.empty() ? isa::all : parse_isa(std::getenv(std::string(var).c_str()), var);
  }();
  return limit;
}

/// The features trainkit's CPU paths and tests ask about.
struct features {
  std::string model;  // the brand string, e.g. "AMD EPYC 9R14 96-Core Processor"
  bool known = true;  // false where CPUID is not read (not an x86 CPU)
  bool avx2 = false, fma = false, f16c = false;
  bool avx512 = false;  // AVX-512 F, BW, VL and DQ (oneDNN's avx512_core)
  bool avx512_bf16 = false, avx512_fp16 = false, amx_bf16 = false;
  bool avx_vnni = false, avx_ne_convert = false;

  /// bfloat16 arithmetic in hardware: dot products or conversions of bf16 (AVX512-BF16, AMX-BF16,
  /// AVX-NE-CONVERT). Without it a bf16 GEMM widens its operands to fp32.
  bool bf16_arithmetic() const { return avx512_bf16 || amx_bf16 || avx_ne_convert; }

  /// "avx2 fma f16c avx512 avx512_bf16": the features set.
  std::string flags() const {
    std::string s;
    auto add = [&s](bool on, const char* n) {
      if (on) s += (s.empty() ? "" : " ") + std::string(n);
    };
    add(avx2, "avx2"), add(fma, "fma"), add(f16c, "f16c"), add(avx_vnni, "avx_vnni"),
        add(avx_ne_convert, "avx_ne_convert"), add(avx512, "avx512"), add(avx512_bf16, "avx512_bf16"),
        add(avx512_fp16, "avx512_fp16"), add(amx_bf16, "amx_bf16");
    return s.empty() ? std::string("(none of avx2 fma f16c avx512 bf16)") : s;
  }
};

/// `f` with what `limit` forbids turned off.
inline features limited(features f, isa limit) {
  if (limit < isa::avx) f.f16c = false;  // F16C needs the YMM state, as AVX does
  if (limit < isa::avx2) f.avx2 = f.fma = false;
  if (limit < isa::avx2_vnni) f.avx_vnni = f.avx_ne_convert = false;
  if (limit < isa::avx512_core) f.avx512 = false;
  if (limit < isa::avx512_core_bf16 || !f.avx512) f.avx512_bf16 = false;
  if (limit < isa::avx512_core_fp16 || !f.avx512) f.avx512_fp16 = false;
  if (limit < isa::avx512_core_amx) f.amx_bf16 = false;
  return f;
}

namespace detail {
#if TRAINKIT_CPU_X86_CPUID
inline features probe() {
  features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  if (osxsave) __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const unsigned long long xcr0 = (static_cast<unsigned long long>(xcr0_hi) << 32) | xcr0_lo;
  const bool ymm = osxsave && (xcr0 & 6u) == 6u, zmm = ymm && (xcr0 & 0xe0u) == 0xe0u,
             tiles = ymm && (xcr0 & 0x60000u) == 0x60000u;
  f.f16c = ymm && avx && ((c >> 29) & 1u);
  f.fma = ymm && ((c >> 12) & 1u);
  unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0, d71 = 0, unused = 0;
  if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7)) {
    f.avx2 = ymm && ((b7 >> 5) & 1u);
    f.avx512 = zmm && ((b7 >> 16) & 1u) && ((b7 >> 17) & 1u) && ((b7 >> 30) & 1u) && ((b7 >> 31) & 1u);
    f.avx512_fp16 = f.avx512 && ((d7 >> 23) & 1u);
    f.amx_bf16 = tiles && ((d7 >> 22) & 1u);
    if (__get_cpuid_count(7, 1, &a71, &unused, &unused, &d71)) {
      f.avx512_bf16 = f.avx512 && ((a71 >> 5) & 1u);
      f.avx_vnni = ymm && ((a71 >> 4) & 1u);
      f.avx_ne_convert = ymm && ((d71 >> 5) & 1u);
    }
  }
  unsigned top = __get_cpuid_max(0x80000000u, nullptr);
  if (top >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      unsigned r[4] = {};
      __get_cpuid(0x80000002u + leaf, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(brand + 16 * leaf, r, 16);
    }
    f.model = brand;
    const auto first = f.model.find_first_not_of(' '), last = f.model.find_last_not_of(' ');
    f.model = first == std::string::npos ? std::string() : f.model.substr(first, last - first + 1);
  }
  if (f.model.empty()) f.model = "unknown x86-64 CPU";
  return f;
}
#else
inline features probe() {
  features f;
  f.model = "CPU not probed here";
  f.known = false;
  return f;
}
#endif
}  // namespace detail

/// What the CPU reports, ignoring the limit.
inline const features& detected() {
  static const features f = detail::probe();
  return f;
}

namespace detail {
/// current()'s value, made once. Out of line, so that current() itself is a guard test and a load
/// the compiler inlines: the vector kernels ask per row or per chunk (has_avx2() and friends), and
/// with the features made inside it current() was a call each time, 0.6 % of the GPT example's step.
__attribute__((noinline)) inline const features& make_current() {
  static const features f = limited(detected(), max_isa());
  return f;
}
}  // namespace detail

/// What trainkit may use: detected() under max_isa().
inline const features& current() {
  static const features& f = detail::make_current();
  return f;
}

/// One line for benchmark and test output: "CPU: <model>; flags: ...; limit: TRAINKIT_MAX_CPU_ISA=avx2".
inline std::string describe() {
  std::string s = "CPU: " + detected().model + "; flags: " + current().flags();
  if (max_isa() != isa::all)
    s += "; limited by " + std::string(limit_variable()) + "=" + std::string(name(max_isa())) + " (the CPU has: " +
         detected().flags() + ")";
  return s;
}

/// The first bf16 GEMM or convolution of a mixed-precision scope on a CPU without bf16 arithmetic
/// says so, once per process, in one line on stderr: bf16 is not faster than fp32 there. Returns
/// whether this call printed it.
inline bool note_bf16_without_arithmetic() {
  if (!current().known || current().bf16_arithmetic()) return false;
  static std::atomic<bool> said{false};  // read first: every later bf16 op of the process passes here
  if (said.load(std::memory_order_relaxed) || said.exchange(true)) return false;
  std::fprintf(stderr,
               "trainkit: this CPU (%s) has no bf16 arithmetic (no AVX512-BF16, AMX-BF16 or AVX-NE-CONVERT): bf16 "
               "GEMMs and convolutions run on the fp32 kernels with bf16-rounded operands held in fp32 (fp32 "
               "accumulation, results rounded to bf16), so bf16 steps are no faster than fp32 here\n",
               detected().model.c_str());
  return true;
}

}  // namespace trainkit::backend::cpu_features
