// trainkit/amp/autocast_list.hpp - which ops a mixed-precision policy runs in its 16-bit compute
// type and which stay in fp32: PyTorch's autocast lists, as one constexpr table.
//
// The list is the contract between a policy and the ops: trainkit::amp::linear/matmul/bmm/conv2d
// (amp/ops.hpp) round their GEMM operands to the compute type; everything else is called as the
// plain fp32 op on the fp32 graph (docs/mixed_precision.md has the full table and the reasons).
#pragma once

#include <string_view>

namespace trainkit::amp {

/// The ops the autocast list talks about.
enum class autocast_op {
  // compute type: GEMMs, where 16-bit inputs halve the bytes moved and tensor cores apply
  matmul,
  bmm,
  linear,
  conv2d,
  scaled_dot_product_attention,  // its tile GEMMs in the compute type; softmax statistics in fp32
  // fp32: reductions over many elements, exponentials and losses lose too much in 16 bits
  softmax,
  log_softmax,
  cross_entropy,
  nll_loss,
  mse_loss,
  batch_norm,
  layer_norm,
  sum,
  mean,
  exp,
  log,
  pow,
};

/// True for the ops a mixed policy runs in its compute type (PyTorch's "lower precision" list);
/// false for those that autocast pins to fp32.
constexpr bool lower_precision_op(autocast_op op) noexcept {
  switch (op) {
    case autocast_op::matmul:
    case autocast_op::bmm:
    case autocast_op::linear:
    case autocast_op::conv2d:
    case autocast_op::scaled_dot_product_attention:
      return true;
    default:
      return false;
  }
}

/// The op's name as PyTorch spells it, for messages and docs.
constexpr std::string_view autocast_op_name(autocast_op op) noexcept {
  switch (op) {
    case autocast_op::matmul:
      return "matmul";
    case autocast_op::bmm:
      return "bmm";
    case autocast_op::linear:
      return "linear";
    case autocast_op::conv2d:
      return "conv2d";
    case autocast_op::scaled_dot_product_attention:
      return "scaled_dot_product_attention";
    case autocast_op::softmax:
      return "softmax";
    case autocast_op::log_softmax:
      return "log_softmax";
    case autocast_op::cross_entropy:
      return "cross_entropy";
    case autocast_op::nll_loss:
      return "nll_loss";
    case autocast_op::mse_loss:
      return "mse_loss";
    case autocast_op::batch_norm:
      return "batch_norm";
    case autocast_op::layer_norm:
      return "layer_norm";
    case autocast_op::sum:
      return "sum";
    case autocast_op::mean:
      return "mean";
    case autocast_op::exp:
      return "exp";
    case autocast_op::log:
      return "log";
    case autocast_op::pow:
      return "pow";
  }
  return "?";
}

}  // namespace trainkit::amp
