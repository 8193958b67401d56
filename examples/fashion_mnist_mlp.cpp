// fashion_mnist_mlp - a 784-512-512-10 multilayer perceptron trained on Fashion-MNIST.
//
//   build/examples/fashion_mnist_mlp --data /usr/share/datasets/fashion-mnist --epochs 8
//       [--precision fp32|fp16|bf16] [--checkpoint none|sqrt|every:N]
//       [--snapshot-dir DIR [--resume] [--snapshot-every N]] [--metrics-port P] [--metrics-log F]
//
// The smallest complete job: load the IDX files, build the model from nn layers, train with
// AdamW under a cosine schedule, print loss, test accuracy and samples/s per epoch. Each step is
// one call of train::train_step, which composes the policies chosen on the command line
// (precision, loss scaling, recomputation); fashion_mnist_cnn writes the same loop out by hand.
// Snapshots, resume and metrics as in fashion_mnist_cnn.
#include <cstdio>
#include <exception>

#include <trainkit/train/train.hpp>  // train_step
#include <trainkit/trainkit.hpp>        // tensors, autograd, nn, optim, data, io, monitor

#include "common/example.hpp"  // flags, stopwatch, accuracy

namespace tk = trainkit;
using tk::index_t;

int main(int argc, char** argv) try {
  example::flags f(argc, argv,
                   {{"data", "/usr/share/datasets/fashion-mnist"}, {"epochs", "8"}, {"batch", "128"},
                    {"lr", "0.001"}, {"train-limit", "0"}, {"test-limit", "0"}, {"seed", "1"},
                    {"precision", "fp32"}, {"checkpoint", "none"}, {"snapshot-dir", ""}, {"resume", "0"},
                    {"snapshot-every", "500"}, {"metrics-port", "0"}, {"metrics-log", ""}});
  const auto precision = tk::amp::parse_precision(f.str("precision"));
  const auto recompute = tk::checkpoint::parse_recompute(f.str("checkpoint"));
  tk::set_seed(static_cast<std::uint64_t>(f.num("seed")));  // every stream: init, dropout, data order

  tk::data::mnist_options opts{.mean = tk::data::fashion_mnist_mean, .stddev = tk::data::fashion_mnist_std};
  if (f.num("train-limit") > 0) opts.limit = f.num("train-limit");
  auto train = tk::data::load_mnist(f.str("data"), tk::data::split::train, opts);
  opts.limit = f.num("test-limit") > 0 ? std::optional<index_t>(f.num("test-limit")) : std::nullopt;
  auto test = tk::data::load_mnist(f.str("data"), tk::data::split::test, opts);
  // The MLP sees each image as a flat 784-vector: [N, 1, 28, 28] -> [N, 784] (a view, no copy).
  auto train_x = train.images.view({train.size(), -1}), test_x = test.images.view({test.size(), -1});
  std::printf("train %lld  test %lld samples of %lld features\n", (long long)train.size(), (long long)test.size(),
              (long long)train_x.size(1));

  namespace nn = tk::nn;
  auto model = nn::make_sequential(std::make_shared<nn::linear<>>(784, 512), std::make_shared<nn::relu<>>(),
                                   std::make_shared<nn::dropout<>>(0.2), std::make_shared<nn::linear<>>(512, 512),
                                   std::make_shared<nn::relu<>>(), std::make_shared<nn::dropout<>>(0.2),
                                   std::make_shared<nn::linear<>>(512, 10));
  std::printf("parameters: %lld\n", (long long)model->num_parameters());

  const index_t batch = f.num("batch"), epochs = f.num("epochs");
  tk::data::batch_iterator batches(train_x, train.labels, batch, /*shuffle=*/true,
                                   static_cast<std::uint64_t>(f.num("seed")));
  const index_t steps = epochs * static_cast<index_t>(batches.size());
  tk::optim::adamw opt(model->parameters(), {.lr = f.real("lr"), .weight_decay = 1e-4});
  tk::optim::warmup_cosine_lr schedule({.base_lr = f.real("lr"), .warmup_steps = std::min<index_t>(200, steps / 10),
                                        .total_steps = steps, .min_lr = 0.0});
  schedule.apply(opt);

  example::run_monitor monitor({.port = static_cast<int>(f.num("metrics-port")), .jsonl_path = f.str("metrics-log")});
  if (monitor.port()) std::printf("metrics on http://0.0.0.0:%d/metrics\n", monitor.port());

  // Precision and recomputation are types; the two visits instantiate train_step for the chosen pair.
  const bool stopped = tk::amp::visit_precision(precision, [&]<class P>(P) {
    return std::visit(
        [&]<class R>(R policy) {
          // forward (P's compute type, R's segments) -> loss -> scaled backward -> unscale and
          // inf check -> step -> schedule -> metrics, in one call per batch.
          tk::train::train_step<tk::nn::sequential<float>, decltype(opt), P, tk::amp::default_scaler_t<P>, R> step(
              *model, opt, {.metrics = &monitor.metrics()}, tk::amp::default_scaler_t<P>(), policy);
          step.attach_schedule(schedule);
          tk::io::resumable_run run({.dir = f.str("snapshot-dir"), .resume = f.num("resume") != 0,
                                     .every_steps = f.num("snapshot-every")});
          run.track("model", *model).track("optimizer", opt).track("schedule", schedule)
              .track("scaler", step.scaler()).track("batches", batches);
          run.resume();
          for (auto epoch = batches.epoch(); epoch < static_cast<std::uint64_t>(epochs); ++epoch) {
            if (epoch != batches.epoch()) batches.set_epoch(epoch);
            example::stopwatch clock;
            double loss_sum = 0;
            index_t seen = 0;
            for (auto& b : batches) {
              const auto r = step(b.x, [&](const tk::var<float>& logits) { return tk::autograd::cross_entropy(logits, b.y); });
              loss_sum += r.loss * double(b.x.size(0));
              seen += b.x.size(0);
              if (run.step_done()) return true;  // SIGTERM/SIGINT: snapshot written, exit cleanly
            }
            monitor.log(run.step(), static_cast<std::int64_t>(epoch) + 1);
            if (seen == 0) continue;
            const double secs = clock.seconds();
            const double acc = example::accuracy(*model, test_x, test.labels, tk::amp::module_forward<P>{});
            std::printf("epoch %lld  loss %.4f  test accuracy %.2f%%  %.0f samples/s\n", (long long)epoch + 1,
                        loss_sum / double(seen), 100 * acc, double(seen) / secs);
            std::fflush(stdout);
          }
          run.finish();
          return false;
        },
        recompute);
  });
  std::printf("%s  parameters digest %016llx\n", stopped ? "stopped" : "done",
              (unsigned long long)example::digest(*model));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist_mlp: %s\n", e.what());
  return 1;
}
