// trainkit/backend/cuda/gather.cuh - gather<cuda>: embedding rows, their gradient (scatter-add)
// and one-hot targets on the GPU (contract in backend/gather.hpp).
//
// scatter_add_rows: with atomics (float, double, half, bfloat16) repeated indices are summed in an
// unspecified order; with settings().deterministic, or for other element types, each thread owns a
// column and adds the rows in index order - the host's order, bit for bit, but with only `cols`
// threads of parallelism.
//
// Indices are checked here, not on the host before the launch: a bad one is never followed (a
// zero row, a skipped row, no class matched) and, when the caller passed an index_check, it is
// recorded in the device's error record and raised at the next read on the host
// (device_error.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "trainkit/backend/cuda/device_error.cuh"
#include "trainkit/backend/cuda/launch.cuh"
#include "trainkit/backend/cuda/settings.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/gather.hpp"
#include "trainkit/core/dtype.hpp"

namespace trainkit::backend {

namespace gpu::detail {

/// The index check a kernel runs: rows in [0, rows) (the table's), and a record to report in.
struct row_bound {
  index_t rows = 0;
  device_fault* fault = nullptr;  // nullptr: do not report
  index_check check;
};

template <class T>
__global__ void __launch_bounds__(block_threads) gather_rows_kernel(const T* table, index_t cols,
                                                                    const std::int64_t* idx, index_t total, T* out,
                                                                    row_bound b) {
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= total) return;
  index_t row = i;
  const index_t c = divmod(row, cols);
  const std::int64_t r = idx[row];
  if (r < 0 || r >= b.rows) {
    out[i] = T(0);
    if (c == 0) record_bad_index(b.fault, b.check, r, row);
    return;
  }
  out[i] = table[r * cols + c];
}

template <class T>
inline constexpr bool has_atomic_add = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                       std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <class T>
__device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, half>)
    atomicAdd(reinterpret_cast<__half*>(p), __ushort_as_half(v.bits()));
  else if constexpr (std::is_same_v<T, bfloat16>)
    atomicAdd(reinterpret_cast<__nv_bfloat16*>(p), __ushort_as_bfloat16(v.bits()));
  else
    atomicAdd(p, v);
}

template <class T>
__global__ void __launch_bounds__(block_threads) scatter_add_atomic_kernel(const T* src, index_t cols,
                                                                           const std::int64_t* idx, index_t total,
                                                                           T* table, row_bound b) {
  const index_t i = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (i >= total) return;
  index_t row = i;
  const index_t c = divmod(row, cols);
  const std::int64_t r = idx[row];
  if (r < 0 || r >= b.rows) {
    if (c == 0) record_bad_index(b.fault, b.check, r, row);
    return;
  }
  if constexpr (has_atomic_add<T>) atomic_add(table + r * cols + c, src[i]);
}

template <class T>
__global__ void __launch_bounds__(block_threads) scatter_add_ordered_kernel(const T* src, index_t cols,
                                                                            const std::int64_t* idx, index_t n,
                                                                            T* table, row_bound b) {
  using C = compute_t<T>;
  const index_t c = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (c >= cols) return;
  for (index_t i = 0; i < n; ++i) {
    const std::int64_t r = idx[i];
    if (r < 0 || r >= b.rows) {
      if (c == 0) record_bad_index(b.fault, b.check, r, i);
      continue;
    }
    T& d = table[r * cols + c];
    d = T(C(d) + C(src[i * cols + c]));
  }
}

template <class T>
__global__ void __launch_bounds__(block_threads) one_hot_kernel(const std::int64_t* target, index_t classes,
                                                                index_t inner, double on, double off,
                                                                std::int64_t ignore_index, index_t total, T* out,
                                                                device_fault* fault, index_check check) {
  const index_t k = index_t(blockIdx.x) * block_threads + threadIdx.x;
  if (k >= total) return;
  index_t q = k;
  const index_t j = divmod(q, inner), c = divmod(q, classes), i = q;
  const std::int64_t t = target[i * inner + j];
  // A target out of [0, classes) matches no class: the column is `off`, and it is reported.
  if (c == 0 && t != ignore_index && (t < 0 || t >= classes)) record_bad_index(fault, check, t, i * inner + j);
  out[k] = t == ignore_index ? T(0) : T(t == c ? on : off);
}

}  // namespace gpu::detail

template <>
struct gather<cuda> {
  /// Bad indices are recorded by the kernels and raised at the next host read.
  static constexpr bool checks_on_device = true;

  /// `rows`: the table's rows (gather_rows and scatter_add_rows need it to stay in bounds: it is
  /// check->range, or else the rows are taken as valid up to INT64_MAX - pass a check).
  template <class T>
  static void gather_rows(const T* table, index_t cols, const std::int64_t* idx, index_t n, T* out,
                          const index_check* check = nullptr) {
    namespace d = gpu::detail;
    const index_t total = n * cols;
    if (total == 0) return;
    d::gather_rows_kernel<T><<<d::grid_for(total, d::block_threads), d::block_threads, 0, gpu::current_stream()>>>(
        table, cols, idx, total, out, bound(check));
    gpu::check_launch("gather_rows_kernel");
  }

  template <class T>
  static void scatter_add_rows(const T* src, index_t cols, const std::int64_t* idx, index_t n, T* table,
                               const index_check* check = nullptr) {
    namespace d = gpu::detail;
    const index_t total = n * cols;
    if (total == 0) return;
    const cudaStream_t st = gpu::current_stream();
    if (d::has_atomic_add<T> && !gpu::settings().deterministic) {
      d::scatter_add_atomic_kernel<T><<<d::grid_for(total, d::block_threads), d::block_threads, 0, st>>>(
          src, cols, idx, total, table, bound(check));
      gpu::check_launch("scatter_add_atomic_kernel");
      return;
    }
    d::scatter_add_ordered_kernel<T><<<d::grid_for(cols, d::block_threads), d::block_threads, 0, st>>>(
        src, cols, idx, n, table, bound(check));
    gpu::check_launch("scatter_add_ordered_kernel");
  }

  template <class T>
  static void one_hot(const std::int64_t* target, index_t n, index_t classes, index_t inner, double on, double off,
                      std::int64_t ignore_index, T* out, const index_check* check = nullptr) {
    namespace d = gpu::detail;
    const index_t total = n * classes * inner;
    if (total == 0) return;
    d::one_hot_kernel<T><<<d::grid_for(total, d::block_threads), d::block_threads, 0, gpu::current_stream()>>>(
        target, classes, inner, on, off, ignore_index, total, out, check ? gpu::detail::fault_record() : nullptr,
        check ? *check : index_check{});
    gpu::check_launch("one_hot_kernel");
  }

 private:
  static gpu::detail::row_bound bound(const index_check* check) {
    gpu::detail::row_bound b;
    b.rows = check ? check->range : std::numeric_limits<index_t>::max();
    b.fault = check ? gpu::detail::fault_record() : nullptr;
    if (check) b.check = *check;
    return b;
  }
};

}  // namespace trainkit::backend
