// tests/parallel/dp_checks.hpp - the DDP equivalence check shared by the thread_group tests
// (tests/dist/test_data_parallel.cpp) and the mpirun ones (tests/mpi/test_ddp.cpp): a small MLP
// (no BatchNorm, so the equivalence is exact up to round-off) trained one way in one process and
// the other way on N ranks. No Catch2 macro here: thread_group calls these on its rank threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "trainkit/autograd/autograd.hpp"
#include "trainkit/autograd/ops/loss.hpp"
#include "trainkit/ops/ops.hpp"
#include "trainkit/parallel/data_parallel.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/sequential.hpp"
#include "trainkit/optim/sgd.hpp"

namespace trainkit_test::dp {

using trainkit::index_t;
using tensor = trainkit::tensor<float>;
using var = trainkit::autograd::var<float>;
namespace nn = trainkit::nn;
namespace dist = trainkit::dist;
namespace compression = trainkit::compression;
namespace parallel = trainkit::parallel;

inline constexpr index_t in_features = 6, out_features = 3;
inline constexpr double lr = 0.05, momentum = 0.9;

inline std::shared_ptr<nn::sequential<>> make_mlp(std::uint64_t seed, index_t hidden = 8) {
  trainkit::generator gen(seed);
  return nn::make_sequential(std::make_shared<nn::linear<>>(in_features, hidden, true, gen),
                             std::make_shared<nn::relu<>>(), std::make_shared<nn::linear<>>(hidden, hidden, true, gen),
                             std::make_shared<nn::relu<>>(),
                             std::make_shared<nn::linear<>>(hidden, out_features, true, gen));
}

/// The inputs and targets of `rows` samples of step `step` (the same on every rank).
inline std::pair<tensor, tensor> batch(int step, index_t rows) {
  trainkit::generator gen(1000 + static_cast<std::uint64_t>(step));
  auto x = tensor::empty({rows, in_features});
  auto y = tensor::empty({rows, out_features});
  trainkit::fill_normal(gen, x.data(), static_cast<std::size_t>(x.numel()), 0.0f, 1.0f);
  trainkit::fill_normal(gen, y.data(), static_cast<std::size_t>(y.numel()), 0.0f, 1.0f);
  return {x, y};
}

using param_values = std::vector<std::vector<float>>;

inline param_values values(const nn::module<>& m) {
  param_values r;
  for (const auto& p : m.parameters()) r.push_back(p.value().to_vector());
  return r;
}

/// One process, `steps` SGD steps (momentum) on the whole batch (world * micro * b rows), one loss.
inline param_values reference(int world, int steps, int micro, index_t b) {
  auto m = make_mlp(7);
  trainkit::optim::sgd<> opt(m->parameters(), {.lr = lr, .momentum = momentum});
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s, world * micro * b);
    opt.zero_grad();
    trainkit::autograd::mse_loss(m->forward(var(x)), var(y)).backward();
    opt.step();
  }
  return values(*m);
}

/// What a rank saw besides its parameters.
struct shard_result {
  param_values params;
  parallel::data_parallel_stats stats;
  std::size_t buckets = 0;
};

/// This rank's part of the same training: rank r starts from another initialisation (the broadcast
/// must fix that) and trains on its shard - micro-batch k of step s is rows [(k * world + r) * b, +b)
/// of the batch - with micro - 1 backward passes inside no_sync() and the last one synced.
template <class Compression = compression::none, class Comm>
shard_result train_shard(Comm& comm, int steps, int micro, index_t b, parallel::data_parallel_options opts = {}) {
  const int world = comm.size(), r = comm.rank();
  auto m = make_mlp(r == 0 ? 7 : 50 + static_cast<std::uint64_t>(r));
  parallel::data_parallel<Comm, Compression> ddp(comm, *m, opts);
  trainkit::optim::sgd<> opt(m->parameters(), {.lr = lr, .momentum = momentum});
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s, world * micro * b);
    opt.zero_grad();
    for (int k = 0; k < micro; ++k) {
      const index_t lo = (k * world + r) * b;
      var xs(x.slice(0, lo, lo + b).contiguous()), ys(y.slice(0, lo, lo + b).contiguous());
      auto loss = trainkit::autograd::mse_loss(m->forward(xs), ys) * (1.0 / micro);
      if (k + 1 < micro) {
        auto guard = ddp.no_sync();
        loss.backward();
        ddp.finish();  // a no-op inside no_sync
      } else {
        loss.backward();
      }
    }
    ddp.finish();
    opt.step();
  }
  return {values(*m), ddp.stats(), ddp.buckets().buckets.size()};
}

/// "" when a and b agree to fp32 round-off (relative 1e-4, absolute 1e-5), else the first difference.
inline std::string compare(const param_values& a, const param_values& b) {
  if (a.size() != b.size()) return "different numbers of parameters";
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return "parameter " + std::to_string(i) + ": different sizes";
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      const double x = a[i][j], y = b[i][j];
      if (std::fabs(x - y) > 1e-5 + 1e-4 * std::fabs(y)) {
        std::ostringstream os;
        os << "parameter " << i << " element " << j << ": " << x << " vs " << y;
        return os.str();
      }
    }
  }
  return "";
}

}  // namespace trainkit_test::dp
