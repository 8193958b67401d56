// trainkit/backend/cuda/cudnn.cuh - the cuDNN handle of each thread and device, bound to the
// current stream at every use, and the data types trainkit's elements map to.
#pragma once

#include <cudnn.h>
#include <cuda_runtime.h>

#include <memory>
#include <type_traits>
#include <unordered_map>

#include "trainkit/backend/cuda/error.cuh"
#include "trainkit/backend/cuda/stream.cuh"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"

namespace trainkit::backend::gpu::detail {

template <class T>
constexpr cudnnDataType_t cudnn_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDNN_DATA_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return CUDNN_DATA_DOUBLE;
  else if constexpr (std::is_same_v<T, half>) return CUDNN_DATA_HALF;
  else if constexpr (std::is_same_v<T, bfloat16>) return CUDNN_DATA_BFLOAT16;
  else static_assert(::trainkit::detail::dependent_false<T>, "cuDNN: float, double, half or bfloat16 only");
}

/// The type cuDNN computes (and takes alpha/beta) in for T: double for double, else float.
template <class T>
using cudnn_scale_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

struct cudnn_handle {
  cudnnHandle_t h = nullptr;
  cudnn_handle() { check(cudnnCreate(&h), "cudnnCreate"); }
  cudnn_handle(const cudnn_handle&) = delete;
  cudnn_handle& operator=(const cudnn_handle&) = delete;
  ~cudnn_handle() {
    if (h) cudnnDestroy(h);
  }
};

/// This thread's cuDNN handle for the current device, set to the current stream.
inline cudnnHandle_t cudnn() {
  // Never destroyed (see blas_for_current_device): a cuDNN handle outlives the runtime at exit.
  thread_local auto* handles = new std::unordered_map<int, cudnn_handle*>;
  cudnn_handle*& slot = (*handles)[current_device()];
  if (slot == nullptr) slot = new cudnn_handle;
  check(cudnnSetStream(slot->h, current_stream()), "cudnnSetStream");
  return slot->h;
}

/// RAII owners of cuDNN descriptors.
struct tensor_desc {
  cudnnTensorDescriptor_t d = nullptr;
  tensor_desc() { check(cudnnCreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor"); }
  tensor_desc(const tensor_desc&) = delete;
  tensor_desc& operator=(const tensor_desc&) = delete;
  ~tensor_desc() {
    if (d) cudnnDestroyTensorDescriptor(d);
  }
};
struct filter_desc {
  cudnnFilterDescriptor_t d = nullptr;
  filter_desc() { check(cudnnCreateFilterDescriptor(&d), "cudnnCreateFilterDescriptor"); }
  filter_desc(const filter_desc&) = delete;
  filter_desc& operator=(const filter_desc&) = delete;
  ~filter_desc() {
    if (d) cudnnDestroyFilterDescriptor(d);
  }
};
struct conv_desc {
  cudnnConvolutionDescriptor_t d = nullptr;
  conv_desc() { check(cudnnCreateConvolutionDescriptor(&d), "cudnnCreateConvolutionDescriptor"); }
  conv_desc(const conv_desc&) = delete;
  conv_desc& operator=(const conv_desc&) = delete;
  ~conv_desc() {
    if (d) cudnnDestroyConvolutionDescriptor(d);
  }
};

}  // namespace trainkit::backend::gpu::detail
