// A few training steps of an MLP and of a CNN (conv, batch norm, pools) against PyTorch: same
// initial parameters and batches (tests/reference/{mlp,cnn}.txt), then per-step losses and the
// final parameters and buffers after SGD (momentum / nesterov, weight decay), Adam and AdamW.
#include <catch2/catch.hpp>

#include <functional>

#include "../support/reference.hpp"

using namespace trainkit;
namespace nn = trainkit::nn;
using index_t = trainkit::index_t;

namespace {
using model_ptr = std::shared_ptr<nn::sequential<float>>;

/// Loads init.* into the model, trains `steps` steps with make_opt, compares with tag.*.
template <class MakeOpt>
void check_training(const test::reference& ref, const model_ptr& model, const std::string& tag, MakeOpt make_opt,
                    int steps = 3) {
  nn::state_dict<float, cpu> init;
  for (auto& [name, t] : model->state_dict()) init.emplace_back(name, ref["init." + name].clone());
  model->load_state_dict(init);
  model->train();
  auto opt = make_opt(model->parameters());
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    auto x = ref["batch" + std::to_string(s) + ".x"];
    auto y = ref.indices("batch" + std::to_string(s) + ".y");
    opt.zero_grad();
    auto loss = autograd::cross_entropy((*model)(var<float>(x)), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item());
  }
  test::require_close(tensor<float>::from_vector(losses), ref[tag + ".losses"], tag + " losses", 1e-4, 1e-5);
  for (auto& [name, t] : model->state_dict())
    test::require_close(t, ref[tag + ".final." + name], tag + " final " + name, 2e-4, 2e-5);
}

model_ptr make_mlp() {
  return nn::make_sequential(std::make_shared<nn::linear<>>(20, 16), std::make_shared<nn::relu<>>(),
                             std::make_shared<nn::linear<>>(16, 16), std::make_shared<nn::gelu<>>(),
                             std::make_shared<nn::linear<>>(16, 10));
}

model_ptr make_cnn() {
  using k = std::array<index_t, 2>;
  return nn::make_sequential(
      // No bias before batch norm (it would be cancelled by the mean; its gradient is pure
      // round-off, which Adam would amplify into noise that no two frameworks share).
      std::make_shared<nn::conv2d<>>(1, 4, k{3, 3}, nn::conv2d_options{.padding = {1, 1}, .bias = false}),
      std::make_shared<nn::batch_norm2d<>>(4), std::make_shared<nn::relu<>>(),
      std::make_shared<nn::max_pool2d<>>(nn::pool2d_options{.kernel = {2, 2}}),
      std::make_shared<nn::conv2d<>>(4, 8, k{3, 3}, nn::conv2d_options{.padding = {1, 1}}),
      std::make_shared<nn::relu<>>(), std::make_shared<nn::max_pool2d<>>(nn::pool2d_options{.kernel = {2, 2}}),
      std::make_shared<nn::flatten<>>(), std::make_shared<nn::linear<>>(8 * 3 * 3, 10));
}
}  // namespace

TEST_CASE("MLP training steps match PyTorch", "[parity][training]") {
  test::reference ref("mlp.txt");
  auto model = make_mlp();
  SECTION("SGD with momentum and weight decay") {
    check_training(ref, model, "sgd", [](auto p) {
      return optim::sgd(std::move(p), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    });
  }
  SECTION("AdamW") {
    check_training(ref, model, "adamw",
                   [](auto p) { return optim::adamw(std::move(p), {.lr = 1e-2, .weight_decay = 0.01}); });
  }
}

TEST_CASE("CNN training steps match PyTorch, batch-norm buffers included", "[parity][training]") {
  test::reference ref("cnn.txt");
  auto model = make_cnn();
  SECTION("SGD nesterov") {
    check_training(ref, model, "sgd", [](auto p) {
      return optim::sgd(std::move(p), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
    });
  }
  SECTION("Adam") {
    check_training(ref, model, "adam", [](auto p) { return optim::adam(std::move(p), {.lr = 1e-3}); });
  }
}
