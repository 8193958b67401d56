// trainkit/data/loader.hpp - mini-batches assembled by worker threads ahead of the training step:
// a bounded prefetch queue, one contiguous buffer per batch, a deterministic order, errors
// delivered to the caller and a clean shutdown.
//
// HOW IT WORKS. At the start of a pass (construction, set_epoch, set_state) the loader copies the
// sampler's remaining indices of the epoch; batch k is the samples at positions [k B, (k + 1) B)
// of that list, so its content never depends on which worker builds it or when. Workers claim
// batch numbers in increasing order, but only while fewer than `prefetch` batches are claimed and
// not yet handed out (the bound on memory); each builds its batch alone into fresh tensors and
// puts it in the slot k mod prefetch. next() waits for slot k, hands it out and frees the slot.
// An exception while building batch k (a corrupt sample, a transform) is stored in its slot and
// rethrown by the next() that would have returned batch k; the loader then goes on with batch
// k + 1. The destructor, set_epoch and set_state stop the workers (they check a flag between
// samples and while waiting for room) and join them, however full the queue is.
#pragma once

#include <algorithm>  // std::min
#include <atomic>
#include <chrono>    // std::chrono::steady_clock: wait_seconds
#include <concepts>  // std::convertible_to, std::copy_constructible, std::same_as
#include <condition_variable>
#include <cstddef>    // std::size_t, std::ptrdiff_t
#include <cstdint>    // std::int64_t, std::uint64_t
#include <cstring>    // std::memcpy
#include <exception>  // std::exception_ptr, std::rethrow_exception
#include <iterator>   // std::default_sentinel_t
#include <mutex>
#include <thread>
#include <type_traits>  // std::is_same_v: float images or int64 token ids
#include <utility>  // std::move
#include <vector>

#include "trainkit/backend/cpu/elementwise.hpp"   // host loops behind copy_: the data lives on the host
#include "trainkit/core/dtype.hpp"                // element
#include "trainkit/ops/elementwise.hpp"          // copy_, behind tensor::contiguous()
#include "trainkit/core/error.hpp"                // shape_error, value_error, index_error, usage_error
#include "trainkit/core/shape.hpp"                // index_t, shape, to_string
#include "trainkit/core/tensor.hpp"               // tensor
#include "trainkit/data/batch.hpp"                // batch, cursor_iterator
#include "trainkit/data/distributed_sampler.hpp"  // distributed_sampler (the default sampler)
#include "trainkit/data/dataset.hpp"              // indexable_dataset, tensor_dataset
#include "trainkit/data/transforms.hpp"           // any_transform, sample_rng, image_shape

namespace trainkit::data {

// ---- Which samples the loader reads (the data set: data/dataset.hpp) ----------------------------

/// Which indices the loader visits, and where it is in them. A model provides
///   const std::vector<index_t>& indices() const   - this epoch's indices, in visiting order
///   index_t position() const                      - how many of them are consumed
///   std::uint64_t epoch() const; void set_epoch(std::uint64_t)
///   void skip(index_t n)                          - consume n (the loader calls it per batch)
///   get_state() / set_state(state)                - for snapshots
/// distributed_sampler is the model (sequential_sampler(n) and shuffled_sampler(n, seed) make one
/// for a single process).
template <class S>
concept index_sampler = std::copy_constructible<S> &&
    requires(S& s, const S& cs, std::uint64_t e, index_t n) {
  { cs.indices() } -> std::convertible_to<const std::vector<index_t>&>;
  { cs.position() } -> std::convertible_to<index_t>;
  { cs.epoch() } -> std::convertible_to<std::uint64_t>;
  s.set_epoch(e);
  s.skip(n);
  s.set_state(cs.get_state());
};

// ---- Where batch buffers come from ---------------------------------------------------------------

/// Where the batch tensors are allocated. A model provides `static constexpr bool pinned` and
/// `template <element T> static tensor<T> empty(shape)` (called from worker threads).
template <class M>
concept batch_memory = requires(shape s) {
  { M::pinned } -> std::convertible_to<bool>;
  { M::template empty<float>(s) } -> std::same_as<tensor<float>>;
  { M::template empty<std::int64_t>(s) } -> std::same_as<tensor<std::int64_t>>;
};

/// A batch_memory that binds the worker threads to the context of the thread that starts them (the
/// CUDA model: the device current there, so that a rank's pinned buffers and their events belong to
/// its GPU, not to device 0): `worker_context()` is read on the thread that starts the workers and
/// `enter_worker(context)` is the first call on each worker.
template <class M>
concept binds_workers = requires { M::enter_worker(M::worker_context()); };

/// Ordinary (pageable) host memory from allocator<cpu>: the CPU model. The CUDA backend supplies
/// a pinned (page-locked, cudaHostAlloc) model, so that copying a batch to the GPU can be
/// asynchronous; the loader is the same, only this parameter changes.
struct pageable_memory {
  static constexpr bool pinned = false;
  template <element T>
  static tensor<T> empty(shape sizes) {
    return tensor<T>::empty(std::move(sizes));
  }
};

// ---- The loader ----------------------------------------------------------------------------------

/// How data_loader batches and prefetches.
/// `data_loader loader(train, sampler, {.batch_size = 128, .num_workers = 2, .transform = augment})`
struct loader_options {
  index_t batch_size = 1;   ///< >= 1
  index_t num_workers = 0;  ///< worker threads; 0 builds each batch in next(), in the caller's thread
  /// Capacity of the prefetch queue: batches claimed by workers (being built or ready) and not yet
  /// handed out. 0 means 2 * num_workers (at least 1). Bounds the memory to about prefetch batches.
  index_t prefetch = 0;
  bool drop_last = false;     ///< leave out a last batch smaller than batch_size
  std::uint64_t seed = 0;     ///< seed of the transform's random draws (see data/transforms.hpp)
  any_transform transform{};  ///< applied to every sample (empty: none); samples must then be [C, H, W]
};

/// Mini-batches of a dataset in the order of a sampler, built ahead by worker threads. next()
/// returns batch position() of the current pass: x [B, ...] (the sample shape after the transform)
/// and y [B], each one fresh contiguous buffer, B = batch_size (or fewer for the last batch). The
/// batches and their contents depend only on (dataset, sampler state, batch_size, drop_last, seed,
/// transform) - never on num_workers or timing. Sample i of epoch e is transformed with
/// sample_rng{seed, e, i, 0}, as transform_images does. Only one thread may call next().
///
/// Resume: the sampler's position counts the samples handed out (the loader skips them as it
/// hands out batches); store get_state() after a step and restore with set_state(), which starts a
/// pass from that position.
///
///   distributed_sampler sampler(train.size(), {.num_replicas = world, .rank = rank, .seed = 1});
///   data_loader loader(train, sampler, {.batch_size = 128, .num_workers = 2});
///   for (std::uint64_t e = 0; e < epochs; ++e) {
///     loader.set_epoch(e);
///     for (auto& b : loader) step(b.x, b.y);
///   }
/// \tparam Dataset an indexable_dataset (tensor_dataset for tensors in memory)
/// \tparam Sampler an index_sampler
/// \tparam Memory a batch_memory policy (pageable_memory on the CPU)
template <indexable_dataset Dataset, index_sampler Sampler = distributed_sampler,
          batch_memory Memory = pageable_memory>
class data_loader {
 public:
  using sampler_state = decltype(std::declval<const Sampler&>().get_state());
  using input_type = dataset_input_t<Dataset>;  ///< float, or std::int64_t for token ids
  using batch_type = batch<input_type>;

  /// Range-for support: hands out next() until the end of the pass.
  using iterator = detail::cursor_iterator<data_loader, batch_type>;

  /// value_error for batch_size < 1, num_workers < 0, prefetch < 0 or a sampler over more samples
  /// than the dataset has; shape_error when a transform does not accept the sample shape. No
  /// thread starts before the first next().
  data_loader(Dataset dataset, Sampler sampler, loader_options options)
      : dataset_(std::move(dataset)), sampler_(std::move(sampler)), o_(std::move(options)) {
    TRAINKIT_CHECK(o_.batch_size >= 1, value_error, "data_loader",
                   "batch_size must be >= 1, got " << o_.batch_size);
    TRAINKIT_CHECK(o_.num_workers >= 0, value_error, "data_loader",
                   "num_workers must be >= 0, got " << o_.num_workers);
    TRAINKIT_CHECK(o_.prefetch >= 0, value_error, "data_loader",
                   "prefetch must be >= 0, got " << o_.prefetch);
    if constexpr (requires { sampler_.dataset_size(); })
      TRAINKIT_CHECK(static_cast<index_t>(sampler_.dataset_size()) <= static_cast<index_t>(dataset_.size()),
                     value_error, "data_loader",
                     "the sampler covers " << sampler_.dataset_size() << " samples but the dataset has only "
                                           << dataset_.size());
    capacity_ = o_.prefetch > 0 ? o_.prefetch : std::max<index_t>(1, 2 * o_.num_workers);
    in_shape_ = shape(dataset_.sample_shape());
    label_shape_ = dataset_label_shape(dataset_);
    label_row_ = trainkit::numel(label_shape_);
    out_shape_ = in_shape_;
    constexpr bool images = std::is_same_v<input_type, float>;
    constexpr bool tokens = std::is_same_v<input_type, std::int64_t>;
    TRAINKIT_CHECK(!o_.transform || images, usage_error, "data_loader",
                   "a transform needs float samples (images); this dataset's are "
                       << (tokens ? "int64 token ids" : "not float"));
    if (o_.transform) {
      in_image_ = to_image_shape(in_shape_, "data_loader");
      out_shape_ = o_.transform.output_shape(in_image_).to_shape();
    }
    in_row_ = trainkit::numel(in_shape_);
    out_row_ = trainkit::numel(out_shape_);
    slots_.resize(static_cast<std::size_t>(capacity_));
    plan();
  }

  data_loader(const data_loader&) = delete;
  data_loader& operator=(const data_loader&) = delete;

  /// Stops and joins the workers, however full the queue is (batches not handed out are dropped).
  ~data_loader() { stop_workers(); }

  // ---- epochs and resume ---------------------------------------------------------------------------

  /// Starts epoch e of the sampler from its position 0 (stops the workers of the current pass).
  void set_epoch(std::uint64_t e) {
    stop_workers();
    sampler_.set_epoch(e);
    plan();
  }
  std::uint64_t epoch() const noexcept { return epoch_; }

  /// The sampler's state: its epoch and the samples handed out so far in it.
  sampler_state get_state() const { return sampler_.get_state(); }
  /// Restores a state from get_state() and starts a pass from there.
  void set_state(const sampler_state& s) {
    stop_workers();
    sampler_.set_state(s);
    plan();
  }

  const Sampler& sampler() const noexcept { return sampler_; }
  const Dataset& dataset() const noexcept { return dataset_; }
  const loader_options& options() const noexcept { return o_; }

  // ---- batches ---------------------------------------------------------------------------------------

  /// Batches in this pass: the sampler's indices from its position at the start of the pass (the
  /// whole epoch unless resumed mid-epoch), ceil(n / B) or floor(n / B) with drop_last.
  index_t size() const noexcept { return n_batches_; }
  /// Batches of this pass handed out (or failed) so far.
  index_t position() const noexcept { return consumed_; }
  bool has_next() const noexcept { return consumed_ < n_batches_; }

  /// Sizes of one sample as it appears in a batch (after the transform).
  const shape& sample_shape() const noexcept { return out_shape_; }
  /// The queue's capacity in batches.
  index_t prefetch() const noexcept { return capacity_; }

  /// Total seconds next() has spent waiting for a batch (with num_workers = 0: building it) since
  /// construction. Monitoring exports it as the data-loader wait time; it may be read from another
  /// thread.
  double wait_seconds() const noexcept { return wait_seconds_.load(std::memory_order_relaxed); }

  /// Batch position() (then position() + 1). Rethrows the exception of a worker that failed to
  /// build it (the batch's samples count as consumed; the next call returns the following batch).
  /// usage_error once the pass is done.
  batch_type next() {
    TRAINKIT_CHECK(has_next(), usage_error, "data_loader::next",
                   "epoch " << epoch_ << " is done (" << n_batches_
                            << " batches in this pass); call set_epoch() to start another");
    const index_t k = consumed_;
    slot got;
    const auto t0 = std::chrono::steady_clock::now();
    if (o_.num_workers == 0) {
      build(k, got);
    } else {
      start_workers();
      std::unique_lock lock(mu_);
      slot& s = slots_[static_cast<std::size_t>(k % capacity_)];
      ready_cv_.wait(lock, [&] { return s.ready && s.k == k; });
      got = std::move(s);
      s = slot{};
      ++consumed_;
    }
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - t0;
    wait_seconds_.store(wait_seconds_.load(std::memory_order_relaxed) + waited.count(),
                        std::memory_order_relaxed);
    if (o_.num_workers == 0) {
      ++consumed_;
    } else {
      work_cv_.notify_one();                        // a slot is free: one more batch may be claimed
      if (consumed_ == n_batches_) stop_workers();  // they are done; join them now
    }
    sampler_.skip(samples_in(k));
    if (got.error) std::rethrow_exception(got.error);
    return std::move(got.data);
  }

  /// The batches from position() to the end of the pass (each step calls next()).
  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  struct slot {
    index_t k = -1;
    bool ready = false;
    batch_type data;
    std::exception_ptr error;
  };

  index_t samples_in(index_t k) const noexcept {
    return std::min(o_.batch_size, n_samples_ - k * o_.batch_size);
  }

  /// The pass from the sampler's position: copies its remaining indices (workers read them
  /// without a lock, so they never change while workers run).
  void plan() {
    const std::vector<index_t>& all = sampler_.indices();
    const auto from = static_cast<std::size_t>(sampler_.position());
    order_.assign(all.begin() + static_cast<std::ptrdiff_t>(std::min(from, all.size())), all.end());
    n_samples_ = static_cast<index_t>(order_.size());
    n_batches_ = o_.drop_last ? n_samples_ / o_.batch_size : (n_samples_ + o_.batch_size - 1) / o_.batch_size;
    epoch_ = sampler_.epoch();
    consumed_ = 0;
    next_claim_ = 0;
    for (slot& s : slots_) s = slot{};
  }

  /// Builds batch k into out (data, or the exception that stopped it). False when stopped midway.
  bool build(index_t k, slot& out) const {
    out.k = k;
    try {
      const index_t b = samples_in(k);
      shape xs{b};
      xs.insert(xs.end(), out_shape_.begin(), out_shape_.end());
      shape ys{b};
      ys.insert(ys.end(), label_shape_.begin(), label_shape_.end());
      batch_type r{Memory::template empty<input_type>(std::move(xs)), Memory::template empty<std::int64_t>(std::move(ys))};
      input_type* x = r.x.data();
      std::int64_t* y = r.y.data();
      std::vector<float> scratch(o_.transform ? static_cast<std::size_t>(in_row_) : 0);
      const index_t n = dataset_.size();
      for (index_t i = 0; i < b; ++i) {
        if (stop_.load(std::memory_order_relaxed)) return false;
        const index_t idx = order_[static_cast<std::size_t>(k * o_.batch_size + i)];
        TRAINKIT_CHECK(idx >= 0 && idx < n, index_error, "data_loader",
                       "the sampler gave index " << idx << " for a dataset of " << n << " samples");
        if constexpr (std::is_same_v<input_type, float>) {  // images only (checked at construction)
          if (o_.transform) {
            dataset_.get(idx, scratch.data(), y + i * label_row_);
            o_.transform(scratch.data(), in_image_, x + i * out_row_,
                         sample_rng{o_.seed, epoch_, static_cast<std::uint64_t>(idx), 0});
            continue;
          }
        }
        dataset_.get(idx, x + i * out_row_, y + i * label_row_);
      }
      out.data = std::move(r);
    } catch (...) {
      out.error = std::current_exception();
    }
    out.ready = true;
    return true;
  }

  void worker() {
    for (;;) {
      index_t k;
      {
        std::unique_lock lock(mu_);
        work_cv_.wait(lock, [&] {
          return stop_.load(std::memory_order_relaxed) || next_claim_ >= n_batches_ ||
                 next_claim_ < consumed_ + capacity_;
        });
        if (stop_.load(std::memory_order_relaxed) || next_claim_ >= n_batches_) return;
        k = next_claim_++;
      }
      slot result;
      if (!build(k, result)) return;
      {
        std::lock_guard lock(mu_);
        slots_[static_cast<std::size_t>(k % capacity_)] = std::move(result);
      }
      ready_cv_.notify_one();
    }
  }

  void start_workers() {
    if (!threads_.empty() || next_claim_ >= n_batches_) return;
    try {
      if constexpr (binds_workers<Memory>) {
        const auto context = Memory::worker_context();
        for (index_t w = 0; w < o_.num_workers; ++w)
          threads_.emplace_back([this, context] {
            Memory::enter_worker(context);
            worker();
          });
      } else {
        for (index_t w = 0; w < o_.num_workers; ++w) threads_.emplace_back([this] { worker(); });
      }
    } catch (...) {
      stop_workers();  // the threads that did start
      throw;
    }
  }

  void stop_workers() noexcept {
    if (threads_.empty()) return;
    {
      std::lock_guard lock(mu_);
      stop_.store(true, std::memory_order_relaxed);
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    stop_.store(false, std::memory_order_relaxed);
  }

  Dataset dataset_;
  Sampler sampler_;
  loader_options o_;
  index_t capacity_ = 1;
  shape in_shape_, out_shape_, label_shape_;
  image_shape in_image_;
  index_t in_row_ = 0, out_row_ = 0, label_row_ = 1;

  // The pass: fixed while workers run.
  std::vector<index_t> order_;
  index_t n_samples_ = 0;
  index_t n_batches_ = 0;
  std::uint64_t epoch_ = 0;

  // Shared with the workers, under mu_.
  std::mutex mu_;
  std::condition_variable work_cv_;   // workers: room in the queue, or stop
  std::condition_variable ready_cv_;  // next(): a batch is ready
  std::vector<slot> slots_;
  index_t next_claim_ = 0;
  index_t consumed_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;

  std::atomic<double> wait_seconds_{0.0};
};

/// A loaded dataset (float images and labels tensors) is read through tensor_dataset.
template <class Sampler>
data_loader(basic_dataset<float>, Sampler, loader_options) -> data_loader<tensor_dataset, Sampler>;

}  // namespace trainkit::data
