// tests/cuda/test_step_sync.cu - host synchronisations of a CUDA training step (gpu::host_syncs()):
// none while the caller does not read the loss (without scaling), one when it does; the found-inf
// decision of a loss scaler is its one read; a bad class index raised at the read of the loss;
// the multi-tensor unscaling and clipping against the host.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "cuda/support.cuh"

namespace tk = trainkit;
namespace ag = trainkit::autograd;
namespace nn = trainkit::nn;
using tk::cpu;
using tk::cuda;
using tk::index_t;
using cuda_test::random;

namespace {
using net_t = nn::sequential<float, cuda>;

std::shared_ptr<net_t> make_mlp() {
  tk::manual_seed(3);
  return nn::make_sequential(std::make_shared<nn::linear<float, cuda>>(12, 32),
                             std::make_shared<nn::relu<float, cuda>>(),
                             std::make_shared<nn::linear<float, cuda>>(32, 4));
}

struct batch {
  tk::tensor<float, cuda> x;
  tk::tensor<std::int64_t, cuda> y;
};

batch make_batch(std::mt19937& rng) {
  return {random<float>({16, 12}, rng).to<cuda>(), cuda_test::random_indices({16}, 4, rng).to<cuda>()};
}

/// Spins until *flag (mapped pinned memory, written by the host) is nonzero.
__global__ void gate_kernel(volatile int* flag) {
  while (*flag == 0) __nanosleep(1000);
}

/// Host synchronisations of one call of step on b.
template <class Step>
std::int64_t syncs_of(Step& step, const batch& b, tk::train::step_result* out = nullptr) {
  const std::int64_t before = tk::gpu::host_syncs();
  auto r = step(b.x, [&](const tk::var<float, cuda>& o) { return ag::cross_entropy(o, b.y); });
  const std::int64_t n = tk::gpu::host_syncs() - before;
  if (out != nullptr) *out = r;
  return n;
}
}  // namespace

TEST_CASE("a CUDA train_step waits for the device only where the caller reads", "[cuda][train][sync]") {
  std::mt19937 rng(1);
  const batch b = make_batch(rng);
  auto net = make_mlp();
  tk::optim::sgd<float, cuda> opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  tk::train::train_step_options o;
  o.max_grad_norm = 1.0;

  SECTION("no scaling: 0 per step without reading the loss, 1 when it is read") {
    o.read_loss = false;
    tk::train::train_step<net_t, tk::optim::sgd<float, cuda>, tk::amp::fp32, tk::amp::no_scaling> quiet(*net, opt, o);
    (void)syncs_of(quiet, b);  // warm-up: handles, workspaces, the allocator's first blocks
    for (int i = 0; i < 3; ++i) {
      tk::train::step_result r;
      REQUIRE(syncs_of(quiet, b, &r) == 0);
      REQUIRE(std::isnan(r.loss));
      REQUIRE(quiet.last_grad_norm().defined());
    }
    const std::int64_t before = tk::gpu::host_syncs();
    const double loss = quiet.last_loss().item();  // the caller's read
    REQUIRE(tk::gpu::host_syncs() - before == 1);
    REQUIRE(std::isfinite(loss));

    o.read_loss = true;
    tk::train::train_step<net_t, tk::optim::sgd<float, cuda>, tk::amp::fp32, tk::amp::no_scaling> loud(*net, opt, o);
    for (int i = 0; i < 3; ++i) {
      tk::train::step_result r;
      REQUIRE(syncs_of(loud, b, &r) == 1);  // loss and gradient norm in one copy
      REQUIRE(std::isfinite(r.loss));
      REQUIRE(std::isfinite(r.grad_norm));
      REQUIRE(r.loss == Approx(double(loud.last_loss().item())));
    }
  }

  SECTION("dynamic scaling: its found-inf decision is the step's one read; the loss adds one") {
    // The optimizer step is skipped or taken on the host, so dynamic scaling reads its one flag
    // (one multi-tensor pass over all gradients) every step.
    o.read_loss = false;
    tk::train::train_step<net_t, tk::optim::sgd<float, cuda>, tk::amp::fp32, tk::amp::dynamic_scaling> quiet(
        *net, opt, o);
    (void)syncs_of(quiet, b);
    for (int i = 0; i < 3; ++i) {
      tk::train::step_result r;
      REQUIRE(syncs_of(quiet, b, &r) == 1);
      REQUIRE_FALSE(r.found_inf);
      REQUIRE(r.stepped);
    }
    o.read_loss = true;
    tk::train::train_step<net_t, tk::optim::sgd<float, cuda>, tk::amp::fp32, tk::amp::dynamic_scaling> loud(
        *net, opt, o);
    for (int i = 0; i < 3; ++i) REQUIRE(syncs_of(loud, b) == 2);
  }
}

TEST_CASE("a bad class index on CUDA is raised at the read of the loss", "[cuda][train][sync]") {
  std::mt19937 rng(2);
  batch b = make_batch(rng);
  auto y = b.y.to<cpu>();
  y.at({2}) = 7;
  b.y = y.to<cuda>();
  auto net = make_mlp();
  tk::optim::sgd<float, cuda> opt(net->parameters(), {.lr = 0.05});
  tk::train::train_step_options o;
  o.read_loss = false;
  tk::train::train_step<net_t, tk::optim::sgd<float, cuda>, tk::amp::fp32, tk::amp::no_scaling> step(*net, opt, o);
  REQUIRE_NOTHROW(syncs_of(step, b));  // nothing waits for the device, so nothing is reported yet
  REQUIRE_THROWS_WITH(step.last_loss().item(), Catch::Contains("cross_entropy") && Catch::Contains("target 7") &&
                                                   Catch::Contains("at position [2]") &&
                                                   Catch::Contains("out of range for 4 classes") &&
                                                   Catch::Contains("logits of sizes [16, 4]"));
  REQUIRE_NOTHROW(step.last_loss().item());  // reported once
  // With read_loss the step itself raises it.
  o.read_loss = true;
  tk::train::train_step<net_t, tk::optim::sgd<float, cuda>, tk::amp::fp32, tk::amp::no_scaling> reading(*net, opt,
                                                                                                     o);
  REQUIRE_THROWS_AS(syncs_of(reading, b), tk::value_error);
  // nll_loss and ignore_index: an ignored target is not an error.
  auto ig = y.clone();
  ig.at({2}) = -100;
  const tk::var<float, cuda> logits(random<float>({16, 4}, rng).to<cuda>());
  REQUIRE_NOTHROW(ag::nll_loss(ag::log_softmax(logits, 1), ig.to<cuda>()).item());
  REQUIRE_THROWS_AS(ag::nll_loss(ag::log_softmax(logits, 1), y.to<cuda>()).item(), tk::value_error);
}

TEST_CASE("multi-tensor unscaling and clipping match the host", "[cuda][amp][optim]") {
  std::mt19937 rng(3);
  std::vector<tk::var<float>> ph;
  std::vector<tk::var<float, cuda>> pd;
  for (index_t n : {index_t(5), index_t(0), index_t(1000), index_t(70000), index_t(3)}) {
    const auto v = random<float>({n}, rng), g = random<float>({n}, rng, -100.0, 100.0);
    tk::var<float> h(v.clone(), true);
    tk::var<float, cuda> d(v.to<cuda>(), true);
    h.set_grad(g.clone());
    d.set_grad(g.to<cuda>());
    ph.push_back(h);
    pd.push_back(d);
  }
  tk::amp::static_scaling sh(64.0), sd(64.0);
  REQUIRE_FALSE(sh.unscale(ph));
  REQUIRE_FALSE(sd.unscale(pd));
  for (std::size_t i = 0; i < ph.size(); ++i) REQUIRE(cuda_test::identical(pd[i].grad(), ph[i].grad()));
  const double nh = tk::optim::clip_grad_norm_(ph, 1.0);
  const auto nd = tk::optim::clip_grad_norm_tensor_(pd, 1.0);
  REQUIRE(double(nd.item()) == Approx(nh).epsilon(1e-5));
  for (std::size_t i = 0; i < ph.size(); ++i) CUDA_TEST_REQUIRE_CLOSE(pd[i].grad(), ph[i].grad(), 1e-5, 1e-7);
  // An inf in one gradient: found on the device, with one read.
  auto g = pd[2].grad().to<cpu>();
  g.at({17}) = std::numeric_limits<float>::infinity();
  pd[2].set_grad(g.to<cuda>());
  tk::amp::static_scaling s2(2.0);
  const std::int64_t before = tk::gpu::host_syncs();
  REQUIRE(s2.unscale(pd));
  REQUIRE(tk::gpu::host_syncs() - before == 1);
}

TEST_CASE("a CUDA train_step returns while the device is still busy (no host wait, as a fact)",
          "[cuda][train][sync]") {
  // A gate kernel holds the stream until the host opens it. A step that waits for the device in any
  // way - a synchronisation of trainkit's own, but also cudaFreeHost, cudaFree, a pageable copy,
  // which no counter sees - cannot return before the gate opens; a watchdog opens it after 20 s so
  // that such a step fails the test instead of hanging it.
  std::mt19937 rng(2);
  const batch b = make_batch(rng);
  auto net = make_mlp();
  tk::optim::sgd<float, cuda> opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  tk::train::train_step_options o;
  o.read_loss = false;
  o.max_grad_norm = 1.0;
  tk::train::train_step<net_t, tk::optim::sgd<float, cuda>, tk::amp::fp32, tk::amp::no_scaling> step(*net, opt, o);
  for (int i = 0; i < 2; ++i) (void)syncs_of(step, b);  // warm-up: handles, workspaces, cached blocks
  tk::gpu::synchronize();

  int* flag = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped) == cudaSuccess);
  *flag = 0;
  int* dflag = nullptr;
  REQUIRE(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dflag), flag, 0) == cudaSuccess);
  gate_kernel<<<1, 1, 0, tk::gpu::current_stream()>>>(dflag);
  REQUIRE(cudaGetLastError() == cudaSuccess);

  std::atomic<bool> finished{false}, opened_by_watchdog{false};
  std::thread watchdog([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!finished.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!finished.load()) {
      opened_by_watchdog = true;
      reinterpret_cast<volatile int*>(flag)[0] = 1;
    }
  });
  for (int i = 0; i < 3; ++i) (void)syncs_of(step, b);
  const bool returned_while_gated = !opened_by_watchdog.load();
  const bool gate_still_closed = cudaStreamQuery(tk::gpu::current_stream()) == cudaErrorNotReady;
  finished = true;
  reinterpret_cast<volatile int*>(flag)[0] = 1;
  watchdog.join();
  tk::gpu::synchronize();
  REQUIRE(cudaFreeHost(flag) == cudaSuccess);
  CHECK(returned_while_gated);
  CHECK(gate_still_closed);
  CHECK(std::isfinite(double(step.last_loss().item())));
}
