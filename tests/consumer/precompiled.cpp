// tests/consumer/precompiled.cpp - a user file compiled with trainkit::precompiled: it only declares
// the float/CPU ops (TRAINKIT_PRECOMPILED), so this links only if the package's
// trainkit::precompiled target built their definitions. One training step of a tiny model.
#include <trainkit/trainkit.hpp>

#include <cstdio>

#if !defined(TRAINKIT_PRECOMPILED)
#error "linking trainkit::precompiled must define TRAINKIT_PRECOMPILED for C++ files"
#endif

int main() {
  namespace tk = trainkit;
  tk::set_seed(1);
  auto model = tk::nn::make_sequential(std::make_shared<tk::nn::linear<>>(4, 8), std::make_shared<tk::nn::relu<>>(),
                                       std::make_shared<tk::nn::linear<>>(8, 3));
  tk::optim::sgd opt(model->parameters(), {.lr = 0.1});
  auto x = tk::tensor<float>::ones({2, 4});
  auto y = tk::tensor<std::int64_t>::zeros({2});
  auto loss = tk::autograd::cross_entropy((*model)(tk::var<float>(x)), y);
  opt.zero_grad();
  loss.backward();
  opt.step();
  const float l = loss.value().item();
  std::printf("precompiled: loss %.4f\n", static_cast<double>(l));
  return l > 0.0f ? 0 : 1;
}
