// examples/common/fashion_cnn.hpp - the Fashion-MNIST CNN that the examples (CPU, CUDA, DDP) and
// the benchmarks that time them share, on either device.
#pragma once

#include <array>
#include <memory>

#include <trainkit/nn/nn.hpp>  // sequential and the layers

namespace example {

/// [N,1,28,28] -> conv block (32) -> [N,32,14,14] -> conv block (64) -> [N,64,7,7] -> flatten ->
/// 3136 -> 128 -> ReLU -> dropout -> 10, where a conv block is conv 3x3 (padding 1) - batch norm -
/// ReLU - max pool 2x2. Parameters are drawn from the default generator (PyTorch's initialisations).
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
