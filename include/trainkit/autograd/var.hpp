// trainkit/autograd/var.hpp - var<T, Device>: a tensor that remembers how it was made.
#pragma once

#include <memory>
#include <utility>

#include "trainkit/autograd/grad_mode.hpp"
#include "trainkit/autograd/node.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/ops/elementwise.hpp"  // cast

namespace trainkit::autograd {

/// A differentiable value, like a torch.Tensor with requires_grad. Copies share state
/// (value, gradient, graph position); detach() makes a new leaf over the same value.
/// \tparam T floating-point element type
/// \tparam Device cpu or cuda
template <class T, class Device = cpu>
class var {
 public:
  using tensor_type = tensor<T, Device>;
  using impl_type = var_impl<T, Device>;
  using node_type = node<T, Device>;

  var() = default;
  /// A leaf holding value.
  var(tensor_type value, bool requires_grad = false) : p_(std::make_shared<impl_type>()) {  // NOLINT
    p_->value = std::move(value);
    p_->requires_grad = requires_grad;
  }

  /// The result of a recorded op (used by autograd/function.hpp).
  static var from_node(tensor_type value, std::shared_ptr<node_type> fn) {
    var v(std::move(value), fn != nullptr);
    v.p_->grad_fn = std::move(fn);
    return v;
  }
  /// A var whose values are held in bfloat16 only (a bf16 precision scope's result; value() makes
  /// the T copy at its first use). fn: the op that made it, or null for a plain value.
  static var from_bfloat16(tensor<bfloat16, Device> value, std::shared_ptr<node_type> fn = nullptr) {
    var v;
    v.p_ = std::make_shared<impl_type>();
    v.p_->value_bf16 = std::move(value);
    v.p_->precision = value_precision::bfloat16;
    v.p_->requires_grad = fn != nullptr;
    v.p_->grad_fn = std::move(fn);
    return v;
  }

  bool defined() const noexcept { return p_ != nullptr; }
  /// The values as T (made from the bfloat16 values, once, when only those are held; rounded in
  /// place, once, when their rounding was deferred).
  const tensor_type& value() const {
    auto& i = impl();
    if (!i.value.defined() && i.value_bf16.defined()) i.value = cast<T>(i.value_bf16);
    if (i.deferred != value_precision::full) round_deferred(i);
    return i.value;
  }
  /// Mutable value, for in-place updates outside the graph (optimizers, initialisers); a var
  /// held in bfloat16 becomes a plain T var.
  tensor_type& value() {
    auto& i = impl();
    if (i.deferred != value_precision::full) round_deferred(i);
    i.rounded = tensor_type();  // the values may change: a kept rounded copy would go stale
    if (i.value_bf16.defined()) {
      if (!i.value.defined()) i.value = cast<T>(i.value_bf16);
      i.value_bf16 = tensor<bfloat16, Device>();
    }
    return i.value;
  }
  /// The values in bfloat16 when an op left them so (undefined otherwise): what the 16-bit ops
  /// read without a cast.
  const tensor<bfloat16, Device>& value_bf16() const { return impl().value_bf16; }
  /// Whether the values are held in bfloat16 (and only made T on demand).
  bool holds_bf16() const noexcept { return p_ && p_->value_bf16.defined(); }

  /// The gradient (rounded in place first where its rounding was deferred: grad_rounding_deferred).
  const tensor_type& grad() const {
    round_deferred_gradient(impl());
    return impl().grad;
  }
  tensor_type& grad() {
    round_deferred_gradient(impl());
    return impl().grad;
  }
  /// Whether a gradient is held (without rounding a deferred one).
  bool has_grad() const { return impl().grad.defined(); }
  void set_grad(tensor_type g) {
    impl().grad = std::move(g);
    impl().grad_deferred = value_precision::full;
  }
  /// Drops the gradient (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad() { set_grad(tensor_type()); }
  /// The precision the gradient still waits to be rounded to (full when it is rounded or plain):
  /// a master weight's gradient from a GEMM of the CPU's widened bf16 route, which an optimizer's
  /// update rounds as it reads it (optimizer_base::fused_step) instead of in a pass of its own.
  value_precision grad_rounding_deferred() const noexcept {
    return p_ && p_->grad.defined() ? p_->grad_deferred : value_precision::full;
  }
  /// The gradient as held, before a deferred rounding: only for a reader that rounds each element
  /// to grad_rounding_deferred() as it reads it.
  const tensor_type& grad_unrounded() const { return impl().grad; }

  bool requires_grad() const { return impl().requires_grad; }

  /// Whether the values are 16-bit values (value_precision; full for a plain var).
  value_precision precision() const noexcept { return p_ ? p_->precision : value_precision::full; }
  /// Tags the values as p's (an op's result; the caller vouches that they are p values).
  var& set_precision(value_precision p) {
    impl().precision = p;
    return *this;
  }
  /// Tags the values as p's (bfloat16 or half) and defers rounding them to p: value() rounds them
  /// in place at its first call, while an op that rounds what it reads anyway (the CPU's batch norm
  /// and relu on bf16 values) takes value_unrounded() and spares the pass. A GEMM result on the CPU's
  /// widened bf16 route is held so: rounding it was a read and a write of every element.
  var& defer_rounding(value_precision p) {
    auto& i = impl();
    TRAINKIT_CHECK(i.value.defined() && !i.value_bf16.defined() && p != value_precision::full, usage_error,
                   "defer_rounding", "only a var holding T values can defer their rounding to bfloat16 or half");
    i.precision = p;
    i.deferred = p;
    return *this;
  }
  /// The precision the values still wait to be rounded to (full when they are rounded or plain).
  value_precision rounding_deferred() const noexcept { return p_ ? p_->deferred : value_precision::full; }
  /// The values as held, before a deferred rounding: only for an op that rounds each value to
  /// rounding_deferred() as it reads it.
  const tensor_type& value_unrounded() const { return impl().value; }
  /// The values rounded to p, where a 16-bit GEMM op that read this var kept that copy
  /// (keep_rounded; nullptr otherwise): the q, k and v projections of one input round it once.
  const tensor_type* rounded_copy(value_precision p) const {
    const auto& i = impl();
    return i.rounded.defined() && i.rounded_precision == p ? &i.rounded : nullptr;
  }
  /// Keeps t, the values rounded to p, for the next reader (rounded_copy).
  void keep_rounded(value_precision p, tensor_type t) const {
    auto& i = impl();
    i.rounded = std::move(t);
    i.rounded_precision = p;
  }
  var& set_requires_grad(bool r) {
    TRAINKIT_CHECK(is_leaf(), usage_error, "set_requires_grad", "only leaves can change requires_grad");
    impl().requires_grad = r;
    return *this;
  }
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  const std::shared_ptr<node_type>& grad_fn() const { return impl().grad_fn; }

  /// A new leaf sharing the value (and the bfloat16 values and their tag), cut from the graph.
  var detach() const {
    (void)value();  // a deferred rounding happens before the value is shared
    var v;
    v.p_ = std::make_shared<impl_type>();
    v.p_->value = impl().value;
    v.p_->value_bf16 = impl().value_bf16;
    v.p_->precision = impl().precision;
    return v;
  }

  /// Keeps the gradient of this non-leaf in grad() after backward.
  void retain_grad() {
    if (is_leaf()) return;
    impl().grad_fn->retained_output = p_;
  }

  /// Hook on a leaf's incoming gradient (may return a replacement or an undefined tensor).
  void register_hook(grad_hook<T, Device> h) {
    TRAINKIT_CHECK(is_leaf() && requires_grad(), usage_error, "register_hook",
                   "hooks can only be registered on leaves that require grad");
    impl().hooks.push_back(std::move(h));
  }
  /// Hook run after the gradient has been accumulated into grad() (DDP's readiness signal).
  void register_post_accumulate_hook(post_accumulate_hook<T, Device> h) {
    TRAINKIT_CHECK(is_leaf() && requires_grad(), usage_error, "register_post_accumulate_hook",
                   "hooks can only be registered on leaves that require grad");
    impl().post_hooks.push_back(std::move(h));
  }
  void clear_hooks() {
    impl().hooks.clear();
    impl().post_hooks.clear();
  }

  /// Where this var's gradient goes: its grad_fn, the leaf's accumulator, or null.
  std::shared_ptr<node_type> gradient_edge() const {
    auto& i = impl();
    if (i.grad_fn) return i.grad_fn;
    if (!i.requires_grad) return nullptr;
    if (auto a = i.accumulator.lock()) return a;
    auto a = std::make_shared<accumulate_grad<T, Device>>(p_);
    i.accumulator = a;
    return a;
  }

  /// Runs backpropagation from this var (see autograd/backward.hpp).
  void backward(const tensor_type& grad = tensor_type(), bool retain_graph = false) const;

  // Sizes without making the T copy of bfloat16-held values.
  const shape& sizes() const { return impl().sizes(); }
  std::size_t dim() const { return sizes().size(); }
  index_t size(index_t d) const { return sizes()[wrap_dim(d, dim(), "tensor::size")]; }
  index_t numel() const { return trainkit::numel(sizes()); }
  T item() const { return value().item(); }

  impl_type* get() const noexcept { return p_.get(); }
  bool same(const var& o) const noexcept { return p_ == o.p_; }

 private:
  static void round_deferred(impl_type& i) {
    i.value = round_to_precision(std::move(i.value), i.deferred);
    i.deferred = value_precision::full;
  }
  impl_type& impl() const {
    TRAINKIT_CHECK(p_ != nullptr, usage_error, "var", "use of an undefined var");
    return *p_;
  }
  std::shared_ptr<impl_type> p_;
};

}  // namespace trainkit::autograd
