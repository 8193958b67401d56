// trainkit/dist/reduce_op.hpp - how an allreduce or a reduce_scatter combines the ranks' values.
#pragma once

#include <string_view>

namespace trainkit::dist {

/// The reduction of allreduce and reduce_scatter. `avg` is the sum divided by the world size (integers
/// divide with truncation, after the sum has wrapped in the element type as `sum` does); 16-bit floats
/// (half, bfloat16) combine in float and round to the element type, as NCCL does.
enum class reduce_op { sum, avg, max, min };

/// "sum", "avg", "max", "min": for messages.
constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::avg:
      return "avg";
    case reduce_op::max:
      return "max";
    case reduce_op::min:
      return "min";
  }
  return "unknown";
}

}  // namespace trainkit::dist
