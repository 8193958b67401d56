// tests/core/test_cpu_features.cpp - backend/cpu/cpu_features.hpp: the ISA limit's names, what a
// limit turns off, and that the limit in force (TRAINKIT_MAX_CPU_ISA, run both ways by ctest:
// test_core_test_cpu_features and ..._avx2) reaches trainkit's own checks and oneDNN alike.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "trainkit/backend/cpu/convert16.hpp"
#include "trainkit/backend/cpu/cpu_features.hpp"
#include "trainkit/backend/cpu/onednn.hpp"
#include "trainkit/core/bfloat16.hpp"

namespace cf = trainkit::backend::cpu_features;

TEST_CASE("ISA limits parse oneDNN's names in any case and reject the rest", "[cpu]") {
  CHECK(cf::parse_isa("avx2", "X") == cf::isa::avx2);
  CHECK(cf::parse_isa("AVX512_CORE_BF16", "X") == cf::isa::avx512_core_bf16);
  CHECK(cf::parse_isa("", "X") == cf::isa::all);
  CHECK(cf::parse_isa("All", "X") == cf::isa::all);
  CHECK_THROWS_AS(cf::parse_isa("avx3", "TRAINKIT_MAX_CPU_ISA"), trainkit::value_error);
  CHECK_THROWS_WITH(cf::parse_isa("avx3", "TRAINKIT_MAX_CPU_ISA"),
                    Catch::Contains("TRAINKIT_MAX_CPU_ISA") && Catch::Contains("avx3") && Catch::Contains("avx2"));
}

TEST_CASE("a limit turns off what its tier does not have", "[cpu]") {
  cf::features all;
  all.avx2 = all.fma = all.f16c = all.avx512 = all.avx512_bf16 = all.avx512_fp16 = all.amx_bf16 = true;
  all.avx_vnni = all.avx_ne_convert = true;
  CHECK(all.bf16_arithmetic());
  const auto avx2 = cf::limited(all, cf::isa::avx2);
  CHECK(avx2.avx2);
  CHECK(avx2.fma);
  CHECK(avx2.f16c);
  CHECK_FALSE(avx2.avx512);
  CHECK_FALSE(avx2.bf16_arithmetic());
  const auto core = cf::limited(all, cf::isa::avx512_core);
  CHECK(core.avx512);
  CHECK_FALSE(core.avx512_bf16);
  CHECK(cf::limited(all, cf::isa::avx512_core_bf16).avx512_bf16);
  CHECK_FALSE(cf::limited(all, cf::isa::avx512_core_bf16).amx_bf16);
  CHECK_FALSE(cf::limited(all, cf::isa::sse41).f16c);
  CHECK(cf::limited(all, cf::isa::all).amx_bf16);
}

TEST_CASE("the limit in force reaches trainkit's checks and oneDNN", "[cpu]") {
  const std::string line = cf::describe();
  std::printf("%s\n", line.c_str());
  CHECK(line.find(cf::detected().model) != std::string::npos);
  const auto& cur = cf::current();
  const auto& det = cf::detected();
  // current() never claims what the CPU lacks
  CHECK((!cur.avx512 || det.avx512));
  CHECK((!cur.avx512_bf16 || det.avx512_bf16));
  CHECK((!cur.f16c || det.f16c));
  CHECK(trainkit::backend::cpu_convert::has_f16c() == cur.f16c);
  const char* limit = std::getenv("TRAINKIT_MAX_CPU_ISA");
  if (limit != nullptr && std::string(limit) == "avx2") {
    CHECK(cf::max_isa() == cf::isa::avx2);
    CHECK_FALSE(cur.avx512);
    CHECK_FALSE(cur.bf16_arithmetic());
    CHECK(line.find("TRAINKIT_MAX_CPU_ISA=avx2") != std::string::npos);
    // oneDNN 2.x has no bf16 kernel below AVX-512: the limit was handed over
    CHECK_FALSE(trainkit::backend::onednn_supports<trainkit::bfloat16>());
  }
#if TRAINKIT_HAS_ONEDNN
  // oneDNN runs bf16 from AVX-512 on (emulated below AVX512-BF16), on whatever tier is in force
  CHECK(trainkit::backend::onednn_supports<trainkit::bfloat16>() == cur.avx512);
#endif
}
