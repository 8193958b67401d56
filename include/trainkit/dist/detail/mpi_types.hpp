// trainkit/dist/detail/mpi_types.hpp - MPI datatypes and reduction ops for the dist_element types.
// MPI has no 16-bit float types: half and bfloat16 travel as MPI_UINT16_T and reduce through
// MPI_Op_create'd ops that combine in float.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <mutex>
#include <type_traits>

#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/dist/detail/element.hpp"
#include "trainkit/dist/reduce_op.hpp"

namespace trainkit::dist::detail {

template <dist_element T>
MPI_Datatype mpi_datatype() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return MPI_UINT16_T;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return MPI_INT8_T;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return MPI_UINT8_T;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return MPI_INT32_T;
  else
    return MPI_INT64_T;
}

template <class T>
inline constexpr bool is_float16 = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// inout[i] = in[i] (+) inout[i], computed in float, rounded to T (the MPI_User_function signature).
template <class T, reduce_op Op>
void mpi_float16_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(combine<T>(Op, to_compute(a[i]), to_compute(b[i])));
}

// The user-defined ops, created once per process after MPI_Init (MPI_Finalize frees them).
struct mpi_float16_ops {
  MPI_Op half_sum = MPI_OP_NULL, half_max = MPI_OP_NULL, half_min = MPI_OP_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL, bf16_min = MPI_OP_NULL;
  int error = MPI_SUCCESS;

  static const mpi_float16_ops& get() {
    static const mpi_float16_ops ops = [] {
      mpi_float16_ops o;
      auto make = [&o](MPI_User_function* f, MPI_Op* op) {
        if (o.error == MPI_SUCCESS) o.error = MPI_Op_create(f, /*commute=*/1, op);
      };
      make(&mpi_float16_op<half, reduce_op::sum>, &o.half_sum);
      make(&mpi_float16_op<half, reduce_op::max>, &o.half_max);
      make(&mpi_float16_op<half, reduce_op::min>, &o.half_min);
      make(&mpi_float16_op<bfloat16, reduce_op::sum>, &o.bf16_sum);
      make(&mpi_float16_op<bfloat16, reduce_op::max>, &o.bf16_max);
      make(&mpi_float16_op<bfloat16, reduce_op::min>, &o.bf16_min);
      return o;
    }();
    return ops;
  }
};

// The MPI op that computes `op` for T; avg reduces with the sum (the division by the world size
// happens locally when the collective completes).
template <dist_element T>
MPI_Op mpi_op(reduce_op op) {
  if constexpr (is_float16<T>) {
    const auto& o = mpi_float16_ops::get();
    const bool h = std::is_same_v<T, half>;
    switch (op) {
      case reduce_op::max:
        return h ? o.half_max : o.bf16_max;
      case reduce_op::min:
        return h ? o.half_min : o.bf16_min;
      default:
        return h ? o.half_sum : o.bf16_sum;
    }
  } else {
    switch (op) {
      case reduce_op::max:
        return MPI_MAX;
      case reduce_op::min:
        return MPI_MIN;
      default:
        return MPI_SUM;
    }
  }
}

}  // namespace trainkit::dist::detail
