// trainkit/backend/cpu/parallel_for.hpp - the OpenMP loop of the row-wise host kernels (norm,
// softmax): parallel only when the whole job is big enough to pay for waking the threads.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/core/shape.hpp"  // index_t
#include "trainkit/core/wait_governor.hpp"  // start_wait_governor

namespace trainkit::backend {

namespace detail {
/// for (i in [0, n)) f(i), in parallel when the whole job (n * cost elements) is big enough.
template <class F>
void parallel_for(index_t n, index_t cost, F&& f) {
  const bool big = n > 1 && n * cost >= 32768;
  if (big) ::trainkit::detail::start_wait_governor();
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (big)
#endif
  for (index_t i = 0; i < n; ++i) f(i);
}
}  // namespace detail

}  // namespace trainkit::backend
