// tests/cuda/nccl_compile.cu - the NCCL communicator compiles and links (nvcc, sm_90), and, where a
// GPU is present, passes the same collective checks as thread_group and mpi.
//
//   nvcc -std=c++20 -arch=sm_90 -I include -I tests -I<mpi include> -DOMPI_SKIP_MPICXX
//        tests/cuda/nccl_compile.cu -o nccl_compile -L/usr/local/cuda/lib -lnccl -L<mpi lib> -lmpi
//   mpirun -np 1 ./nccl_compile        one GPU, world size 1 (scripts/gpu-check.sh)
//   mpirun -np N ./nccl_compile        N ranks on the machine's GPUs (rank r on GPU r % count); more
//                                      ranks than GPUs: NCCL refuses two ranks on one GPU, and the
//                                      check passes if every rank reports that as a dist_error
// Exit code 0 on success (also without a GPU: "compiled only"), 1 on a failed check, the same on every rank.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dist/collective_checks.hpp"
#include "trainkit/dist/nccl.cuh"
#include "trainkit/dist/mpi.hpp"

namespace {

using namespace trainkit::dist;
namespace checks = trainkit_test::dist;

static_assert(communicator<nccl>);

// Device memory for the length of one check.
template <class T>
struct device_buffer {
  T* p = nullptr;
  explicit device_buffer(std::size_t n) {
    if (n != 0 && cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)) != cudaSuccess)
      throw dist_error("cudaMalloc failed");
  }
  ~device_buffer() {
    if (p != nullptr) cudaFree(p);
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

template <class T>
void to_device(T* d, const T* h, std::size_t n) {
  if (n != 0 && cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
    throw dist_error("H2D copy failed");
}
template <class T>
void to_host(T* h, const T* d, std::size_t n) {
  if (n != 0 && cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
    throw dist_error("D2H copy failed");
}

// A communicator on host buffers that stages them through device memory, so that the host-side checks
// of tests/dist/collective_checks.hpp run unchanged on nccl. Synchronous: each call waits.
class staged {
 public:
  explicit staged(nccl& c) : c_(c) {}
  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  std::size_t p() const { return static_cast<std::size_t>(size()); }

  template <dist_element T>
  work allreduce(T* data, std::size_t n, reduce_op op) {
    device_buffer<T> d(n);
    to_device(d.p, data, n);
    c_.allreduce(d.p, n, op).wait();
    to_host(data, d.p, n);
    return {};
  }
  template <dist_element T>
  work broadcast(T* data, std::size_t n, int root) {
    device_buffer<T> d(n);
    to_device(d.p, data, n);
    c_.broadcast(d.p, n, root).wait();
    to_host(data, d.p, n);
    return {};
  }
  template <dist_element T>
  work allgather(const T* in, std::size_t n, T* out) {
    device_buffer<T> din(n), dout(p() * n);
    to_device(din.p, in, n);
    c_.allgather(static_cast<const T*>(din.p), n, dout.p).wait();
    to_host(out, dout.p, p() * n);
    return {};
  }
  template <dist_element T>
  work reduce_scatter(const T* in, T* out, std::size_t n, reduce_op op) {
    device_buffer<T> din(p() * n), dout(n);
    to_device(din.p, in, p() * n);
    c_.reduce_scatter(static_cast<const T*>(din.p), dout.p, n, op).wait();
    to_host(out, dout.p, n);
    return {};
  }
  template <dist_element T>
  work alltoall(const T* in, T* out, std::size_t n) {
    device_buffer<T> din(p() * n), dout(p() * n);
    to_device(din.p, in, p() * n);
    c_.alltoall(static_cast<const T*>(din.p), dout.p, n).wait();
    to_host(out, dout.p, p() * n);
    return {};
  }
  work barrier() {
    c_.barrier().wait();
    return {};
  }

 private:
  nccl& c_;
};
static_assert(communicator<staged>);

int failures = 0;
void expect(const std::string& error, int rank) {
  if (error.empty()) return;
  ++failures;
  std::printf("rank %d: FAILED: %s\n", rank, error.c_str());
}

template <class T>
void check_type(staged& g) {
  for (const std::size_t n : checks::lengths) {
    for (const reduce_op op : checks::all_ops) {
      expect(checks::check_allreduce<T>(g, n, op), g.rank());
      expect(checks::check_reduce_scatter<T>(g, n, op), g.rank());
    }
    for (int root = 0; root < g.size(); ++root) expect(checks::check_broadcast<T>(g, n, root), g.rank());
    expect(checks::check_allgather<T>(g, n), g.rank());
    expect(checks::check_alltoall<T>(g, n), g.rank());
  }
}

}  // namespace

int main(int argc, char** argv) {
  mpi::environment env(argc, argv);
  mpi world({.timeout = std::chrono::milliseconds(60000)});
  int devices = 0;
  const bool have_gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  std::uint8_t all_have_gpu = have_gpu ? 1 : 0;
  world.allreduce(&all_have_gpu, 1, reduce_op::min).wait();
  if (all_have_gpu == 0) {
    if (world.rank() == 0)
      std::printf("nccl_compile: no CUDA device on some rank: compiled and linked only\n");
    return 0;
  }
  const int device = world.rank() % devices;
  const bool shared_gpu = world.size() > devices;
  try {
    nccl comm(world, device, {.timeout = std::chrono::milliseconds(60000)});
    if (shared_gpu)
      std::printf("rank %d: note: NCCL accepted %d ranks on %d GPU(s)\n", world.rank(), world.size(),
                  devices);
    staged g(comm);
    check_type<float>(g);
    check_type<double>(g);
    check_type<trainkit::half>(g);
    check_type<trainkit::bfloat16>(g);
    check_type<std::int8_t>(g);
    check_type<std::uint8_t>(g);
    check_type<std::int32_t>(g);
    check_type<std::int64_t>(g);
    g.barrier();
    std::printf("rank %d of %d (GPU %d): nccl collectives %s\n", comm.rank(), comm.size(), device,
                failures == 0 ? "passed" : "FAILED");
  } catch (const dist_error& e) {
    // Two ranks on one GPU: NCCL refuses ("Duplicate GPU detected"); it must be this clear error.
    std::printf("rank %d: dist_error: %s\n", world.rank(), e.what());
    if (!shared_gpu) ++failures;
  }
  std::int32_t total = failures;  // the same exit code on every rank, bounded by world's timeout
  try {
    world.allreduce(&total, 1, reduce_op::sum).wait();
  } catch (const dist_error& e) {
    std::printf("rank %d: combining the results failed: %s\n", world.rank(), e.what());
    total = failures + 1;
  }
  return total == 0 ? 0 : 1;
}
