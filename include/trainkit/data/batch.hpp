// trainkit/data/batch.hpp - a mini-batch, and the range-for iterator of every batch source
// (batch_iterator, data_loader): anything with has_next() and next() is a range of batches.
#pragma once

#include <cstddef>   // std::ptrdiff_t
#include <cstdint>   // std::int64_t
#include <iterator>  // std::default_sentinel_t, std::input_iterator_tag

#include "trainkit/core/dtype.hpp"   // element
#include "trainkit/core/tensor.hpp"  // tensor

namespace trainkit::data {

/// One mini-batch: inputs [B, ...] and labels [B], each a fresh contiguous tensor (B is the batch
/// size, or fewer samples for the last batch of an epoch).
/// \tparam T element type of the inputs
template <element T>
struct batch {
  tensor<T> x;
  tensor<std::int64_t> y;
};

namespace detail {

/// An input iterator that hands out source->next() until source->has_next() is false; compares
/// equal to std::default_sentinel at the end. The previous batch is dropped before the next one is
/// built, so a range-for holds one batch at a time.
/// \tparam Source has bool has_next() and Batch next()
template <class Source, class Batch>
class cursor_iterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;

  cursor_iterator() = default;
  explicit cursor_iterator(Source* source) : source_(source) { advance(); }
  Batch& operator*() const { return current_; }
  Batch* operator->() const { return &current_; }
  cursor_iterator& operator++() {
    advance();
    return *this;
  }
  void operator++(int) { advance(); }
  friend bool operator==(const cursor_iterator& it, std::default_sentinel_t) { return it.done_; }

 private:
  void advance() {
    current_ = {};
    done_ = !(source_ && source_->has_next());
    if (!done_) current_ = source_->next();
  }
  Source* source_ = nullptr;
  mutable Batch current_;
  bool done_ = true;
};

}  // namespace detail

}  // namespace trainkit::data
