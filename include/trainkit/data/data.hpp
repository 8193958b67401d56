// trainkit/data/data.hpp - umbrella of the data component: data sets in memory, the IDX, MNIST and
// CIFAR-10 readers, text (a character vocabulary, token windows), samplers, transforms and the
// loaders of mini-batches.
#pragma once

#include "trainkit/data/batch.hpp"
#include "trainkit/data/batch_iterator.hpp"
#include "trainkit/data/cifar10.hpp"
#include "trainkit/data/distributed_sampler.hpp"
#include "trainkit/data/idx.hpp"
#include "trainkit/data/dataset.hpp"
#include "trainkit/data/loader.hpp"
#include "trainkit/data/mnist.hpp"
#include "trainkit/data/permutation.hpp"
#include "trainkit/data/text.hpp"
#include "trainkit/data/transforms.hpp"
