// trainkit/core/shape.hpp - sizes and strides of a tensor, and the rules that combine them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainkit/core/error.hpp"

namespace trainkit {

/// Element counts and offsets: signed, like PyTorch's int64 sizes, so that -1 can mean "infer".
using index_t = std::int64_t;

/// Sizes of each dimension (or strides, in elements). A scalar tensor has an empty shape.
using shape = std::vector<index_t>;

/// "[2, 3, 4]" - every error message that involves a shape prints it this way.
inline std::string to_string(const shape& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

inline index_t numel(const shape& s) {
  index_t n = 1;
  for (index_t v : s) n *= v;
  return n;
}

/// Row-major strides of a dense tensor of sizes s.
inline shape contiguous_strides(const shape& s) {
  shape st(s.size());
  index_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i] > 0 ? s[i] : 1;
  }
  return st;
}

/// Turns a possibly negative dimension into [0, ndim); names the op on failure.
inline std::size_t wrap_dim(index_t d, std::size_t ndim, const char* op) {
  const index_t n = static_cast<index_t>(ndim);
  TRAINKIT_CHECK(d >= -n && d < n, index_error, op,
                 "dimension " << d << " is out of range for a tensor with " << n << " dimensions");
  return static_cast<std::size_t>(d < 0 ? d + n : d);
}

/// NumPy broadcasting: align trailing dimensions; each pair must be equal or contain a 1.
inline shape broadcast_shapes(const shape& a, const shape& b, const char* op) {
  const std::size_t n = std::max(a.size(), b.size());
  shape r(n);
  for (std::size_t i = 0; i < n; ++i) {
    const index_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const index_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TRAINKIT_CHECK(da == db || da == 1 || db == 1, shape_error, op,
                   "shapes " << to_string(a) << " and " << to_string(b) << " cannot be broadcast together");
    r[i] = da == 1 ? db : da;
  }
  return r;
}

/// Replaces a single -1 by the size that keeps the element count; checks the count matches.
inline shape infer_size(shape s, index_t count, const char* op) {
  index_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TRAINKIT_CHECK(infer < 0, shape_error, op, "only one dimension can be -1 in " << to_string(s));
      infer = static_cast<int>(i);
    } else {
      TRAINKIT_CHECK(s[i] >= 0, shape_error, op, "invalid size " << s[i] << " in " << to_string(s));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TRAINKIT_CHECK(known != 0 && count % known == 0, shape_error, op,
                   "shape " << to_string(s) << " is invalid for " << count << " elements");
    s[static_cast<std::size_t>(infer)] = count / known;
  }
  TRAINKIT_CHECK(numel(s) == count, shape_error, op,
                 "shape " << to_string(s) << " is invalid for " << count << " elements");
  return s;
}

}  // namespace trainkit
