// fashion_mnist_cnn.cu - the two-block CNN of fashion_mnist_cnn.cpp, trained on a CUDA GPU.
//
//   build/examples/fashion_mnist_cnn_cuda --data /usr/share/datasets/fashion-mnist --epochs 3
//       [--precision fp32|fp16|bf16] [--checkpoint none|sqrt|every:N] [--tf32]
//       [--snapshot-dir DIR [--resume 0|1|auto] [--snapshot-every N]] [--metrics-port P] [--metrics-log F]
//       [--tensorboard DIR] [--log-every N]
//
// The same model, data, optimizer and schedule as the CPU example - only the device type differs:
// layers are nn::conv2d<float, cuda> etc., each batch is copied to the GPU, and everything else
// (cuDNN convolutions, cuBLASLt GEMMs, our kernels for the rest) follows from the tensor type.
// --precision bf16 runs convolutions and linear layers in bfloat16 with fp32 master weights
// (cuDNN and cuBLASLt take the 16-bit operands directly); fp16 adds dynamic loss scaling.
// Prints loss, test accuracy, samples/s and peak GPU memory per epoch. Snapshots, resume and
// metrics (--log-every) as in the CPU example; a step's loss stays on the GPU (summed there per
// epoch and per --log-every interval, read once each). Exit code 77 without a CUDA device.
//
// Reading order: train<Precision>() is the whole job, top to bottom; main() parses the flags and
// picks which train() to run. The model is fashion_mnist_cnn.cpp's fashion_cnn(), included from
// there (only the model: FASHION_MNIST_CNN_MODEL_ONLY).
#include <cstdio>
#include <exception>

#include <trainkit/cuda.cuh>  // tensors, autograd, nn, optim, data, io, monitor, train + the CUDA backend

#include "common/example.hpp"  // flags, stopwatch, digest, run_monitor, interval_log
#define FASHION_MNIST_CNN_MODEL_ONLY
#include "fashion_mnist_cnn.cpp"  // example::fashion_cnn<Device>(), the CPU example's model

namespace tk = trainkit;
using tk::cuda;
using tk::index_t;

namespace {

/// Batches in page-locked host memory: each batch.x.to<cuda>() is one asynchronous DMA, so the
/// copy of batch k + 1 overlaps the kernels of batch k (the workers fill the buffers ahead).
using gpu_loader = tk::data::data_loader<tk::data::tensor_dataset, tk::data::distributed_sampler, tk::gpu::pinned_memory>;

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
  tk::gpu::settings().allow_tf32 = f.num("tf32", 0, 1) != 0;
  tk::manual_seed(seed);  // init and dropout

  // Data on the host (pixels standardised with the training set's mean and std); the loaders copy
  // each batch into pinned memory, from where it goes to the device as it is used.
  tk::data::mnist_options opts{.mean = tk::data::fashion_mnist_mean, .stddev = tk::data::fashion_mnist_std};
  if (train_limit > 0) opts.limit = train_limit;
  auto train = tk::data::load_mnist(f.str("data"), tk::data::split::train, opts);
  opts.limit = test_limit > 0 ? std::optional<index_t>(test_limit) : std::nullopt;
  auto test = tk::data::load_mnist(f.str("data"), tk::data::split::test, opts);
  std::printf("train %lld  test %lld images of %lldx%lld\n", (long long)train.size(), (long long)test.size(),
              (long long)train.images.size(2), (long long)train.images.size(3));

  // Model: [N,1,28,28] -> conv block (32) -> [N,32,14,14] -> conv block (64) -> [N,64,7,7] -> MLP head,
  // its parameters drawn on the host from the seeded generator (the CPU example's values) and
  // copied to the GPU.
  auto model = example::fashion_cnn<cuda>();
  std::printf("parameters: %lld  device: %d multiprocessors\n", (long long)model->num_parameters(),
              tk::gpu::current_device_info().multiprocessors);

  // Batches: a seeded shuffle per epoch (one process is one replica of the sampler); two workers
  // keep the pinned buffers ahead of the GPU. The test set in order, 1000 images per batch.
  gpu_loader batches(train, tk::data::shuffled_sampler(train.size(), seed), {.batch_size = batch, .num_workers = 2});
  gpu_loader test_batches(test, tk::data::sequential_sampler(test.size()), {.batch_size = 1000, .num_workers = 2});
  const index_t steps = epochs * batches.size();
  tk::optim::sgd opt(model->parameters(), {.lr = lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  tk::optim::warmup_cosine_lr schedule({.base_lr = lr, .warmup_steps = std::min<index_t>(100, steps / 10),
                                        .total_steps = steps, .min_lr = 0.0});
  schedule.apply(opt);
  tk::amp::default_scaler_t<Precision> scaler;  // dynamic loss scaling for fp16, none for fp32/bf16

  std::printf("precision %s  checkpoint %s  tf32 %s\n", std::string(Precision::name).c_str(),
              tk::checkpoint::to_string(recompute).c_str(), tk::gpu::settings().allow_tf32 ? "on" : "off");
  example::run_monitor monitor(
      {.port = port, .jsonl_path = f.str("metrics-log"), .tensorboard_dir = f.str("tensorboard")});
  if (monitor.port()) std::printf("metrics on http://0.0.0.0:%d/metrics\n", monitor.port());
  tk::monitor::progress_line bar;  // redrawn in place on a terminal; silent in logs and pipes
  // Reading the loss waits for the GPU to finish the step: once per --log-every interval (its sum
  // grows on the device), and only when someone watches the figures.
  const bool watched = monitor.port() > 0 || !f.str("metrics-log").empty() || monitor.tensorboard() || bar.live();
  example::interval_log<cuda> interval(monitor, log_every, watched);

  // Snapshots: model and optimizer state come from the device, the loader's place in its epoch
  // and the generator (dropout) from the host.
  tk::io::resumable_run run({.dir = f.str("snapshot-dir"),
                             .resume = resume,
                             .config = example::run_config(f, *model, {{"precision", f.str("precision")}}),
                             .every_steps = snapshot_every});
  run.track("model", *model).track("optimizer", opt).track("schedule", schedule)
      .track("scaler", scaler).track("batches", batches);
  run.resume();  // no-op without --resume or a snapshot; a resumed epoch continues mid-way

  for (auto epoch = batches.epoch(); epoch < static_cast<std::uint64_t>(epochs); ++epoch) {
    if (epoch != batches.epoch()) batches.set_epoch(epoch);
    bar.begin("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs), batches.size(), batches.position());
    example::stopwatch clock;
    interval.start();
    // The epoch's loss is summed on the device: no host sync per step.
    auto loss_sum = tk::tensor<float, cuda>::zeros({});
    index_t seen = 0;
    double waited = batches.wait_seconds();
    for (auto& b : batches) {
      example::stopwatch step_clock;
      const auto x = b.x.to<cuda>();  // from pinned memory: asynchronous
      const auto y = b.y.to<cuda>();
      auto logits = tk::checkpoint::apply_recompute(recompute, *model, tk::var<float, cuda>(x),
                                                    tk::amp::module_forward<Precision>{});
      auto loss = tk::autograd::cross_entropy(logits, y);
      opt.zero_grad();
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      schedule.step(opt);
      tk::add_(loss_sum, loss.value(), double(b.x.size(0)));
      interval.add(loss.value(), b.x.size(0));
      seen += b.x.size(0);
      const double data_wait = batches.wait_seconds() - waited;  // next()'s wait for this batch
      waited = batches.wait_seconds();
      monitor.metrics().observe({.seconds = step_clock.seconds(), .samples = b.x.size(0),  // loss: per interval
                                 .learning_rate = opt.lr(), .loss_scale = scaler.get_scale(),
                                 .data_wait_seconds = data_wait});
      const bool stop = run.step_done();  // counts the step; SIGTERM/SIGINT: snapshot written
      // Every --log-every steps: the interval's figures to the logs, its mean loss to the bar.
      bar.step(b.x.size(0), interval.step_done(run.step(), static_cast<std::int64_t>(epoch) + 1),
               tk::allocator<cuda>::stats().allocated);
      if (stop) {  // exit cleanly
        bar.end();
        std::printf("stopped  parameters digest %016llx\n", (unsigned long long)example::digest(*model));
        return example::exit_restart;  // 75: "run me again" (the snapshot is written)
      }
    }
    bar.end();  // the epoch's summary line takes its place
    if (seen == 0) continue;  // resumed at the very end of an epoch
    const double mean_loss = double(loss_sum.item()) / double(seen);  // waits for the epoch's work
    const double secs = clock.seconds();
    test_batches.set_epoch(0);  // a fresh pass over the test set
    const double acc = tk::train::accuracy(*model, test_batches, tk::amp::module_forward<Precision>{});
    const auto mem = tk::allocator<cuda>::stats();
    std::printf("epoch %lld  loss %.4f  test accuracy %.2f%%  %.0f samples/s  peak %.1f MiB\n",
                (long long)epoch + 1, mean_loss, 100 * acc, double(seen) / secs, double(mem.peak) / double(1 << 20));
    if (auto* tb = monitor.tensorboard()) {  // beside train/loss etc. written every --log-every steps
      tb->add_scalar("eval/test_accuracy", acc, run.step());
      tb->flush();
    }
    std::fflush(stdout);
  }
  run.finish();
  // Bit-exact resume shows here: an interrupted and resumed run prints the same digest.
  std::printf("done  parameters digest %016llx\n", (unsigned long long)example::digest(*model));
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  example::flags f(argc, argv,
                   {{"data", "/usr/share/datasets/fashion-mnist"}, {"epochs", "3"}, {"batch", "128"},
                    {"lr", "0.05"}, {"train-limit", "0"}, {"test-limit", "0"}, {"seed", "1"},
                    {"precision", "fp32"}, {"checkpoint", "none"}, {"tf32", "0"}, {"snapshot-dir", ""},
                    {"resume", "0"}, {"snapshot-every", "200"}, {"metrics-port", "0"}, {"metrics-log", ""},
                    {"tensorboard", ""}, {"log-every", "50"}});
  if (!tk::gpu::available()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  const auto recompute = tk::checkpoint::parse_recompute(f.str("checkpoint"));
  switch (tk::amp::parse_precision(f.str("precision"))) {
    case tk::amp::precision_kind::fp32: return train<tk::amp::fp32>(f, recompute);
    case tk::amp::precision_kind::fp16: return train<tk::amp::mixed_fp16>(f, recompute);
    case tk::amp::precision_kind::bf16: return train<tk::amp::mixed_bf16>(f, recompute);
  }
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist_cnn_cuda: %s\n", e.what());
  return 1;
}
