// trainkit/dist/local_device.cuh - one GPU per process, chosen from the launcher's local rank.
#pragma once

#include <cstdio>

#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/core/error.hpp"
#include "trainkit/dist/local_rank.hpp"

namespace trainkit::dist {

/// Makes the device of this process's local rank current (local rank % devices; device 0 without
/// a launcher) and returns it. Call it before building the model: tensors live on the device that
/// was current when they were made. More ranks than devices on a node share devices round-robin
/// (NCCL refuses that; host communicators accept it); that is said once on stderr.
inline int select_local_device() {
  const int devices = backend::gpu::device_count();
  TRAINKIT_CHECK(devices > 0, runtime_failure, "dist::select_local_device", "no CUDA device is visible");
  const int local = local_rank().value_or(0);
  const int d = local_device(local, devices);
  if (local >= devices && local == devices)
    std::fprintf(stderr, "trainkit: local rank %d and more share the %d visible CUDA device(s) round-robin\n", local,
                 devices);
  backend::gpu::set_device(d);
  return d;
}

}  // namespace trainkit::dist
