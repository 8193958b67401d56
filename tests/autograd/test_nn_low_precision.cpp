// tests/autograd/test_nn_low_precision.cpp - every neural-network op runs in half and bfloat16
// (statistics and sums in float) and agrees with the float computation within the type's precision.
#include <catch2/catch.hpp>

#include <random>

#include "support/gradcheck.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using namespace trainkit::autograd;

namespace {
/// A small CNN + MLP + loss over every op of nn_ops.hpp; returns the loss and the input gradient.
template <class T>
std::pair<double, tensor<float>> run_network(const std::vector<tensor<float>>& p, const tensor<float>& x0) {
  var<T> x(cast<T>(x0), true);
  std::vector<var<T>> v;
  for (auto& t : p) v.emplace_back(cast<T>(t), true);
  auto rm = tensor<T>::zeros({4}), rv = tensor<T>::ones({4});
  auto h = conv2d(x, v[0], v[1], {.padding = {1, 1}});
  h = batch_norm(h, v[2], v[3], rm, rv, true);
  h = relu(max_pool2d(h));
  h = avg_pool2d(h, {.kernel = {2, 2}});
  h = flatten(h, 1);             // [2, 4 * 2 * 2]
  h = linear(h, v[4], v[5]);     // [2, 6]
  h = layer_norm(h, {6}, v[6], v[7]);
  generator g(5);
  h = dropout(h, 0.25, true, g);
  auto e = embedding(tensor<std::int64_t>::from_vector({1, 3}, {2}), v[8]);  // [2, 6]
  h = h + e;
  auto loss = cross_entropy(h, tensor<std::int64_t>::from_vector({2, 5}, {2}), {.label_smoothing = 0.1}) +
              mse_loss(softmax(h, 1), log_softmax(h, 1));
  loss.backward();
  return {double(loss.item()), cast<float>(x.grad())};
}
}  // namespace

TEMPLATE_TEST_CASE("nn ops agree with float in 16-bit types", "[nn][half]", trainkit::half, trainkit::bfloat16) {
  std::mt19937 rng(61);
  std::vector<tensor<float>> p = {
      tk_test::random_tensor<float>({4, 2, 3, 3}, rng, -0.5, 0.5), tk_test::random_tensor<float>({4}, rng),
      tk_test::random_tensor<float>({4}, rng, 0.5, 1.5),           tk_test::random_tensor<float>({4}, rng),
      tk_test::random_tensor<float>({6, 16}, rng, -0.5, 0.5),      tk_test::random_tensor<float>({6}, rng),
      tk_test::random_tensor<float>({6}, rng, 0.5, 1.5),           tk_test::random_tensor<float>({6}, rng),
      tk_test::random_tensor<float>({4, 6}, rng),
  };
  const auto x = tk_test::random_tensor<float>({2, 2, 8, 8}, rng);
  const auto ref = run_network<float>(p, x);
  const auto low = run_network<TestType>(p, x);
  const double tol = std::is_same_v<TestType, trainkit::half> ? 2e-2 : 1e-1;
  REQUIRE(low.first == Approx(ref.first).margin(tol));
  TK_REQUIRE_CLOSE(low.second, ref.second, tol * (1 + double(amax(abs(ref.second)).item())));
}
