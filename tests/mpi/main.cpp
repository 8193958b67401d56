// tests/mpi/main.cpp - main() of test_mpi, the Catch2 tests of tests/mpi/ in one executable (run
// under mpiexec; ctest's test_mpi_<file>_np<N> runs one file's cases: -# "[#test_<file>]").
// Listed first among test_mpi's sources (one translation unit), so that every header the test files
// use is read before any file's own using-declarations (as the precompiled header does for the other
// tests). Catch2's implementation comes from tests/catch_session.cpp.
#include <catch2/catch.hpp>

#include "trainkit/trainkit.hpp"

#include <chrono>
#include <memory>

#include "dist/collective_checks.hpp"
#include "dist/rank_gradients.hpp"
#include "io/io_test_util.hpp"
#include "mpi/mpi_catch_main.hpp"
#include "parallel/dp_checks.hpp"
#include "parallel/resize_checks.hpp"
#include "trainkit/dist/check_consistent.hpp"
#include "trainkit/compression/hierarchical.hpp"
#include "trainkit/dist/mpi.hpp"
#include "trainkit/parallel/data_parallel.hpp"

int main(int argc, char** argv) {
  trainkit::dist::mpi::environment env(argc, argv);
  trainkit_test::mpi_world_slot() =
      std::make_unique<trainkit::dist::mpi>(trainkit::dist::mpi_options{.timeout = std::chrono::milliseconds(30000)});
  const int rc = trainkit_test::run_mpi_catch_session(argc, argv, "test_mpi");
  trainkit_test::mpi_world_slot().reset();
  return rc;
}
