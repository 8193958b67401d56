// fashion_mnist_ddp - the CNN of fashion_mnist_cnn trained data-parallel over MPI processes, with
// optional gradient compression.
//
//   mpirun -np 2 build/examples/fashion_mnist_ddp --data /usr/share/datasets/fashion-mnist
//          --epochs 3 --batch 64 --compression int8         (one command line)
//   build/examples/fashion_mnist_ddp ...            (one process: MPI starts as a singleton)
//
// Every rank holds the whole data set (the files are small); a distributed_sampler gives rank r its
// own shard of each epoch's shuffled order, and the rank's data_loader builds batches of --batch
// samples from it, so each step trains on ranks x --batch samples in all. data_parallel averages
// the gradients over the ranks bucket by bucket while backward is still running, through the chosen
// compression (none, fp16, bf16, int8, sign_1bit; lossy ones with error feedback). Rank 0 prints
// per epoch: loss (mean over all ranks), test accuracy (each rank scores a slice of the test set),
// samples/s over all ranks, and the share of step time the communication thread was busy
// ("comm") and the share backward could not hide (finish() waiting: "exposed"). --overlap 0 reduces
// every bucket in finish() instead of during backward, to see what overlapping hides.
// --snapshot-dir: rank 0 writes the whole state (with every rank's error-feedback residuals and
// dropout stream) every --snapshot-every steps and when any rank gets SIGTERM/SIGINT; --resume
// restores it on every rank - on any number of ranks: a snapshot of N ranks resumes on M, the
// error-feedback residuals redistributed and the epoch continued from its global sample position.
// --stop-after K stops after K steps of this run as a signal would (snapshot, exit 75).
// --hierarchical 1: the gradients go through compression::hierarchical - fp32 through shared memory among
// the ranks of a host, --compression only between hosts (benchmarks/allreduce_netns.sh makes hosts).
// --metrics-port: rank r serves /metrics on port P + r. --tensorboard DIR: rank 0 writes its metrics (loss, learning rate, communication share ...) and the test accuracy
// per epoch as TensorBoard scalars. The CUDA build (fashion_mnist_ddp.cu -> fashion_mnist_ddp_cuda)
// runs the same job with one process per GPU; --comm nccl|mpi chooses its gradient transport.

#include "common/ddp_train.hpp"  // the training job, on either device

// OMP_WAIT_POLICY=passive and cores / local ranks threads unless the environment says otherwise:
// well-behaved on shared cores and under mpirun (trainkit/core/threads.hpp).
TRAINKIT_THREAD_DEFAULTS();

namespace tk = trainkit;
namespace dist = trainkit::dist;
namespace compression = trainkit::compression;

int main(int argc, char** argv) {
  return example::ddp_main("fashion_mnist_ddp", argc, argv, [&] {
    const auto f = example::ddp_flags(argc, argv);
    dist::mpi comm;
    bool stopped = false;
    if (f.num("hierarchical", 0, 1) != 0) {  // fp32 inside a host, compressed between hosts
      auto grads = compression::hierarchical<dist::mpi>::by_host(dist::mpi());
      if (comm.rank() == 0)
        std::printf("hierarchical: %d host(s) x %d rank(s)\n", grads.hosts(), grads.ranks_per_host());
      stopped = example::train_ddp_with<tk::cpu, tk::data::pageable_memory>(comm, grads, f);
    } else {
      stopped = example::train_ddp_with<tk::cpu, tk::data::pageable_memory>(comm, comm, f);
    }
    // A stop signal (snapshot written): 75, so that the scheduler requeues the job.
    return stopped ? example::exit_restart : 0;
  });
}
