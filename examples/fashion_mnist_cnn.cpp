// fashion_mnist_cnn - a two-block CNN trained on Fashion-MNIST on the CPU.
//
//   build/examples/fashion_mnist_cnn --data /usr/share/datasets/fashion-mnist --epochs 3
//       [--precision fp32|fp16|bf16] [--checkpoint none|sqrt|every:N]
//       [--snapshot-dir DIR [--resume 0|1|auto] [--snapshot-every N]] [--metrics-port P] [--metrics-log F]
//       [--tensorboard DIR] [--log-every N]
//
// Reads the IDX files (Debian's dataset-fashion-mnist), trains with SGD + momentum under a
// cosine schedule with warmup, and prints loss, test accuracy and samples/s per epoch.
// --precision runs convolutions and linear layers in half/bfloat16 (fp32 master weights, loss
// scaling for fp16); --checkpoint recomputes activations in backward instead of storing them.
// --snapshot-dir keeps the whole training state (model, optimizer, scaler, schedule, data order,
// RNG) there every N steps and on SIGTERM/SIGINT (then exits 75); --resume continues from the newest
// good snapshot, bit-exactly. --metrics-port serves Prometheus metrics on /metrics, --metrics-log
// appends them as JSON lines and --tensorboard DIR writes them as TensorBoard scalars, every
// --log-every steps (and the test accuracy per epoch). The loss figures: the epoch line's is the
// mean over the epoch's samples; the logs' and the progress line's are the mean over the last
// --log-every steps (example::interval_log); /metrics serves the last step's between log points.
// The loop is written out by hand; fashion_mnist_mlp shows the same job through train::train_step.
//
// Reading order: fashion_cnn() is the model; train<Precision>() is the whole job, top to bottom;
// main() parses the flags and picks which train() to run.
//
// The model is reused, not copied: fashion_mnist_cnn.cu (the same job on a GPU), fashion_mnist_ddp
// and the benchmarks that time it include this file with FASHION_MNIST_CNN_MODEL_ONLY defined,
// which keeps the includes and fashion_cnn() and leaves out the rest (the job and main()).
#include <array>
#include <cstdio>
#include <exception>
#include <memory>

#include <trainkit/trainkit.hpp>  // tensors, autograd, nn, optim, data, io, monitor, train::accuracy

#include "common/example.hpp"  // flags, stopwatch, digest, run_monitor, interval_log

namespace example {

/// The model: [N,1,28,28] -> conv block (32) -> [N,32,14,14] -> conv block (64) -> [N,64,7,7] ->
/// flatten -> 3136 -> 128 -> ReLU -> dropout -> 10, where a conv block is conv 3x3 (padding 1) -
/// batch norm - ReLU - max pool 2x2. Parameters are drawn from the default generator (PyTorch's
/// initialisations) on the host, so a CUDA model starts from the CPU model's values.
/// \tparam Device trainkit::cpu or trainkit::cuda
template <class Device = trainkit::cpu>
std::shared_ptr<trainkit::nn::sequential<float, Device>> fashion_cnn(double dropout = 0.2) {
  namespace nn = trainkit::nn;
  using k = std::array<trainkit::index_t, 2>;
  const nn::conv2d_options same{.padding = {1, 1}};
  const nn::pool2d_options halve{.kernel = {2, 2}};
  return nn::make_sequential(
      std::make_shared<nn::conv2d<float, Device>>(1, 32, k{3, 3}, same),
      std::make_shared<nn::batch_norm2d<float, Device>>(32), std::make_shared<nn::relu<float, Device>>(),
      std::make_shared<nn::max_pool2d<float, Device>>(halve),
      std::make_shared<nn::conv2d<float, Device>>(32, 64, k{3, 3}, same),
      std::make_shared<nn::batch_norm2d<float, Device>>(64), std::make_shared<nn::relu<float, Device>>(),
      std::make_shared<nn::max_pool2d<float, Device>>(halve), std::make_shared<nn::flatten<float, Device>>(),
      std::make_shared<nn::linear<float, Device>>(64 * 7 * 7, 128), std::make_shared<nn::relu<float, Device>>(),
      std::make_shared<nn::dropout<float, Device>>(dropout), std::make_shared<nn::linear<float, Device>>(128, 10));
}

}  // namespace example

#ifndef FASHION_MNIST_CNN_MODEL_ONLY  // the job and main(): this program's own

// OMP_WAIT_POLICY=passive and cores / local ranks threads unless the environment says otherwise:
// well-behaved on shared cores and under mpirun (trainkit/core/threads.hpp).
TRAINKIT_THREAD_DEFAULTS();

namespace tk = trainkit;
using tk::index_t;

namespace {

/// The whole training job for one precision policy (a type: the loop is compiled once per policy).
/// \tparam Precision amp::fp32, amp::mixed_fp16 or amp::mixed_bf16
template <class Precision>
int train(const example::flags& f, const tk::checkpoint::recompute_choice& recompute) {
  // The numeric flags, checked before any work: a bad value is an error naming the flag.
  const auto seed = static_cast<std::uint64_t>(f.num("seed", 0));
  const index_t epochs = f.num("epochs", 1), batch = f.num("batch", 1);
  const index_t train_limit = f.num("train-limit", 0), test_limit = f.num("test-limit", 0);  // 0: all
  const double lr = f.real("lr", 0);
  const auto resume = example::resume_flag(f);  // 0, 1 or auto
  const index_t snapshot_every = f.num("snapshot-every", 0);
  const int port = static_cast<int>(f.num("metrics-port", 0, 65535));
  const long log_every = f.num("log-every", 1);
  tk::set_seed(seed);  // every stream: init, dropout

  // Data: pixels scaled to [0, 1], then standardised with the training set's mean and std.
  tk::data::mnist_options opts{.mean = tk::data::fashion_mnist_mean, .stddev = tk::data::fashion_mnist_std};
  if (train_limit > 0) opts.limit = train_limit;
  auto train = tk::data::load_mnist(f.str("data"), tk::data::split::train, opts);
  opts.limit = test_limit > 0 ? std::optional<index_t>(test_limit) : std::nullopt;
  auto test = tk::data::load_mnist(f.str("data"), tk::data::split::test, opts);
  std::printf("train %lld  test %lld images of %lldx%lld\n", (long long)train.size(), (long long)test.size(),
              (long long)train.images.size(2), (long long)train.images.size(3));

  auto model = example::fashion_cnn();  // the model above
  std::printf("parameters: %lld\n", (long long)model->num_parameters());
  std::printf("%s\n", example::threads_line().c_str());

  // Batches: the sampler decides the order (a fresh seeded shuffle per epoch; one process is one
  // replica), the loader copies each batch into one buffer on a worker thread while the step runs.
  tk::data::data_loader batches(train, tk::data::shuffled_sampler(train.size(), seed),
                                {.batch_size = batch, .num_workers = 1});
  const index_t steps = epochs * batches.size();
  tk::optim::sgd opt(model->parameters(), {.lr = lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  tk::optim::warmup_cosine_lr schedule({.base_lr = lr, .warmup_steps = std::min<index_t>(100, steps / 10),
                                        .total_steps = steps, .min_lr = 0.0});
  schedule.apply(opt);
  tk::amp::default_scaler_t<Precision> scaler;  // dynamic loss scaling for fp16, none for fp32/bf16

  std::printf("precision %s  checkpoint %s\n", std::string(Precision::name).c_str(),
              tk::checkpoint::to_string(recompute).c_str());
  example::run_monitor monitor(
      {.port = port, .jsonl_path = f.str("metrics-log"), .tensorboard_dir = f.str("tensorboard")});
  if (monitor.port()) std::printf("metrics on http://0.0.0.0:%d/metrics\n", monitor.port());
  tk::monitor::progress_line bar;  // redrawn in place on a terminal; silent in logs and pipes
  example::interval_log<> interval(monitor, log_every);  // every N steps: their mean loss and samples/s

  // Snapshots: everything the next step depends on, including where the loader is in its epoch.
  // The settings that change the trajectory go into every snapshot; a resume that differs is an
  // error (--resume 1) or a warning naming each difference (--resume auto).
  tk::io::resumable_run run({.dir = f.str("snapshot-dir"),
                             .resume = resume,
                             .config = example::run_config(f, *model, {{"precision", f.str("precision")}}),
                             .every_steps = snapshot_every});
  run.track("model", *model).track("optimizer", opt).track("schedule", schedule)
      .track("scaler", scaler).track("batches", batches);
  run.resume();  // no-op without --resume (and with --resume auto and no snapshot); a resumed epoch continues mid-way

  for (auto epoch = batches.epoch(); epoch < static_cast<std::uint64_t>(epochs); ++epoch) {
    if (epoch != batches.epoch()) batches.set_epoch(epoch);
    bar.begin("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs), batches.size(), batches.position());
    example::stopwatch clock;
    interval.start();
    double loss_sum = 0;
    index_t seen = 0;
    double waited = batches.wait_seconds();
    for (auto& b : batches) {
      example::stopwatch step_clock;
      // One step, written out: forward (conv/linear in Precision's compute type, segments
      // recomputed per the policy), fp32 loss, scaled backward, unscale + inf check + step, schedule.
      auto logits = tk::checkpoint::apply_recompute(recompute, *model, tk::var<float>(b.x),
                                                    tk::amp::module_forward<Precision>{});
      auto loss = tk::autograd::cross_entropy(logits, b.y);
      opt.zero_grad();
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      schedule.step(opt);
      const double loss_value = loss.item();
      loss_sum += loss_value * double(b.x.size(0));
      seen += b.x.size(0);
      // The time next() waited for this batch: near 0 while the worker keeps ahead of the step.
      const double data_wait = batches.wait_seconds() - waited;
      waited = batches.wait_seconds();
      monitor.metrics().observe({.seconds = step_clock.seconds(), .samples = b.x.size(0),
                                 .loss = loss_value, .learning_rate = opt.lr(), .loss_scale = scaler.get_scale(),
                                 .data_wait_seconds = data_wait});
      interval.add(loss_value, b.x.size(0));
      const bool stop = run.step_done();  // counts the step; SIGTERM/SIGINT: snapshot written
      // Every --log-every steps: the interval's figures to the logs, its mean loss to the bar.
      bar.step(b.x.size(0), interval.step_done(run.step(), static_cast<std::int64_t>(epoch) + 1));
      if (stop) {  // exit cleanly
        bar.end();
        std::printf("stopped  parameters digest %016llx\n", (unsigned long long)example::digest(*model));
        return example::exit_restart;  // 75: "run me again" (the snapshot is written)
      }
    }
    bar.end();  // the epoch's summary line takes its place
    if (seen == 0) continue;  // resumed at the very end of an epoch
    const double secs = clock.seconds();
    const double acc = tk::train::accuracy(*model, test.images, test.labels, tk::amp::module_forward<Precision>{});
    std::printf("epoch %lld  loss %.4f  test accuracy %.2f%%  %.0f samples/s\n", (long long)epoch + 1,
                loss_sum / double(seen), 100 * acc, double(seen) / secs);
    if (auto* tb = monitor.tensorboard()) {  // beside train/loss etc. written every --log-every steps
      tb->add_scalar("eval/test_accuracy", acc, run.step());
      tb->flush();
    }
    std::fflush(stdout);
  }
  run.finish();
  // Bit-exact resume shows here: an interrupted and resumed run prints the same digest.
  if (const std::string w = example::wait_line(); !w.empty()) std::printf("%s\n", w.c_str());
  std::printf("done  parameters digest %016llx\n", (unsigned long long)example::digest(*model));
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  example::flags f(argc, argv,
                   {{"data", "/usr/share/datasets/fashion-mnist"}, {"epochs", "3"}, {"batch", "128"},
                    {"lr", "0.05"}, {"train-limit", "0"}, {"test-limit", "0"}, {"seed", "1"},
                    {"precision", "fp32"}, {"checkpoint", "none"}, {"snapshot-dir", ""}, {"resume", "0"},
                    {"snapshot-every", "200"}, {"metrics-port", "0"}, {"metrics-log", ""},
                    {"tensorboard", ""}, {"log-every", "50"}});
  const auto recompute = tk::checkpoint::parse_recompute(f.str("checkpoint"));
  switch (tk::amp::parse_precision(f.str("precision"))) {
    case tk::amp::precision_kind::fp32: return train<tk::amp::fp32>(f, recompute);
    case tk::amp::precision_kind::fp16: return train<tk::amp::mixed_fp16>(f, recompute);
    case tk::amp::precision_kind::bf16: return train<tk::amp::mixed_bf16>(f, recompute);
  }
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist_cnn: %s\n", e.what());
  return 1;
}

#endif  // FASHION_MNIST_CNN_MODEL_ONLY
