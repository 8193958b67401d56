// tests/parallel/resize_checks.hpp - resume on another world size, shared by the thread_group test
// (tests/parallel/test_resize.cpp) and the mpirun one (tests/mpi/test_resize.cpp): N ranks train a
// small MLP with int8 compression part of an epoch and snapshot; M ranks resume from it. One phase
// is resize_phase(); it reports, collectively (every rank gets the same figures), what the checks
// compare across the two phases:
//   - the replicated state: a hash of the parameters and the step counter;
//   - the error-feedback residuals: the sum over the ranks of the worker residuals (in double, per
//     element of every bucket) and the server residuals reassembled into the buckets' length;
//   - the samples of the epoch every rank trained on, counted over all ranks (the labels are the
//     sample indices).
// No Catch2 macro here: thread_group calls it on its rank threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainkit/autograd/autograd.hpp"
#include "trainkit/autograd/ops/loss.hpp"
#include "trainkit/data/loader.hpp"
#include "trainkit/dist/check_consistent.hpp"  // hash_bytes
#include "trainkit/compression/codecs.hpp"
#include "trainkit/io/distributed.hpp"
#include "trainkit/io/resumable_run.hpp"
#include "trainkit/parallel/data_parallel.hpp"

#include "parallel/dp_checks.hpp"  // make_mlp, in_features, out_features

namespace trainkit_test::resize {

using namespace trainkit_test::dp;
namespace data = trainkit::data;
namespace io = trainkit::io;
namespace dist = trainkit::dist;  // not trainkit_test::dist (collective_checks.hpp)

inline constexpr index_t samples = 150;  // per epoch, over all ranks
inline constexpr index_t per_rank_batch = 3;
using codec = compression::int8_block<16>;  // small blocks: several per chunk even at 4 ranks

/// The data set: random inputs, the sample's index as its label (the loss does not use it).
inline data::tensor_dataset dataset() {
  trainkit::generator gen(99);
  auto x = tensor::empty({samples, in_features});
  trainkit::fill_normal(gen, x.data(), static_cast<std::size_t>(x.numel()), 0.0f, 1.0f);
  auto y = trainkit::tensor<std::int64_t>::empty({samples});
  for (index_t i = 0; i < samples; ++i) y.data()[i] = i;
  return data::tensor_dataset(x, y);
}

/// What one phase saw, the same on every rank (combined over the ranks).
struct phase_report {
  std::uint64_t params = 0;         // hash of the parameters (rank 0's; check_consistent-ed)
  std::int64_t step = 0;            // resumable_run's step counter (after the resume / at the save)
  std::int64_t end_step = 0;        // and at the end of the phase
  std::vector<double> worker_sum;   // sum over ranks of the worker residuals, buckets concatenated
  std::vector<float> server;        // the server residuals reassembled, buckets concatenated
  std::vector<std::int64_t> seen;   // per sample: how many times a rank trained on it in this phase
  std::int64_t sampler_offset = 0;  // the sampler's offset after the resume (0 without)
  std::int64_t sampler_position = 0;  // and its position
  std::uint64_t rank_rng_offset = 0;  // this rank's own generator's offset after the resume (per-rank state)
  std::string resumed;              // resumable_run's messages (fail_mid_step: the path written)
};

template <class Comm>
void residual_report(Comm& comm, const codec& c, const dist::bucket_plan& plan, phase_report& out) {
  const int world = comm.size(), r = comm.rank();
  index_t total = 0;
  std::vector<index_t> base;
  for (const auto& b : plan.buckets) {
    base.push_back(total);
    total += b.numel;
  }
  out.worker_sum.assign(static_cast<std::size_t>(total), 0.0);
  out.server.assign(static_cast<std::size_t>(total), 0.0f);
  for (const auto& [key, t] : c.state()) {
    const bool worker = key.starts_with("worker.");
    const std::size_t b = std::stoul(key.substr(7));
    const auto v = t.to_vector();
    const index_t n = plan.buckets[b].numel, lo = base[b];
    if (worker) {
      for (index_t e = 0; e < n; ++e) out.worker_sum[static_cast<std::size_t>(lo + e)] = v[static_cast<std::size_t>(e)];
    } else {
      const index_t chunk = compression::detail::compress_chunk(n, world, codec::block);
      for (index_t e = 0; e < chunk && r * chunk + e < n; ++e)
        out.server[static_cast<std::size_t>(lo + r * chunk + e)] = v[static_cast<std::size_t>(e)];
    }
  }
  comm.allreduce(out.worker_sum.data(), out.worker_sum.size(), dist::reduce_op::sum).wait();
  comm.allreduce(out.server.data(), out.server.size(), dist::reduce_op::sum).wait();  // disjoint: exact
}

/// One phase on comm: builds the job (model, int8 data_parallel, SGD with momentum, the sharded
/// loader, a per-rank generator), resumes from dir when `resume`, trains `steps` steps (-1: to the
/// end of the epoch) and saves a snapshot when `save`. The residual figures are taken right after
/// the resume (resume) or right before the save (save).
/// How a phase ends: a collective snapshot, nothing, or a peer failing in the middle of the next
/// step (its batch taken, the per-rank stream moved) and rank 0 writing save_after_failure().
enum class phase_end { save, none, fail_mid_step };

template <class Comm>
phase_report resize_phase(Comm& comm, const std::string& dir, int steps, bool resume, phase_end end) {
  const bool save = end == phase_end::save;
  const int world = comm.size(), r = comm.rank();
  phase_report out;
  auto m = make_mlp(7);
  parallel::data_parallel<Comm, codec> ddp(comm, *m,
                                                 {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 40});
  trainkit::optim::sgd<> opt(m->parameters(), {.lr = lr, .momentum = momentum});
  data::distributed_sampler sampler(samples, {.num_replicas = world, .rank = r, .seed = 5, .drop_last = true});
  data::data_loader<data::tensor_dataset> batches(dataset(), sampler,
                                                  {.batch_size = per_rank_batch, .drop_last = true});
  trainkit::generator own(1000 + static_cast<std::uint64_t>(r));
  io::resumable_run run({.dir = dir,
                         .resume = resume ? io::resume_mode::required : io::resume_mode::off,
                         .rank = r,
                         .world_size = world,
                         .handle_signals = false,
                         .any_rank = io::any_rank_of(comm),
                         .allgather_bytes = io::allgather_bytes_of(comm),
                         .log = [&](std::string_view s) { out.resumed += std::string(s); }},
                        /*include_default_generator=*/false);
  run.track("model", *m).track("optimizer", opt).track("batches", batches);
  run.track_per_rank("compression", ddp.compression()).track_per_rank("rng", own);
  // The replicated state and the residuals, as all ranks hold them (right after the resume, or
  // right before the save).
  auto report = [&] {
    residual_report(comm, ddp.compression(), ddp.buckets(), out);
    std::uint64_t h = dist::hash_bytes(nullptr, 0);
    for (const auto& v : dp::values(*m)) h = dist::hash_bytes(v.data(), v.size() * sizeof(float), h);
    dist::check_consistent(comm, h, "parameters");
    out.params = h;
    out.step = run.step();
  };
  if (resume) {
    run.resume();
    report();
    out.sampler_offset = batches.sampler().offset();
    out.sampler_position = batches.sampler().position();
  }
  out.rank_rng_offset = own.offset();
  out.seen.assign(static_cast<std::size_t>(samples), 0);
  for (int s = 0; steps < 0 || s < steps; ++s) {
    if (batches.position() == batches.size()) break;
    const auto b = batches.next();
    for (index_t i = 0; i < b.y.numel(); ++i) ++out.seen[static_cast<std::size_t>(b.y.data()[i])];
    (void)own.reserve(4);  // the per-rank stream moves on
    const auto x = b.x;
    const auto target = x.slice(1, 0, out_features).contiguous();
    opt.zero_grad();
    trainkit::autograd::mse_loss(m->forward(var(x)), var(target)).backward();
    ddp.finish();
    opt.step();
    run.step_done();
  }
  comm.allreduce(out.seen.data(), out.seen.size(), dist::reduce_op::sum).wait();
  if (save) {
    report();
    run.save();
  }
  if (end == phase_end::fail_mid_step) {
    report();
    (void)batches.next();
    (void)own.reserve(4);
    if (r == 0) out.resumed = run.save_after_failure().value_or("").string();
  }
  out.end_step = run.step();
  return out;
}

/// "" when `after` (M ranks, right after the resume) holds what `before` (N ranks, right before
/// the save) left, else what differs: the parameters and step bit for bit, the server residuals
/// element for element, the worker residuals' sum to fp32 round-off of the additions.
inline std::string compare_resume(const phase_report& before, const phase_report& after) {
  if (before.params != after.params) return "parameters differ";
  if (before.step != after.step) return "step " + std::to_string(after.step) + " after, " + std::to_string(before.step) + " before";
  if (before.worker_sum.size() != after.worker_sum.size()) return "bucket layouts differ";
  bool any = false;
  for (std::size_t i = 0; i < before.worker_sum.size(); ++i) {
    const double a = before.worker_sum[i], b = after.worker_sum[i];
    any = any || a != 0.0;
    if (std::fabs(a - b) > 1e-6 * std::fabs(a) + 1e-9)
      return "worker residual sum, element " + std::to_string(i) + ": " + std::to_string(a) + " before, " +
             std::to_string(b) + " after";
  }
  if (!any) return "no worker residual before the save (nothing was checked)";
  for (std::size_t i = 0; i < before.server.size(); ++i)
    if (before.server[i] != after.server[i])
      return "server residual, element " + std::to_string(i) + ": " + std::to_string(before.server[i]) +
             " before, " + std::to_string(after.server[i]) + " after";
  return "";
}

/// "" when the two phases together trained on every sample of the epoch exactly once, except at
/// most `dropped_max` left out (drop_last), else the first sample that was not.
inline std::string compare_epoch(const phase_report& first, const phase_report& second, index_t dropped_max) {
  index_t dropped = 0;
  for (index_t i = 0; i < samples; ++i) {
    const auto n = first.seen[static_cast<std::size_t>(i)] + second.seen[static_cast<std::size_t>(i)];
    if (n > 1) return "sample " + std::to_string(i) + " trained on " + std::to_string(n) + " times";
    dropped += n == 0;
  }
  if (dropped > dropped_max) return std::to_string(dropped) + " samples left out (at most " + std::to_string(dropped_max) + ")";
  return "";
}

}  // namespace trainkit_test::resize
