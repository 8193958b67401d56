// fashion_mnist_ddp - the CNN of fashion_mnist_cnn trained data-parallel over MPI processes, with
// optional gradient compression.
//
//   mpirun -np 2 build/examples/fashion_mnist_ddp --data /usr/share/datasets/fashion-mnist
//          --epochs 3 --batch 64 --compression int8         (one command line)
//   build/examples/fashion_mnist_ddp ...            (one process: MPI starts as a singleton)
//
// Every rank holds the whole data set (the files are small); a distributed_sampler gives rank r its
// own shard of each epoch's shuffled order, and the rank's data_loader builds batches of --batch
// samples from it, so each step trains on ranks x --batch samples in all. data_parallel averages
// the gradients over the ranks bucket by bucket while backward is still running, through the chosen
// compression (none, fp16, bf16, int8, sign_1bit; lossy ones with error feedback). Rank 0 prints
// per epoch: loss (mean over all ranks), test accuracy (each rank scores a slice of the test set),
// samples/s over all ranks, and the share of step time the communication thread was busy
// ("comm") and the share backward could not hide (finish() waiting: "exposed"). --overlap 0 reduces
// every bucket in finish() instead of during backward, to see what overlapping hides.
// --snapshot-dir: rank 0 writes the whole state (with every rank's error-feedback residuals and
// dropout stream) every --snapshot-every steps and when any rank gets SIGTERM/SIGINT; --resume
// restores it on every rank - on any number of ranks: a snapshot of N ranks resumes on M, the
// error-feedback residuals redistributed and the epoch continued from its global sample position.
// --stop-after K stops after K steps of this run as a signal would (snapshot, exit 75).
// --hierarchical 1: the gradients go through compression::hierarchical - fp32 through shared memory among
// the ranks of a host, --compression only between hosts (benchmarks/allreduce_netns.sh makes hosts).
// --metrics-port: rank r serves /metrics on port P + r. --tensorboard DIR: rank 0 writes the metrics
// every --log-every steps and the test accuracy per epoch as TensorBoard scalars. The loss and
// samples/s there (and on the progress line) are the job's over those N steps: every rank adds its
// interval's sums at the same steps (example::interval_log); the other figures (learning rate,
// communication share ...) are rank 0's. The CUDA build (fashion_mnist_ddp.cu -> fashion_mnist_ddp_cuda)
// runs the same job with one process per GPU; --comm nccl|mpi chooses its gradient transport.
//
// Reading order: the model is fashion_mnist_cnn.cpp's fashion_cnn(), included from there (only the
// model: FASHION_MNIST_CNN_MODEL_ONLY); train_ddp<Device, Compression>() is the whole job, top to
// bottom, for either device; main() at the end starts MPI and picks the communicators.
//
// One job, two builds, no copy: this file is the device-generic job and the CPU build's main().
// fashion_mnist_ddp.cu includes it with FASHION_MNIST_DDP_JOB_ONLY defined, which leaves out the
// CPU main() below, and supplies the GPU build's main() (GPU selection, NCCL or MPI gradients).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <trainkit/trainkit.hpp>   // tensors, autograd, nn, optim, data, io, monitor, parallel
#include <trainkit/dist/mpi.hpp>  // dist::mpi: processes, control messages, CPU gradients

#include "common/example.hpp"  // flags, stopwatch, digest, run_monitor, interval_log
#define FASHION_MNIST_CNN_MODEL_ONLY
#include "fashion_mnist_cnn.cpp"  // example::fashion_cnn<Device>(), the model of fashion_mnist_cnn

namespace tk = trainkit;
namespace dist = trainkit::dist;
namespace compression = trainkit::compression;
namespace parallel = trainkit::parallel;
using tk::index_t;

namespace {

/// On the way out of a failed job (an exception while a communicator is broken): the lowest
/// surviving rank writes the snapshot of the last completed step (resumable_run::save_after_failure),
/// so the requeued job loses at most the step that was running. The MPI communicator's probe
/// names the dead ranks; when only the gradient communicator (NCCL) broke, rank 0 writes.
template <class Grads>
class snapshot_on_peer_failure {
 public:
  snapshot_on_peer_failure(dist::mpi& comm, Grads& grads, tk::io::resumable_run& run)
      : comm_(comm), grads_(grads), run_(run), in_flight_(std::uncaught_exceptions()) {}
  snapshot_on_peer_failure(const snapshot_on_peer_failure&) = delete;
  snapshot_on_peer_failure& operator=(const snapshot_on_peer_failure&) = delete;
  ~snapshot_on_peer_failure() {
    if (std::uncaught_exceptions() <= in_flight_ || !(comm_.broken() || grads_.broken())) return;
    if (comm_.lowest_surviving_rank() != comm_.rank()) return;
    try {
      run_.save_after_failure();
    } catch (const std::exception& e) {  // the job's own error is the one to report
      std::fprintf(stderr, "rank %d: the snapshot after the failure could not be written: %s\n", comm_.rank(), e.what());
    }
  }

 private:
  dist::mpi& comm_;
  Grads& grads_;
  tk::io::resumable_run& run_;
  int in_flight_;
};

/// The whole job on Device: `comm` (MPI) carries the control messages (snapshot agreement, the
/// epoch's loss and accuracy), `grads` the gradients (the same mpi object on the CPU; nccl on GPUs).
/// Returns true when a signal stopped it (snapshot written).
/// \tparam Memory the loader's batch memory (pageable_memory on the CPU, gpu::pinned_memory on CUDA)
template <class Device, class Compression, class Memory, class Comm>
bool train_ddp(dist::mpi& comm, Comm& grads, const example::flags& f) {
  constexpr bool on_cpu = std::is_same_v<Device, tk::cpu>;
  const int rank = comm.rank(), world = comm.size();
  auto say = [&](const char* fmt, auto... args) { example::say(rank, fmt, args...); };  // rank 0 speaks for all

  // The numeric flags, checked before any work: a bad value is an error naming the flag.
  const auto seed = static_cast<std::uint64_t>(f.num("seed", 0));
  const index_t epochs = f.num("epochs", 1), per_rank = f.num("batch", 1);
  const index_t train_limit = f.num("train-limit", 0), test_limit = f.num("test-limit", 0);  // 0: all
  const double lr = f.real("lr", 0);
  const bool overlap = f.num("overlap", 0, 1) != 0;
  const auto resume = example::resume_flag(f);  // 0, 1 or auto
  const index_t snapshot_every = f.num("snapshot-every", 0);
  const index_t stop_after = f.num("stop-after", 0);  // steps of this run, then stop as on a signal
  const int port = static_cast<int>(f.num("metrics-port", 0, 65535 - world + 1));
  const long log_every = f.num("log-every", 1);

  // Data: every rank loads all of it (the files are small); the sampler below picks its shard.
  tk::data::mnist_options opts{.mean = tk::data::fashion_mnist_mean, .stddev = tk::data::fashion_mnist_std};
  if (train_limit > 0) opts.limit = train_limit;
  auto train_set = tk::data::load_mnist(f.str("data"), tk::data::split::train, opts);
  opts.limit = test_limit > 0 ? std::optional<index_t>(test_limit) : std::nullopt;
  auto test_set = tk::data::load_mnist(f.str("data"), tk::data::split::test, opts);

  // Every rank builds the model; data_parallel checks that they match and broadcasts rank 0's
  // parameters and BatchNorm statistics. Dropout masks differ per rank (seed + rank).
  tk::manual_seed(seed);
  auto model = example::fashion_cnn<Device>();
  parallel::data_parallel<Comm, Compression, float, Device> ddp(grads, *model, {.overlap = overlap});
  tk::manual_seed(seed * 1000 + static_cast<std::uint64_t>(rank));
  say("%d rank(s) on %s, compression %s, %lld parameters in %zu gradient bucket(s); train %lld, test %lld images\n",
      world, on_cpu ? "the CPU" : "GPUs", std::string(Compression::name).c_str(), (long long)model->num_parameters(), ddp.buckets().buckets.size(),
      (long long)train_set.size(), (long long)test_set.size());
  if (on_cpu) say("%s\n", example::threads_line().c_str());

  // Batches: every rank shuffles with the same seed and takes every world-th index from rank on
  // (its shard); drop_last in the sampler (no padded repeats) and in the loader (full batches
  // only) gives every rank the same number of equal steps, which data_parallel needs.
  tk::data::distributed_sampler shard(train_set.size(), {.num_replicas = world, .rank = rank, .shuffle = true,
                                                         .seed = seed,
                                                         .drop_last = true});
  // On a GPU the batches go to pinned host memory: each copy to the device is one asynchronous DMA.
  tk::data::data_loader<tk::data::tensor_dataset, tk::data::distributed_sampler, Memory> batches(
      train_set, shard, {.batch_size = per_rank, .num_workers = 1, .drop_last = true});
  tk::optim::sgd opt(model->parameters(), {.lr = lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  // The schedule counts samples, not steps: the same rate for the same training progress on any
  // number of ranks, so a job resumed on another world size goes on where it was and ends at the
  // same rate. Warmup: 100 steps of one rank's batch, at most a tenth of the run.
  const index_t global_batch = per_rank * world, total_samples = epochs * train_set.size();
  tk::optim::warmup_cosine_lr schedule({.base_lr = lr,
                                        .warmup_steps = std::min<index_t>(100 * per_rank, total_samples / 10),
                                        .total_steps = std::max<index_t>(total_samples, 1), .min_lr = 0.0});
  schedule.apply(opt);

  // This rank's slice of the test set; the correct counts are summed over the ranks.
  const index_t t_lo = test_set.size() * rank / world, t_hi = test_set.size() * (rank + 1) / world;
  const auto test_x = test_set.images.slice(0, t_lo, t_hi).contiguous().template to<Device>();
  const auto test_y = test_set.labels.slice(0, t_lo, t_hi).contiguous().template to<Device>();

  // Snapshots: rank 0 writes, every rank reads; a stop (signal on any rank) is agreed by all.
  // Shared state once; what differs by rank (residuals, dropout stream) once per rank.
  // What changes the trajectory is recorded and compared on resume (see fashion_mnist_cnn.cpp).
  // The world size may change: a snapshot of N ranks resumes on this job's `world` - error-feedback
  // residuals redistributed, the epoch continued from its global sample position (docs/ddp.md).
  tk::io::resumable_run run({.dir = f.str("snapshot-dir"),
                             .resume = resume,
                             .config = example::run_config(f, *model, {{"compression", std::string(Compression::name)},  // canonical: 1bit = sign_1bit
                                                                       {"hierarchical", f.str("hierarchical")}}),
                             .every_steps = snapshot_every,
                             .rank = rank, .world_size = world, .any_rank = tk::io::any_rank_of(comm),
                             .allgather_bytes = tk::io::allgather_bytes_of(comm)},
                            /*include_default_generator=*/false);
  run.track("model", *model).track("optimizer", opt).track("schedule", schedule).track("batches", batches);
  run.track_per_rank("compression", ddp.compression()).track_per_rank("rng.default", tk::default_generator());
  if (run.resume()) schedule.apply(opt);  // the restored position's rate
  const std::int64_t first_step = run.step();
  auto say_rate = [&](const char* when) {
    say("%s: learning rate %.9g at sample %lld of %lld\n", when, opt.lr(), (long long)schedule.current_step(),
        (long long)total_samples);
  };
  if (first_step > 0) say_rate("resumed");
  snapshot_on_peer_failure<Comm> failure_snapshot(comm, grads, run);
  example::run_monitor monitor(
      {.port = port > 0 ? port + rank : 0, .tensorboard_dir = rank == 0 ? f.str("tensorboard") : std::string()});
  if constexpr (!on_cpu)  // the caching allocator's allocated / reserved / peak bytes, device="cuda"
    monitor.metrics().track_memory("cuda", [] { return tk::allocator<Device>::stats(); });
  // Rank 0's progress stands for all (every rank takes the same steps); redrawn on a terminal only.
  tk::monitor::progress_line bar({.mode = rank == 0 ? tk::monitor::progress_mode::automatic
                                                    : tk::monitor::progress_mode::never});
  // Every --log-every steps the job's mean loss and samples/s: each rank's interval sums (the loss
  // summed on the device), added over the ranks. On a GPU, reading the loss waits for the step:
  // only when someone watches, decided from the flags so that every rank agrees.
  const bool watched = on_cpu || port > 0 || !f.str("tensorboard").empty();
  example::interval_log<Device> interval(monitor, log_every, watched, [&](double* sums, int n) {
    comm.allreduce(sums, n, dist::reduce_op::sum).wait();
  });

  for (auto epoch = batches.epoch(); epoch < static_cast<std::uint64_t>(epochs); ++epoch) {
    if (epoch != batches.epoch()) batches.set_epoch(epoch);
    // Where the epoch is over all ranks (after a resume on another world size this rank's loader
    // starts at 0 of what is left): the bar starts at the global steps already done.
    const index_t global_done = batches.sampler().global_position() / global_batch;
    bar.begin("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs),
              global_done + batches.size() - batches.position(), global_done);
    // An epoch resumed in its middle: its figures cover the part since the resume, and say so.
    const bool partial_epoch = batches.sampler().global_position() > 0;
    const auto before = ddp.stats();
    example::stopwatch clock;
    interval.start();
    double sums[2] = {0, 0};  // loss * samples, samples (this rank)
    auto loss_sum = tk::tensor<float, Device>::zeros({});
    double waited = batches.wait_seconds();
    for (auto& b : batches) {  // this rank's batch of its shard
      example::stopwatch step_clock;
      const auto step_before = ddp.stats();
      auto loss = tk::autograd::cross_entropy((*model)(tk::var<float, Device>(b.x.template to<Device>())),
                                              b.y.template to<Device>());
      opt.zero_grad();
      loss.backward();  // full buckets are reduced while backward goes on
      ddp.finish();     // waits for the rest; .grad() = the mean over the ranks
      opt.step();
      schedule.step(opt, global_batch);
      tk::add_(loss_sum, loss.value(), double(b.x.size(0)));
      interval.add(loss.value(), b.x.size(0));
      sums[1] += double(b.x.size(0));
      const auto step_after = ddp.stats();
      const double data_wait = batches.wait_seconds() - waited;  // next()'s wait for this batch
      waited = batches.wait_seconds();
      monitor.metrics().observe({.seconds = step_clock.seconds(), .samples = b.x.size(0),  // loss: per interval
                                 .learning_rate = opt.lr(),
                                 .communication_seconds = step_after.comm_seconds - step_before.comm_seconds,
                                 .bytes_sent = step_after.bytes_sent - step_before.bytes_sent,
                                 .data_wait_seconds = data_wait});
      if (stop_after > 0 && run.step() + 1 - first_step == stop_after) run.request_stop();  // on every rank
      const bool stop = run.step_done();  // counts the step; a rank was signalled: snapshot written
      // Samples of all ranks; every --log-every steps the job's interval figures to the logs and the bar.
      bar.step(b.x.size(0) * world, interval.step_done(run.step(), static_cast<std::int64_t>(epoch) + 1));
      if (stop) {  // all stop
        say_rate("stopped");
        return true;
      }
    }
    bar.end();  // the epoch's summary line takes its place
    if (sums[1] == 0) continue;  // resumed at the very end of an epoch
    sums[0] = double(loss_sum.item());  // waits for the epoch's work
    const double secs = clock.seconds();
    const auto after = ddp.stats();
    comm.allreduce(sums, 2, dist::reduce_op::sum).wait();

    // Evaluate with rank 0's BatchNorm statistics on every rank (each rank's drifted on its shard).
    ddp.sync_buffers();
    double correct = double(tk::train::count_correct(*model, test_x, test_y).correct);
    comm.allreduce(&correct, 1, dist::reduce_op::sum).wait();

    const double comm_s = after.comm_seconds - before.comm_seconds;
    const double exposed_s = after.exposed_seconds - before.exposed_seconds;
    const double mib = double(after.bytes_sent - before.bytes_sent) / (1 << 20);
    say("epoch %lld  loss %.4f  test accuracy %.2f%%  %.0f samples/s  comm %.1f%% (exposed %.1f%%)  "
        "sent %.1f MiB/rank%s\n",
        (long long)epoch + 1, sums[0] / sums[1], 100.0 * correct / double(test_set.size()), sums[1] / secs,
        100.0 * comm_s / secs, 100.0 * exposed_s / secs, mib,
        partial_epoch ? "  (loss, samples/s and comm since the resume)" : "");
    if (auto* tb = monitor.tensorboard()) {  // rank 0 only
      tb->add_scalar("eval/test_accuracy", correct / double(test_set.size()), run.step());
      tb->flush();
    }
  }
  run.finish();
  ddp.sync_buffers();
  if (on_cpu)
    if (const std::string w = example::wait_line(); !w.empty()) say("%s (rank 0)\n", w.c_str());
  say("done  parameters digest %016llx\n", (unsigned long long)example::digest(*model));
  return false;
}

/// The flags of fashion_mnist_ddp (both builds).
example::flags ddp_flags(int argc, char** argv) {
  return example::flags(argc, argv,
                        {{"data", "/usr/share/datasets/fashion-mnist"}, {"epochs", "3"}, {"batch", "64"},
                         {"lr", "0.05"}, {"train-limit", "0"}, {"test-limit", "0"}, {"seed", "1"},
                         {"compression", "none"}, {"overlap", "1"}, {"snapshot-dir", ""}, {"resume", "0"},
                         {"snapshot-every", "100"}, {"stop-after", "0"}, {"hierarchical", "0"},
                         {"metrics-port", "0"}, {"tensorboard", ""}, {"log-every", "50"},
                         {"comm", "nccl"}});
}

/// Runs train_ddp with the compression policy --compression names.
template <class Device, class Memory, class Comm>
bool train_ddp_with(dist::mpi& comm, Comm& grads, const example::flags& f) {
  const std::string c = f.str("compression");
  if (c == "none") return train_ddp<Device, compression::none, Memory>(comm, grads, f);
  if (c == "fp16") return train_ddp<Device, compression::fp16, Memory>(comm, grads, f);
  if (c == "bf16") return train_ddp<Device, compression::bf16, Memory>(comm, grads, f);
  if (c == "int8") return train_ddp<Device, compression::int8, Memory>(comm, grads, f);
  if (c == "sign_1bit" || c == "1bit") return train_ddp<Device, compression::sign_1bit, Memory>(comm, grads, f);
  throw std::invalid_argument("--compression must be none, fp16, bf16, int8 or sign_1bit, got '" + c + "'");
}

/// main() of a DDP example around `job` (returns the exit status). MPI lives outside the
/// handlers, so an error is printed first and never waits in MPI_Finalize for peers that are still
/// inside a collective: a failed peer (dist_error, which names it) exits 75, worth restarting; this
/// rank's own error (a bad flag, a full disk, a damaged file) ends every rank now
/// (dist::abort_job) - the others would otherwise wait in their next collective until the timeout.
template <class Job>
int ddp_main(const char* program, int argc, char** argv, Job job) {
  // SIGTERM/SIGINT are recorded from here on: a stop that comes while MPI, NCCL or the data start
  // up is still a snapshot and exit status 75 at the first step boundary, not a kill (143).
  tk::io::catch_stop_signals_early();
  dist::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    return job();
  } catch (const dist::dist_error& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, e.what());
    std::fflush(stderr);
    return example::exit_restart;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, e.what());
    dist::abort_job(1);  // the other ranks end now (trainkit-run, or MPI_Abort under a bare mpirun)
  }
}

}  // namespace

#ifndef FASHION_MNIST_DDP_JOB_ONLY  // the CPU build's main(); the CUDA build has its own

// OMP_WAIT_POLICY=passive and cores / local ranks threads unless the environment says otherwise:
// well-behaved on shared cores and under mpirun (trainkit/core/threads.hpp).
TRAINKIT_THREAD_DEFAULTS();

int main(int argc, char** argv) {
  return ddp_main("fashion_mnist_ddp", argc, argv, [&] {
    const auto f = ddp_flags(argc, argv);
    dist::mpi comm;
    bool stopped = false;
    if (f.num("hierarchical", 0, 1) != 0) {  // fp32 inside a host, compressed between hosts
      auto grads = compression::hierarchical<dist::mpi>::by_host(dist::mpi());
      if (comm.rank() == 0)
        std::printf("hierarchical: %d host(s) x %d rank(s)\n", grads.hosts(), grads.ranks_per_host());
      stopped = train_ddp_with<tk::cpu, tk::data::pageable_memory>(comm, grads, f);
    } else {
      stopped = train_ddp_with<tk::cpu, tk::data::pageable_memory>(comm, comm, f);
    }
    // A stop signal (snapshot written): 75, so that the scheduler requeues the job.
    return stopped ? example::exit_restart : 0;
  });
}

#endif  // FASHION_MNIST_DDP_JOB_ONLY
