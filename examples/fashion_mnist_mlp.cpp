// fashion_mnist_mlp - a 784-512-512-10 multilayer perceptron trained on Fashion-MNIST.
//
//   build/examples/fashion_mnist_mlp --data /usr/share/datasets/fashion-mnist --epochs 8
//       [--precision fp32|fp16|bf16] [--checkpoint none|sqrt|every:N]
//       [--snapshot-dir DIR [--resume 0|1|auto] [--snapshot-every N]] [--metrics-port P] [--metrics-log F]
//       [--tensorboard DIR] [--log-every N]
//
// The smallest complete job: load the IDX files, build the model from nn layers, train with
// AdamW under a cosine schedule, print loss, test accuracy and samples/s per epoch. Each step is
// one call of train::train_step, which composes the policies chosen on the command line
// (precision, loss scaling, recomputation); fashion_mnist_cnn writes the same loop out by hand.
// Snapshots, resume and metrics as in fashion_mnist_cnn; --tensorboard DIR writes the metrics every
// --log-every steps and the test accuracy per epoch as TensorBoard scalars (`tensorboard --logdir DIR`).
// The loss figures: the epoch line's is the mean over the epoch's samples; TensorBoard's
// train/loss, --metrics-log's trainkit_loss and the progress line's are the mean over the last
// --log-every steps (example::interval_log); /metrics serves the last step's between log points.
//
// Reading order: train<Precision>() is the whole job, top to bottom; main() parses the
// flags and picks which train() to run.
#include <cstdio>
#include <exception>

#include <trainkit/train/train.hpp>  // train_step, accuracy
#include <trainkit/trainkit.hpp>        // tensors, autograd, nn, optim, data, io, monitor

#include "common/example.hpp"  // flags, stopwatch, digest, run_monitor, interval_log

// OMP_WAIT_POLICY=passive and cores / local ranks threads unless the environment says otherwise:
// well-behaved on shared cores and under mpirun (trainkit/core/threads.hpp).
TRAINKIT_THREAD_DEFAULTS();

namespace tk = trainkit;
namespace nn = trainkit::nn;
using tk::index_t;

namespace {

/// The whole training job for one precision policy (a type, so train_step is compiled for it; main
/// picks it at run time) and the recompute policy of --checkpoint (chosen at run time: one
/// train_step type serves none, sqrt and every:N).
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
  // The MLP sees each image as a flat 784-vector: [N, 1, 28, 28] -> [N, 784] (a view, no copy).
  auto train_x = train.images.view({train.size(), -1}), test_x = test.images.view({test.size(), -1});
  std::printf("train %lld  test %lld samples of %lld features\n", (long long)train.size(), (long long)test.size(),
              (long long)train_x.size(1));

  // Batches: the sampler decides the order (a fresh seeded shuffle per epoch; one process is one
  // replica), the loader copies each batch into one buffer on a worker thread while the step runs.
  tk::data::data_loader batches(tk::data::tensor_dataset(train_x, train.labels),
                                tk::data::shuffled_sampler(train.size(), seed),
                                {.batch_size = batch, .num_workers = 1});
  const index_t steps = epochs * batches.size();

  auto model = nn::make_sequential(std::make_shared<nn::linear<>>(784, 512), std::make_shared<nn::relu<>>(),
                                   std::make_shared<nn::dropout<>>(0.2), std::make_shared<nn::linear<>>(512, 512),
                                   std::make_shared<nn::relu<>>(), std::make_shared<nn::dropout<>>(0.2),
                                   std::make_shared<nn::linear<>>(512, 10));
  std::printf("parameters: %lld\n", (long long)model->num_parameters());
  std::printf("%s\n", example::threads_line().c_str());

  tk::optim::adamw opt(model->parameters(), {.lr = lr, .weight_decay = 1e-4});
  tk::optim::warmup_cosine_lr schedule({.base_lr = lr, .warmup_steps = std::min<index_t>(200, steps / 10),
                                        .total_steps = steps, .min_lr = 0.0});
  schedule.apply(opt);

  example::run_monitor monitor(
      {.port = port, .jsonl_path = f.str("metrics-log"), .tensorboard_dir = f.str("tensorboard")});
  if (monitor.port()) std::printf("metrics on http://0.0.0.0:%d/metrics\n", monitor.port());
  tk::monitor::progress_line bar;  // redrawn in place on a terminal; silent in logs and pipes
  example::interval_log<> interval(monitor, log_every);  // every N steps: their mean loss and samples/s

  // One step = forward (Precision's compute type, the recompute policy's segments) -> loss -> scaled
  // backward -> unscale and inf check -> optimizer step -> schedule -> metrics.
  using scaler_t = tk::amp::default_scaler_t<Precision>;  // dynamic loss scaling for fp16 only
  tk::train::train_step<nn::sequential<float>, decltype(opt), Precision, scaler_t, tk::checkpoint::recompute_choice>
      step(*model, opt, {.metrics = &monitor.metrics()}, scaler_t(), recompute);
  step.attach_schedule(schedule);

  // Snapshots: everything the next step depends on, including where the loader is in its epoch.
  // The settings that change the trajectory go into every snapshot; a resume that differs is an
  // error (--resume 1) or a warning naming each difference (--resume auto).
  tk::io::resumable_run run({.dir = f.str("snapshot-dir"),
                             .resume = resume,
                             .config = example::run_config(f, *model, {{"precision", f.str("precision")}}),
                             .every_steps = snapshot_every});
  run.track("model", *model).track("optimizer", opt).track("schedule", schedule)
      .track("scaler", step.scaler()).track("batches", batches);
  run.resume();  // no-op without --resume (and with --resume auto and no snapshot); a resumed epoch continues mid-way

  for (auto epoch = batches.epoch(); epoch < static_cast<std::uint64_t>(epochs); ++epoch) {
    if (epoch != batches.epoch()) batches.set_epoch(epoch);
    bar.begin("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs), batches.size(), batches.position());
    example::stopwatch clock;
    interval.start();
    const double waited = batches.wait_seconds();
    double loss_sum = 0;
    index_t seen = 0;
    for (auto& b : batches) {
      const auto r = step(b.x, [&](const tk::var<float>& logits) { return tk::autograd::cross_entropy(logits, b.y); });
      loss_sum += r.loss * double(b.x.size(0));
      seen += b.x.size(0);
      interval.add(r.loss, b.x.size(0));
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
    monitor.metrics().add_data_wait(batches.wait_seconds() - waited);
    if (seen == 0) continue;  // resumed at the very end of an epoch
    const double secs = clock.seconds();
    const double acc = tk::train::accuracy(*model, test_x, test.labels, tk::amp::module_forward<Precision>{});
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
                   {{"data", "/usr/share/datasets/fashion-mnist"}, {"epochs", "8"}, {"batch", "128"},
                    {"lr", "0.001"}, {"train-limit", "0"}, {"test-limit", "0"}, {"seed", "1"},
                    {"precision", "fp32"}, {"checkpoint", "none"}, {"snapshot-dir", ""}, {"resume", "0"},
                    {"snapshot-every", "500"}, {"metrics-port", "0"}, {"metrics-log", ""},
                    {"tensorboard", ""}, {"log-every", "50"}});
  const auto recompute = tk::checkpoint::parse_recompute(f.str("checkpoint"));
  switch (tk::amp::parse_precision(f.str("precision"))) {
    case tk::amp::precision_kind::fp32: return train<tk::amp::fp32>(f, recompute);
    case tk::amp::precision_kind::fp16: return train<tk::amp::mixed_fp16>(f, recompute);
    case tk::amp::precision_kind::bf16: return train<tk::amp::mixed_bf16>(f, recompute);
  }
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist_mlp: %s\n", e.what());
  return 1;
}
