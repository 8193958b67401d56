// test_package.cpp - a tiny model trained for real with the packaged headers: a 2-16-2 MLP
// (nn::sequential of linear + relu) learns XOR-of-signs with AdamW for a few dozen full-batch steps.
// Exits 1 unless the loss drops to below half its initial value.
#include <trainkit/trainkit.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

namespace tk = trainkit;
namespace nn = trainkit::nn;

int main() {
  std::printf("trainkit %d.%d.%d\n", TRAINKIT_VERSION_MAJOR, TRAINKIT_VERSION_MINOR, TRAINKIT_VERSION_PATCH);

  // 256 points in [-1, 1]^2, class = sign(x0) xor sign(x1).
  tk::generator data_gen(1);
  const std::size_t n = 256;
  std::vector<float> xs;
  std::vector<std::int64_t> ys;
  float u[2];
  while (ys.size() < n) {
    tk::fill_uniform(data_gen, u, 2, -1.0f, 1.0f);
    if (std::abs(u[0]) < 0.1f || std::abs(u[1]) < 0.1f) continue;
    xs.push_back(u[0]);
    xs.push_back(u[1]);
    ys.push_back((u[0] > 0) != (u[1] > 0) ? 1 : 0);
  }
  const auto x = tk::tensor<float>::from_vector(xs, {static_cast<tk::index_t>(n), 2});
  const auto y = tk::tensor<std::int64_t>::from_vector(ys);

  tk::generator init_gen(2);
  auto model = nn::make_sequential(std::make_shared<nn::linear<float>>(2, 16, true, init_gen),
                                   std::make_shared<nn::relu<float>>(),
                                   std::make_shared<nn::linear<float>>(16, 2, true, init_gen));
  tk::optim::adamw<float> opt(model->parameters(), {.lr = 0.05});

  double first = 0, last = 0;
  const int steps = 60;
  for (int step = 0; step < steps; ++step) {
    auto loss = tk::autograd::cross_entropy(model->forward(tk::var<float>(x)), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item();
    if (step == 0) first = last;
    if (step % 10 == 0 || step == steps - 1) std::printf("step %2d  loss %.4f\n", step, last);
  }
  const bool ok = std::isfinite(last) && last < 0.5 * first;
  std::printf("loss %.4f -> %.4f: %s\n", first, last, ok ? "decreased" : "DID NOT DECREASE");
  return ok ? 0 : 1;
}
