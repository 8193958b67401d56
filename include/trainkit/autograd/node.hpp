// trainkit/autograd/node.hpp - a step of the recorded graph: one output, edges to its inputs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

template <class T, class Device>
struct var_impl;

/// What a var's values are when they are fewer than its element type can hold: the outputs of a
/// precision scope's ops (amp/autocast.hpp) are bfloat16 or half values in float elements, as
/// torch.autocast's are bf16/fp16 tensors. Ops that keep such values (relu, max pooling, batch norm
/// and the add of two such vars round to them, as PyTorch's 16-bit kernels do) pass the tag on, and
/// save what backward needs in 16 bits (autograd/saved.hpp): exactly, since the values are 16-bit
/// values.
enum class value_precision : std::uint8_t { full, bfloat16, half };

/// t with every value rounded to p's type (t itself for full); in place when t is handed over as
/// the only holder of its storage (rounded_to).
template <class T, class D>
tensor<T, D> round_to_precision(tensor<T, D> t, value_precision p) {
  switch (p) {
    case value_precision::bfloat16: return rounded_to<bfloat16>(std::move(t));
    case value_precision::half: return rounded_to<half>(std::move(t));
    default: return t;
  }
}

/// A gradient on its way between nodes: fp32 (full), or bfloat16 (bf16) when it is the gradient
/// of a var whose values are held in bfloat16 (var::value_bf16) - torch.autocast's bf16
/// activations have bf16 gradients, and the 16-bit ops read and write them without a cast.
/// Nodes that take only fp32 see the widened gradient (node::apply_flow's default).
template <class T, class Device>
struct grad_flow {
  tensor<T, Device> full;
  tensor<bfloat16, Device> bf16;
  /// full's values are bfloat16 values (its producer rounded them: the CPU's widened bf16 route),
  /// so a 16-bit op reading it need not round it again. Sums and plain nodes drop the tag.
  bool bf16_values = false;
  /// Not full while full's values still wait to be rounded to this precision: a master weight's
  /// gradient from a GEMM of the CPU's widened bf16 route, on its way to the leaf. The leaf's
  /// accumulator keeps it so (var::grad_rounding_deferred) and an optimizer's update rounds it as it
  /// reads it, sparing a pass over every weight gradient; every other reader gets it rounded
  /// (widened()).
  value_precision deferred = value_precision::full;

  grad_flow() = default;
  grad_flow(tensor<T, Device> f) : full(std::move(f)) {}  // NOLINT: an fp32 gradient
  /// A bf16 gradient (for a bfloat16 graph that is simply its gradient).
  static grad_flow narrow(tensor<bfloat16, Device> b) {
    grad_flow g;
    if constexpr (std::is_same_v<T, bfloat16>)
      g.full = std::move(b);
    else
      g.bf16 = std::move(b);
    return g;
  }
  bool defined() const noexcept { return full.defined() || bf16.defined(); }
  bool is_narrow() const noexcept { return !full.defined() && bf16.defined(); }
  const shape& sizes() const { return full.defined() ? full.sizes() : bf16.sizes(); }
  /// The gradient as T (a widening copy when it is held in bfloat16).
  tensor<T, Device> widened() const& {
    if (deferred != value_precision::full) return round_to_precision(full, deferred);
    if (full.defined() || !bf16.defined()) return full;
    return cast<T>(bf16);
  }
  /// The same, moving an fp32 gradient out: a node that consumes its gradient hands the tensor on
  /// as the only owner, so accumulate_grad can keep it as the leaf's grad without a copy.
  tensor<T, Device> widened() && {
    if (deferred != value_precision::full) return round_to_precision(std::move(full), deferred);
    if (full.defined() || !bf16.defined()) return std::move(full);
    return cast<T>(bf16);
  }
};

namespace detail {
inline std::uint64_t next_sequence_number() {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

/// A recorded operation. apply() maps the gradient of its output to gradients of its inputs
/// (undefined tensors where an input needs none); release() frees what forward saved.
/// \tparam T element type of the graph
/// \tparam Device device of the graph
template <class T, class Device>
class node {
 public:
  using tensor_type = tensor<T, Device>;

  /// Tears the graph below down without recursion: released through `next`, each node's
  /// destructor ran its successor's, one stack frame group per op, and a chain of 20000 ops (an
  /// unrolled loop) overflowed an 8 MiB stack in an unoptimised build (-O0, ASan). A node whose last
  /// owner this is hands its edges to a local list instead, as torch's deleteNode does.
  virtual ~node() {
    if (next.empty()) return;
    std::vector<std::shared_ptr<node>> pending;
    for (auto& e : next)
      if (e) pending.push_back(std::move(e));
    while (!pending.empty()) {
      std::shared_ptr<node> n = std::move(pending.back());
      pending.pop_back();
      if (n.use_count() != 1) continue;  // another edge or a var still holds it: only ours goes
      for (auto& e : n->next)
        if (e) pending.push_back(std::move(e));
      n->next.clear();  // its destructor then has nothing to walk
    }
  }
  virtual std::vector<tensor_type> apply(tensor_type grad) = 0;
  /// apply() for a gradient that may be held in bfloat16; nodes whose op reads bf16 gradients
  /// (autograd/function.hpp) override it, the others see it widened.
  virtual std::vector<grad_flow<T, Device>> apply_flow(grad_flow<T, Device> grad) {
    auto r = apply(std::move(grad).widened());
    return std::vector<grad_flow<T, Device>>(std::make_move_iterator(r.begin()), std::make_move_iterator(r.end()));
  }
  virtual void release() {}
  virtual std::string_view name() const = 0;

  /// next[i] receives the gradient of input i; null when that input needs no gradient.
  std::vector<std::shared_ptr<node>> next;
  /// Set by var::retain_grad() on a non-leaf: the var whose grad keeps this node's output gradient.
  std::weak_ptr<var_impl<T, Device>> retained_output;
  /// Creation order: backward runs ready nodes latest-first, which makes it deterministic and
  /// frees activations in the reverse of the order they were made.
  const std::uint64_t sequence = detail::next_sequence_number();
};

/// Called with a leaf's incoming gradient before it is accumulated; may return a replacement
/// (or an undefined tensor to keep it).
template <class T, class Device>
using grad_hook = std::function<tensor<T, Device>(const tensor<T, Device>&)>;

/// Called after a leaf's gradient has been accumulated into var::grad() - the moment DDP can
/// start reducing it.
template <class T, class Device>
using post_accumulate_hook = std::function<void(tensor<T, Device>& grad)>;

/// Shared state of a var: its value, gradient, the node that made it and leaf hooks. An op of a
/// bf16 precision scope may leave its result in value_bf16 only (the value that passes to the
/// next 16-bit op as it is); value is then made from it at the first use that wants T.
template <class T, class Device>
struct var_impl {
  tensor<T, Device> value;
  tensor<bfloat16, Device> value_bf16;
  /// The sizes of the values, however they are held.
  const shape& sizes() const { return value.defined() || !value_bf16.defined() ? value.sizes() : value_bf16.sizes(); }
  tensor<T, Device> grad;
  /// Not full while `grad` still waits to be rounded to this precision (grad_flow::deferred).
  value_precision grad_deferred = value_precision::full;
  value_precision precision = value_precision::full;
  /// Not full while `value` still waits to be rounded to this precision (var::defer_rounding).
  value_precision deferred = value_precision::full;
  /// value rounded to rounded_precision, made by the first 16-bit GEMM op that read it and kept for
  /// the next (var::rounded_copy); undefined when none is kept.
  tensor<T, Device> rounded;
  value_precision rounded_precision = value_precision::full;
  std::shared_ptr<node<T, Device>> grad_fn;
  std::weak_ptr<node<T, Device>> accumulator;
  bool requires_grad = false;
  std::vector<grad_hook<T, Device>> hooks;
  std::vector<post_accumulate_hook<T, Device>> post_hooks;
};

namespace detail {
/// True when nobody else references the storage of t, so it can become a gradient in place.
template <class T, class D>
bool exclusively_owned(const tensor<T, D>& t) {
  return t.storage_ptr() && t.storage_ptr().use_count() == 1 && t.is_contiguous() && t.offset() == 0 &&
         static_cast<index_t>(t.storage_ptr()->size()) == t.numel();
}
}  // namespace detail

/// Rounds a leaf's gradient that waits for it (var_impl::grad_deferred), in place.
template <class T, class D>
void round_deferred_gradient(var_impl<T, D>& i) {
  if (i.grad_deferred == value_precision::full) return;
  i.grad = round_to_precision(std::move(i.grad), i.grad_deferred);
  i.grad_deferred = value_precision::full;
}

/// The sink of a leaf that requires grad: runs hooks, accumulates into grad, runs post hooks.
template <class T, class Device>
class accumulate_grad final : public node<T, Device> {
 public:
  using tensor_type = tensor<T, Device>;
  explicit accumulate_grad(std::shared_ptr<var_impl<T, Device>> leaf) : leaf_(std::move(leaf)) {}

  std::vector<tensor_type> apply(tensor_type g) override {
    for (auto& h : leaf_->hooks)
      if (auto r = h(g); r.defined()) g = std::move(r);
    accumulate(std::move(g), value_precision::full);
    return {};
  }
  /// A gradient whose rounding is deferred (grad_flow::deferred) is kept so when it is the leaf's
  /// first; it is rounded (and the held one too) before it adds to one, before hooks on the
  /// incoming gradient see it, and before the post hooks (DDP's) read the sum.
  std::vector<grad_flow<T, Device>> apply_flow(grad_flow<T, Device> g) override {
    if (g.deferred == value_precision::full || !leaf_->hooks.empty() || !g.full.defined())
      return node<T, Device>::apply_flow(std::move(g));
    accumulate(std::move(g.full), g.deferred);
    return {};
  }
  std::string_view name() const override { return "accumulate_grad"; }
  const std::shared_ptr<var_impl<T, Device>>& leaf() const { return leaf_; }

 private:
  /// grad = g, kept waiting for its rounding to `deferred` (full: none), or grad += g rounded (a held
  /// gradient whose rounding waits is rounded first); then the post hooks, on a rounded sum.
  void accumulate(tensor_type g, value_precision deferred) {
    auto& i = *leaf_;
    TRAINKIT_CHECK(g.sizes() == i.sizes(), shape_error, "accumulate_grad",
                   "gradient of sizes " << to_string(g.sizes()) << " for a leaf of sizes " << to_string(i.sizes()));
    if (!i.grad.defined()) {
      i.grad = detail::exclusively_owned(g) ? std::move(g) : g.clone();
      i.grad_deferred = deferred;
    } else {
      round_deferred_gradient(i);
      add_(i.grad, round_to_precision(std::move(g), deferred));
    }
    if (!i.post_hooks.empty()) {
      round_deferred_gradient(i);
      for (auto& h : i.post_hooks) h(i.grad);
    }
  }

  std::shared_ptr<var_impl<T, Device>> leaf_;
};

}  // namespace trainkit::autograd
