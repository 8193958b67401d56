// fashion_mnist_ddp.cu - fashion_mnist_ddp on GPUs: one process per GPU under mpirun (or srun),
// the same flags and the same printed figures as the CPU build. The job is fashion_mnist_ddp.cpp's
// train_ddp<Device, ...>(), included from there without its CPU main() (FASHION_MNIST_DDP_JOB_ONLY);
// this file is the GPU build's main().
//
//   mpirun -np 8 build/examples/fashion_mnist_ddp_cuda --data /usr/share/datasets/fashion-mnist
//          --epochs 3 --batch 128 --compression none|fp16|bf16|int8|sign_1bit [--comm nccl|mpi]
//
// Each process takes the GPU of its local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
// LOCAL_RANK; dist::select_local_device(), inside dist::nccl's constructor). --comm nccl (the
// default, where NCCL was found at build time): the gradients go through NCCL, bootstrapped over
// MPI, and every bucket is reduced on data_parallel's side stream with no host wait (compression
// on the device). --comm mpi: through MPI, staged in pinned host memory (GPU jobs without NCCL, or
// more ranks than GPUs). MPI carries the control messages either way. Exit code 77 without a
// CUDA device.
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include <trainkit/cuda.cuh>  // everything + the CUDA backend, nccl, data_parallel<..., cuda>

#define FASHION_MNIST_DDP_JOB_ONLY
#include "fashion_mnist_ddp.cpp"  // the training job, on either device (and the model)

int main(int argc, char** argv) {
  // As fashion_mnist_ddp.cpp: 75 after a stop signal or a failed peer, a rank's own error printed
  // first and then MPI_Abort for the whole job (ddp_main).
  return ddp_main("fashion_mnist_ddp_cuda", argc, argv, [&] {
    const auto f = ddp_flags(argc, argv);
    dist::mpi comm;
    if (!tk::gpu::available()) {
      if (comm.rank() == 0) std::printf("SKIPPED: no CUDA device\n");
      return 77;
    }
    using pinned = tk::gpu::pinned_memory;
    const std::string how = f.str("comm");
    if (f.num("hierarchical", 0, 1) != 0)  // NCCL is hierarchical by itself (NVLink inside, the network between)
      throw std::invalid_argument("--hierarchical is for the CPU build; on GPUs NCCL's own topology does it");
    bool stopped = false;
    if (how == "nccl") {
#if TRAINKIT_HAS_NCCL
      dist::nccl grads(comm);  // on the local rank's GPU, which it makes current
      stopped = train_ddp_with<tk::cuda, pinned>(comm, grads, f);
#else
      throw std::invalid_argument("--comm nccl: this build has no NCCL (use --comm mpi)");
#endif
    } else if (how == "mpi") {
      dist::select_local_device();
      stopped = train_ddp_with<tk::cuda, pinned>(comm, comm, f);
    } else {
      throw std::invalid_argument("--comm must be nccl or mpi, got '" + how + "'");
    }
    return stopped ? example::exit_restart : 0;
  });
}
