// Tests of trainkit/dist/mpi.hpp under mpirun -np 2, 3, 4: every collective x element type x lengths
// 0, 1, 7, 1000, 1001 (the same checks as thread_group's, tests/dist/collective_checks.hpp), issue
// order, the options and the error paths that need no dead peer (test_fault.cpp has those).
//
// Every rank runs the same test cases in the same order (they are collective). Checks compare a rank's
// own result and use CHECK, never REQUIRE inside a collective sequence, so that a wrong value on one
// rank does not desynchronise the ranks; if they desynchronise anyway, the communicator's timeout
// turns the mismatch into a failure instead of a hang. The exit code is the same on every rank.
#include <catch2/catch.hpp>

#include "mpi/mpi_catch_main.hpp"
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dist/collective_checks.hpp"
#include "trainkit/dist/mpi.hpp"

namespace {

using trainkit::bfloat16;
using trainkit::half;
using namespace trainkit::dist;
namespace checks = trainkit_test::dist;

static_assert(communicator<mpi>);

// The communicator the tests share (created after MPI_Init in main).
using trainkit_test::mpi_world;

#define TK_DIST_TYPES float, double, half, bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::int64_t

}  // namespace

TEMPLATE_TEST_CASE("mpi allreduce: every op and length", "[dist][mpi]", TK_DIST_TYPES) {
  for (const std::size_t n : checks::lengths)
    for (const reduce_op op : checks::all_ops) CHECK(checks::check_allreduce<TestType>(mpi_world(), n, op) == "");
}

TEMPLATE_TEST_CASE("mpi broadcast from every root", "[dist][mpi]", TK_DIST_TYPES) {
  for (const std::size_t n : checks::lengths)
    for (int root = 0; root < mpi_world().size(); ++root)
      CHECK(checks::check_broadcast<TestType>(mpi_world(), n, root) == "");
}

TEMPLATE_TEST_CASE("mpi allgather", "[dist][mpi]", TK_DIST_TYPES) {
  for (const std::size_t n : checks::lengths) CHECK(checks::check_allgather<TestType>(mpi_world(), n) == "");
}

TEMPLATE_TEST_CASE("mpi reduce_scatter", "[dist][mpi]", TK_DIST_TYPES) {
  for (const std::size_t n : checks::lengths)
    for (const reduce_op op : checks::all_ops)
      CHECK(checks::check_reduce_scatter<TestType>(mpi_world(), n, op) == "");
}

TEMPLATE_TEST_CASE("mpi alltoall", "[dist][mpi]", TK_DIST_TYPES) {
  for (const std::size_t n : checks::lengths) CHECK(checks::check_alltoall<TestType>(mpi_world(), n) == "");
}

TEST_CASE("mpi: back-to-back collectives, waited in order and last first", "[dist][mpi]") {
  CHECK(checks::check_back_to_back(mpi_world(), false) == "");
  CHECK(checks::check_back_to_back(mpi_world(), true) == "");
  mpi_world().barrier().wait();
}

TEST_CASE("mpi: overlapping buffers (in-place allgather, reduce_scatter into its input)", "[dist][mpi]") {
  mpi& g = mpi_world();
  const auto p = static_cast<std::size_t>(g.size());
  const auto r = static_cast<std::size_t>(g.rank());
  const std::size_t n = 5;
  std::vector<float> buf(p * n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) buf[r * n + i] = float(r * 10 + i);
  g.allgather(buf.data() + r * n, n, buf.data()).wait();  // MPI_IN_PLACE
  bool ok = true;
  for (std::size_t j = 0; j < p; ++j)
    for (std::size_t i = 0; i < n; ++i) ok = ok && buf[j * n + i] == float(j * 10 + i);
  CHECK(ok);
  g.reduce_scatter(buf.data(), buf.data() + r * n, n, reduce_op::sum).wait();  // output inside the input
  ok = true;
  for (std::size_t i = 0; i < n; ++i) ok = ok && buf[r * n + i] == float(p) * float(r * 10 + i);
  CHECK(ok);
  std::vector<std::int32_t> a(p * 3);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::int32_t>(r * 100 + i);
  g.alltoall(a.data(), a.data(), 3).wait();  // same buffer in and out
  ok = true;
  for (std::size_t j = 0; j < p; ++j)
    for (std::size_t i = 0; i < 3; ++i)
      ok = ok && a[j * 3 + i] == static_cast<std::int32_t>(j * 100 + r * 3 + i);
  CHECK(ok);
}

TEST_CASE("mpi: zero-length collectives complete at once, even when only one rank calls", "[dist][mpi]") {
  float* none = nullptr;
  if (mpi_world().rank() == 0) {
    CHECK(mpi_world().allreduce(none, 0, reduce_op::sum).done());
    CHECK(mpi_world().alltoall(static_cast<const float*>(none), none, 0).done());
  }
  mpi_world().barrier().wait();
}

TEST_CASE("mpi: barrier, rank, size, done()", "[dist][mpi]") {
  CHECK(mpi_world().rank() >= 0);
  CHECK(mpi_world().rank() < mpi_world().size());
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  CHECK(r == mpi_world().rank());
  work w = mpi_world().barrier();
  w.wait();
  CHECK(w.done());
  w.wait();  // again: returns at once
}

TEST_CASE("mpi: check_same names the ranks that differ, on every rank", "[dist][mpi]") {
  mpi& g = mpi_world();
  g.check_same(hash_bytes("same model", 10), "parameter list");
  g.check_same(std::vector<std::uint64_t>{1, 2, 3}, "parameter shapes");
  std::string seen;
  try {
    g.check_same(g.rank() == g.size() - 1 ? 99u : 1u, "parameter list");
  } catch (const dist_error& e) {
    seen = e.what();
  }
  INFO(seen);
  CHECK(seen.find("parameter list differs across ranks") != std::string::npos);
  CHECK(seen.find("rank " + std::to_string(g.size() - 1) + " (0x0000000000000063)") != std::string::npos);
  std::string seen_v;
  try {
    std::vector<std::uint64_t> h{1, 2, 3};
    if (g.rank() == 1) h[1] = 7;
    g.check_same(h, "parameter shapes");
  } catch (const dist_error& e) {
    seen_v = e.what();
  }
  INFO(seen_v);
  CHECK(seen_v.find("rank 1 differs first at index 1") != std::string::npos);
}

TEST_CASE("mpi: options, TRAINKIT_DIST_TIMEOUT_MS, bad arguments", "[dist][mpi]") {
  {
    mpi c({.timeout = std::chrono::milliseconds(1234)});
    CHECK(c.timeout() == std::chrono::milliseconds(1234));
    c.set_timeout(std::chrono::milliseconds(4321));
    CHECK(c.timeout() == std::chrono::milliseconds(4321));
    CHECK_THROWS_AS(c.set_timeout(std::chrono::milliseconds(0)), trainkit::usage_error);
    CHECK(c.size() == mpi_world().size());
    CHECK_FALSE(c.broken());
  }
  ::setenv("TRAINKIT_DIST_TIMEOUT_MS", "777", 1);
  {
    mpi c({.timeout = std::chrono::milliseconds(1234)});
    CHECK(c.timeout() == std::chrono::milliseconds(777));
  }
  ::setenv("TRAINKIT_DIST_TIMEOUT_MS", "soon", 1);
  CHECK_THROWS_AS(mpi(), trainkit::usage_error);  // before any collective: every rank throws alike
  ::unsetenv("TRAINKIT_DIST_TIMEOUT_MS");
  float x = 0;
  CHECK_THROWS_AS(mpi_world().broadcast(&x, 1, mpi_world().size()), trainkit::usage_error);
  CHECK_THROWS_AS(mpi_world().broadcast(&x, 1, -1), trainkit::usage_error);
  mpi_world().barrier().wait();
}

extern "C" void test_sigpipe_handler(int) {}

TEST_CASE("mpi: a write to a dead peer's socket does not end a survivor (SIGPIPE ignored)", "[dist][mpi]") {
  // MPI is up (mpi_world): SIGPIPE, at its default action before, is now ignored, so raising it
  // returns (under the default action the process would die here).
  struct sigaction now {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK(now.sa_handler == SIG_IGN);
  ::raise(SIGPIPE);
  // A handler the program set itself is left alone, and the default action becomes "ignore".
  struct sigaction mine {};
  mine.sa_handler = test_sigpipe_handler;
  ::sigemptyset(&mine.sa_mask);
  REQUIRE(::sigaction(SIGPIPE, &mine, nullptr) == 0);
  trainkit::dist::detail::ignore_sigpipe();
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK(now.sa_handler == test_sigpipe_handler);
  ::signal(SIGPIPE, SIG_DFL);
  trainkit::dist::detail::ignore_sigpipe();
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK(now.sa_handler == SIG_IGN);
}

TEST_CASE("mpi: a communicator of a split MPI_Comm", "[dist][mpi]") {
  MPI_Comm half_comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, mpi_world().rank() % 2, mpi_world().rank(), &half_comm);
  {
    mpi c(half_comm);
    CHECK(c.size() == (mpi_world().size() + (mpi_world().rank() % 2 == 0 ? 1 : 0)) / 2);
    CHECK(checks::check_allreduce<float>(c, 1001, reduce_op::sum) == "");
  }
  MPI_Comm_free(&half_comm);
}

TEST_CASE("mpi: a stalled peer is reported by wait() after the timeout on the others", "[dist][mpi][fault]") {
  // The last rank joins the collective only after the others have timed out: they must throw
  // dist_error naming the collective, rank, size, count and timeout. Runs last: the communicator
  // it uses is broken afterwards (the late rank's collective completes in the end, or not at all).
  mpi c({.timeout = std::chrono::milliseconds(300)});
  const bool late = c.rank() == c.size() - 1;
  std::vector<double> v(100, 1.0);
  std::string seen;
  if (!late) {
    const auto start = std::chrono::steady_clock::now();
    try {
      c.allreduce(v.data(), v.size(), reduce_op::sum).wait();
    } catch (const dist_error& e) {
      seen = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(seen);
    CHECK(seen.find("allreduce(float64, 100 elements, sum) on rank " + std::to_string(c.rank()) + " of " +
                    std::to_string(c.size()) + " (timeout 300 ms): timed out") != std::string::npos);
    // The late rank is named, with its host and pid, by the probe after the timeout.
    CHECK(seen.find("rank " + std::to_string(c.size() - 1) + " (host ") != std::string::npos);
    CHECK(seen.find(") did not answer within 500 ms - dead or stalled") != std::string::npos);
    CHECK(s >= 0.29);
    CHECK(s < 3.0);
    CHECK(c.broken());
    CHECK_THROWS_AS(c.barrier(), dist_error);  // broken for good
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the others have timed out
  if (late) {
    // Completing the collective now lets the others' abandoned request finish inside MPI too.
    c.set_timeout(std::chrono::milliseconds(5000));
    c.allreduce(v.data(), v.size(), reduce_op::sum).wait();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
