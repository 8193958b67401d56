// trainkit/backend/cpu/reduce.hpp - reductions on the host, parallel over outputs (OpenMP).
#pragma once

#include <algorithm>  // std::min
#include <type_traits>  // std::integral_constant
#include <vector>

#include "trainkit/backend/reduce.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

template <>
struct reduce<cpu> {
  template <class R, class In, class Out>
  static void run(const shape& sizes, const std::vector<bool>& reduced, const In* in, const shape& in_strides,
                  Out* out, const shape& out_strides, R r) {
    reduce_dims dims = split_reduce_dims(sizes, reduced, in_strides, out_strides);
    shape &ksz = dims.kept_sizes, &kin = dims.kept_in_strides, &kout = dims.kept_out_strides;
    shape &rsz = dims.reduced_sizes, &rin = dims.reduced_in_strides;
    const index_t n_out = numel(ksz), n_red = numel(rsz);
    if (n_out == 0) return;
    using C = compute_t<In>;

    auto outer_offsets = [&](index_t o, index_t& ioff, index_t& ooff) {
      ioff = 0;
      ooff = 0;
      for (std::size_t d = ksz.size(); d-- > 0;) {
        const index_t i = o % ksz[d];
        o /= ksz[d];
        ioff += i * kin[d];
        ooff += i * kout[d];
      }
    };
    // Folds reduced elements [k0, k1) starting at input offset base.
    auto fold = [&](index_t base, index_t k0, index_t k1) {
      auto a = r.init();
      if (k0 >= k1) return a;
      const std::size_t nr = rsz.size();
      if (nr == 0) return r.step(a, static_cast<C>(in[base]), 0);
      std::vector<index_t> idx(nr);
      index_t rem = k0, off = base;
      for (std::size_t d = nr; d-- > 0;) {
        idx[d] = rem % rsz[d];
        rem /= rsz[d];
        off += idx[d] * rin[d];
      }
      const index_t last = rsz[nr - 1], lst = rin[nr - 1];
      index_t k = k0;
      while (k < k1) {
        // Run along the innermost reduced dim, then carry the odometer.
        const index_t run = std::min(last - idx[nr - 1], k1 - k);
        for (index_t j = 0; j < run; ++j) a = r.step(a, static_cast<C>(in[off + j * lst]), k + j);
        k += run;
        off += run * lst;
        idx[nr - 1] += run;
        for (std::size_t d = nr - 1; d > 0 && idx[d] == rsz[d]; --d) {
          off -= idx[d] * rin[d];
          idx[d] = 0;
          ++idx[d - 1];
          off += rin[d - 1];
        }
      }
      return a;
    };

    const bool big = n_out * n_red >= 32768;
    if (n_out == 1 && big && n_red >= 65536) {
      // One output from many inputs: per-thread partial folds over contiguous k ranges,
      // merged in k order so the result does not depend on scheduling.
#if TRAINKIT_HAS_OPENMP
      const int nt = omp_get_max_threads();
#else
      const int nt = 1;
#endif
      using A = decltype(r.init());
      std::vector<A> part(static_cast<std::size_t>(nt), r.init());
      const index_t chunk = (n_red + nt - 1) / nt;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static)
#endif
      for (int t = 0; t < nt; ++t)
        part[static_cast<std::size_t>(t)] = fold(0, std::min(n_red, t * chunk), std::min(n_red, (t + 1) * chunk));
      A a = part[0];
      for (int t = 1; t < nt; ++t) a = r.merge(a, part[static_cast<std::size_t>(t)]);
      out[0] = r.template finish<Out>(a, n_red);
      return;
    }
    if (!ksz.empty() && kin.back() == 1 && kout.back() == 1 && ksz.back() >= 8 && !rsz.empty()) {
      // The outputs are contiguous along the innermost kept dim in the input too (a column sum:
      // a bias gradient). A tile of them folds together, one reduced element after another, so the
      // reads are unit-stride rows instead of strided columns; each output still folds its own
      // elements in k order, as one at a time would.
      constexpr index_t tile = 64;
      const index_t inner = ksz.back(), per_row = (inner + tile - 1) / tile, items = n_out / inner * per_row;
      const std::size_t nr = rsz.size();
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big)
#endif
      for (index_t item = 0; item < items; ++item) {
        const index_t j0 = item % per_row * tile, len = std::min(tile, inner - j0);
        index_t ioff, ooff;
        outer_offsets(item / per_row * inner + j0, ioff, ooff);
        using A = decltype(r.init());
        A acc[tile];
        for (index_t j = 0; j < len; ++j) acc[j] = r.init();
        std::vector<index_t> idx(nr, 0);
        index_t off = ioff;
        // A full tile's row has a trip count the vectoriser knows: the tile's accumulators stay in
        // vector registers (a variable count kept them in memory, one scalar add at a time).
        auto fold_row = [&](const In* row, index_t k, auto n) {
          for (index_t j = 0; j < index_t(n); ++j) acc[j] = r.step(acc[j], static_cast<C>(row[j]), k);
        };
        for (index_t k = 0; k < n_red; ++k) {
          if (len == tile)
            fold_row(in + off, k, std::integral_constant<index_t, tile>{});
          else
            fold_row(in + off, k, len);
          for (std::size_t d = nr; d-- > 0;) {  // the odometer over the reduced dims
            off += rin[d];
            if (++idx[d] < rsz[d]) break;
            off -= idx[d] * rin[d];
            idx[d] = 0;
          }
        }
        for (index_t j = 0; j < len; ++j) out[ooff + j] = r.template finish<Out>(acc[j], n_red);
      }
      return;
    }
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big)
#endif
    for (index_t o = 0; o < n_out; ++o) {
      index_t ioff, ooff;
      outer_offsets(o, ioff, ooff);
      out[ooff] = r.template finish<Out>(fold(ioff, 0, n_red), n_red);
    }
  }
};

}  // namespace trainkit::backend
