// tests/mpi/mpi_catch_main.hpp - the Catch2 session of test_mpi (tests/mpi/main.cpp): every rank
// runs the test cases (rank 0 reports in full, the others only their failures, through Catch's
// compact reporter), and every rank exits with the same code, the ranks' failures summed; and the
// world communicator the test files share (mpi_world(), a 30 s timeout: the ranks share 2 cores
// under --oversubscribe, and a rank that falls out of step then fails its tests instead of hanging).
#pragma once

#include "support/catch_session.hpp"
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "trainkit/dist/mpi.hpp"

namespace trainkit_test {

/// The world communicator of the test files, made and destroyed by main().
inline std::unique_ptr<trainkit::dist::mpi>& mpi_world_slot() {
  static std::unique_ptr<trainkit::dist::mpi> world;
  return world;
}
inline trainkit::dist::mpi& mpi_world() { return *mpi_world_slot(); }

inline int run_mpi_catch_session(int argc, char** argv, const char* program) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char*> args(argv, argv + argc);
  std::string reporter = "compact", reporter_flag = "-r";
  if (rank != 0) {
    args.push_back(reporter_flag.data());
    args.push_back(reporter.data());
  }
  const int failed = run_catch_session(static_cast<int>(args.size()), args.data());
  if (failed != 0) std::fprintf(stderr, "%s: rank %d of %d: %d test case(s) failed\n", program, rank, size, failed);
  int total = failed;
  if (trainkit::dist::mpi::environment::healthy())
    MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return total == 0 ? 0 : 1;
}

}  // namespace trainkit_test
