// trainkit/dist/detail/collective.hpp - what a collective call was, for matching ranks and for messages.
#pragma once

#include <chrono>
#include <cstddef>
#include <sstream>
#include <string>
#include <string_view>

#include "trainkit/core/dtype.hpp"
#include "trainkit/dist/detail/element.hpp"
#include "trainkit/dist/reduce_op.hpp"

namespace trainkit::dist::detail {

/// One collective call as a rank issued it. Two ranks' calls match when every field is equal.
struct collective_desc {
  collective_kind kind = collective_kind::barrier;
  int element = -1;                    // element_id<T>(), -1 for barrier
  std::string_view element_name = "";  // dtype_name<T>()
  std::size_t count = 0;               // n (allreduce, broadcast, allgather) or n_per_rank
  reduce_op op = reduce_op::sum;       // allreduce, reduce_scatter
  int root = -1;                       // broadcast

  friend bool operator==(const collective_desc& a, const collective_desc& b) noexcept {
    return a.kind == b.kind && a.element == b.element && a.count == b.count &&
           (!uses_op(a.kind) || a.op == b.op) && a.root == b.root;
  }

  static constexpr bool uses_op(collective_kind k) noexcept {
    return k == collective_kind::allreduce || k == collective_kind::reduce_scatter;
  }

  template <dist_element T>
  static collective_desc make(collective_kind kind, std::size_t count, reduce_op op = reduce_op::sum,
                              int root = -1) {
    return {kind, element_id<T>(), dtype_name<T>(), count, op, root};
  }

  /// "allreduce(float32, 1000 elements, sum)", "broadcast(int8, 7 elements, root 0)", "barrier()".
  [[nodiscard]] std::string str() const {
    std::ostringstream os;
    os << to_string(kind) << "(";
    if (kind != collective_kind::barrier) {
      os << element_name << ", " << count << (count == 1 ? " element" : " elements");
      if (kind == collective_kind::reduce_scatter || kind == collective_kind::alltoall) os << " per rank";
      if (uses_op(kind)) os << ", " << to_string(op);
      if (kind == collective_kind::broadcast) os << ", root " << root;
    }
    os << ")";
    return os.str();
  }
};

/// "<model>: allreduce(float32, 1000 elements, sum) on rank 1 of 3 (timeout 500 ms): <reason>":
/// the message every dist_error carries, so a log line from any rank says what hung where.
inline std::string failure_message(std::string_view model, const collective_desc& c, int rank, int size,
                                   std::chrono::milliseconds timeout, std::string_view reason) {
  std::ostringstream os;
  os << "trainkit::dist::" << model << ": " << c.str() << " on rank " << rank << " of " << size
     << " (timeout " << timeout.count() << " ms): " << reason;
  return os.str();
}

}  // namespace trainkit::dist::detail
