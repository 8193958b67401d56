// test_package_cu.cu - a .cu file compiled with trainkit::cuda's flags from the Conan package:
// C++20 (a constrained template) in device code, TRAINKIT_HD functions, an extended __device__
// lambda. Nothing is launched: it prints the language level and exits 0 without a GPU.
#include <trainkit/config.hpp>

#include <concepts>
#include <cstdio>

template <std::floating_point T>
TRAINKIT_HD T twice(T x) { return x + x; }

template <class F>
__global__ void apply(float* x, int n, F f) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = f(x[i]);
}

int main() {
  auto f = [] __device__(float v) { return twice(v); };
  (void)&apply<decltype(f)>;  // instantiate the kernel
  std::printf("nvcc: __cplusplus %ld, trainkit %d.%d.%d, host twice(2) = %g\n", long(__cplusplus),
              TRAINKIT_VERSION_MAJOR, TRAINKIT_VERSION_MINOR, TRAINKIT_VERSION_PATCH, double(twice(2.0f)));
  return __cplusplus >= 202002L ? 0 : 1;
}
