// tests/parallel/dp_generic.hpp - the device-generic DDP check, compiled for the cpu
// (tests/parallel/test_data_parallel.cpp) and for cuda (tests/cuda/test_ddp.cu): a small MLP on
// Device trained on this rank's shard through data_parallel, alternating zero_grad(set_to_none)
// and zero_grad(false), checking after every finish() that each gradient is the view of its
// bucket (the right offset of bucket_buffer) and that with zero_grad(false) the view survives the
// next step (backward accumulated straight into the bucket). No Catch2 macro: it runs on rank
// threads; the first failure comes back as a string.
#pragma once

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "trainkit/autograd/autograd.hpp"
#include "trainkit/autograd/ops/loss.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/sequential.hpp"
#include "trainkit/optim/sgd.hpp"
#include "trainkit/parallel/data_parallel.hpp"

#include "parallel/dp_checks.hpp"

namespace trainkit_test::dp {

template <class Device>
std::shared_ptr<nn::sequential<float, Device>> make_mlp_on(std::uint64_t seed, index_t hidden = 8) {
  trainkit::generator gen(seed);
  return nn::make_sequential(std::make_shared<nn::linear<float, Device>>(in_features, hidden, true, gen),
                             std::make_shared<nn::relu<float, Device>>(),
                             std::make_shared<nn::linear<float, Device>>(hidden, out_features, true, gen));
}

/// What generic_shard saw: the parameters (host copies) and the first problem ("" = none).
struct generic_result {
  param_values params;
  std::string problem;
  parallel::data_parallel_stats stats;
};

/// `steps` SGD steps of rank comm.rank() on rows [r * b, + b) of each step's batch (world * b rows).
template <class Device, class Compression = compression::none, class Comm>
generic_result generic_shard(Comm& comm, int steps, index_t b, parallel::data_parallel_options opts = {}) {
  using dvar = trainkit::autograd::var<float, Device>;
  const int world = comm.size(), r = comm.rank();
  auto m = make_mlp_on<Device>(r == 0 ? 7 : 50 + static_cast<std::uint64_t>(r));
  parallel::data_parallel<Comm, Compression, float, Device> ddp(comm, *m, opts);
  trainkit::optim::sgd<float, Device> opt(m->parameters(), {.lr = lr, .momentum = momentum});
  const auto params = m->parameters();
  const auto& plan = ddp.buckets();
  generic_result out;
  auto note = [&](int s, const std::string& what) {
    if (out.problem.empty()) {
      std::ostringstream os;
      os << "rank " << r << ", step " << s << ": " << what;
      out.problem = os.str();
    }
  };
  std::vector<const float*> before(params.size(), nullptr);
  for (int s = 0; s < steps; ++s) {
    const bool keep = s % 2 == 1;  // odd steps: zero_grad(false), the views stay
    opt.zero_grad(!keep);
    auto [x, y] = batch(s, world * b);
    dvar xs(x.slice(0, r * b, (r + 1) * b).contiguous().template to<Device>());
    dvar ys(y.slice(0, r * b, (r + 1) * b).contiguous().template to<Device>());
    trainkit::autograd::mse_loss(m->forward(xs), ys).backward();
    ddp.finish();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& g = params[i].grad();
      const auto& bucket = ddp.bucket_buffer(plan.bucket_of[i]);
      const float* want = bucket.data() + plan.buckets[plan.bucket_of[i]].offsets[plan.slot_of[i]];
      if (!g.defined() || g.data() != want) note(s, "gradient " + std::to_string(i) + " is not its bucket view");
      if (keep && before[i] != nullptr && g.data() != before[i])
        note(s, "gradient " + std::to_string(i) + " moved although zero_grad(false) kept it");
      before[i] = g.data();
    }
    opt.step();
  }
  for (const auto& p : m->parameters()) out.params.push_back(p.value().template to<trainkit::cpu>().to_vector());
  out.stats = ddp.stats();
  return out;
}

/// One process on the whole batch of every step (the reference of generic_shard).
inline param_values generic_reference(int world, int steps, index_t b) {
  auto m = make_mlp_on<trainkit::cpu>(7);
  trainkit::optim::sgd<> opt(m->parameters(), {.lr = lr, .momentum = momentum});
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s, world * b);
    opt.zero_grad(s % 2 == 0);
    trainkit::autograd::mse_loss(m->forward(var(x)), var(y)).backward();
    opt.step();
  }
  return values(*m);
}

}  // namespace trainkit_test::dp
