// tests/cuda/test_nn_ops.cu - the neural-network ops on the GPU against the host backend on the
// same inputs, forward and backward: conv2d (cuDNN, every algorithm-selection mode), im2col,
// pooling, batch norm (cuDNN and our kernels, more than 65535 channels, empty batches), layer
// norm, softmax and the losses, dropout (the same Philox mask bit for bit), embedding; then the
// fused optimizers, the loss scaler, the compression codecs, the amp ops and a small CNN end to end.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "cuda/support.cuh"

namespace tk = trainkit;
namespace ag = trainkit::autograd;
namespace nn = trainkit::nn;
using tk::cpu;
using tk::cuda;
using tk::index_t;
using tk::shape;
using cuda_test::check_op;
using cuda_test::random;

namespace {
struct conv_case {
  shape x, w;
  ag::conv2d_options o;
  bool bias;
};
const std::vector<conv_case> conv_cases = {
    {{2, 3, 9, 9}, {4, 3, 3, 3}, {.padding = {1, 1}}, true},
    {{3, 4, 11, 7}, {6, 4, 3, 2}, {.stride = {2, 1}, .padding = {1, 0}}, false},
    {{2, 4, 10, 10}, {4, 2, 3, 3}, {.padding = {2, 2}, .dilation = {2, 2}, .groups = 2}, true},
    {{4, 8, 5, 5}, {16, 8, 1, 1}, {}, true},
    {{1, 1, 28, 28}, {8, 1, 5, 5}, {.stride = {2, 2}, .padding = {2, 2}}, true},
};
}  // namespace

TEST_CASE("conv2d forward and backward through cuDNN match im2col on the host", "[cuda][conv]") {
  std::mt19937 rng(1);
  cuda_test::settings_guard keep;
  for (int mode = 0; mode < 3; ++mode) {
    tk::gpu::settings() = keep.saved;
    tk::gpu::settings().deterministic = mode == 1;
    tk::gpu::settings().cudnn_benchmark = mode == 2;
    INFO("mode " << (mode == 0 ? "heuristic" : mode == 1 ? "deterministic" : "benchmark"));
    for (const auto& c : conv_cases) {
      INFO("x " << tk::to_string(c.x) << " w " << tk::to_string(c.w));
      const auto x = random<float>(c.x, rng), w = random<float>(c.w, rng), b = random<float>({c.w[0]}, rng);
      const auto o = c.o;
      if (c.bias)
        check_op<float>([o](const auto& v) { return ag::conv2d(v[0], v[1], v[2], o); }, {x, w, b}, 1e-4, 1e-4);
      else
        check_op<float>([o](const auto& v) { return ag::conv2d(v[0], v[1], {}, o); }, {x, w}, 1e-4, 1e-4);
    }
  }
  // fp64 and unbatched input.
  const auto x = random<double>({3, 6, 6}, rng), w = random<double>({2, 3, 3, 3}, rng);
  check_op<double>([](const auto& v) { return ag::conv2d(v[0], v[1]); }, {x, w}, 1e-10, 1e-10);
}

TEST_CASE("conv2d in half and bfloat16 agrees with the host's widened computation", "[cuda][conv][amp]") {
  std::mt19937 rng(2);
  const auto x = random<float>({2, 4, 8, 8}, rng), w = random<float>({5, 4, 3, 3}, rng);
  const ag::conv2d_options o{.padding = {1, 1}};
  const auto xh = tk::cast<tk::half>(x), wh = tk::cast<tk::half>(w);
  auto yh_host = ag::conv2d(tk::var<tk::half>(xh), tk::var<tk::half>(wh), {}, o).value();
  auto yh_dev = ag::conv2d(tk::var<tk::half, cuda>(xh.to<cuda>()), tk::var<tk::half, cuda>(wh.to<cuda>()), {}, o).value();
  CUDA_TEST_REQUIRE_CLOSE(tk::cast<float>(yh_dev), tk::cast<float>(yh_host), 4e-3, 4e-3);
  const auto xb = tk::cast<tk::bfloat16>(x), wb = tk::cast<tk::bfloat16>(w);
  auto yb_host = ag::conv2d(tk::var<tk::bfloat16>(xb), tk::var<tk::bfloat16>(wb), {}, o).value();
  auto yb_dev =
      ag::conv2d(tk::var<tk::bfloat16, cuda>(xb.to<cuda>()), tk::var<tk::bfloat16, cuda>(wb.to<cuda>()), {}, o).value();
  CUDA_TEST_REQUIRE_CLOSE(tk::cast<float>(yb_dev), tk::cast<float>(yb_host), 3e-2, 3e-2);
}

TEST_CASE("im2col<cuda> unfold and fold match the host", "[cuda][conv]") {
  std::mt19937 rng(3);
  tk::backend::conv2d_geometry g;
  g.channels = 3;
  g.height = 7;
  g.width = 6;
  g.kernel_h = 3;
  g.kernel_w = 2;
  g.stride_h = 2;
  g.pad_h = 1;
  g.pad_w = 1;
  g.dilation_w = 2;
  g.out_h = (g.height + 2 * g.pad_h - g.dilation_h * (g.kernel_h - 1) - 1) / g.stride_h + 1;
  g.out_w = (g.width + 2 * g.pad_w - g.dilation_w * (g.kernel_w - 1) - 1) / g.stride_w + 1;
  const index_t batch = 2, rows = g.col_rows(), cols = g.col_cols();
  const auto x = random<float>({batch, g.channels, g.height, g.width}, rng);
  auto hc = tk::tensor<float>::empty({batch, rows, cols});
  auto dc = tk::tensor<float, cuda>::empty({batch, rows, cols});
  tk::backend::im2col<cpu>::unfold(g, batch, x.data(), hc.data(), cols, rows * cols);
  const auto dx = x.to<cuda>();
  tk::backend::im2col<cuda>::unfold(g, batch, dx.data(), dc.data(), cols, rows * cols);
  REQUIRE(cuda_test::identical(dc, hc));
  auto hx = tk::tensor<float>::empty(x.sizes());
  auto dxf = tk::tensor<float, cuda>::empty(x.sizes());
  tk::backend::im2col<cpu>::fold(g, batch, hc.data(), cols, rows * cols, hx.data());
  tk::backend::im2col<cuda>::fold(g, batch, dc.data(), cols, rows * cols, dxf.data());
  CUDA_TEST_REQUIRE_CLOSE(dxf, hx, 1e-6, 1e-6);
}

TEST_CASE("max and average pooling forward and backward match the host", "[cuda][pool]") {
  std::mt19937 rng(4);
  for (ag::pool2d_options o : {ag::pool2d_options{}, ag::pool2d_options{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}},
                               ag::pool2d_options{.kernel = {2, 3}, .stride = {1, 2}}}) {
    const auto x = random<float>({2, 3, 9, 8}, rng);
    check_op<float>([o](const auto& v) { return ag::max_pool2d(v[0], o); }, {x}, 0, 0);
    check_op<float>([o](const auto& v) { return ag::avg_pool2d(v[0], o); }, {x}, 1e-6, 1e-6);
  }
  // Ties and NaN pick the same winner as the host.
  auto t = tk::tensor<float>::zeros({1, 1, 4, 4});
  t.at({0, 0, 1, 1}) = std::numeric_limits<float>::quiet_NaN();
  check_op<float>([](const auto& v) { return ag::max_pool2d(v[0]); }, {t}, 0, 0);
}

TEST_CASE("batch norm: cuDNN and our kernels match the host, train and eval", "[cuda][norm]") {
  std::mt19937 rng(5);
  cuda_test::settings_guard keep;
  for (bool use_cudnn : {true, false}) {
    tk::gpu::settings().cudnn_batch_norm = use_cudnn;
    INFO("cudnn " << use_cudnn);
    for (shape xs : {shape{8, 3, 5, 5}, shape{16, 4}, shape{4, 2, 3}}) {
      INFO("x " << tk::to_string(xs));
      const auto x = random<float>(xs, rng, -2, 3), w = random<float>({xs[1]}, rng), b = random<float>({xs[1]}, rng);
      for (bool training : {true, false}) {
        INFO("training " << training);
        auto rm_h = random<float>({xs[1]}, rng), rv_h = random<float>({xs[1]}, rng, 0.5, 1.5);
        auto rm_d = rm_h.to<cuda>(), rv_d = rv_h.to<cuda>();
        auto f = [&](const auto& v) {
          using V = std::decay_t<decltype(v[0])>;
          using D = typename V::tensor_type::device_type;
          if constexpr (std::is_same_v<D, cpu>)
            return ag::batch_norm(v[0], v[1], v[2], rm_h, rv_h, training, 0.1, 1e-5);
          else
            return ag::batch_norm(v[0], v[1], v[2], rm_d, rv_d, training, 0.1, 1e-5);
        };
        check_op<float>(f, {x, w, b}, 2e-4, 2e-4);
        CUDA_TEST_REQUIRE_CLOSE(rm_d, rm_h, 1e-5, 1e-6);
        CUDA_TEST_REQUIRE_CLOSE(rv_d, rv_h, 1e-5, 1e-6);
      }
      // No affine parameters and no running statistics.
      tk::tensor<float> none_h;
      tk::tensor<float, cuda> none_d;
      auto g = [&](const auto& v) {
        using V = std::decay_t<decltype(v[0])>;
        if constexpr (std::is_same_v<typename V::tensor_type::device_type, cpu>)
          return ag::batch_norm(v[0], V(), V(), none_h, none_h, true);
        else
          return ag::batch_norm(v[0], V(), V(), none_d, none_d, true);
      };
      check_op<float>(g, {x}, 2e-4, 2e-4);
    }
  }
}

TEST_CASE("batch norm kernels: more channels than a grid's y dimension, and empty batches", "[cuda][norm]") {
  std::mt19937 rng(15);
  cuda_test::settings_guard keep;
  tk::gpu::settings().cudnn_batch_norm = false;
  for (shape xs : {shape{4, 70000}, shape{3, 66000, 2}}) {
    INFO("x " << tk::to_string(xs));
    const auto x = random<float>(xs, rng, -2, 3), w = random<float>({xs[1]}, rng), b = random<float>({xs[1]}, rng);
    for (bool training : {true, false}) {
      INFO("training " << training);
      auto rm_h = random<float>({xs[1]}, rng), rv_h = random<float>({xs[1]}, rng, 0.5, 1.5);
      auto rm_d = rm_h.to<cuda>(), rv_d = rv_h.to<cuda>();
      auto f = [&](const auto& v) {
        using V = std::decay_t<decltype(v[0])>;
        if constexpr (std::is_same_v<typename V::tensor_type::device_type, cpu>)
          return ag::batch_norm(v[0], v[1], v[2], rm_h, rv_h, training, 0.1, 1e-5);
        else
          return ag::batch_norm(v[0], v[1], v[2], rm_d, rv_d, training, 0.1, 1e-5);
      };
      check_op<float>(f, {x, w, b}, 2e-4, 2e-4);
      CUDA_TEST_REQUIRE_CLOSE(rm_d, rm_h, 1e-5, 1e-6);
      CUDA_TEST_REQUIRE_CLOSE(rv_d, rv_h, 1e-5, 1e-6);
    }
  }
  // Eval on an empty batch: empty output, zero weight and bias gradients.
  {
    const index_t c = 4;
    auto rm_h = random<float>({c}, rng), rv_h = random<float>({c}, rng, 0.5, 1.5);
    auto rm_d = rm_h.to<cuda>(), rv_d = rv_h.to<cuda>();
    auto f = [&](const auto& v) {
      using V = std::decay_t<decltype(v[0])>;
      if constexpr (std::is_same_v<typename V::tensor_type::device_type, cpu>)
        return ag::batch_norm(v[0], v[1], v[2], rm_h, rv_h, false);
      else
        return ag::batch_norm(v[0], v[1], v[2], rm_d, rv_d, false);
    };
    check_op<float>(f, {random<float>({0, c, 3}, rng), random<float>({c}, rng), random<float>({c}, rng)}, 0, 0);
  }
  // Training on an empty batch through the backend (the autograd op refuses it): no input is
  // read; the saved and running statistics and the zero gradients are the host's.
  {
    const index_t c = 70000, s = 3;
    const auto w = random<float>({c}, rng), b = random<float>({c}, rng);
    const auto wd = w.to<cuda>(), bd = b.to<cuda>();
    auto rm_h = random<float>({c}, rng), rv_h = random<float>({c}, rng, 0.5, 1.5);
    auto rm_d = rm_h.to<cuda>(), rv_d = rv_h.to<cuda>();
    auto mean_h = tk::tensor<float>::empty({c}), inv_h = tk::tensor<float>::empty({c});
    auto mean_d = tk::tensor<float, cuda>::empty({c}), inv_d = tk::tensor<float, cuda>::empty({c});
    const float* none = nullptr;
    tk::backend::norm<cpu>::batch_norm_train(none, 0, c, s, w.data(), b.data(), 1e-5, 0.1, rm_h.data(), rv_h.data(),
                                             static_cast<float*>(nullptr), mean_h.data(), inv_h.data());
    tk::backend::norm<cuda>::batch_norm_train(none, 0, c, s, wd.data(), bd.data(), 1e-5, 0.1, rm_d.data(),
                                              rv_d.data(), static_cast<float*>(nullptr), mean_d.data(), inv_d.data());
    CUDA_TEST_REQUIRE_CLOSE(mean_d, mean_h, 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(inv_d, inv_h, 1e-7, 0);
    CUDA_TEST_REQUIRE_CLOSE(rm_d, rm_h, 1e-7, 0);
    CUDA_TEST_REQUIRE_CLOSE(rv_d, rv_h, 0, 0);  // NaN: no unbiased variance of nothing
    auto dw_h = tk::tensor<float>::empty({c}), db_h = tk::tensor<float>::empty({c});
    auto dw_d = tk::tensor<float, cuda>::empty({c}), db_d = tk::tensor<float, cuda>::empty({c});
    tk::fill_(dw_d, 7.0f);
    tk::fill_(db_d, 7.0f);
    tk::backend::norm<cpu>::batch_norm_backward(none, none, 0, c, s, w.data(), mean_h.data(), inv_h.data(), true,
                                                static_cast<float*>(nullptr), dw_h.data(), db_h.data());
    tk::backend::norm<cuda>::batch_norm_backward(none, none, 0, c, s, wd.data(), mean_d.data(), inv_d.data(), true,
                                                 static_cast<float*>(nullptr), dw_d.data(), db_d.data());
    CUDA_TEST_REQUIRE_CLOSE(dw_d, tk::tensor<float>::zeros({c}), 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(db_d, tk::tensor<float>::zeros({c}), 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(dw_h, tk::tensor<float>::zeros({c}), 0, 0);
    CUDA_TEST_REQUIRE_CLOSE(db_h, tk::tensor<float>::zeros({c}), 0, 0);
  }
}

TEST_CASE("layer norm forward and backward match the host", "[cuda][norm]") {
  std::mt19937 rng(6);
  for (shape xs : {shape{6, 10}, shape{3, 4, 1500}}) {
    const shape ns{xs.back()};
    const auto x = random<float>(xs, rng, -2, 2), w = random<float>(ns, rng), b = random<float>(ns, rng);
    check_op<float>([ns](const auto& v) { return ag::layer_norm(v[0], ns, v[1], v[2]); }, {x, w, b}, 2e-4, 2e-4);
    check_op<float>([ns](const auto& v) { return ag::layer_norm(v[0], ns); }, {x}, 2e-4, 2e-4);
  }
}

TEST_CASE("softmax, log_softmax and the losses match the host", "[cuda][softmax][loss]") {
  std::mt19937 rng(7);
  for (auto [xs, dim] : {std::pair<shape, index_t>{{8, 10}, 1}, {{3, 2000}, 1}, {{4, 5, 6}, 1}, {{2, 3, 7}, 0}}) {
    INFO("x " << tk::to_string(xs) << " dim " << dim);
    const auto x = random<float>(xs, rng, -4, 4);
    const index_t d = dim;
    check_op<float>([d](const auto& v) { return ag::softmax(v[0], d); }, {x}, 1e-5, 1e-6);
    check_op<float>([d](const auto& v) { return ag::log_softmax(v[0], d); }, {x}, 1e-5, 1e-5);
  }
  const auto logits = random<float>({16, 10}, rng, -3, 3);
  auto target = cuda_test::random_indices({16}, 10, rng);
  target.at({3}) = -100;  // ignored
  const auto target_d = target.to<cuda>();
  for (double eps : {0.0, 0.1}) {
    for (auto red : {ag::reduction::mean, ag::reduction::sum, ag::reduction::none}) {
      const ag::cross_entropy_options o{.label_smoothing = eps, .reduce = red};
      auto f = [&](const auto& v) {
        using V = std::decay_t<decltype(v[0])>;
        if constexpr (std::is_same_v<typename V::tensor_type::device_type, cpu>)
          return ag::cross_entropy(v[0], target, o);
        else
          return ag::cross_entropy(v[0], target_d, o);
      };
      check_op<float>(f, {logits}, 1e-5, 1e-6);
    }
  }
  auto nll = [&](const auto& v) {
    using V = std::decay_t<decltype(v[0])>;
    if constexpr (std::is_same_v<typename V::tensor_type::device_type, cpu>)
      return ag::nll_loss(ag::log_softmax(v[0], 1), target);
    else
      return ag::nll_loss(ag::log_softmax(v[0], 1), target_d);
  };
  check_op<float>(nll, {logits}, 1e-5, 1e-6);
  const auto y = random<float>({16, 10}, rng);
  check_op<float>([](const auto& v) { return ag::mse_loss(v[0], v[1]); }, {logits, y}, 1e-5, 1e-6);
  // Out-of-range targets are checked by the kernel and raised at the next read on the host.
  auto bad = target.clone();
  bad.at({0}) = 10;
  REQUIRE_THROWS_AS(ag::cross_entropy(tk::var<float, cuda>(logits.to<cuda>()), bad.to<cuda>()).item(),
                    tk::value_error);
  REQUIRE_NOTHROW(tk::gpu::check_device_errors());  // reported once
}

TEST_CASE("dropout draws the host's Philox mask bit for bit", "[cuda][dropout]") {
  for (index_t n : {index_t(1), index_t(7), index_t(4096), index_t(1000003)}) {
    INFO("n = " << n);
    tk::generator gh(1234), gd(1234);
    gh.reserve(5);
    gd.reserve(5);
    const auto mh = ag::dropout_mask<float, cpu>({n}, 0.3, gh);
    const auto md = ag::dropout_mask<float, cuda>({n}, 0.3, gd);
    REQUIRE(cuda_test::identical(md, mh));
    REQUIRE(gh.get_state() == gd.get_state());
    const auto hh = ag::dropout_mask<tk::half, cpu>({n}, 0.5, gh);
    const auto hd = ag::dropout_mask<tk::half, cuda>({n}, 0.5, gd);
    REQUIRE(cuda_test::identical(hd, hh));
  }
  std::mt19937 rng(8);
  const auto x = random<float>({5, 33}, rng);
  tk::generator g1(9), g2(9);
  auto f = [&](const auto& v) {
    using V = std::decay_t<decltype(v[0])>;
    return ag::dropout(v[0], 0.25, true, std::is_same_v<typename V::tensor_type::device_type, cpu> ? g1 : g2);
  };
  check_op<float>(f, {x}, 0, 0);
}

TEST_CASE("embedding forward and backward (atomic and deterministic) match the host", "[cuda][embedding]") {
  std::mt19937 rng(9);
  cuda_test::settings_guard keep;
  const auto w = random<float>({12, 7}, rng);
  const auto idx = cuda_test::random_indices({5, 6}, 12, rng);  // repeated indices accumulate
  const auto idx_d = idx.to<cuda>();
  for (bool det : {false, true}) {
    tk::gpu::settings().deterministic = det;
    auto f = [&](const auto& v) {
      using V = std::decay_t<decltype(v[0])>;
      if constexpr (std::is_same_v<typename V::tensor_type::device_type, cpu>)
        return ag::embedding(idx, v[0]);
      else
        return ag::embedding(idx_d, v[0]);
    };
    check_op<float>(f, {w}, 1e-6, 1e-6);
  }
  auto bad = idx.clone();
  bad.at({0, 0}) = 12;
  const auto bad_d = bad.to<cuda>();
  const tk::var<float, cuda> w_d(w.to<cuda>());
  REQUIRE_THROWS_WITH(ag::embedding(bad_d, w_d).value().to_vector(),
                      Catch::Contains("embedding") && Catch::Contains("index 12 at position [0, 0]") &&
                          Catch::Contains("num_embeddings = 12"));
  auto embed_and_check = [&] {
    const auto e = ag::embedding(bad_d, w_d);
    tk::gpu::check_device_errors();
  };
  REQUIRE_THROWS_AS(embed_and_check(), tk::index_error);
  REQUIRE_NOTHROW(tk::gpu::check_device_errors());
}

namespace {
/// A few steps of an optimizer on both devices from the same parameters and gradients.
template <template <class, class> class Opt, class Options>
void check_optimizer(const Options& opts) {
  std::mt19937 rng(10);
  const auto p0 = random<float>({37, 19}, rng), p1 = random<float>({19}, rng);
  std::vector<tk::var<float, cpu>> ph{tk::var<float, cpu>(p0.clone(), true), tk::var<float, cpu>(p1.clone(), true)};
  std::vector<tk::var<float, cuda>> pd{tk::var<float, cuda>(p0.to<cuda>(), true),
                                       tk::var<float, cuda>(p1.to<cuda>(), true)};
  Opt<float, cpu> oh(ph, opts);
  Opt<float, cuda> od(pd, opts);
  for (int step = 0; step < 4; ++step) {
    for (std::size_t i = 0; i < ph.size(); ++i) {
      const auto g = random<float>(ph[i].sizes(), rng);
      ph[i].grad() = g.clone();
      pd[i].grad() = g.to<cuda>();
    }
    oh.step();
    od.step();
  }
  for (std::size_t i = 0; i < ph.size(); ++i) CUDA_TEST_REQUIRE_CLOSE(pd[i].value(), ph[i].value(), 1e-5, 1e-6);
}
}  // namespace

TEST_CASE("fused optimizer updates on cuda match the host", "[cuda][optim]") {
  check_optimizer<tk::optim::sgd>(tk::optim::sgd_options{.lr = 0.1});
  check_optimizer<tk::optim::sgd>(
      tk::optim::sgd_options{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  check_optimizer<tk::optim::adam>(tk::optim::adam_options{.lr = 1e-2, .weight_decay = 1e-3});
  check_optimizer<tk::optim::adam>(tk::optim::adam_options{.lr = 1e-2, .amsgrad = true});
  check_optimizer<tk::optim::adamw>(tk::optim::adamw_options{.lr = 1e-2, .weight_decay = 0.1});
}

TEST_CASE("the loss scaler's inf check and unscale run on device gradients", "[cuda][amp]") {
  std::mt19937 rng(11);
  tk::var<float, cuda> p(random<float>({64, 3}, rng).to<cuda>(), true);
  std::vector<tk::var<float, cuda>> params{p};
  tk::optim::sgd<float, cuda> opt(params, {.lr = 0.1});
  tk::amp::dynamic_scaling scaler;
  const double s = scaler.get_scale();
  auto g = random<float>({64, 3}, rng);
  p.grad() = (g * s).to<cuda>();
  REQUIRE_FALSE(scaler.unscale(opt));
  CUDA_TEST_REQUIRE_CLOSE(p.grad(), g, 1e-6, 1e-7);
  REQUIRE(scaler.step(opt));
  scaler.update();
  auto bad = g.clone();
  bad.at({17, 2}) = std::numeric_limits<float>::infinity();
  p.grad() = bad.to<cuda>();
  const auto before = p.value().to<cpu>();
  REQUIRE_FALSE(scaler.step(opt));  // found inf: skipped
  REQUIRE(cuda_test::identical(p.value(), before));
  scaler.update();
  REQUIRE(scaler.get_scale() == s / 2);
}

TEST_CASE("compression codecs encode the host's bytes on device buffers", "[cuda][compression]") {
  std::mt19937 rng(12);
  const index_t n = 256 * 40;
  auto x = random<float>({n}, rng, -3, 3);
  x.at({5}) = 1e6f;  // beyond fp16: saturates
  x.at({300}) = 0.0f;
  for (index_t i = 512; i < 768; ++i) x.at({i}) = 1e-35f;  // a block below int8's smallest scale
  x.at({1000}) = std::numeric_limits<float>::infinity();   // a non-finite block
  // A NaN with its sign and a payload set: arithmetic on it gives its payload on the host and
  // 0x7fffffff on the GPU, so the codecs must write one fixed NaN (0x7fc00000) on both.
  x.at({2000}) = tk::detail::bit_cast<float>(std::uint32_t(0xffc00123u));
  x.at({4100}) = tk::detail::bit_cast<float>(std::uint32_t(0x7f800001u));  // a signalling NaN
  const auto xd = x.to<cuda>();
  auto run = [&]<class C>(C) {
    INFO("codec " << C::name);
    const std::size_t bytes = C::wire_bytes(n);
    std::vector<std::uint8_t> wh(bytes);
    C::encode(x.data(), n, wh.data());
    auto wd = tk::tensor<std::uint8_t, cuda>::empty({index_t(bytes)});
    tk::compression::gpu::compress_encode<C>(xd.data(), n, wd.data());
    REQUIRE(wd.to_vector() == wh);
    auto yh = tk::tensor<float>::empty({n});
    C::decode(wh.data(), n, yh.data());
    auto yd = tk::tensor<float, cuda>::empty({n});
    tk::compression::gpu::compress_decode<C>(wd.data(), n, yd.data());
    REQUIRE(cuda_test::identical(yd, yh));
  };
  run(tk::compression::none{});
  run(tk::compression::fp16{});
  run(tk::compression::bf16{});
  run(tk::compression::int8{});
  run(tk::compression::int8_block<64>{});
  run(tk::compression::sign_1bit{});
}

TEST_CASE("amp ops run natively in half and bfloat16 on cuda and match the host", "[cuda][amp]") {
  std::mt19937 rng(13);
  static_assert(tk::backend::native_gemm<cuda, tk::bfloat16> && !tk::backend::native_gemm<cpu, tk::bfloat16>);
  const auto x = random<float>({8, 32}, rng), w = random<float>({16, 32}, rng), b = random<float>({16}, rng);
  check_op<float>([](const auto& v) { return tk::amp::linear<tk::amp::mixed_bf16>(v[0], v[1], v[2]); }, {x, w, b}, 2e-2,
                  2e-2);
  check_op<float>([](const auto& v) { return tk::amp::linear<tk::amp::mixed_fp16>(v[0], v[1], v[2]); }, {x, w, b}, 3e-3,
                  3e-3);
  const auto xi = random<float>({2, 3, 8, 8}, rng), wi = random<float>({4, 3, 3, 3}, rng);
  const ag::conv2d_options o{.padding = {1, 1}};
  check_op<float>([o](const auto& v) { return tk::amp::conv2d<tk::amp::mixed_bf16>(v[0], v[1], {}, o); }, {xi, wi},
                  3e-2, 3e-2);
  check_op<float>([](const auto& v) { return tk::amp::matmul<tk::amp::mixed_fp16>(v[0], ag::transpose(v[1], 0, 1)); },
                  {x, w}, 3e-3, 3e-3);
}

TEST_CASE("a CNN built on cuda trains like the same CNN on the host", "[cuda][nn]") {
  auto build = [](auto device_tag) {
    using D = decltype(device_tag);
    tk::manual_seed(42);
    return nn::make_sequential(
        std::make_shared<nn::conv2d<float, D>>(1, 4, std::array<index_t, 2>{3, 3}, nn::conv2d_options{.padding = {1, 1}}),
        std::make_shared<nn::batch_norm2d<float, D>>(4), std::make_shared<nn::relu<float, D>>(),
        std::make_shared<nn::max_pool2d<float, D>>(nn::pool2d_options{.kernel = {2, 2}}),
        std::make_shared<nn::flatten<float, D>>(), std::make_shared<nn::linear<float, D>>(4 * 4 * 4, 10));
  };
  auto mh = build(cpu{});
  auto md = build(cuda{});
  std::mt19937 rng(14);
  const auto x = random<float>({6, 1, 8, 8}, rng);
  const auto y = cuda_test::random_indices({6}, 10, rng);
  tk::optim::sgd oh(mh->parameters(), {.lr = 0.1, .momentum = 0.9});
  tk::optim::sgd od(md->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    auto lh = ag::cross_entropy((*mh)(tk::var<float>(x)), y);
    auto ld = ag::cross_entropy((*md)(tk::var<float, cuda>(x.to<cuda>())), y.to<cuda>());
    CUDA_TEST_REQUIRE_CLOSE(ld.value(), lh.value(), 1e-4, 1e-5);
    oh.zero_grad();
    od.zero_grad();
    lh.backward();
    ld.backward();
    oh.step();
    od.step();
  }
  const auto ph = mh->parameters();
  const auto pd = md->parameters();
  REQUIRE(ph.size() == pd.size());
  for (std::size_t i = 0; i < ph.size(); ++i) CUDA_TEST_REQUIRE_CLOSE(pd[i].value(), ph[i].value(), 1e-3, 1e-4);
}
