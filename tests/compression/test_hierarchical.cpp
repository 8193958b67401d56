// compression::hierarchical on thread_group "hosts": H hosts of L rank threads (a world group, one local
// group per host, one cross group per local index). The compressed allreduce reduces inside a host
// in full precision and compresses only between hosts: one host is exact whatever the policy;
// several hosts agree with the exact mean to the policy's error, identically on every rank, with
// error feedback on the inter-host hop (the running sum of what was received tracks the true one);
// the inter-host bytes are those of one slice over H ranks; data_parallel trains through it; hosts
// of different sizes are refused. Rank threads only record, this thread checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "trainkit/compression/hierarchical.hpp"
#include "trainkit/dist/thread_group.hpp"

#include "dist/rank_gradients.hpp"
#include "parallel/dp_checks.hpp"

namespace {

using trainkit::index_t;
namespace dist = trainkit::dist;
namespace compression = trainkit::compression;
using hier = compression::hierarchical<dist::thread_group>;
using trainkit_test::exact_mean;
using trainkit_test::grad_of;
using trainkit_test::max_error;

/// Runs f(comm) on H * L threads; world rank = host * L + local index.
void run_hosts(int hosts, int per_host, const std::function<void(hier&)>& f) {
  const int w = hosts * per_host;
  auto world = dist::thread_group::create(w);
  std::vector<std::vector<dist::thread_group>> local, cross;
  for (int h = 0; h < hosts; ++h) local.push_back(dist::thread_group::create(per_host));
  for (int l = 0; l < per_host; ++l) cross.push_back(dist::thread_group::create(hosts));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(w));
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      const int h = r / per_host, l = r % per_host;
      try {
        hier comm(std::move(world[static_cast<std::size_t>(r)]), std::move(local[static_cast<std::size_t>(h)][static_cast<std::size_t>(l)]),
                  std::move(cross[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]));
        f(comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) CHECK(e == "");
}

}  // namespace

TEST_CASE("hierarchical: one host is full precision whatever the policy", "[dist][hierarchical]") {
  const index_t n = 1001;
  std::vector<std::vector<float>> got(4);
  std::vector<std::uint64_t> bytes(4);
  run_hosts(1, 4, [&](hier& comm) {
    auto g = grad_of(comm.rank(), n);
    compression::int8 c;
    compression::compressed_allreduce(comm, c, g.data(), n, 0, dist::reduce_op::avg);
    got[static_cast<std::size_t>(comm.rank())] = g;
    bytes[static_cast<std::size_t>(comm.rank())] = c.bytes_sent();
  });
  const auto want = exact_mean(4, n);
  for (int r = 0; r < 4; ++r) {
    CHECK(max_error(got[static_cast<std::size_t>(r)], want) < 1e-6);  // fp32 round-off only
    CHECK(got[static_cast<std::size_t>(r)] == got[0]);
    CHECK(bytes[static_cast<std::size_t>(r)] == 0u);  // nothing crossed a host boundary
  }
}

TEST_CASE("hierarchical: several hosts - compressed between them only, with error feedback", "[dist][hierarchical]") {
  for (const auto& [hosts, per_host] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 1}, std::pair{3, 2}}) {
    for (const index_t n : {index_t(1), index_t(7), index_t(1000), index_t(4099), index_t(1100001)}) {
      if (n > 4099 && (hosts != 2 || per_host != 2)) continue;  // pieces: 3, the last padded
      INFO(hosts << " hosts x " << per_host << " ranks, n = " << n);
      const int w = hosts * per_host;
      std::vector<std::vector<float>> fp32(static_cast<std::size_t>(w)), int8(fp32.size()), sums(fp32.size());
      std::vector<std::uint64_t> bytes(fp32.size());
      std::vector<std::string> layout(fp32.size());
      const int steps = 8;
      run_hosts(hosts, per_host, [&](hier& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        auto g = grad_of(comm.rank(), n);
        compression::none plain;
        compression::compressed_allreduce(comm, plain, g.data(), n, 0, dist::reduce_op::avg);
        fp32[r] = g;
        // The same gradient every step through int8: with error feedback the running sum of the
        // results stays within one step's error of steps x the mean.
        compression::int8 c;
        std::vector<float> sum(static_cast<std::size_t>(n), 0.0f);
        compression::compress_workspace ws;
        for (int s = 0; s < steps; ++s) {
          auto x = grad_of(comm.rank(), n);
          compression::compressed_allreduce(comm, c, x.data(), n, 3, dist::reduce_op::avg, &ws);
          if (s == 0) int8[r] = x;
          for (index_t i = 0; i < n; ++i) sum[static_cast<std::size_t>(i)] += x[static_cast<std::size_t>(i)];
        }
        sums[r] = sum;
        bytes[r] = c.bytes_sent();
        layout[r] = c.feedback().layout();
      });
      const auto want = exact_mean(w, n);
      const index_t slice = (n + per_host - 1) / per_host;
      for (int r = 0; r < w; ++r) {
        const auto i = static_cast<std::size_t>(r);
        CHECK(max_error(fp32[i], want) < 1e-5);
        CHECK(fp32[i] == fp32[0]);
        CHECK(int8[i] == int8[0]);  // every rank the same bits
        const double one_step = max_error(int8[i], want);
        CHECK(one_step < 0.05);  // int8: a few hundredths of unit-normal values
        std::vector<double> total(want.size());
        for (std::size_t k = 0; k < want.size(); ++k) total[k] = want[k] * steps;
        CHECK(max_error(sums[i], total) < 2 * one_step + 1e-4);  // feedback: the error does not add up
        // Bytes: one flat compressed allreduce of this rank's slice among the hosts, per step.
        const index_t mine = std::max<index_t>(0, std::min<index_t>(n, (r % per_host + 1) * slice) - (r % per_host) * slice);
        if (n <= 4099)  // one piece
          CHECK(bytes[i] == steps * compression::compressed_allreduce_bytes<compression::int8>(mine, hosts));
        else            // several: within the blocks' padding of that
          CHECK(std::fabs(double(bytes[i]) / double(steps * compression::compressed_allreduce_bytes<compression::int8>(mine, hosts)) - 1) < 0.01);
        CHECK(layout[i] == "hierarchical");
      }
    }
  }
}

TEST_CASE("hierarchical: data_parallel trains through it like through the world", "[dist][hierarchical]") {
  using namespace trainkit_test::dp;
  std::vector<param_values> flat(4), hier_params(4);
  dist::thread_group::run(4, [&](dist::thread_group& comm) {
    flat[static_cast<std::size_t>(comm.rank())] = train_shard(comm, 4, 1, 5).params;
  });
  run_hosts(2, 2, [&](hier& comm) {
    hier_params[static_cast<std::size_t>(comm.rank())] = train_shard(comm, 4, 1, 5).params;
  });
  for (int r = 0; r < 4; ++r) CHECK(compare(hier_params[static_cast<std::size_t>(r)], flat[0]) == "");
}

TEST_CASE("hierarchical: hosts of different sizes are refused; hierarchical residuals do not reshard",
          "[dist][hierarchical]") {
  // World 3 = a host of 2 and a host of 1.
  auto world = dist::thread_group::create(3);
  auto a = dist::thread_group::create(2), b = dist::thread_group::create(1);
  auto x0 = dist::thread_group::create(2), x1 = dist::thread_group::create(1);
  std::vector<std::string> errors(3);
  std::vector<std::thread> t;
  t.reserve(3);
  t.emplace_back([&] {
    try { hier h(std::move(world[0]), std::move(a[0]), std::move(x0[0])); } catch (const std::exception& e) { errors[0] = e.what(); }
  });
  t.emplace_back([&] {
    try { hier h(std::move(world[1]), std::move(a[1]), std::move(x1[0])); } catch (const std::exception& e) { errors[1] = e.what(); }
  });
  t.emplace_back([&] {
    try { hier h(std::move(world[2]), std::move(b[0]), std::move(x0[1])); } catch (const std::exception& e) { errors[2] = e.what(); }
  });
  for (auto& th : t) th.join();
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("same number of ranks") && Catch::Contains("from 1 to 2"));

  compression::int8 c;
  c.feedback().set_layout("hierarchical");
  (void)c.feedback().worker(0, 10);
  std::vector<compression::compression_state> old{c.state(), c.state()};
  CHECK_THROWS_WITH(compression::reshard_feedback<compression::int8>(old, 0, 1),
                    Catch::Contains("hierarchical allreduce") && Catch::Contains("same world size"));
  compression::int8 back;
  back.load_state(c.state());
  CHECK(back.feedback().layout() == "hierarchical");
}
