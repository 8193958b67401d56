// trainkit/autograd/nn_ops.hpp - umbrella of the neural-network ops: linear, convolution,
// pooling, normalisation, dropout, embedding, softmax, attention and the losses.
#pragma once

#include "trainkit/autograd/ops/attention.hpp"  // scaled_dot_product_attention, attention_options
#include "trainkit/autograd/ops/conv.hpp"       // conv2d, conv2d_options
#include "trainkit/autograd/ops/dropout.hpp"    // dropout, dropout_mask
#include "trainkit/autograd/ops/embedding.hpp"  // embedding
#include "trainkit/autograd/ops/linear.hpp"     // linear
#include "trainkit/autograd/ops/loss.hpp"       // cross_entropy, nll_loss, mse_loss, reduction
#include "trainkit/autograd/ops/norm.hpp"       // batch_norm, layer_norm
#include "trainkit/autograd/ops/pool.hpp"       // max_pool2d, avg_pool2d, pool2d_options
#include "trainkit/autograd/ops/softmax.hpp"    // softmax, log_softmax
