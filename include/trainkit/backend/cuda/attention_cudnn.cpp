// trainkit/backend/cuda/attention_cudnn.cpp - the one translation unit of cuDNN's fused attention
// (attention_cudnn_impl.hpp), compiled by the host compiler into every target that links
// trainkit::cudnn_frontend.
#include "trainkit/backend/cuda/attention_cudnn_impl.hpp"
