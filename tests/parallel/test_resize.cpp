// Resume on another world size, on thread_group: N rank threads train part of an epoch with int8
// compression and snapshot; M rank threads resume from it (2 -> 1, 2 -> 3, 4 -> 2). The replicated
// state comes back bit for bit, the error-feedback residuals are redistributed with their sum over
// the ranks preserved (tests/parallel/resize_checks.hpp), the epoch goes on from its global sample
// position (no sample skipped or repeated), ranks that were in the snapshot get their own per-rank
// state back and new ranks keep theirs; then the resumed job trains to the end of the epoch.
// The same runs under mpirun: tests/mpi/test_resize.cpp. Rank threads only record, this thread checks.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "trainkit/dist/thread_group.hpp"

#include "io/io_test_util.hpp"
#include "parallel/resize_checks.hpp"

namespace {

using namespace trainkit_test::resize;

std::vector<phase_report> phase(int world, const std::string& dir, int steps, bool resume, phase_end end) {
  std::vector<phase_report> got(static_cast<std::size_t>(world));
  dist::thread_group::run(world, [&](dist::thread_group& comm) {
    got[static_cast<std::size_t>(comm.rank())] = resize_phase(comm, dir, steps, resume, end);
  });
  return got;
}

}  // namespace

TEST_CASE("resume on another world size: thread_group 2 -> 1, 2 -> 3, 4 -> 2", "[io][dist][resize]") {
  const std::pair<int, int> cases[] = {{2, 1}, {2, 3}, {4, 2}};
  for (const auto& [n, m] : cases) {
    INFO(n << " -> " << m << " ranks");
    const auto dir = io_test::fresh_dir("resize_" + std::to_string(n) + "_" + std::to_string(m)).string();
    const int steps = 7;  // of 150 / (n * 3) per epoch: mid-epoch
    const auto before = phase(n, dir, steps, /*resume=*/false, phase_end::save);
    const auto after = phase(m, dir, /*steps=*/-1, /*resume=*/true, phase_end::none);
    for (int r = 0; r < m; ++r) {
      INFO("new rank " << r);
      const auto& a = after[static_cast<std::size_t>(r)];
      CHECK(compare_resume(before[0], a) == "");
      CHECK(a.sampler_offset == steps * per_rank_batch * n);  // the epoch's global position
      CHECK(a.resumed.find("written by " + std::to_string(n) + " ranks, now " + std::to_string(m)) != std::string::npos);
      // Per-rank state without a redistribution rule: the old rank's own where there was one (its
      // stream moved one block a step), a new rank's own fresh one otherwise.
      CHECK(a.rank_rng_offset == (r < n ? static_cast<std::uint64_t>(steps) : 0u));
    }
    // Rest of the epoch on m ranks: every sample once, except what drop_last leaves out (the
    // sampler's < m and the loader's < 3 per rank).
    CHECK(compare_epoch(before[0], after[0], (m - 1) + m * (per_rank_batch - 1)) == "");
    CHECK(after[0].end_step == steps + (150 - steps * per_rank_batch * n) / m / per_rank_batch);
  }
}

TEST_CASE("reshard_feedback: sums preserved, chunks moved, bad layouts named", "[dist][resize]") {
  using C = compression::int8_block<16>;
  // Two old ranks of a 40-element bucket: chunks of 32 (a multiple of 16), rank 1's valid part 8.
  auto vec = [](int n, float base) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = base + 0.25f * static_cast<float>(i);
    return trainkit::tensor<float>::from_vector(v, {n});
  };
  std::vector<compression::compression_state> old(2);
  old[0] = {{"worker.0", vec(40, 1)}, {"server.0", vec(32, 100)}};
  old[1] = {{"worker.0", vec(40, -3)}, {"server.0", vec(32, 200)}};
  // 2 -> 3: ranks 0 and 1 keep theirs, rank 2 starts at zero; the chunks become 16, 16, 16.
  const auto r0 = compression::reshard_feedback<C>(old, 0, 3), r2 = compression::reshard_feedback<C>(old, 2, 3);
  REQUIRE(r0.size() == 2);
  CHECK(r0[0].second.to_vector() == old[0][0].second.to_vector());
  CHECK(r0[1].second.numel() == 16);
  CHECK(r0[1].second.to_vector()[15] == 100 + 0.25f * 15);
  REQUIRE(r2.size() == 1);  // no worker residual: it starts from zero
  CHECK(r2[0].first == "server.0");
  const auto s2 = r2[0].second.to_vector();  // elements 32..39 of the bucket: old rank 1's 0..7
  CHECK(s2[0] == 200.0f);
  CHECK(s2[7] == 200 + 0.25f * 7);
  CHECK(s2[8] == 0.0f);  // padding
  // 2 -> 1: one rank owes what both did.
  const auto one = compression::reshard_feedback<C>(old, 0, 1);
  CHECK(one[0].second.to_vector()[3] == (1 + 0.75f) + (-3 + 0.75f));
  CHECK(one[1].second.numel() == 48);
  // A server residual of the wrong length names the rank and key.
  old[1][1].second = vec(31, 0);
  CHECK_THROWS_WITH(compression::reshard_feedback<C>(old, 0, 1),
                    Catch::Contains("old rank 1's 'server.0' has 31 elements") && Catch::Contains("has 32"));
}

TEST_CASE("after a peer failed mid-step, one survivor writes the last completed step", "[io][dist][resize]") {
  const auto dir = io_test::fresh_dir("resize_failure").string();
  const int steps = 6;
  const auto failed = phase(2, dir, steps, /*resume=*/false, phase_end::fail_mid_step);
  REQUIRE(failed[0].resumed.find("snapshot-000000000006.tks") != std::string::npos);  // step 6, not 7
  CHECK(failed[1].resumed.empty());                                                    // rank 1 wrote nothing
  for (int m : {2, 3}) {
    INFO("resumed on " << m << " ranks");
    const auto after = phase(m, dir, /*steps=*/-1, /*resume=*/true, phase_end::none);
    for (const auto& a : after) {
      CHECK(a.params == failed[0].params);  // the model and optimizer as at step 6
      CHECK(a.step == steps);
      // The loader as at step 6: the batch of the failed step is trained on after the resume.
      CHECK(a.sampler_offset + a.sampler_position * m == steps * per_rank_batch * 2);
      CHECK(a.resumed.find("holds no per-rank state") != std::string::npos);
      for (double w : a.worker_sum) CHECK(w == 0.0);  // error feedback starts afresh
      CHECK(a.rank_rng_offset == 0u);                 // so do the per-rank streams
    }
    CHECK(compare_epoch(failed[0], after[0], (m - 1) + m * (per_rank_batch - 1)) == "");
  }
  // A complete snapshot of that step is never replaced by the survivor's.
  const auto dir2 = io_test::fresh_dir("resize_failure_periodic").string();
  (void)phase(2, dir2, steps, /*resume=*/false, phase_end::save);
  const auto again = phase(2, dir2, 0, /*resume=*/true, phase_end::fail_mid_step);
  CHECK(again[0].resumed.empty());
}
