// test_package_cuda.cpp - trainkit::cuda from the Conan package: the CUDA runtime, cuBLAS, cuDNN
// and NCCL headers and libraries are found and linked (host code; no GPU is needed to run it).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <cstdio>

int main() {
  int runtime = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  std::printf("cuda runtime %d, cublasLt %zu, cudnn %zu, nccl %d\n", runtime, cublasLtGetVersion(),
              cudnnGetVersion(), nccl);
  return runtime > 0 && nccl > 0 ? 0 : 1;
}
