// trainkit/autograd/function.hpp - how an op struct becomes a node of the graph.
//
// An op is a struct with
//   static constexpr std::string_view name;
//   members holding what backward needs (saved in forward by the function that records it);
//   backward(const tensor& grad_out, const std::vector<bool>& needs) -> a range of tensors,
//     one per input, undefined where needs[i] is false;
// and the differentiable function computes the output tensor, fills the op and calls record().
// The same struct serves every device: it only calls device-generic tensor functions.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "trainkit/autograd/var.hpp"

namespace trainkit::autograd {

/// An op whose backward also takes a gradient held in bfloat16 (grad_flow) and may hand its input
/// gradients on in bfloat16: backward_flow(g, needs) -> a range of grad_flow, one per input.
template <class Op, class T, class D>
concept reads_bf16_gradients = requires(const Op& op, const grad_flow<T, D>& g, const std::vector<bool>& needs) {
  op.backward_flow(g, needs);
};

/// The node that holds an op between forward and backward.
template <class Op, class T, class D>
class op_node final : public node<T, D> {
 public:
  op_node(Op op, std::vector<bool> needs) : op_(std::move(op)), needs_(std::move(needs)) {}

  std::vector<tensor<T, D>> apply(tensor<T, D> g) override {
    check_alive();
    auto r = op_->backward(g, needs_);
    std::vector<tensor<T, D>> out;
    out.reserve(needs_.size());
    for (auto& t : r) out.push_back(std::move(t));
    return out;
  }
  std::vector<grad_flow<T, D>> apply_flow(grad_flow<T, D> g) override {
    if constexpr (reads_bf16_gradients<Op, T, D>) {
      check_alive();
      auto r = op_->backward_flow(g, needs_);
      std::vector<grad_flow<T, D>> out;
      out.reserve(needs_.size());
      for (auto& t : r) out.push_back(std::move(t));
      return out;
    } else {
      return node<T, D>::apply_flow(std::move(g));
    }
  }
  void release() override { op_.reset(); }
  std::string_view name() const override { return Op::name; }

 private:
  void check_alive() const {
    TRAINKIT_CHECK(op_.has_value(), usage_error, Op::name,
                   "trying to backward through the graph a second time (or after its saved tensors were "
                   "freed); pass retain_graph=true to the first backward()");
  }
  std::optional<Op> op_;
  std::vector<bool> needs_;
};

namespace detail {
/// The node recording op over inputs, or null when grad mode is off or no input requires grad
/// (op and what it saved are then dropped).
template <class Op, class T, class D>
std::shared_ptr<node<T, D>> node_for(Op&& op, const std::vector<const var<T, D>*>& inputs) {
  if (!is_grad_enabled()) return nullptr;
  std::vector<bool> needs(inputs.size());
  bool any = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) any |= needs[i] = inputs[i]->requires_grad();
  if (!any) return nullptr;
  auto n = std::make_shared<op_node<std::decay_t<Op>, T, D>>(std::forward<Op>(op), std::move(needs));
  n->next.reserve(inputs.size());
  for (const auto* in : inputs) n->next.push_back(in->gradient_edge());
  return n;
}
}  // namespace detail

/// Wraps out as the result of op applied to inputs: records a node when grad mode is on and
/// some input requires grad; otherwise returns a plain leaf and drops the op (and what it saved).
template <class Op, class T, class D>
var<T, D> record(Op&& op, tensor<T, D> out, const std::vector<const var<T, D>*>& inputs) {
  return var<T, D>::from_node(std::move(out), detail::node_for<Op, T, D>(std::forward<Op>(op), inputs));
}

/// record() for a result held in bfloat16 (var::from_bfloat16): the next 16-bit op reads it as it
/// is, anything else gets the T copy on demand.
template <class Op, class T, class D>
var<T, D> record_bf16(Op&& op, tensor<bfloat16, D> out, const std::vector<const var<T, D>*>& inputs) {
  return var<T, D>::from_bfloat16(std::move(out), detail::node_for<Op, T, D>(std::forward<Op>(op), inputs));
}

template <class Op, class T, class D, class... V>
var<T, D> record_bf16(Op&& op, tensor<bfloat16, D> out, const var<T, D>& first, const V&... rest) {
  return record_bf16<Op, T, D>(std::forward<Op>(op), std::move(out), std::vector<const var<T, D>*>{&first, &rest...});
}

template <class Op, class T, class D, class... V>
var<T, D> record(Op&& op, tensor<T, D> out, const var<T, D>& first, const V&... rest) {
  return record(std::forward<Op>(op), std::move(out), std::vector<const var<T, D>*>{&first, &rest...});
}

template <class Op, class T, class D>
var<T, D> record(Op&& op, tensor<T, D> out, const std::vector<var<T, D>>& inputs) {
  std::vector<const var<T, D>*> p;
  p.reserve(inputs.size());
  for (auto& v : inputs) p.push_back(&v);
  return record(std::forward<Op>(op), std::move(out), p);
}

}  // namespace trainkit::autograd
