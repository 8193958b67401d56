// gpt_char.cu - the GPT-style character-level language model of gpt_char.cpp, trained on CUDA GPUs.
//
//   [mpirun -np N] build/examples/gpt_char_cuda [--text FILE[,FILE...]] [--steps 2000] [--batch 32]
//       [--context 64] [--layers 4] [--embd 128] [--heads 4] [--dropout 0.0] [--lr 0.001]
//       [--weight-decay 0.1] [--clip 1.0] [--precision fp32|bf16|fp16] [--checkpoint none|sqrt|every:N]
//       [--snapshot-dir DIR [--resume 0|1|auto] [--snapshot-every N]] [--eval-every N] [--sample-chars N]
//
// The same model, data, optimizer, schedule, snapshots and output as the CPU example - the job is
// gpt_char.cpp's train<Device, ...>(), included from there (GPT_CHAR_JOB_ONLY) - on tensors of
// trainkit::cuda: cuBLASLt for the GEMMs, cuDNN's fused attention for bf16/fp16 heads (trainkit's
// own attention kernels for fp32 and for attention dropout), trainkit's kernels for the rest. The
// batches go through pinned memory, so each copy to the GPU is one asynchronous DMA, and the loss
// stays on the GPU between --eval-every points: a step does not wait for the GPU. Under mpirun
// every process is a rank on its node's GPU number LOCAL_RANK; the gradients go over NCCL where
// this build has it, else over MPI (staged through the host). Exit code 77 without a CUDA device.
#include <cstdio>

#include <trainkit/cuda.cuh>  // everything + the CUDA backend, nccl, data_parallel<..., cuda>

#define GPT_CHAR_JOB_ONLY
#include "gpt_char.cpp"  // example::gpt<Device>, train_with<Device, Memory>(), gpt_main(), gpt_flags()

int main(int argc, char** argv) {
  return gpt_main("gpt_char_cuda", argc, argv, [&] {
    const auto f = gpt_flags(argc, argv);
    tk::dist::mpi comm;
    if (!tk::gpu::available()) {
      if (comm.rank() == 0) std::printf("SKIPPED: no CUDA device\n");
      return 77;
    }
    using pinned = tk::gpu::pinned_memory;
#if TRAINKIT_HAS_NCCL
    tk::dist::nccl grads(comm);  // on the local rank's GPU, which it makes current
    return train_with<tk::cuda, pinned>(comm, grads, f);
#else
    tk::dist::select_local_device();
    return train_with<tk::cuda, pinned>(comm, comm, f);
#endif
  });
}
