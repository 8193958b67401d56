// test_package_mpi.cpp - trainkit::mpi from the Conan package: MPI_Init through trainkit's
// environment and one allreduce on the world communicator (one rank when run without mpirun).
#include <trainkit/dist/mpi.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  trainkit::dist::mpi::environment env(argc, argv);
  trainkit::dist::mpi comm;
  float v[2] = {1.0f, 2.0f};
  comm.allreduce(v, 2, trainkit::dist::reduce_op::sum).wait();
  const bool ok = v[0] == 1.0f * float(comm.size()) && v[1] == 2.0f * float(comm.size());
  std::printf("mpi: rank %d of %d, allreduce %s\n", comm.rank(), comm.size(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
