// trainkit/dist/local_rank.hpp - which process of its node this one is, from the launcher's
// environment: what picks the GPU of a rank (dist/nccl.cuh's nccl(bootstrap) and
// gpu::select_local_device()) so that user code does not.
#pragma once

#include <cstdlib>   // std::getenv
#include <optional>
#include <string>
#include <string_view>

#include "trainkit/core/error.hpp"

namespace trainkit::dist {

/// The launcher variables local_rank() reads, in this order: Open MPI's mpirun, Slurm's srun,
/// torchrun (and most Python launchers), MPICH's and Intel MPI's Hydra.
inline constexpr std::string_view local_rank_variables[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                                            "LOCAL_RANK", "MPI_LOCALRANKID"};

/// This process's rank among the processes of its node, from the first of local_rank_variables
/// that is set; std::nullopt when none is (one process started by hand). A value that is not a
/// non-negative integer is a usage_error naming the variable and the value.
inline std::optional<int> local_rank() {
  for (std::string_view name : local_rank_variables) {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) continue;
    const std::string s(v);
    std::size_t used = 0;
    long r = -1;
    try {
      r = std::stol(s, &used);
    } catch (...) {
      used = 0;
    }
    TRAINKIT_CHECK(used == s.size() && !s.empty() && r >= 0 && r <= 1 << 20, usage_error, "dist::local_rank",
                   name << "='" << s << "' is not a non-negative integer");
    return static_cast<int>(r);
  }
  return std::nullopt;
}

/// The device a process of local rank `local` uses on a node with `devices` devices: local % devices
/// (several ranks per device only when there are more ranks than devices). devices must be > 0.
inline int local_device(int local, int devices) {
  TRAINKIT_CHECK(devices > 0, usage_error, "dist::local_device", "no device to choose from (" << devices << ")");
  TRAINKIT_CHECK(local >= 0, usage_error, "dist::local_device", "negative local rank " << local);
  return local % devices;
}

}  // namespace trainkit::dist
