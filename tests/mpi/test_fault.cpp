// A rank dies (or stalls) in the middle of a loop of allreduces: the survivors must observe dist_error
// within the timeout and exit with a clear message, not hang. Run with 3 ranks, through
// tests/drivers/trainkit_mpi_run.cmake, which runs mpirun under a hard time limit and passes when every
// survivor printed its "rank R: dist_error" line (mpirun's own exit code says nothing here).
//
//   test_mpi_fault [kill|stall]   kill: rank 2 raise(SIGKILL)s itself at iteration 10 (default);
//                                 stall: rank 2 stops calling for 3 timeouts, then carries on
//                                 (and times out itself: its peers have left);
//                                 transport: rank 2 dies at iteration 10 while the others wait on
//                                 another transport (as on NCCL, which cannot tell who is gone): after
//                                 the timeout they ask mpi::liveness_probe(), which must name rank 2,
//                                 and lowest_surviving_rank() must then be 0 (the snapshot writer);
//                                 the communicator is then broken and the process unhealthy (no
//                                 MPI_Finalize with a dead peer).
//                                 split: the allreduces run on a sub-communicator whose ranks are the
//                                 world's reversed (world rank 2 is its rank 0); the survivors must
//                                 still name world rank 2, and the world communicator's
//                                 lowest_surviving_rank() must be 0 (the probe is the world's).
//
// What OpenMPI 4.1 does (observed with Debian's 4.1.4): by default mpirun tears the whole job down as
// soon as a process dies on a signal ("mpirun noticed that process rank 2 ... exited on signal 9"),
// about 1 s later, before any timeout can fire: no hang, but no error from the survivors either.
// Under `mpirun --enable-recovery` the job survives the death; a dead peer then makes no MPI call
// fail (neither the shared-memory nor the TCP transport returns an error): the collective simply
// never completes, and our timeout turns that into dist_error on every survivor.
// Not a Catch2 test: its output is matched by the runner script. It brings its own main.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "trainkit/dist/mpi.hpp"

namespace {
constexpr auto timeout = std::chrono::milliseconds(2000);
constexpr int victim = 2;
constexpr int fatal_iteration = 10;
}  // namespace

int main(int argc, char** argv) {
  using namespace trainkit::dist;
  const std::string mode = argc > 1 ? argv[1] : "kill";
  mpi::environment env(argc, argv);
  mpi comm({.timeout = timeout});
  if (comm.size() != 3) {
    std::printf("rank %d: FAIL: run with 3 ranks (got %d)\n", comm.rank(), comm.size());
    return 1;
  }
  std::vector<float> grad(1 << 16, 1.0f);
  // split: a sub-communicator of the same ranks in reverse order (sub rank = 2 - world rank).
  std::optional<mpi> reversed;
  if (mode == "split") reversed.emplace(comm.split(0, comm.size() - 1 - comm.rank()));
  mpi& reduce_on = reversed ? *reversed : comm;
  for (int it = 0; it < 200; ++it) {
    if (comm.rank() == victim && it == fatal_iteration) {
      std::printf("rank %d: %s at iteration %d\n", comm.rank(),
                  mode == "stall" ? "stalling" : "raise(SIGKILL)", it);
      std::fflush(stdout);
      if (mode == "stall") {
        // Falls behind by 3 timeouts, then carries on: by then its peers have given up, so its own
        // collective times out too (returning instead would leave it in MPI_Finalize waiting for
        // peers that left without one, forever under --enable-recovery).
        std::this_thread::sleep_for(3 * timeout);
      } else {
        std::raise(SIGKILL);
      }
    }
    const auto start = std::chrono::steady_clock::now();
    if (mode == "transport" && it == fatal_iteration) {  // the other transport's collective never completes
      std::this_thread::sleep_for(timeout);
      const std::string who = comm.liveness_probe()(std::chrono::milliseconds(500));
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("rank %d: dist_error at iteration %d after %.2f s (the other transport timed out): %s; "
                  "lowest surviving rank %d\n",
                  comm.rank(), it, waited, who.c_str(), comm.lowest_surviving_rank());
      std::fflush(stdout);
      // A probe that found a dead rank leaves the communicator broken and the process unhealthy, so
      // that neither ~mpi (MPI_Comm_free) nor ~environment (MPI_Finalize) waits for the dead peer:
      // both survivors hung in MPI_Finalize under load before.
      if (!comm.broken() || mpi::environment::healthy(std::chrono::milliseconds(0))) {
        std::printf("rank %d: FAIL: the probe found rank %d silent, yet the communicator is %s and the process %s\n",
                    comm.rank(), victim, comm.broken() ? "broken" : "not broken",
                    mpi::environment::healthy(std::chrono::milliseconds(0)) ? "healthy" : "unhealthy");
        return 1;
      }
      return 0;
    }
    try {
      reduce_on.allreduce(grad.data(), grad.size(), reduce_op::avg).wait();
    } catch (const dist_error& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const bool in_time = waited < std::chrono::duration<double>(timeout).count() + 2.0;
      std::printf("rank %d: %sdist_error at iteration %d after %.2f s (timeout %lld ms): %s; world's lowest surviving "
                  "rank %d\n",
                  comm.rank(), in_time ? "" : "FAIL: late ", it, waited, static_cast<long long>(timeout.count()),
                  e.what(), comm.lowest_surviving_rank());
      std::fflush(stdout);
      // The job is broken: exit with a clear message. mpi::environment skips MPI_Finalize (it would
      // wait for the dead rank).
      return in_time ? 0 : 1;
    }
  }
  std::printf("rank %d: FAIL: 200 allreduces completed although rank %d left at iteration %d\n", comm.rank(),
              victim, fatal_iteration);
  return 1;
}
