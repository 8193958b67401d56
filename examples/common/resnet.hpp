// examples/common/resnet.hpp - the small residual network of the ResNet-9 family (the model
// DAWNBench and airbench train on CIFAR-10) that fashion_mnist_resnet trains and bench_train_step
// times: a user module - no nn::sequential at the top, no precision or checkpointing code in it.
//
// prep (conv-BN-ReLU, width w) -> layer1 (conv-BN-ReLU 2w, max pool, residual block) -> layer2
// (conv-BN-ReLU 4w, max pool) -> layer3 (conv-BN-ReLU 8w, max pool, residual block) -> global
// average pool -> linear -> x 0.125. segments() names what a recompute policy splits.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include <trainkit/trainkit.hpp>

namespace example {

namespace resnet_parts {
namespace tk = trainkit;
namespace nn = trainkit::nn;
using tk::index_t;
using fvar = tk::var<float>;

/// conv 3x3 (padding 1, no bias) - batch norm - ReLU.
inline std::shared_ptr<nn::sequential<>> conv_bn(index_t in, index_t out) {
  return nn::make_sequential(
      std::make_shared<nn::conv2d<>>(in, out, 3, nn::conv2d_options{.padding = {1, 1}, .bias = false}),
      std::make_shared<nn::batch_norm2d<>>(out), std::make_shared<nn::relu<>>());
}

/// x + f(x), f = two conv-BN-ReLU blocks of c channels.
class residual : public nn::module<float> {
 public:
  explicit residual(index_t c) : a_(register_module("a", conv_bn(c, c))), b_(register_module("b", conv_bn(c, c))) {}
  std::string_view type_name() const override { return "residual"; }
  fvar forward(const fvar& x) override { return x + b_->forward(a_->forward(x)); }

 private:
  std::shared_ptr<nn::sequential<>> a_, b_;
};

/// conv-BN-ReLU to `out` channels, max pool 2x2, and a residual block when `with_residual`.
class stage : public nn::module<float> {
 public:
  stage(index_t in, index_t out, bool with_residual)
      : conv_(register_module("conv", conv_bn(in, out))),
        pool_(register_module("pool", std::make_shared<nn::max_pool2d<>>(2))),
        res_(with_residual ? register_module("res", std::make_shared<residual>(out)) : nullptr) {}
  std::string_view type_name() const override { return "stage"; }
  fvar forward(const fvar& x) override {
    auto h = pool_->forward(conv_->forward(x));
    return res_ ? res_->forward(h) : h;
  }

 private:
  std::shared_ptr<nn::sequential<>> conv_;
  std::shared_ptr<nn::max_pool2d<>> pool_;
  std::shared_ptr<residual> res_;
};

/// Global average pool, linear classifier, output scaled by 1/8 (airbench's head).
class head : public nn::module<float> {
 public:
  head(index_t c, index_t classes) : fc_(register_module("fc", std::make_shared<nn::linear<>>(c, classes))) {}
  std::string_view type_name() const override { return "head"; }
  fvar forward(const fvar& x) override { return fc_->forward(tk::autograd::mean(x, {2, 3})) * 0.125; }

 private:
  std::shared_ptr<nn::linear<>> fc_;
};

/// The network: a user module whose forward is its segments in turn (checkpoint::segmented_module).
class resnet : public nn::module<float> {
 public:
  resnet(index_t channels, index_t width, index_t classes)
      : prep_(register_module("prep", conv_bn(channels, width))),
        layer1_(register_module("layer1", std::make_shared<stage>(width, 2 * width, true))),
        layer2_(register_module("layer2", std::make_shared<stage>(2 * width, 4 * width, false))),
        layer3_(register_module("layer3", std::make_shared<stage>(4 * width, 8 * width, true))),
        head_(register_module("head", std::make_shared<head>(8 * width, classes))) {}
  std::string_view type_name() const override { return "resnet"; }
  /// What a recompute policy splits: forward(x) applies these in order.
  std::vector<nn::module<float>*> segments() {
    return {prep_.get(), layer1_.get(), layer2_.get(), layer3_.get(), head_.get()};
  }
  fvar forward(const fvar& x) override {
    fvar h = x;
    for (auto* s : segments()) h = s->forward(h);
    return h;
  }

 private:
  std::shared_ptr<nn::sequential<>> prep_;
  std::shared_ptr<stage> layer1_, layer2_, layer3_;
  std::shared_ptr<head> head_;
};

}  // namespace resnet_parts

using resnet_parts::resnet;

}  // namespace example
