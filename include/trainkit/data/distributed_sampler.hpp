// trainkit/data/distributed_sampler.hpp - which dataset indices each rank visits in an epoch, and
// where it is in them (PyTorch's DistributedSampler, resumable).
//
// THE RULE (as torch.utils.data.DistributedSampler; N samples, R replicas, rank r):
//   per_rank = drop_last && N % R != 0 ? floor(N / R) : ceil(N / R);   total = per_rank * R
//   order    = shuffle ? epoch_permutation(N, seed, epoch) : [0, 1, ..., N-1]
//              (data/permutation.hpp: the same on every rank, since it depends only on N, seed, epoch)
//   drop_last: order = order[0, total)                 - the tail is left out this epoch
//   otherwise: order += order[0, total - N) repeated   - the first indices pad it to total
//   rank r visits order[r], order[r + R], order[r + 2R], ...    (per_rank indices)
// So across ranks every sample is visited once per epoch, plus total - N padded repeats (or minus
// the N - total dropped ones). The order differs from torch's, which draws from torch.randperm.
//
// RESUME ON ANOTHER WORLD SIZE. Ranks in step (every DDP rank takes the same number of samples)
// have together consumed a prefix of the epoch's order: with every rank at position p, exactly
// order[0, p R). The state stores that (epoch, position, num_replicas, offset), so set_state() on
// a sampler with another num_replicas continues the epoch from global position g = offset + p R_old:
// the rest of the epoch, order[g, N), is sharded over the new R by the same rule (rank r visits
// order[g + r], order[g + r + R], ...; per_rank = drop_last ? floor((N - g) / R) : ceil((N - g) / R),
// padding from the start of the order). No sample of the epoch is skipped or repeated (except the
// < R the rule leaves out with drop_last, or pads without it); the next set_epoch() starts at 0.
#pragma once

#include <algorithm>  // std::min
#include <array>
#include <cstdint>  // std::uint64_t
#include <numeric>  // std::iota
#include <string_view>
#include <vector>

#include "trainkit/core/error.hpp"        // value_error, index_error, usage_error, TRAINKIT_CHECK
#include "trainkit/core/shape.hpp"        // index_t
#include "trainkit/data/permutation.hpp"  // epoch_permutation

namespace trainkit::data {

/// How a distributed_sampler shards and orders the dataset.
/// `distributed_sampler(n, {.num_replicas = comm.size(), .rank = comm.rank(), .seed = 42})`
struct distributed_sampler_options {
  index_t num_replicas = 1;  ///< >= 1: the world size of data parallelism
  index_t rank = 0;          ///< in [0, num_replicas)
  bool shuffle = true;       ///< per-epoch seeded permutation; false keeps 0..N-1
  std::uint64_t seed = 0;    ///< must be the same on every rank
  bool drop_last = false;    ///< leave out the tail instead of padding with repeats
};

/// The indices one rank visits in each epoch (the rule at the top of this header) and a cursor in
/// them: next() hands them out one by one, skip(n) consumes n at once (a loader takes a batch),
/// get_state()/set_state() save and restore {epoch, position} for a bit-exact resume.
///
///   distributed_sampler s(train.size(), {.num_replicas = 2, .rank = r, .seed = 1});
///   for (e = 0; e < epochs; ++e) { s.set_epoch(e); while (s.has_next()) use(s.next()); }
class distributed_sampler {
 public:
  /// Where the sampler is: snapshots store it. position = indices of this epoch already consumed
  /// by this rank; num_replicas and offset say how the epoch was sharded (offset: the global
  /// position the sharding started from, nonzero in an epoch resumed on another world size).
  struct state {
    std::uint64_t epoch = 0;
    index_t position = 0;
    index_t num_replicas = 1;
    index_t offset = 0;
    friend constexpr bool operator==(const state&, const state&) = default;
    static constexpr std::array<std::string_view, 4> snapshot_field_names = {"epoch", "position", "num_replicas",
                                                                             "offset"};
  };

  /// dataset_size >= 0 samples. value_error for num_replicas < 1; index_error for a rank outside
  /// [0, num_replicas). Starts at epoch 0, position 0.
  explicit distributed_sampler(index_t dataset_size, const distributed_sampler_options& o = {})
      : n_(dataset_size), o_(o) {
    TRAINKIT_CHECK(dataset_size >= 0, value_error, "distributed_sampler",
                   "dataset_size must be >= 0, got " << dataset_size);
    TRAINKIT_CHECK(o.num_replicas >= 1, value_error, "distributed_sampler",
                   "num_replicas must be >= 1, got " << o.num_replicas);
    TRAINKIT_CHECK(o.rank >= 0 && o.rank < o.num_replicas, index_error, "distributed_sampler",
                   "rank " << o.rank << " is outside [0, " << o.num_replicas
                           << ") for num_replicas = " << o.num_replicas);
    make_indices();
  }

  // ---- epoch and position ------------------------------------------------------------------------

  /// Starts epoch e (the permutation of (seed, e)) at position 0. Every rank must call it with the
  /// same e, as with torch's set_epoch; without it every epoch repeats epoch 0's order.
  void set_epoch(std::uint64_t e) {
    epoch_ = e;
    position_ = 0;
    offset_ = 0;
    make_indices();
  }
  std::uint64_t epoch() const noexcept { return epoch_; }

  /// Indices of this epoch already consumed; the next one is indices()[position()].
  index_t position() const noexcept { return position_; }
  /// Indices left in this epoch.
  index_t remaining() const noexcept { return per_rank_ - position_; }

  /// Moves to position p of this epoch (0 <= p <= size()).
  void seek(index_t p) {
    TRAINKIT_CHECK(p >= 0 && p <= per_rank_, index_error, "distributed_sampler::seek",
                   "position " << p << " is outside [0, " << per_rank_ << "] (rank " << o_.rank << " has "
                               << per_rank_ << " indices per epoch)");
    position_ = p;
  }

  /// Consumes the next n indices (0 <= n <= remaining()).
  void skip(index_t n) {
    TRAINKIT_CHECK(n >= 0 && n <= remaining(), index_error, "distributed_sampler::skip",
                   "cannot skip " << n << " indices at position " << position_ << " of " << per_rank_
                                  << " (epoch " << epoch_ << ", " << remaining() << " left)");
    position_ += n;
  }

  state get_state() const noexcept { return {epoch_, position_, o_.num_replicas, offset_}; }
  /// Restores a state from get_state(); the order is recomputed from (seed, epoch). A state of
  /// another num_replicas (a snapshot of another world size) continues the epoch from its global
  /// position (see the top of this file); index_error for a state that fits no sampler of this
  /// dataset size.
  void set_state(const state& s) {
    TRAINKIT_CHECK(s.num_replicas >= 1 && s.offset >= 0 && s.offset <= n_,
                   index_error, "distributed_sampler::set_state",
                   "num_replicas " << s.num_replicas << ", offset " << s.offset << " do not fit a dataset of " << n_
                                   << " samples");
    const index_t old_per_rank = per_rank_of(s.offset, s.num_replicas);
    TRAINKIT_CHECK(s.position >= 0 && s.position <= old_per_rank, index_error, "distributed_sampler::set_state",
                   "position " << s.position << " is outside [0, " << old_per_rank << "] of epoch " << s.epoch
                               << " (" << s.num_replicas << " replicas from offset " << s.offset << ")");
    epoch_ = s.epoch;
    if (s.num_replicas == o_.num_replicas) {
      offset_ = s.offset;
      position_ = s.position;
    } else {  // another world size: the rest of the epoch from its global position, sharded anew
      offset_ = std::min(s.offset + s.position * s.num_replicas, n_);  // past n_: only padding was left
      position_ = 0;
    }
    make_indices();
  }

  /// Samples of this epoch consumed over all ranks (every rank at this rank's position): the
  /// global position a resume on another world size continues from.
  index_t global_position() const noexcept { return offset_ + position_ * o_.num_replicas; }

  // ---- indices -----------------------------------------------------------------------------------

  bool has_next() const noexcept { return position_ < per_rank_; }

  /// The index at position() (then position() + 1); usage_error once the epoch is done.
  index_t next() {
    TRAINKIT_CHECK(
        has_next(), usage_error, "distributed_sampler::next",
        "epoch " << epoch_ << " is done (" << per_rank_ << " indices); call set_epoch() to start another");
    return indices_[static_cast<std::size_t>(position_++)];
  }

  /// This rank's indices of this epoch, in visiting order (size() of them, from position 0).
  const std::vector<index_t>& indices() const noexcept { return indices_; }

  // ---- sizes and settings ------------------------------------------------------------------------

  /// Indices per epoch on this rank (torch's num_samples).
  index_t size() const noexcept { return per_rank_; }
  /// Indices per epoch over all ranks: size() * num_replicas() (from offset() on).
  index_t total_size() const noexcept { return per_rank_ * o_.num_replicas; }
  index_t dataset_size() const noexcept { return n_; }
  index_t num_replicas() const noexcept { return o_.num_replicas; }
  index_t rank() const noexcept { return o_.rank; }
  bool shuffle() const noexcept { return o_.shuffle; }
  bool drop_last() const noexcept { return o_.drop_last; }
  std::uint64_t seed() const noexcept { return o_.seed; }
  /// The global position this epoch's sharding started from (0 unless resumed on another world size).
  index_t offset() const noexcept { return offset_; }

 private:
  /// Indices per rank of an epoch sharded over r replicas from global position g.
  index_t per_rank_of(index_t g, index_t r) const noexcept {
    const index_t m = n_ - g;
    if (m <= 0) return 0;
    return o_.drop_last && m % r != 0 ? m / r : (m + r - 1) / r;
  }

  void make_indices() {
    std::vector<index_t> order;
    if (o_.shuffle) {
      order = epoch_permutation(n_, o_.seed, epoch_);
    } else {
      order.resize(static_cast<std::size_t>(n_));
      std::iota(order.begin(), order.end(), index_t(0));
    }
    const index_t r = o_.num_replicas;
    per_rank_ = per_rank_of(offset_, r);
    indices_.resize(static_cast<std::size_t>(per_rank_));
    // Position j of the padded order is order[j mod N]: the padding repeats the first indices (as
    // many rounds as needed when N < R - 1).
    for (index_t k = 0; k < per_rank_; ++k) {
      const index_t j = offset_ + o_.rank + k * r;
      indices_[static_cast<std::size_t>(k)] = order[static_cast<std::size_t>(j < n_ ? j : j % n_)];
    }
  }

  index_t n_;
  distributed_sampler_options o_;
  index_t per_rank_ = 0;
  std::uint64_t epoch_ = 0;
  index_t position_ = 0;
  index_t offset_ = 0;
  std::vector<index_t> indices_;
};

/// A single-process sampler visiting 0..n-1 in order each epoch.
inline distributed_sampler sequential_sampler(index_t n) {
  return distributed_sampler(n, {.num_replicas = 1, .rank = 0, .shuffle = false});
}

/// A single-process sampler visiting epoch_permutation(n, seed, epoch) each epoch.
inline distributed_sampler shuffled_sampler(index_t n, std::uint64_t seed) {
  return distributed_sampler(n, {.num_replicas = 1, .rank = 0, .shuffle = true, .seed = seed});
}

}  // namespace trainkit::data
