// fashion_mnist_resnet - a small residual network of the ResNet-9 family (the model DAWNBench and
// airbench train on CIFAR-10), written as a user module - no nn::sequential at the top, no
// precision or checkpointing code in it - and trained through train::train_step on the CPU.
//
//   build/examples/fashion_mnist_resnet --data /usr/share/datasets/fashion-mnist --epochs 3
//       [--precision fp32|fp16|bf16] [--checkpoint none|sqrt|every:N] [--width 16]
//       [--snapshot-dir DIR [--resume 0|1|auto] [--snapshot-every N]] [--metrics-port P] [--metrics-log F]
//       [--tensorboard DIR] [--log-every N]
//
// --data: the Fashion-MNIST IDX files by default; a directory with CIFAR-10's binary batches
// (data_batch_1..5.bin, test_batch.bin, or cifar-10-batches-bin/ below it) trains on CIFAR-10.
// The network (examples/common/resnet.hpp): prep (conv-BN-ReLU, width w) -> layer1 (conv-BN-ReLU
// 2w, max pool, residual block) -> layer2 (conv-BN-ReLU 4w, max pool) -> layer3 (conv-BN-ReLU 8w,
// max pool, residual block) -> global average pool -> linear -> x 0.125. --precision runs every convolution and GEMM in
// half/bfloat16 through the precision scope (amp::autocast: the module does not know);
// --checkpoint recomputes the model's named segments (segments(): prep, layer1, layer2, layer3,
// head) in backward. Flags, snapshots, metrics (--log-every: the mean loss and samples/s of every
// N steps in the logs and on the progress line) and printed figures as in the other examples.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <trainkit/trainkit.hpp>  // tensors, autograd, nn, optim, data, io, monitor, train

#include "common/example.hpp"  // flags, stopwatch, digest, run_monitor, interval_log
#include "common/resnet.hpp"   // the model

// OMP_WAIT_POLICY=passive and cores / local ranks threads unless the environment says otherwise:
// well-behaved on shared cores and under mpirun (trainkit/core/threads.hpp).
TRAINKIT_THREAD_DEFAULTS();

namespace tk = trainkit;
namespace nn = trainkit::nn;
using tk::index_t;
using fvar = tk::var<float>;

namespace {

/// The data set --data names: CIFAR-10 binary batches where they are, else Fashion-MNIST.
struct data_sets {
  tk::data::basic_dataset<float> train, test;
  std::string name;
};
data_sets load(const std::string& dir, index_t train_limit, index_t test_limit) {
  namespace fs = std::filesystem;
  const bool cifar = fs::exists(fs::path(dir) / "data_batch_1.bin") ||
                     fs::exists(fs::path(dir) / "cifar-10-batches-bin" / "data_batch_1.bin");
  data_sets d;
  if (cifar) {
    tk::data::cifar10_options o;
    if (train_limit > 0) o.limit = train_limit;
    d.train = tk::data::load_cifar10(dir, tk::data::split::train, o);
    o.limit = test_limit > 0 ? std::optional<index_t>(test_limit) : std::nullopt;
    d.test = tk::data::load_cifar10(dir, tk::data::split::test, o);
    // Per-channel standardisation with the training set's statistics (in place, once).
    for (auto* set : {&d.train, &d.test}) {
      float* p = set->images.data();
      const index_t n = set->images.size(0), hw = set->images.size(2) * set->images.size(3);
      for (index_t i = 0; i < n; ++i)
        for (index_t c = 0; c < 3; ++c)
          for (index_t k = 0; k < hw; ++k, ++p) *p = (*p - tk::data::cifar10_mean[c]) / tk::data::cifar10_std[c];
    }
    d.name = "CIFAR-10";
  } else {
    tk::data::mnist_options o{.mean = tk::data::fashion_mnist_mean, .stddev = tk::data::fashion_mnist_std};
    if (train_limit > 0) o.limit = train_limit;
    d.train = tk::data::load_mnist(dir, tk::data::split::train, o);
    o.limit = test_limit > 0 ? std::optional<index_t>(test_limit) : std::nullopt;
    d.test = tk::data::load_mnist(dir, tk::data::split::test, o);
    d.name = "Fashion-MNIST";
  }
  return d;
}

/// The whole job for one precision policy (a type) and the recompute policy of --checkpoint (chosen
/// at run time: one train_step type for none, sqrt and every:N).
template <class Precision>
int train(const example::flags& f, const tk::checkpoint::recompute_choice& recompute) {
  const auto seed = static_cast<std::uint64_t>(f.num("seed", 0));
  const index_t epochs = f.num("epochs", 1), batch = f.num("batch", 1), width = f.num("width", 1, 512);
  const index_t train_limit = f.num("train-limit", 0), test_limit = f.num("test-limit", 0);  // 0: all
  const double lr = f.real("lr", 0);
  const auto resume = example::resume_flag(f);  // 0, 1 or auto
  const index_t snapshot_every = f.num("snapshot-every", 0);
  const int port = static_cast<int>(f.num("metrics-port", 0, 65535));
  const long log_every = f.num("log-every", 1);
  tk::set_seed(seed);

  auto data = load(f.str("data"), train_limit, test_limit);
  std::printf("%s: train %lld  test %lld images of %lldx%lldx%lld\n", data.name.c_str(), (long long)data.train.size(),
              (long long)data.test.size(), (long long)data.train.images.size(1), (long long)data.train.images.size(2),
              (long long)data.train.images.size(3));

  auto model = std::make_shared<example::resnet>(data.train.images.size(1), width, 10);
  std::printf("parameters: %lld\n", (long long)model->num_parameters());
  std::printf("%s\n", example::threads_line().c_str());

  tk::data::data_loader batches(tk::data::tensor_dataset(data.train.images, data.train.labels),
                                tk::data::shuffled_sampler(data.train.size(), seed),
                                {.batch_size = batch, .num_workers = 1});
  const index_t steps = epochs * batches.size();
  tk::optim::sgd opt(model->parameters(), {.lr = lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  tk::optim::warmup_cosine_lr schedule({.base_lr = lr, .warmup_steps = std::min<index_t>(100, steps / 10),
                                        .total_steps = steps, .min_lr = 0.0});
  schedule.apply(opt);

  std::printf("precision %s  checkpoint %s\n", std::string(Precision::name).c_str(),
              tk::checkpoint::to_string(recompute).c_str());
  example::run_monitor monitor(
      {.port = port, .jsonl_path = f.str("metrics-log"), .tensorboard_dir = f.str("tensorboard")});
  if (monitor.port()) std::printf("metrics on http://0.0.0.0:%d/metrics\n", monitor.port());
  tk::monitor::progress_line bar;
  example::interval_log<> interval(monitor, log_every);  // every N steps: their mean loss and samples/s

  // The step: forward under the precision scope and the recompute policy (over the model's
  // segments), loss, scaled backward, unscale + inf check, SGD step, schedule, metrics.
  using scaler_t = tk::amp::default_scaler_t<Precision>;
  tk::train::train_step<example::resnet, decltype(opt), Precision, scaler_t, tk::checkpoint::recompute_choice>
      step(*model, opt, {.metrics = &monitor.metrics()}, scaler_t(), recompute);
  step.attach_schedule(schedule);

  // The settings that change the trajectory go into every snapshot; a resume that differs is an
  // error (--resume 1) or a warning naming each difference (--resume auto).
  tk::io::resumable_run run({.dir = f.str("snapshot-dir"),
                             .resume = resume,
                             .config = example::run_config(f, *model, {{"precision", f.str("precision")}}),
                             .every_steps = snapshot_every});
  run.track("model", *model).track("optimizer", opt).track("schedule", schedule)
      .track("scaler", step.scaler()).track("batches", batches);
  run.resume();

  for (auto epoch = batches.epoch(); epoch < static_cast<std::uint64_t>(epochs); ++epoch) {
    if (epoch != batches.epoch()) batches.set_epoch(epoch);
    bar.begin("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs), batches.size(), batches.position());
    example::stopwatch clock;
    interval.start();
    const double waited = batches.wait_seconds();
    double loss_sum = 0;
    index_t seen = 0;
    for (auto& b : batches) {
      const auto r = step(b.x, [&](const fvar& logits) { return tk::autograd::cross_entropy(logits, b.y); });
      loss_sum += r.loss * double(b.x.size(0));
      seen += b.x.size(0);
      interval.add(r.loss, b.x.size(0));
      const bool stop = run.step_done();
      bar.step(b.x.size(0), interval.step_done(run.step(), static_cast<std::int64_t>(epoch) + 1));
      if (stop) {
        bar.end();
        std::printf("stopped  parameters digest %016llx\n", (unsigned long long)example::digest(*model));
        return example::exit_restart;  // 75: "run me again" (the snapshot is written)
      }
    }
    bar.end();
    monitor.metrics().add_data_wait(batches.wait_seconds() - waited);
    if (seen == 0) continue;
    const double secs = clock.seconds();
    const double acc =
        tk::train::accuracy(*model, data.test.images, data.test.labels, tk::amp::module_forward<Precision>{});
    std::printf("epoch %lld  loss %.4f  test accuracy %.2f%%  %.0f samples/s\n", (long long)epoch + 1,
                loss_sum / double(seen), 100 * acc, double(seen) / secs);
    if (auto* tb = monitor.tensorboard()) {
      tb->add_scalar("eval/test_accuracy", acc, run.step());
      tb->flush();
    }
    std::fflush(stdout);
  }
  run.finish();
  if (const std::string w = example::wait_line(); !w.empty()) std::printf("%s\n", w.c_str());
  std::printf("done  parameters digest %016llx\n", (unsigned long long)example::digest(*model));
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  example::flags f(argc, argv,
                   {{"data", "/usr/share/datasets/fashion-mnist"}, {"epochs", "3"}, {"batch", "128"},
                    {"lr", "0.05"}, {"train-limit", "0"}, {"test-limit", "0"}, {"seed", "1"}, {"width", "16"},
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
  std::fprintf(stderr, "fashion_mnist_resnet: %s\n", e.what());
  return 1;
}
