// trainkit/backend/cpu/dropout.hpp - the dropout mask on the host, four values per Philox block.
#pragma once

#include <cstdint>

#include "trainkit/backend/dropout.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/generator.hpp"

namespace trainkit::backend {

template <>
struct dropout<cpu> {
  template <class T>
  static void mask(std::uint64_t seed, std::uint64_t offset, index_t n, float keep, double scale, T* out) {
    const T on = T(scale), off = T(0);
    const index_t blocks = (n + 3) / 4;
    const bool big = blocks > 4096;
    (void)big;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big)
#endif
    for (index_t b = 0; b < blocks; ++b) {
      // One Philox block gives the four words of values 4b..4b+3 (uniform_at's rule).
      const philox_result r = philox_block(seed, offset + std::uint64_t(b));
      for (index_t k = 0; k < 4 && 4 * b + k < n; ++k) out[4 * b + k] = uniform_float(r.v[k]) < keep ? on : off;
    }
  }
};

}  // namespace trainkit::backend
