// compression::hierarchical over MPI processes (mpirun -np 2, 3, 4): by_host() on this machine finds one
// host (MPI_COMM_TYPE_SHARED), where the compressed allreduce is exact; "hosts" made with split()
// (ranks 2h and 2h + 1 on host h) compress between them only, every rank getting the same bits
// close to the exact mean; at -np 3 such hosts are uneven and refused on every rank.
#include <catch2/catch.hpp>

#include "dist/rank_gradients.hpp"
#include "mpi/mpi_catch_main.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "trainkit/dist/check_consistent.hpp"
#include "trainkit/compression/hierarchical.hpp"
#include "trainkit/dist/mpi.hpp"

namespace {

namespace dist = trainkit::dist;
namespace compression = trainkit::compression;
using trainkit::index_t;
using dist::mpi;
const dist::mpi_options hier_options{.timeout = std::chrono::milliseconds(30000)};

using trainkit_test::grad_of;

double error_to_mean(const std::vector<float>& got, int w) {
  return trainkit_test::max_error(got, trainkit_test::exact_mean(w, static_cast<index_t>(got.size())));
}

std::uint64_t hash_of(const std::vector<float>& v) { return dist::hash_bytes(v.data(), v.size() * sizeof(float)); }

}  // namespace

TEST_CASE("mpi hierarchical: one host by MPI_COMM_TYPE_SHARED is exact", "[dist][mpi][hierarchical]") {
  auto comm = compression::hierarchical<mpi>::by_host(mpi(hier_options));
  CHECK(comm.hosts() == 1);
  CHECK(comm.ranks_per_host() == comm.size());
  const index_t n = 3001;
  auto g = grad_of(comm.rank(), n);
  compression::int8 c;
  compression::compressed_allreduce(comm, c, g.data(), n, 0, dist::reduce_op::avg);
  CHECK(error_to_mean(g, comm.size()) < 1e-6);
  CHECK(c.bytes_sent() == 0u);
  CHECK_NOTHROW(dist::check_consistent(comm, hash_of(g), "result"));
}

TEST_CASE("mpi hierarchical: hosts of two ranks compress between them only", "[dist][mpi][hierarchical]") {
  mpi world(hier_options);
  const int r = world.rank(), w = world.size();
  mpi local = world.split(r / 2, r), cross = world.split(r % 2, r);
  if (w % 2 != 0) {  // a host of 1 next to hosts of 2
    CHECK_THROWS_WITH(compression::hierarchical<mpi>(std::move(world), std::move(local), std::move(cross)),
                      Catch::Contains("same number of ranks"));
    return;
  }
  compression::hierarchical<mpi> comm(std::move(world), std::move(local), std::move(cross));
  const index_t n = 5000;
  auto g = grad_of(r, n);
  compression::int8 c;
  compression::compressed_allreduce(comm, c, g.data(), n, 0, dist::reduce_op::avg);
  const double e = error_to_mean(g, w);
  if (comm.hosts() == 1) {
    CHECK(e < 1e-6);
  } else {
    CHECK(e > 0.0);  // quantized between the hosts
    CHECK(e < 0.05);
  }
  CHECK(c.bytes_sent() == compression::compressed_allreduce_bytes<compression::int8>(n / 2, comm.hosts()));
  CHECK_NOTHROW(dist::check_consistent(comm, hash_of(g), "result"));
}
