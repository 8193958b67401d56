// trainkit/backend/cuda/reduce.cuh - reduce<cuda>::run: sum, mean, amax, argmax... on the GPU with
// the reducer functors of core/reducers.hpp (init/step/merge/finish, all TRAINKIT_HD).
//
// The problem is seen as n_out outputs, each folding n_red elements (kept dims x reduced dims,
// each group coalesced). Two kernels:
//   row:    the innermost reduced dim is contiguous - a warp folds each output when there are
//           enough outputs to fill the device with warps, else a block does (long rows, few
//           outputs); 16-byte vector loads, four in flight per thread, when the whole reduced
//           space is one dense run. Lanes meet by warp shuffles, warps through shared memory.
//   column: otherwise - a block is BX adjacent outputs wide (adjacent threads read adjacent
//           outputs, so the loads coalesce) and BY = block_threads / BX lanes deep; the lanes
//           take every BY-th element of the block's k range (four loads in flight when there is
//           one reduced dim) and their partials meet in a shared-memory tree.
// When there are too few outputs to fill the GPU, each output's k range is cut into contiguous
// splits (at most one wave of resident blocks) whose partials a third kernel merges in split
// order - a warp per output when there are 32 splits or more. Partials of one group interleave
// in k, so merges of states that carry an index (argmax) are ordered by that index: ties and
// NaNs resolve to the first occurrence, as on the host. The launch configuration depends only on
// the shape and the device, so results repeat bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <sstream>
#include <type_traits>
#include <vector>

#include "trainkit/backend/cuda/allocator.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/reduce.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

namespace gpu::detail {

template <class R, class A>
__device__ __forceinline__ A ordered_merge(const R& r, const A& a, const A& b) {
  if constexpr (requires { a.k; }) {
    if (b.k >= 0 && (a.k < 0 || b.k < a.k)) return r.merge(b, a);
  }
  return r.merge(a, b);
}

/// A reducer state moved down the warp by 32-bit words (states here are 4, 8 or 16 bytes).
template <class A>
__device__ __forceinline__ A shfl_down_state(const A& a, int s) {
  constexpr int W = int(sizeof(A) / 4);
  unsigned w[W];
  memcpy(w, &a, sizeof(A));
#pragma unroll
  for (int i = 0; i < W; ++i) w[i] = __shfl_down_sync(0xffffffffu, w[i], s);
  A b;
  memcpy(&b, w, sizeof(A));
  return b;
}

template <class A>
inline constexpr bool shuffles = sizeof(A) % 4 == 0 && sizeof(A) <= 32;

/// Lane 0 gets the merge of lanes [0, n) (n a power of two, at most 32), in a fixed tree; every
/// lane of the warp must call it.
template <class R, class A>
__device__ __forceinline__ A warp_merge(const R& r, A a, int n) {
  for (int s = n / 2; s > 0; s >>= 1) a = ordered_merge(r, a, shfl_down_state(a, s));
  return a;
}

struct reduce_params {
  offset_calc<2> kept;  // strides[0]: input, strides[1]: output
  offset_calc<1> red;   // the reduced dims and their input strides
  index_t n_out = 0, n_red = 0;
  index_t chunk = 0;    // elements of k per split
  int splits = 1;
};

/// Input offset of reduced element k (row-major over the reduced dims).
__device__ __forceinline__ index_t reduced_offset(const reduce_params& p, index_t k) {
  if (p.red.dims == 1) return k * p.red.strides[0][0];
  index_t off[1];
  p.red.get(k, off);
  return off[0];
}

template <class R, class Out, class A>
__device__ __forceinline__ void reduce_store(const reduce_params& p, const R& r, Out* out, A* partial, index_t o,
                                             index_t out_off, const A& a) {
  if (p.splits == 1)
    out[out_off] = r.template finish<Out>(a, p.n_red);
  else
    partial[index_t(blockIdx.y) * p.n_out + o] = a;
}

// G: threads per output (32: a warp, short rows; block_threads: long rows), a run-time value so
// that each reducer and type compiles two row kernels, not four.
template <bool Vec, class R, class In, class Out, class A>
__global__ void __launch_bounds__(block_threads) reduce_row_kernel(reduce_params p, int G, R r, const In* in,
                                                                  Out* out, A* partial) {
  using C = compute_t<In>;
  const int groups = block_threads / G;
  __shared__ alignas(16) unsigned char smem_raw[block_threads * sizeof(A)];
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int group = int(threadIdx.x) / G, lane = int(threadIdx.x) % G;
  const index_t o = index_t(blockIdx.x) * groups + group;
  A a = r.init();
  index_t out_off = 0;
  if (o < p.n_out) {
    index_t offs[2];
    p.kept.get(o, offs);
    out_off = offs[1];
    const In* base = in + offs[0];
    const index_t k0 = index_t(blockIdx.y) * p.chunk;
    const index_t k1 = k0 + p.chunk < p.n_red ? k0 + p.chunk : p.n_red;
    if constexpr (Vec) {
      constexpr int V = int(16 / sizeof(In));
      using VT = vec<In, V>;
      constexpr int U = 4;
      index_t k = k0 + index_t(lane) * V;
      // Four independent 16-byte loads in flight per thread, then fold them in k order.
      for (; k + index_t(U - 1) * G * V + V <= k1; k += index_t(U) * G * V) {
        VT x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) x[u] = *reinterpret_cast<const VT*>(base + k + index_t(u) * G * V);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int j = 0; j < V; ++j) a = r.step(a, static_cast<C>(x[u].v[j]), k + index_t(u) * G * V + j);
      }
      for (; k + V <= k1; k += index_t(G) * V) {
        const VT x = *reinterpret_cast<const VT*>(base + k);
#pragma unroll
        for (int j = 0; j < V; ++j) a = r.step(a, static_cast<C>(x.v[j]), k + j);
      }
      // The ragged end of the split: k1 - k0 is a multiple of G*V except in the last split.
      const index_t vec_end = k0 + (k1 - k0) / V * V;
      for (index_t t = vec_end + lane; t < k1; t += G) a = r.step(a, static_cast<C>(base[t]), t);
    } else {
      for (index_t k = k0 + lane; k < k1; k += G) a = r.step(a, static_cast<C>(base[reduced_offset(p, k)]), k);
    }
  }
  if constexpr (shuffles<A>) {
    // Lanes of a warp meet by shuffles; with a block per output, the warps' results then meet in
    // warp 0.
    a = warp_merge(r, a, 32);
    if (G > 32) {
      const int warp = int(threadIdx.x) / 32, wl = int(threadIdx.x) % 32;
      if (wl == 0) smem[warp] = a;
      __syncthreads();
      if (warp == 0) {
        a = wl < block_threads / 32 ? smem[wl] : r.init();
        a = warp_merge(r, a, block_threads / 32);
      }
    }
    if (lane == 0 && o < p.n_out) reduce_store(p, r, out, partial, o, out_off, a);
  } else {
    smem[threadIdx.x] = a;
    __syncthreads();
    for (int s = G / 2; s > 0; s >>= 1) {
      if (lane < s) smem[threadIdx.x] = ordered_merge(r, smem[threadIdx.x], smem[threadIdx.x + s]);
      __syncthreads();
    }
    if (lane == 0 && o < p.n_out) reduce_store(p, r, out, partial, o, out_off, smem[threadIdx.x]);
  }
}

/// Input offset of reduced element k; `inner` gets its index along the innermost reduced dim.
__device__ __forceinline__ index_t reduced_offset(const reduce_params& p, index_t k, index_t& inner) {
  const int nd = p.red.dims;
  index_t off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    const index_t i = d > 0 ? divmod(k, p.red.sizes[d]) : k;
    if (d == nd - 1) inner = i;
    off += i * p.red.strides[0][d];
  }
  return off;
}

// BX: outputs per block, a power of two dividing block_threads (chosen on the host); a run-time
// value like G of the row kernel.
template <class R, class In, class Out, class A>
__global__ void __launch_bounds__(block_threads) reduce_column_kernel(reduce_params p, int BX, R r, const In* in,
                                                                     Out* out, A* partial) {
  using C = compute_t<In>;
  __shared__ alignas(16) unsigned char smem_raw[block_threads * sizeof(A)];
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int BY = block_threads / BX;
  const int tx = int(threadIdx.x) % BX, ty = int(threadIdx.x) / BX;
  const index_t o = index_t(blockIdx.x) * BX + tx;
  A a = r.init();
  index_t out_off = 0;
  if (o < p.n_out) {
    index_t offs[2];
    p.kept.get(o, offs);
    out_off = offs[1];
    const In* base = in + offs[0];
    const index_t k0 = index_t(blockIdx.y) * p.chunk;
    const index_t k1 = k0 + p.chunk < p.n_red ? k0 + p.chunk : p.n_red;
    index_t k = k0 + ty;
    if (p.red.dims == 1) {
      // One reduced dim: four independent loads in flight per thread, folded in k order (the
      // same sequence of steps as one at a time).
      const index_t s = p.red.strides[0][0];
      for (; k + index_t(3) * BY < k1; k += index_t(4) * BY) {
        const C x0 = static_cast<C>(base[k * s]), x1 = static_cast<C>(base[(k + BY) * s]);
        const C x2 = static_cast<C>(base[(k + 2 * BY) * s]), x3 = static_cast<C>(base[(k + 3 * BY) * s]);
        a = r.step(a, x0, k);
        a = r.step(a, x1, k + BY);
        a = r.step(a, x2, k + 2 * BY);
        a = r.step(a, x3, k + 3 * BY);
      }
      for (; k < k1; k += BY) a = r.step(a, static_cast<C>(base[k * s]), k);
    } else if (k < k1) {
      // Steps of BY along the innermost reduced dim; a full decomposition only when one leaves it.
      const index_t size = p.red.sizes[p.red.dims - 1], step = index_t(BY) * p.red.strides[0][p.red.dims - 1];
      index_t inner = 0;
      index_t off = reduced_offset(p, k, inner);
      for (;;) {
        a = r.step(a, static_cast<C>(base[off]), k);
        k += BY;
        if (k >= k1) break;
        inner += BY;
        off += step;
        if (inner >= size) off = reduced_offset(p, k, inner);
      }
    }
  }
  smem[threadIdx.x] = a;
  __syncthreads();
  for (int s = BY / 2; s > 0; s >>= 1) {
    if (ty < s) smem[threadIdx.x] = ordered_merge(r, smem[threadIdx.x], smem[threadIdx.x + s * BX]);
    __syncthreads();
  }
  if (ty == 0 && o < p.n_out) reduce_store(p, r, out, partial, o, out_off, smem[threadIdx.x]);
}

template <class R, class Out, class A>
__global__ void __launch_bounds__(block_threads) reduce_finish_kernel(reduce_params p, R r, Out* out,
                                                                     const A* partial) {
  const index_t o = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (o >= p.n_out) return;
  index_t offs[2];
  p.kept.get(o, offs);
  A a = partial[o];
  for (int s = 1; s < p.splits; ++s) a = ordered_merge(r, a, partial[index_t(s) * p.n_out + o]);
  out[offs[1]] = r.template finish<Out>(a, p.n_red);
}

// Many splits (a few outputs over a long range): a warp per output, lane l merging splits l, l+32...
// in order, then a fixed tree over the lanes.
template <class R, class Out, class A>
__global__ void __launch_bounds__(block_threads) reduce_finish_warp_kernel(reduce_params p, R r, Out* out,
                                                                          const A* partial) {
  const index_t o = index_t(blockIdx.x) * (block_threads / 32) + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  A a = r.init();
  if (o < p.n_out)
    for (int s = lane; s < p.splits; s += 32) a = ordered_merge(r, a, partial[index_t(s) * p.n_out + o]);
  a = warp_merge(r, a, 32);
  if (lane == 0 && o < p.n_out) {
    index_t offs[2];
    p.kept.get(o, offs);
    out[offs[1]] = r.template finish<Out>(a, p.n_red);
  }
}

// Merges adjacent dims of one group (kept or reduced) that walk memory as one.
inline void coalesce_group(shape& sz, std::vector<shape*> strides) {
  shape ns;
  std::vector<shape> nst(strides.size());
  for (std::size_t i = 0; i < sz.size(); ++i) {
    if (sz[i] == 1) continue;
    bool merge = !ns.empty();
    for (std::size_t k = 0; merge && k < strides.size(); ++k) merge = nst[k].back() == (*strides[k])[i] * sz[i];
    if (merge) {
      ns.back() *= sz[i];
      for (std::size_t k = 0; k < strides.size(); ++k) nst[k].back() = (*strides[k])[i];
    } else {
      ns.push_back(sz[i]);
      for (std::size_t k = 0; k < strides.size(); ++k) nst[k].push_back((*strides[k])[i]);
    }
  }
  sz = std::move(ns);
  for (std::size_t k = 0; k < strides.size(); ++k) *strides[k] = std::move(nst[k]);
}

inline std::string reduce_context(const shape& sizes) {
  std::ostringstream os;
  os << "reduction over sizes " << to_string(sizes);
  return os.str();
}

}  // namespace gpu::detail

/// The CUDA model of the reduction (contract in backend/reduce.hpp); runs on the current stream.
template <>
struct reduce<cuda> {
  template <class R, class In, class Out>
  static void run(const shape& sizes, const std::vector<bool>& reduced, const In* in, const shape& in_strides,
                  Out* out, const shape& out_strides, R r) {
    namespace g = gpu::detail;
    using A = decltype(r.init());
    static_assert(std::is_trivially_copyable_v<A> && std::is_trivially_copyable_v<R>,
                  "reduce<cuda>: reducer and state are copied to the device");
    reduce_dims dims = split_reduce_dims(sizes, reduced, in_strides, out_strides);
    shape &ksz = dims.kept_sizes, &kin = dims.kept_in_strides, &kout = dims.kept_out_strides;
    shape &rsz = dims.reduced_sizes, &rin = dims.reduced_in_strides;
    const index_t n_out = numel(ksz), n_red = numel(rsz);
    if (n_out == 0) return;
    g::coalesce_group(ksz, {&kin, &kout});
    g::coalesce_group(rsz, {&rin});
    TRAINKIT_CHECK(ksz.size() <= std::size_t(g::max_dims) && rsz.size() <= std::size_t(g::max_dims), shape_error,
                   "reduce<cuda>", "more than " << g::max_dims << " kept or reduced dimensions after coalescing in "
                                                << to_string(sizes));
    if (ksz.empty()) {  // one output
      ksz = {1};
      kin = {0};
      kout = {0};
    }
    if (rsz.empty()) {  // nothing (or one element) to fold per output
      rsz = {1};
      rin = {0};
    }
    g::reduce_params p;
    p.kept = g::make_offset_calc<2>(ksz, {kin, kout});
    p.red = g::make_offset_calc<1>(rsz, {rin});
    p.n_out = n_out;
    p.n_red = n_red;

    const auto& info = gpu::current_device_info();
    const index_t target_blocks = index_t(info.multiprocessors) * 8;
    const cudaStream_t st = gpu::current_stream();
    const bool row = n_red > 1 && rin.back() == 1;
    constexpr int V = sizeof(In) <= 8 ? int(16 / sizeof(In)) : 1;
    bool vec_ok = row && V > 1 && rsz.size() == 1 && g::aligned(in, 16);
    for (std::size_t d = 0; vec_ok && d < kin.size(); ++d)
      vec_ok = ksz[d] == 1 || (kin[d] * index_t(sizeof(In))) % 16 == 0;

    if (row) {
      // A warp per output when there are enough outputs to fill the device with warps (short
      // per-block work and no block-wide merge); a block per output, split along k if need be,
      // when there are few long rows.
      const index_t warps_per_block = g::block_threads / 32;
      const int G = n_red >= 2048 && n_out < target_blocks * warps_per_block ? g::block_threads : 32;
      const index_t groups = g::block_threads / G;
      const index_t base_blocks = (n_out + groups - 1) / groups;
      const index_t step = index_t(G) * (vec_ok ? V : 1);
      int splits = 1;
      // At most one wave of resident blocks: a second, partial wave would double the time.
      if (base_blocks < target_blocks)
        splits = int(std::clamp<index_t>(std::min(target_blocks / base_blocks, n_red / (step * 16)), 1, 65535));
      launch_split(p, splits, step, [&](dim3 grid, A* partial) {
        if constexpr (V > 1) {
          if (vec_ok) {
            g::reduce_row_kernel<true, R, In, Out, A><<<grid, g::block_threads, 0, st>>>(p, G, r, in, out, partial);
            gpu::check_launch("reduce_row_kernel", g::reduce_context(sizes));
            return;
          }
        }
        g::reduce_row_kernel<false, R, In, Out, A><<<grid, g::block_threads, 0, st>>>(p, G, r, in, out, partial);
        gpu::check_launch("reduce_row_kernel", g::reduce_context(sizes));
      }, (n_out + groups - 1) / groups, r, out);
    } else {
      // BX: a warp's width of outputs (fewer when there are fewer); BY: lanes over k, halved
      // until each has 8 elements or more, the threads freed widening BX.
      int bx = 1;
      while (bx < 32 && bx < n_out) bx *= 2;
      int by = g::block_threads / bx;
      while (by > 1 && index_t(by) * 8 > n_red) by /= 2;
      bx = g::block_threads / by;
      const index_t base_blocks = (n_out + bx - 1) / bx;
      int splits = 1;
      if (base_blocks < target_blocks && n_red > index_t(by) * 64)
        splits = int(std::clamp<index_t>(std::min(target_blocks / base_blocks, n_red / (index_t(by) * 32)), 1, 65535));
      launch_split(p, splits, 1, [&](dim3 grid, A* partial) {
        g::reduce_column_kernel<R, In, Out, A><<<grid, g::block_threads, 0, st>>>(p, bx, r, in, out, partial);
        gpu::check_launch("reduce_column_kernel", g::reduce_context(sizes));
      }, base_blocks, r, out);
    }
  }

 private:
  // Sets the split size, runs `launch(grid, partial)` and, with several splits, merges them.
  template <class Launch, class R, class Out>
  static void launch_split(gpu::detail::reduce_params& p, int splits, index_t step, Launch&& launch, index_t grid_x,
                           const R& r, Out* out) {
    namespace g = gpu::detail;
    using A = decltype(r.init());
    index_t chunk = (p.n_red + splits - 1) / std::max(splits, 1);
    chunk = std::max<index_t>(step, (chunk + step - 1) / step * step);
    p.chunk = chunk;
    p.splits = int((p.n_red + chunk - 1) / chunk);
    if (p.splits < 1) p.splits = 1;
    const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(p.splits));
    TRAINKIT_CHECK(grid_x <= index_t(0x7fffffff), shape_error, "reduce<cuda>",
                   "too many outputs (" << p.n_out << ") for one launch");
    if (p.splits == 1) {
      launch(grid, static_cast<A*>(nullptr));
      return;
    }
    const std::size_t bytes = std::size_t(p.splits) * std::size_t(p.n_out) * sizeof(A);
    A* partial = static_cast<A*>(allocator<cuda>::allocate(bytes));
    struct release {
      void* q;
      std::size_t b;
      ~release() { allocator<cuda>::deallocate(q, b); }  // stream-ordered: later work on this stream reuses it
    } guard{partial, bytes};
    launch(grid, partial);
    if constexpr (g::shuffles<A>) {
      if (p.splits >= 32) {
        constexpr index_t per_block = g::block_threads / 32;
        g::reduce_finish_warp_kernel<R, Out, A><<<static_cast<unsigned>((p.n_out + per_block - 1) / per_block),
                                                  g::block_threads, 0, gpu::current_stream()>>>(p, r, out, partial);
        gpu::check_launch("reduce_finish_warp_kernel");
        return;
      }
    }
    g::reduce_finish_kernel<R, Out, A><<<g::grid_for(p.n_out, g::block_threads), g::block_threads, 0,
                                         gpu::current_stream()>>>(p, r, out, partial);
    gpu::check_launch("reduce_finish_kernel");
  }
};

}  // namespace trainkit::backend
