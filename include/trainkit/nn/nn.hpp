// trainkit/nn/nn.hpp - umbrella of the layers: module, sequential, linear, conv2d, norms, dropout,
// activations, pooling, embedding, multi-head attention, and the initialisers.
#pragma once

#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/attention.hpp"
#include "trainkit/nn/conv2d.hpp"
#include "trainkit/nn/dropout.hpp"
#include "trainkit/nn/embedding.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/module.hpp"
#include "trainkit/nn/norm.hpp"
#include "trainkit/nn/pool.hpp"
#include "trainkit/nn/sequential.hpp"
