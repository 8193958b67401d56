// trainkit/dist/bucket.hpp - which gradients travel together: the bucket assignment of
// data_parallel, as PyTorch DDP makes it.
//
// Parameters are taken in reverse registration order (backward produces the last layers' gradients
// first, so the first bucket fills first), appended to the open bucket, and the bucket is closed once
// it holds at least its cap: the first one a small cap (1 MiB, so communication starts early), the
// others the big one (25 MiB). A parameter larger than the cap gets a bucket of its own.
#pragma once

#include <cstddef>
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::dist {

/// Caps of the bucket assignment, in bytes of gradient.
struct bucket_options {
  std::size_t cap_bytes = std::size_t(25) << 20;       // every bucket after the first
  std::size_t first_cap_bytes = std::size_t(1) << 20;  // the first one (the last layers)
};

/// One bucket: the parameters it holds (indices into the registration order) and where each one's
/// gradient lies in the bucket's flat buffer.
struct bucket {
  std::vector<std::size_t> params;  // registration indices, in the order they were added
  std::vector<index_t> offsets;     // element offset of each in the flat buffer
  index_t numel = 0;                // elements of the flat buffer
};

/// The buckets, and for every parameter its (bucket, position in bucket.params).
struct bucket_plan {
  std::vector<bucket> buckets;
  std::vector<std::size_t> bucket_of;  // by registration index
  std::vector<std::size_t> slot_of;    // position inside buckets[bucket_of[i]].params
};

/// Assigns parameters of the given element counts (in registration order; elem_size bytes each) to
/// buckets as described at the top of this file. Parameters with skip[i] (no gradient needed) are
/// left out; bucket_of is then the number of buckets.
inline bucket_plan plan_buckets(const std::vector<index_t>& numels, std::size_t elem_size, const bucket_options& opts,
                                const std::vector<bool>& skip = {}) {
  TRAINKIT_CHECK(opts.cap_bytes > 0 && opts.first_cap_bytes > 0, value_error, "plan_buckets",
                 "bucket caps must be positive, got cap_bytes = " << opts.cap_bytes
                                                                  << ", first_cap_bytes = " << opts.first_cap_bytes);
  TRAINKIT_CHECK(skip.empty() || skip.size() == numels.size(), value_error, "plan_buckets",
                 "skip has " << skip.size() << " entries for " << numels.size() << " parameters");
  bucket_plan plan;
  plan.bucket_of.assign(numels.size(), 0);
  plan.slot_of.assign(numels.size(), 0);
  bucket open;
  auto close = [&] {
    if (open.params.empty()) return;
    plan.buckets.push_back(std::move(open));
    open = bucket{};
  };
  for (std::size_t k = numels.size(); k-- > 0;) {
    if (!skip.empty() && skip[k]) continue;
    plan.bucket_of[k] = plan.buckets.size();
    plan.slot_of[k] = open.params.size();
    open.params.push_back(k);
    open.offsets.push_back(open.numel);
    open.numel += numels[k];
    const std::size_t cap = plan.buckets.empty() ? opts.first_cap_bytes : opts.cap_bytes;
    if (static_cast<std::size_t>(open.numel) * elem_size >= cap) close();
  }
  close();
  for (std::size_t k = 0; k < numels.size(); ++k)
    if (!skip.empty() && skip[k]) plan.bucket_of[k] = plan.buckets.size();
  return plan;
}

}  // namespace trainkit::dist
