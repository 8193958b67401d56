// trainkit/data/data.hpp - umbrella of the data component: IDX/MNIST readers and mini-batches.
#pragma once

#include "trainkit/data/batch_iterator.hpp"
#include "trainkit/data/idx.hpp"
#include "trainkit/data/mnist.hpp"
#include "trainkit/data/permutation.hpp"
