// Resume on another world size under mpirun (-np 2, 3, 4): the checks of tests/parallel/test_resize.cpp
// with MPI processes. Sub-communicators of MPI_COMM_WORLD play the two jobs: the first N ranks train
// part of an epoch with int8 compression and snapshot, the first M resume (2 -> 1 at any -np,
// 2 -> 3 from -np 3, 4 -> 2 at -np 4); the other ranks wait at a barrier. Every check is made on
// every rank of the resuming job (the reports are combined over its ranks).
#include <catch2/catch.hpp>

#include "mpi/mpi_catch_main.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainkit/dist/mpi.hpp"

#include "io/io_test_util.hpp"
#include "parallel/resize_checks.hpp"

namespace {

using namespace trainkit_test::resize;
using trainkit::dist::mpi;

const trainkit::dist::mpi_options resize_options{.timeout = std::chrono::milliseconds(30000)};

/// resize_phase on the first k ranks of MPI_COMM_WORLD (nothing on the others); then a barrier.
std::optional<phase_report> on_first(int k, const std::string& dir, int steps, bool resume, phase_end end) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < k ? 0 : MPI_UNDEFINED, rank, &sub);
  std::optional<phase_report> r;
  if (sub != MPI_COMM_NULL) {
    {
      mpi comm(sub, resize_options);
      r = resize_phase(comm, dir, steps, resume, end);
    }
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return r;
}

}  // namespace

TEST_CASE("resume on another world size: mpirun 2 -> 1, 2 -> 3, 4 -> 2", "[io][dist][mpi][resize]") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::pair<int, int> cases[] = {{2, 1}, {2, 3}, {4, 2}};
  for (const auto& [n, m] : cases) {
    if (n > size || m > size) continue;
    INFO("rank " << rank << " of " << size << ": " << n << " -> " << m << " ranks");
    const std::string dir = std::string(TRAINKIT_TEST_TMP_DIR) + "/mpi_resize_np" + std::to_string(size) + "_" +
                            std::to_string(n) + "_" + std::to_string(m);
    if (rank == 0) io_test::fresh_dir(std::filesystem::path(dir).filename().string());
    MPI_Barrier(MPI_COMM_WORLD);
    const int steps = 5;
    // Every rank of the first job holds the same report (combined over its ranks); rank 0 is in both.
    const auto before = on_first(n, dir, steps, /*resume=*/false, phase_end::save);
    const auto after = on_first(m, dir, /*steps=*/-1, /*resume=*/true, phase_end::none);
    // The first job's report, from rank 0 (in both jobs) to every rank: its sizes, then its bytes.
    std::vector<char> bytes;
    long long sizes[3] = {0, 0, 0};
    if (rank == 0) {
      const auto& b = *before;
      sizes[0] = static_cast<long long>(b.worker_sum.size());
      sizes[1] = static_cast<long long>(b.server.size());
      sizes[2] = static_cast<long long>(b.seen.size());
    }
    MPI_Bcast(sizes, 3, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    phase_report first;
    first.worker_sum.resize(static_cast<std::size_t>(sizes[0]));
    first.server.resize(static_cast<std::size_t>(sizes[1]));
    first.seen.resize(static_cast<std::size_t>(sizes[2]));
    if (rank == 0) first = *before;
    bytes.resize(sizeof(std::uint64_t) + sizeof(std::int64_t) + first.worker_sum.size() * sizeof(double) +
                 first.server.size() * sizeof(float) + first.seen.size() * sizeof(std::int64_t));
    // Through the buffer: rank 0 packs, every rank unpacks.
    auto pack = [&](bool in) {
      char* p = bytes.data();
      auto move = [&](void* v, std::size_t len) {
        if (in) std::memcpy(p, v, len); else std::memcpy(v, p, len);
        p += len;
      };
      move(&first.params, sizeof first.params);
      move(&first.step, sizeof first.step);
      move(first.worker_sum.data(), first.worker_sum.size() * sizeof(double));
      move(first.server.data(), first.server.size() * sizeof(float));
      move(first.seen.data(), first.seen.size() * sizeof(std::int64_t));
    };
    if (rank == 0) pack(true);
    MPI_Bcast(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
    pack(false);
    if (!after) continue;

    CHECK(compare_resume(first, *after) == "");
    CHECK(after->sampler_offset == steps * per_rank_batch * n);
    CHECK(after->resumed.find("written by " + std::to_string(n) + " ranks, now " + std::to_string(m)) != std::string::npos);
    CHECK(after->rank_rng_offset == (rank < n ? static_cast<std::uint64_t>(steps) : 0u));
    CHECK(compare_epoch(first, *after, (m - 1) + m * (per_rank_batch - 1)) == "");
  }
}
