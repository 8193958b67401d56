// trainkit/backend/cuda/device_error.cuh - errors that kernels find (a bad class or embedding
// index), recorded on the device and raised on the host at the next read, so that no check
// blocks the host before a launch.
//
// Each device has one record in device memory. The first kernel thread that meets a bad index
// takes it (atomicCAS on its flag) and writes the index, its position and the kernel's
// index_check; later errors leave it alone until it is reported. Every copy to the host
// (item(), to_vector(), to<cpu>()) enqueues a copy of the record into pinned memory before it
// waits, so reading the loss also reads the record at no extra synchronisation, and raises the
// error with the host check's message (backend::throw_bad_index). check_device_errors() does the
// same on its own.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/backend/gather.hpp"

namespace trainkit::backend::gpu {

/// The device's error record.
struct device_fault {
  int flag = 0;  // 0: none; 1: a bad index was recorded
  int pad = 0;
  std::int64_t value = 0;     // the bad index
  std::int64_t position = 0;  // its flat position in the index tensor
  index_check check;          // what the kernel checked (names, range, sizes)
};

namespace detail {

struct fault_records {
  static constexpr int max_devices = 64;
  std::mutex m;
  device_fault* record[max_devices] = {};
};

inline fault_records& faults() {
  static fault_records* f = new fault_records;  // leaked, like the allocator's pools
  return *f;
}

/// The current device's record, created (zeroed) on first use.
inline device_fault* fault_record() {
  const int d = current_device();
  if (d < 0 || d >= fault_records::max_devices) return nullptr;
  fault_records& f = faults();
  std::lock_guard<std::mutex> lock(f.m);
  if (f.record[d] == nullptr) {
    void* p = nullptr;
    TRAINKIT_CUDA_CHECK_CTX(cudaMalloc(&p, sizeof(device_fault)), "device error record of " << sizeof(device_fault)
                                                                                             << " bytes");
    TRAINKIT_CUDA_CHECK(cudaMemset(p, 0, sizeof(device_fault)));
    f.record[d] = static_cast<device_fault*>(p);
  }
  return f.record[d];
}

/// The current device's record, or nullptr when no checking kernel has run on it.
inline device_fault* existing_fault_record() noexcept {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (d < 0 || d >= fault_records::max_devices) return nullptr;
  fault_records& f = faults();
  std::lock_guard<std::mutex> lock(f.m);
  return f.record[d];
}

/// This thread's pinned copy of a record (freed at thread exit).
struct fault_mirror {
  device_fault* p = nullptr;
  fault_mirror() {
    if (cudaMallocHost(reinterpret_cast<void**>(&p), sizeof(device_fault)) != cudaSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
  }
  fault_mirror(const fault_mirror&) = delete;
  fault_mirror& operator=(const fault_mirror&) = delete;
  ~fault_mirror() {
    if (p != nullptr) (void)cudaFreeHost(p);
  }
};

inline device_fault* mirror() {
  thread_local fault_mirror m;
  return m.p;
}

/// Records a bad index (device side): the first one wins until the host has reported it.
__device__ __forceinline__ void record_bad_index(device_fault* f, const index_check& c, std::int64_t value,
                                                 std::int64_t position) {
  if (f == nullptr) return;
  if (atomicCAS(&f->flag, 0, 1) == 0) {
    f->value = value;
    f->position = position;
    f->check = c;
  }
}

/// Enqueues the copy of the current device's record into this thread's mirror on st (no wait).
/// Returns the record, or nullptr when there is none to read.
inline device_fault* enqueue_fault_readback(cudaStream_t st) {
  device_fault* r = existing_fault_record();
  device_fault* m = r != nullptr ? mirror() : nullptr;
  if (m == nullptr) return nullptr;
  m->flag = 0;
  TRAINKIT_CUDA_CHECK(cudaMemcpyAsync(m, r, sizeof(device_fault), cudaMemcpyDeviceToHost, st));
  return r;
}

/// Once st has passed the readback of record r: raises the error it holds, after clearing it.
inline void raise_fault(device_fault* r, cudaStream_t st) {
  if (r == nullptr) return;
  const device_fault f = *mirror();
  if (f.flag == 0) [[likely]]
    return;
  TRAINKIT_CUDA_CHECK(cudaMemsetAsync(&r->flag, 0, sizeof(int), st));
  const index_check& c = f.check;
  throw_bad_index(c.kind, c.op, c.what, c.range, f.value, f.position, c.index_shape(), c.other_shape());
}

}  // namespace detail

/// Waits for the current stream and raises the first error a kernel on this device recorded
/// since the last report (a class index out of [0, C) and not ignore_index, an embedding index
/// out of [0, num_embeddings)), with the message the host check gives. Every copy to the host
/// does this by itself; call it to check without reading a value. No wait when no checking
/// kernel has run.
inline void check_device_errors() {
  const cudaStream_t st = current_stream();
  device_fault* r = detail::enqueue_fault_readback(st);
  if (r == nullptr) return;
  synchronize_stream(st);
  detail::raise_fault(r, st);
}

}  // namespace trainkit::backend::gpu
