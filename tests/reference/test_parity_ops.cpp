// Every differentiable op against PyTorch on the inputs of tests/reference/ops.txt: forward
// output and the gradients of sum(out * R) for a fixed random R.
#include <catch2/catch.hpp>

#include <functional>

#include "../support/reference.hpp"

using namespace trainkit;
namespace ag = trainkit::autograd;
using V = ag::var<float>;

namespace {
const test::reference& ref() {
  static test::reference r("ops.txt");
  return r;
}

/// Runs fn on the case's inputs as leaves, compares out and every input gradient.
void check(const std::string& name, std::size_t n_inputs, const std::function<V(std::vector<V>&)>& fn,
           double rtol = 1e-4, double atol = 2e-5) {
  std::vector<V> in;
  for (std::size_t i = 0; i < n_inputs; ++i) in.emplace_back(ref()[name + ".in" + std::to_string(i)].clone(), true);
  V out = fn(in);
  test::require_close(out.value(), ref()[name + ".out"], name + " forward", rtol, atol);
  ag::sum(out * V(ref()[name + ".r"])).backward();
  for (std::size_t i = 0; i < n_inputs; ++i)
    test::require_close(in[i].grad(), ref()[name + ".grad" + std::to_string(i)],
                        name + " grad of input " + std::to_string(i), rtol, atol);
}
}  // namespace

TEST_CASE("pointwise and broadcasting ops match PyTorch", "[parity]") {
  check("add", 2, [](auto& x) { return x[0] + x[1]; });
  check("mul", 2, [](auto& x) { return x[0] * x[1]; });
  check("div", 2, [](auto& x) { return x[0] / x[1]; });
  check("exp", 1, [](auto& x) { return ag::exp(x[0]); });
  check("log", 1, [](auto& x) { return ag::log(x[0]); });
  check("sqrt", 1, [](auto& x) { return ag::sqrt(x[0]); });
  check("pow", 1, [](auto& x) { return ag::pow(x[0], 3.0); });
  check("tanh", 1, [](auto& x) { return ag::tanh(x[0]); });
  check("sigmoid", 1, [](auto& x) { return ag::sigmoid(x[0]); });
  check("relu", 1, [](auto& x) { return ag::relu(x[0]); });
  check("gelu", 1, [](auto& x) { return ag::gelu(x[0]); });
}

TEST_CASE("matmul and reductions match PyTorch", "[parity]") {
  check("matmul", 2, [](auto& x) { return ag::matmul(x[0], x[1]); });
  check("sum", 1, [](auto& x) { return ag::sum(x[0], {1}); });
  check("mean", 1, [](auto& x) { return ag::mean(x[0], {0, 2}, true); });
}

TEST_CASE("nn ops match PyTorch", "[parity]") {
  check("softmax", 1, [](auto& x) { return ag::softmax(x[0], 1); });
  check("log_softmax", 1, [](auto& x) { return ag::log_softmax(x[0], 1); });
  check("linear", 3, [](auto& x) { return ag::linear(x[0], x[1], x[2]); });
  check("conv2d", 3, [](auto& x) {
    return ag::conv2d(x[0], x[1], x[2], {.stride = {2, 2}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 2});
  });
  check("conv2d_dilated", 2, [](auto& x) {
    return ag::conv2d(x[0], x[1], V(), {.stride = {1, 1}, .padding = {2, 2}, .dilation = {2, 2}});
  });
  check("max_pool2d", 1, [](auto& x) { return ag::max_pool2d(x[0], {.kernel = {2, 2}, .stride = {2, 2}}); });
  check("max_pool2d_s1p1", 1,
        [](auto& x) { return ag::max_pool2d(x[0], {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}}); });
  check("avg_pool2d", 1,
        [](auto& x) { return ag::avg_pool2d(x[0], {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}); });
  check("layer_norm", 3, [](auto& x) { return ag::layer_norm(x[0], {6}, x[1], x[2], 1e-5); });
  check("mse_loss", 2, [](auto& x) { return ag::mse_loss(x[0], x[1]); });
  check("embedding", 1, [](auto& x) { return ag::embedding(ref().indices("embedding.indices"), x[0]); });
}

TEST_CASE("batch_norm in training mode matches PyTorch, running statistics included", "[parity]") {
  auto rm = ref()["batch_norm.running_mean_in"].clone(), rv = ref()["batch_norm.running_var_in"].clone();
  check("batch_norm", 3, [&](auto& x) { return ag::batch_norm(x[0], x[1], x[2], rm, rv, true, 0.1, 1e-5); });
  test::require_close(rm, ref()["batch_norm.running_mean_out"], "running_mean");
  test::require_close(rv, ref()["batch_norm.running_var_out"], "running_var");
}

TEST_CASE("cross_entropy with label smoothing and ignore_index matches PyTorch", "[parity]") {
  check("cross_entropy", 1, [](auto& x) {
    return ag::cross_entropy(x[0], ref().indices("cross_entropy.target"), {.label_smoothing = 0.1});
  });
  check("cross_entropy_ignore", 1, [](auto& x) {
    return ag::cross_entropy(x[0], ref().indices("cross_entropy_ignore.target"), {.ignore_index = -100});
  });
}
