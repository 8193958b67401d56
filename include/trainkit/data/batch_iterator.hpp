// trainkit/data/batch_iterator.hpp - shuffled mini-batches over an (inputs, labels) pair of tensors,
// reproducible per epoch and resumable mid-epoch.
#pragma once

#include <algorithm>  // std::min
#include <cstddef>    // std::ptrdiff_t, std::size_t
#include <cstdint>    // std::int64_t, std::uint64_t
#include <cstring>    // std::memcpy
#include <iterator>   // std::default_sentinel_t
#include <numeric>    // std::iota
#include <utility>    // std::move
#include <vector>

#include "trainkit/backend/cpu/elementwise.hpp"  // host loops behind copy_: the data lives on the host
#include "trainkit/config.hpp"                   // TRAINKIT_HAS_OPENMP
#include "trainkit/core/dtype.hpp"               // element
#include "trainkit/ops/elementwise.hpp"         // copy_, behind tensor::contiguous()/to_vector()
#include "trainkit/core/error.hpp"               // shape_error, value_error, index_error, usage_error
#include "trainkit/core/shape.hpp"               // index_t, shape, to_string
#include "trainkit/core/tensor.hpp"              // tensor
#include "trainkit/data/batch.hpp"               // batch, cursor_iterator
#include "trainkit/data/permutation.hpp"         // epoch_permutation

namespace trainkit::data {

/// Mini-batches over samples x[i], y[i] (i along dim 0). Each epoch visits every sample once, in
/// the order epoch_permutation(N, seed, epoch) when shuffling (see data/permutation.hpp for the
/// exact rule) or 0..N-1 otherwise; batch k holds the samples at positions [k B, (k+1) B) of that
/// order. The iterator is a cursor: next() and range-for hand out the batches from position() to
/// the end of the epoch, and set_epoch(e) starts epoch e at batch 0. To resume, store
/// {epoch(), position()} (or get_state()) after a training step and restore with set_epoch + seek.
///
///   batch_iterator it(train.images, train.labels, 64, true, seed);
///   for (std::uint64_t e = 0; e < epochs; ++e) {
///     it.set_epoch(e);
///     for (auto& b : it) step(b.x, b.y);
///   }
/// \tparam T element type of the inputs
template <element T>
class batch_iterator {
 public:
  /// What a snapshot stores to resume exactly where the run stopped.
  struct state {
    std::uint64_t seed = 0;
    std::uint64_t epoch = 0;
    index_t position = 0;  ///< batches of this epoch already handed out
    friend constexpr bool operator==(const state&, const state&) = default;
  };

  /// Range-for support: hands out next() until the end of the epoch.
  using iterator = detail::cursor_iterator<batch_iterator, batch<T>>;

  /// x: [N, ...] inputs; y: [N] labels; batch_size >= 1. shuffle = false keeps the order 0..N-1
  /// (seed unused). drop_last = true leaves out a last batch smaller than batch_size. The tensors
  /// are shared, not copied (a non-contiguous x or y is made contiguous once). Starts at epoch 0.
  batch_iterator(const tensor<T>& x, const tensor<std::int64_t>& y, index_t batch_size, bool shuffle,
                 std::uint64_t seed, bool drop_last = false)
      : batch_size_(batch_size), shuffle_(shuffle), drop_last_(drop_last), seed_(seed) {
    TRAINKIT_CHECK(x.defined() && y.defined(), value_error, "batch_iterator",
                   "inputs and labels must be defined");
    TRAINKIT_CHECK(x.dim() >= 1, shape_error, "batch_iterator",
                   "inputs need a sample dimension, got sizes " << to_string(x.sizes()));
    TRAINKIT_CHECK(y.dim() == 1, shape_error, "batch_iterator",
                   "labels must be 1-D [N], got sizes " << to_string(y.sizes()));
    TRAINKIT_CHECK(x.size(0) == y.size(0), shape_error, "batch_iterator",
                   "inputs " << to_string(x.sizes()) << " and labels " << to_string(y.sizes())
                             << " hold different numbers of samples");
    TRAINKIT_CHECK(batch_size >= 1, value_error, "batch_iterator",
                   "batch_size must be >= 1, got " << batch_size);
    x_ = x.contiguous();
    y_ = y.contiguous();
    n_ = x.size(0);
    sample_shape_.assign(x.sizes().begin() + 1, x.sizes().end());
    row_ = trainkit::numel(sample_shape_);
    make_order();
  }

  // ---- epoch and position --------------------------------------------------------------------

  /// Starts epoch e: recomputes the order from (seed, e) and rewinds to batch 0.
  void set_epoch(std::uint64_t e) {
    epoch_ = e;
    position_ = 0;
    make_order();
  }
  std::uint64_t epoch() const noexcept { return epoch_; }

  /// Batches of this epoch already handed out; the next() batch is batch position().
  index_t position() const noexcept { return position_; }

  /// Moves to batch k of this epoch (0 <= k <= size(); size() means the epoch is done).
  void seek(index_t k) {
    TRAINKIT_CHECK(k >= 0 && k <= size(), index_error, "batch_iterator::seek",
                   "batch " << k << " is out of range for an epoch of " << size() << " batches");
    position_ = k;
  }

  state get_state() const noexcept { return {seed_, epoch_, position_}; }
  /// Restores a state from get_state() (seed, epoch and position); the order is recomputed.
  void set_state(const state& s) {
    seed_ = s.seed;
    set_epoch(s.epoch);
    seek(s.position);
  }

  // ---- sizes ---------------------------------------------------------------------------------

  /// Batches per epoch: ceil(N / B), or floor(N / B) with drop_last.
  index_t size() const noexcept {
    return drop_last_ ? n_ / batch_size_ : (n_ + batch_size_ - 1) / batch_size_;
  }
  index_t samples() const noexcept { return n_; }
  index_t batch_size() const noexcept { return batch_size_; }
  bool shuffle() const noexcept { return shuffle_; }
  bool drop_last() const noexcept { return drop_last_; }
  std::uint64_t seed() const noexcept { return seed_; }

  /// The sample indices of this epoch, in visiting order.
  const std::vector<index_t>& order() const noexcept { return order_; }

  // ---- batches -------------------------------------------------------------------------------

  bool has_next() const noexcept { return position_ < size(); }

  /// The batch at position() (then position() + 1); usage_error once the epoch is done.
  batch<T> next() {
    TRAINKIT_CHECK(
        has_next(), usage_error, "batch_iterator::next",
        "epoch " << epoch_ << " is done (" << size() << " batches); call set_epoch() to start another");
    return get(position_++);
  }

  /// Batch k of this epoch, without moving the position.
  batch<T> get(index_t k) const {
    TRAINKIT_CHECK(k >= 0 && k < size(), index_error, "batch_iterator::get",
                   "batch " << k << " is out of range for an epoch of " << size() << " batches");
    const index_t start = k * batch_size_;
    const index_t b = std::min(batch_size_, n_ - start);
    shape xs{b};
    xs.insert(xs.end(), sample_shape_.begin(), sample_shape_.end());
    batch<T> out{tensor<T>::empty(std::move(xs)), tensor<std::int64_t>::empty({b})};
    const index_t* idx = order_.data() + start;
    const T* src = x_.data();
    T* dst = out.x.data();
    const std::size_t row_bytes = static_cast<std::size_t>(row_) * sizeof(T);
    const index_t row = row_;
    // Gathering whole samples: one memcpy each, spread over threads when the batch is large.
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (static_cast <std::size_t>(b) * row_bytes > \
                                              (std::size_t(1) << 18))
#endif
    for (index_t i = 0; i < b; ++i)
      if (row_bytes) std::memcpy(dst + i * row, src + idx[i] * row, row_bytes);
    const std::int64_t* ys = y_.data();
    std::int64_t* yd = out.y.data();
    for (index_t i = 0; i < b; ++i) yd[i] = ys[idx[i]];
    return out;
  }

  /// The batches from position() to the end of the epoch (each step calls next()).
  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  void make_order() {
    if (shuffle_) {
      order_ = epoch_permutation(n_, seed_, epoch_);
    } else if (static_cast<index_t>(order_.size()) != n_) {
      order_.resize(static_cast<std::size_t>(n_));
      std::iota(order_.begin(), order_.end(), index_t(0));
    }
  }

  tensor<T> x_;
  tensor<std::int64_t> y_;
  index_t n_ = 0;
  shape sample_shape_;
  index_t row_ = 0;
  index_t batch_size_;
  bool shuffle_;
  bool drop_last_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  index_t position_ = 0;
  std::vector<index_t> order_;
};

}  // namespace trainkit::data
