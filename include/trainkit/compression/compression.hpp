// trainkit/compression/compression.hpp - gradient compression: the gradient_compression concept and its
// codecs (none, fp16, bf16, int8_block<B>, sign_1bit_block<B>, each lossy one with error feedback),
// the quantized allreduce over any dist::communicator, and compression::hierarchical, a communicator
// that compresses only the hop between hosts. Built on ops/ (the residuals are tensors) and dist/
// (the communicators). The CUDA codecs and the device-side allreduce are CUDA code:
// <trainkit/compression/quantized_allreduce.cuh> (brought in by <trainkit/cuda.cuh>).
#pragma once

#include "trainkit/compression/codecs.hpp"
#include "trainkit/compression/hierarchical.hpp"
#include "trainkit/compression/quantized_allreduce.hpp"
