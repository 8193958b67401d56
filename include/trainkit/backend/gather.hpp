// trainkit/backend/gather.hpp - indexed row copies (embedding lookups and their gradients) and
// one-hot targets (the class-index side of the losses).
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "trainkit/config.hpp"
#include "trainkit/core/device.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::backend {

/// What an index-consuming kernel checks, and what its error names when an index is bad: a
/// class index in [0, range) or ignore_index (cross_entropy, nll_loss), or a row in [0, range)
/// (embedding). Plain data, so a kernel can take it by value and copy it into a device error
/// record; op and what must be string literals (their addresses are read back on the host).
struct index_check {
  static constexpr int max_dims = 8;
  enum kind_t : int { class_index, row_index };
  kind_t kind = class_index;
  const char* op = "";
  const char* what = "";            ///< class_index: the input's name ("logits", "log_probs")
  std::int64_t range = 0;           ///< classes or num_embeddings
  std::int64_t ignore_index = -1;   ///< class_index only
  int index_dims = 0, other_dims = 0;
  std::int64_t index_sizes[max_dims] = {};  ///< the index tensor's sizes (target, indices)
  std::int64_t other_sizes[max_dims] = {};  ///< the input's (class_index) or the weight's sizes

  /// False when a shape has more than max_dims dimensions: the caller checks on the host.
  static bool fits(const shape& index, const shape& other) noexcept {
    return index.size() <= std::size_t(max_dims) && other.size() <= std::size_t(max_dims);
  }
  TRAINKIT_HD bool bad(std::int64_t v) const noexcept {
    return (kind != class_index || v != ignore_index) && (v < 0 || v >= range);
  }
  static index_check classes(const char* op, const char* what, std::int64_t classes, std::int64_t ignore_index,
                             const shape& target, const shape& input) {
    index_check c;
    c.kind = class_index;
    c.op = op;
    c.what = what;
    c.range = classes;
    c.ignore_index = ignore_index;
    c.set_sizes(target, input);
    return c;
  }
  static index_check rows(const char* op, std::int64_t num, const shape& indices, const shape& weight) {
    index_check c;
    c.kind = row_index;
    c.op = op;
    c.range = num;
    c.set_sizes(indices, weight);
    return c;
  }
  shape index_shape() const { return shape(index_sizes, index_sizes + index_dims); }
  shape other_shape() const { return shape(other_sizes, other_sizes + other_dims); }

 private:
  void set_sizes(const shape& index, const shape& other) {
    index_dims = int(std::min(index.size(), std::size_t(max_dims)));
    other_dims = int(std::min(other.size(), std::size_t(max_dims)));
    std::copy_n(index.begin(), index_dims, index_sizes);
    std::copy_n(other.begin(), other_dims, other_sizes);
  }
};

namespace detail {
/// The multi-index of the k-th element (row-major) of a tensor of sizes s.
inline shape unravel(const shape& s, index_t k) {
  shape idx(s.size());
  for (std::size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? k % s[d] : 0;
    k = s[d] ? k / s[d] : 0;
  }
  return idx;
}
}  // namespace detail

/// The error of a bad index `value` at flat `position` of the index tensor: value_error naming
/// the target for a class index, index_error naming num_embeddings for a row. The host check
/// and the device check (read back later) raise this same message.
[[noreturn]] inline void throw_bad_index(index_check::kind_t kind, const char* op, const char* what,
                                         std::int64_t range, std::int64_t value, index_t position,
                                         const shape& index_sizes, const shape& other_sizes) {
  const shape at = detail::unravel(index_sizes, position);
  std::ostringstream os;
  if (kind == index_check::class_index) {
    os << "target " << value << " at position " << to_string(at) << " is out of range for " << range
       << " classes (" << what << " of sizes " << to_string(other_sizes) << ")";
    ::trainkit::detail::throw_error<value_error>(op, os.str());
  }
  os << "index " << value << " at position " << to_string(at) << " of indices of sizes " << to_string(index_sizes)
     << " is out of range for num_embeddings = " << range << " (weight sizes " << to_string(other_sizes) << ")";
  ::trainkit::detail::throw_error<index_error>(op, os.str());
}

/// Per-device indexed kernels. A model provides
///   static constexpr bool checks_on_device: true when the kernels below check the indices they
///     are given a check for and report a bad one later (the CUDA model: a device error flag read
///     back at the next host read); false when the caller must validate them first (the host).
///   `template <class T>` static void gather_rows(const T* table, index_t cols, const std::int64_t* idx,
///       index_t n, T* out);            out[i, :] = table[idx[i], :]  (rows of `cols` dense elements)
///   `template <class T>` static void scatter_add_rows(const T* src, index_t cols, const std::int64_t* idx,
///       index_t n, T* table);          table[idx[i], :] += src[i, :]  (repeated indices accumulate)
///   `template <class T>` static void one_hot(const std::int64_t* target, index_t n, index_t classes,
///       index_t inner, double on, double off, std::int64_t ignore_index, T* out);
///     out viewed as [n, classes, inner]: out[i, c, j] = c == target[i * inner + j] ? on : off,
///     and 0 for the whole (i, :, j) column when the target equals ignore_index.
/// Each takes a last `const index_check* check` (nullptr: nothing to report). A model that
/// checks on the device never reads or writes out of bounds for a bad index: gather_rows writes
/// a zero row, scatter_add_rows skips it, one_hot writes `off` (no class matches), and a check,
/// when given, records the first bad index it meets.
template <class Device>
struct gather {
  static_assert(::trainkit::detail::dependent_false<Device>,
                "trainkit::backend::gather has no model for this device: include its backend header");
};

}  // namespace trainkit::backend
