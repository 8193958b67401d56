// trainkit/checkpoint/function.hpp - checkpoint(fn, inputs...): run a sub-graph without keeping
// its activations, and recompute it in backward.
//
// Forward runs fn under no_grad, so nothing inside fn is recorded; the checkpoint keeps only the
// input values, the states of the random generators fn may draw from, and fn itself, in ONE node.
// When backward reaches that node it
//   1. sets the generators back to the states they had at forward (so dropout draws the same
//      masks), remembering where they are now;
//   2. re-runs fn with grad enabled on detached copies of the inputs (each requiring grad as its
//      original did), recording the sub-graph;
//   3. puts the generators back where they were, so the recomputation does not shift the stream
//      the rest of training sees;
//   4. runs autograd::backward (a nested call - the engine keeps all its state on the stack)
//      from the recomputed output with the incoming gradient, and returns the detached inputs'
//      gradients to the outer backward.
// Parameters fn captures (leaves inside the closure) get their gradients in step 4 through their
// own accumulators, exactly once per backward, with their hooks (DDP's readiness hook) firing
// once - the sub-graph is recorded once and traversed once.
//
// Because parameters inside fn are invisible from the outside, the output requires grad whenever
// grad mode is on, even if no input does (the first segment of a network, whose input is data).
// fn must be deterministic given its inputs and the restored generators; draws from a generator
// that is not preserved would differ on recompute.
#pragma once

#include <array>
#include <concepts>  // std::same_as
#include <cstddef>   // std::size_t
#include <memory>    // std::make_shared
#include <optional>
#include <string_view>
#include <tuple>        // std::apply
#include <type_traits>  // std::decay_t, std::invoke_result_t
#include <utility>
#include <vector>

#include "trainkit/autograd/autocast.hpp"
#include "trainkit/autograd/backward.hpp"
#include "trainkit/autograd/grad_mode.hpp"
#include "trainkit/autograd/node.hpp"
#include "trainkit/autograd/var.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"

namespace trainkit::checkpoint {

/// Which random generators a checkpoint saves at forward and replays at recomputation: the
/// default generator (what nn::dropout and autograd::dropout use unless given another) and any
/// others fn draws from. checkpoint_sequential adds the generators of the nn::dropout layers of
/// each segment by itself.
struct preserve_rng {
  bool default_generator = true;
  std::vector<generator*> generators;
};

namespace detail {

/// A set of generators with one state each.
class rng_states {
 public:
  rng_states() = default;
  explicit rng_states(const preserve_rng& p) {
    if (p.default_generator) add(&trainkit::default_generator());
    for (generator* g : p.generators) add(g);
  }
  /// The same generators with the states they have now.
  rng_states current() const {
    rng_states r = *this;
    for (auto& [g, s] : r.states_) s = g->get_state();
    return r;
  }
  void restore() const {
    for (const auto& [g, s] : states_) g->set_state(s);
  }

 private:
  void add(generator* g) {
    TRAINKIT_CHECK(g != nullptr, value_error, "checkpoint", "preserve_rng lists a null generator");
    for (const auto& e : states_)
      if (e.first == g) return;
    states_.emplace_back(g, g->get_state());
  }
  std::vector<std::pair<generator*, generator::state>> states_;
};

/// Sets the forward-time states for the duration of a recomputation, then (even when fn throws)
/// puts back the states the generators had before it.
class rng_replay {
 public:
  explicit rng_replay(const rng_states& at_forward) : now_(at_forward.current()) { at_forward.restore(); }
  ~rng_replay() { now_.restore(); }
  rng_replay(const rng_replay&) = delete;
  rng_replay& operator=(const rng_replay&) = delete;

 private:
  rng_states now_;
};

/// The one node a checkpoint records: keeps fn, the N input values, which of them require grad
/// and the generator states, and recomputes in apply().
template <class T, class D, class Fn, std::size_t N>
class checkpoint_node final : public autograd::node<T, D> {
 public:
  using tensor_type = tensor<T, D>;
  using var_type = autograd::var<T, D>;

  checkpoint_node(Fn fn, std::array<var_type, N> inputs, std::array<bool, N> requires_grad, rng_states rng,
                  const autograd::autocast_ops<T, D>* autocast)
      : fn_(std::move(fn)),
        inputs_(std::move(inputs)),
        requires_grad_(requires_grad),
        rng_(std::move(rng)),
        autocast_(autocast) {}

  std::vector<tensor_type> apply(tensor_type grad) override {
    TRAINKIT_CHECK(fn_.has_value(), usage_error, "checkpoint",
                   "trying to backward through a checkpoint a second time (its saved inputs were freed); "
                   "pass retain_graph=true to the first backward()");
    std::array<var_type, N> in;
    for (std::size_t i = 0; i < N; ++i) {
      in[i] = inputs_[i].detach();  // a fresh leaf over the kept values (bf16-held ones stay so)
      if (requires_grad_[i]) in[i].set_requires_grad(true);
    }
    var_type out;
    {
      rng_replay replay(rng_);
      autograd::autocast_guard<T, D> precision(autocast_);  // the forward's precision scope, as PyTorch's checkpoint
      autograd::enable_grad recording;
      autograd::recomputing again;  // batch norm does not update its running statistics twice
      out = std::apply(*fn_, in);
    }
    std::vector<tensor_type> r(N);
    TRAINKIT_CHECK(out.defined(), usage_error, "checkpoint",
                   "the recomputed function returned an undefined var");
    if (!out.requires_grad()) return r;  // nothing inside depends on anything that needs a gradient
    TRAINKIT_CHECK(out.sizes() == grad.sizes(), usage_error, "checkpoint",
                   "the recomputation produced sizes "
                       << trainkit::to_string(out.sizes()) << " but forward produced "
                       << trainkit::to_string(grad.sizes())
                       << "; the checkpointed function must be deterministic");
    autograd::backward(out, std::move(grad));
    for (std::size_t i = 0; i < N; ++i)
      if (requires_grad_[i]) r[i] = in[i].grad();
    return r;
  }
  void release() override {
    fn_.reset();
    inputs_ = {};
  }
  std::string_view name() const override { return "checkpoint"; }

 private:
  std::optional<Fn> fn_;
  std::array<var_type, N> inputs_;  // detached: the values (and how they are held) without the graph
  std::array<bool, N> requires_grad_;
  rng_states rng_;
  const autograd::autocast_ops<T, D>* autocast_;  // the precision scope forward ran in (static tables)
};

}  // namespace detail

/// What checkpoint() can run: Fn called with one var<T, D> per input (V... being more of the
/// same) returns a var<T, D>.
template <class Fn, class T, class D, class... V>
concept checkpoint_function =
    (std::same_as<V, autograd::var<T, D>> && ...) &&
    std::same_as<std::invoke_result_t<std::decay_t<Fn>&, autograd::var<T, D>&, V&...>, autograd::var<T, D>>;

/// fn(inputs...) without storing fn's activations: they are recomputed in backward (see the top
/// of this header). fn takes the vars (by value or const reference) and returns one var of the
/// same element type and device; it is copied into the graph and must stay valid (with whatever
/// it captures by reference) until backward. rng says which generators to replay. Under no_grad
/// this is just fn(inputs...).
// clang-format 14 folds a requires-clause into the declaration that follows it:
// clang-format off
template <class Fn, class T, class D, class... V>
  requires checkpoint_function<Fn, T, D, V...>
autograd::var<T, D> checkpoint(const preserve_rng& rng, Fn&& fn, const autograd::var<T, D>& first,
                               const V&... rest) {
  // clang-format on
  using var_type = autograd::var<T, D>;
  constexpr std::size_t n = 1 + sizeof...(V);
  std::array<var_type, n> in{first, rest...};
  if (!autograd::is_grad_enabled()) return std::apply(fn, in);
  detail::rng_states states(rng);
  var_type out;
  {
    autograd::no_grad plain;
    out = std::apply(fn, in);
  }
  TRAINKIT_CHECK(out.defined(), usage_error, "checkpoint",
                 "the checkpointed function returned an undefined var");
  auto node = std::make_shared<detail::checkpoint_node<T, D, std::decay_t<Fn>, n>>(
      std::forward<Fn>(fn), std::array<var_type, n>{first.detach(), rest.detach()...},
      std::array<bool, n>{first.requires_grad(), rest.requires_grad()...}, std::move(states),
      autograd::current_autocast<T, D>());
  node->next = {first.gradient_edge(), rest.gradient_edge()...};
  // The output as fn left it: held in bf16 stays so, 16-bit values keep their tag.
  if (out.holds_bf16()) return var_type::from_bfloat16(out.value_bf16(), std::move(node));
  auto r = var_type::from_node(out.value(), std::move(node));
  r.set_precision(out.precision());
  return r;
}

/// checkpoint with the default generator preserved (what dropout draws from unless told otherwise).
// clang-format off
template <class Fn, class T, class D, class... V>
  requires(!std::same_as<std::decay_t<Fn>, preserve_rng>) && checkpoint_function<Fn, T, D, V...>
autograd::var<T, D> checkpoint(Fn&& fn, const autograd::var<T, D>& first, const V&... rest) {
  // clang-format on
  return checkpoint(preserve_rng{}, std::forward<Fn>(fn), first, rest...);
}

}  // namespace trainkit::checkpoint
