// data_parallel over MPI processes (mpirun -np 2, 3, 4): the same equivalence as the thread_group
// tests (tests/parallel/dp_checks.hpp) - N ranks on their shards give the parameters of one process on the
// concatenated batch, with and without no_sync accumulation - plus compressed training keeping the
// ranks identical, mismatched models reported on every rank, unused parameters and found_inf.
//
// Every test case is collective and issues the same collectives on every rank whatever its checks
// find (CHECK, not REQUIRE, around collective code), so one wrong value cannot desynchronise the
// ranks; if they fall out of step anyway, the communicator's timeout fails the run instead of hanging.
#include <catch2/catch.hpp>

#include "mpi/mpi_catch_main.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "trainkit/dist/check_consistent.hpp"
#include "trainkit/parallel/data_parallel.hpp"
#include "trainkit/dist/mpi.hpp"

#include "parallel/dp_checks.hpp"

namespace {

using namespace trainkit_test::dp;
using trainkit::dist::mpi;

using trainkit_test::mpi_world;

// A fingerprint of a rank's parameters, bit for bit.
std::uint64_t fingerprint(const param_values& p) {
  std::uint64_t h = dist::hash_bytes(nullptr, 0);
  for (const auto& v : p) h = dist::hash_bytes(v.data(), v.size() * sizeof(float), h);
  return h;
}

// "" when every rank holds the same value, else check_consistent's message.
std::string same_on_every_rank(std::uint64_t h, const char* what) {
  try {
    dist::check_consistent(mpi_world(), h, what);
  } catch (const dist::dist_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("mpi data_parallel: N processes on shards = one process on the whole batch", "[dist][mpi][ddp]") {
  const int world_size = mpi_world().size();
  const index_t b = 5;
  const int steps = 4;
  for (int micro : {1, 3}) {
    const auto ref = reference(world_size, steps, micro, b);
    for (int layout = 0; layout < 3; ++layout) {
      INFO("rank " << mpi_world().rank() << " of " << world_size << ", micro-steps " << micro << ", layout " << layout);
      parallel::data_parallel_options opts;
      if (layout == 1) opts = {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40};
      if (layout == 2) opts = {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40, .overlap = false};
      const auto got = train_shard(mpi_world(), steps, micro, b, opts);
      CHECK(compare(got.params, ref) == "");
      CHECK(same_on_every_rank(fingerprint(got.params), "parameters after training") == "");
      CHECK(got.stats.steps == static_cast<std::uint64_t>(steps));
      CHECK(got.stats.buckets_reduced == steps * got.buckets);
      CHECK(got.stats.bytes_sent > 0);
    }
  }
}

TEST_CASE("mpi data_parallel: compressed training keeps the processes identical", "[dist][mpi][ddp]") {
  const auto fp32 = train_shard<compression::none>(mpi_world(), 20, 1, 8);
  const auto i8 = train_shard<compression::int8>(mpi_world(), 20, 1, 8);
  const auto s1 = train_shard<compression::sign_1bit>(mpi_world(), 20, 1, 8);
  const auto h16 = train_shard<compression::fp16>(mpi_world(), 20, 1, 8);
  CHECK(same_on_every_rank(fingerprint(i8.params), "int8 parameters") == "");
  CHECK(same_on_every_rank(fingerprint(s1.params), "1-bit parameters") == "");
  CHECK(same_on_every_rank(fingerprint(h16.params), "fp16 parameters") == "");
  CHECK(fp32.stats.bytes_sent > 0);
  CHECK(h16.stats.bytes_sent < fp32.stats.bytes_sent);
  // (This model's single bucket of 171 values is smaller than world x block: int8 and 1-bit pad it,
  // so the byte ratios are checked on a buffer of realistic size below.)
}

TEST_CASE("mpi compressed_allreduce: bytes on the wire", "[dist][mpi][ddp]") {
  const index_t n = (index_t(1) << 20) + 3;
  std::vector<float> x(static_cast<std::size_t>(n), 1.0f + static_cast<float>(mpi_world().rank()));
  compression::none a;
  compression::int8 b;
  compression::sign_1bit c;
  compression::compress_workspace ws;
  compression::compressed_allreduce(mpi_world(), a, x.data(), n, 0, dist::reduce_op::avg, &ws);
  compression::compressed_allreduce(mpi_world(), b, x.data(), n, 0, dist::reduce_op::avg, &ws);
  compression::compressed_allreduce(mpi_world(), c, x.data(), n, 0, dist::reduce_op::avg, &ws);
  const double mean_rank = static_cast<double>(mpi_world().size() + 1) / 2.0;
  CHECK(x[0] == Approx(mean_rank).epsilon(0.02));
  CHECK(static_cast<double>(b.bytes_sent()) <= 0.27 * static_cast<double>(a.bytes_sent()));
  CHECK(static_cast<double>(c.bytes_sent()) <= 0.04 * static_cast<double>(a.bytes_sent()));
}

TEST_CASE("mpi data_parallel: different models are a clear error on every rank", "[dist][mpi][ddp]") {
  const int r = mpi_world().rank();
  auto m = make_mlp(1, r == mpi_world().size() - 1 ? 9 : 8);  // the last rank: another hidden size
  std::string message;
  try {
    parallel::data_parallel<mpi> ddp(mpi_world(), *m);
  } catch (const dist::dist_error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("'0.weight' [8, 6]") && Catch::Contains("'0.weight' [9, 6]"));
  CHECK(same_on_every_rank(dist::hash_bytes(message.data(), message.size()), "the mismatch report") == "");
}

TEST_CASE("mpi data_parallel: unused parameters and found_inf", "[dist][mpi][ddp]") {
  const int r = mpi_world().rank(), w = mpi_world().size();
  var a(tensor::zeros({3}), true), unused_here(tensor::zeros({2}), true);
  parallel::data_parallel<mpi> ddp(mpi_world(), {{"a", a}, {"b", unused_here}}, {});
  auto loss = trainkit::autograd::sum(a * var(tensor::full({3}, static_cast<float>(r + 1))));
  if (r == 0) loss = loss + trainkit::autograd::sum(unused_here);  // only rank 0 uses b
  loss.backward();
  ddp.finish();
  const float mean_rank = static_cast<float>(w + 1) / 2.0f;  // mean of 1..w
  for (float g : a.grad().to_vector()) CHECK(g == Approx(mean_rank));
  for (float g : unused_here.grad().to_vector()) CHECK(g == Approx(1.0f / static_cast<float>(w)));
  CHECK(ddp.found_inf(r == w - 1));
  CHECK_FALSE(ddp.found_inf(false));
}
