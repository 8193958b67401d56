// trainkit/train/batch_size_finder.hpp - the largest batch whose training step fits in a share of
// the device memory, found by running trial steps and reading the allocator's peak.
//
//   auto r = train::find_max_batch_size<cpu>([&](index_t b) { step(x.slice(0, 0, b), loss_of(b)); },
//                                            {.budget_bytes = 8ull << 30});   // fraction 0.8 by default
//   std::printf("batch %lld, peak %zu of %zu bytes\n", (long long)r.batch, r.peak_bytes, r.limit_bytes);
//
// The peak of a trial is allocator<Device>::stats().peak after reset_peak() - it includes what
// was allocated before the trial (the model, the optimizer state), which is what has to fit. A
// trial that throws an out-of-memory error (runtime_failure from the allocator) does not fit.
// Peak memory is assumed to grow with the batch: the search doubles from min_batch until a trial
// does not fit, then bisects between the last fit and the first miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>

#include "trainkit/core/allocator.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"

namespace trainkit::train {

/// Settings of find_max_batch_size.
struct batch_size_options {
  std::size_t budget_bytes = 0;  ///< the device memory to fit in (required on the CPU)
  double fraction = 0.8;         ///< of the budget; the rest is headroom (fragmentation, workspaces)
  index_t min_batch = 1;
  index_t max_batch = index_t(1) << 16;
};

/// What the search found.
struct batch_size_result {
  index_t batch = 0;            ///< the largest batch that fits
  std::size_t peak_bytes = 0;   ///< its trial's peak
  std::size_t limit_bytes = 0;  ///< fraction * budget
  int trials = 0;               ///< trial steps run
};

/// Runs trial(batch) - one training step at that batch size - for a few batch sizes and returns
/// the largest one whose peak stays within fraction * budget_bytes. value_error when even
/// min_batch does not fit (the message gives what it needed); errors other than out-of-memory
/// propagate.
/// \tparam Device the device whose allocator is measured
template <class Device, class Trial>
batch_size_result find_max_batch_size(Trial&& trial, const batch_size_options& o) {
  TRAINKIT_CHECK(o.budget_bytes > 0, usage_error, "find_max_batch_size",
                 "give budget_bytes: the memory of the device (on the CPU there is no fixed size)");
  TRAINKIT_CHECK(o.fraction > 0.0 && o.fraction <= 1.0, value_error, "find_max_batch_size",
                 "fraction must be in (0, 1], got " << o.fraction);
  TRAINKIT_CHECK(o.min_batch >= 1 && o.max_batch >= o.min_batch, value_error, "find_max_batch_size",
                 "need 1 <= min_batch <= max_batch, got " << o.min_batch << " and " << o.max_batch);
  batch_size_result r;
  r.limit_bytes = static_cast<std::size_t>(static_cast<double>(o.budget_bytes) * o.fraction);

  // Peak of one trial, or 0 when it ran out of memory (the allocator throws runtime_failure).
  std::size_t last_peak = 0;
  auto fits = [&](index_t b) {
    ++r.trials;
    allocator<Device>::reset_peak();
    try {
      trial(b);
    } catch (const runtime_failure& e) {
      const std::string what = e.what();
      if (what.find("out of memory") == std::string::npos) throw;
      last_peak = 0;
      return false;
    }
    last_peak = allocator<Device>::stats().peak;
    return last_peak <= r.limit_bytes;
  };

  index_t good = 0, bad = 0;
  std::size_t good_peak = 0;
  for (index_t b = o.min_batch;; b = b > o.max_batch / 2 ? o.max_batch : b * 2) {
    if (fits(b)) {
      good = b;
      good_peak = last_peak;
      if (b == o.max_batch) break;
    } else {
      bad = b;
      break;
    }
  }
  TRAINKIT_CHECK(
      good > 0, value_error, "find_max_batch_size",
      "even a batch of " << o.min_batch << " does not fit: its step peaked at "
                         << (last_peak ? std::to_string(last_peak) + " bytes" : std::string("out of memory"))
                         << ", the limit is " << o.fraction << " x " << o.budget_bytes << " = "
                         << r.limit_bytes << " bytes");
  while (bad > 0 && bad - good > 1) {
    const index_t mid = good + (bad - good) / 2;
    if (fits(mid)) {
      good = mid;
      good_peak = last_peak;
    } else {
      bad = mid;
    }
  }
  r.batch = good;
  r.peak_bytes = good_peak;
  return r;
}

}  // namespace trainkit::train
