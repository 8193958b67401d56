// trainkit/train/concepts.hpp - the axes of train_step that no other component defines: the
// parallel policy (what runs between backward and the optimizer step) and the model. The other
// four axes are the other components' concepts: optim::optimizer, amp::precision_policy,
// amp::loss_scaler, checkpoint::recompute_policy.
#pragma once

#include <concepts>
#include <cstdint>
#include <vector>

#include "trainkit/nn/module.hpp"

namespace trainkit::train {

/// The parallel axis: reduces the gradients across ranks after backward.
/// A model provides:
///   p.finish()     after backward, before unscaling and the step: waits for the reduction and
///                  leaves the averaged gradients in .grad() (a no-op for one process).
/// Optional, used when present: p.found_inf(bool) -> bool (the OR over the ranks, so every rank
/// skips the same steps), p.stats() with bytes_sent and comm_seconds (for the metrics) and
/// p.no_sync() (gradient accumulation, parallel_policy_with_no_sync below).
/// Models: no_parallel, parallel::data_parallel<Comm, Compression>.
template <class P>
concept parallel_policy = requires(P& p) {
  p.finish();
};

/// A parallel policy that communicates during backward and can hold that back while gradients
/// accumulate over micro-batches:
///   p.no_sync()    an RAII guard: backward passes while it lives only accumulate locally; the
///                  next backward outside it (then finish()) reduces the accumulated sum.
/// train_step runs the first accumulation_steps - 1 backward passes of each optimizer step inside
/// it. A policy without no_sync() is taken to do all its communication in finish(), which
/// train_step calls once per optimizer step. Models: parallel::data_parallel<Comm, Compression>.
template <class P>
concept parallel_policy_with_no_sync = parallel_policy<P> && requires(P& p) {
  p.no_sync();
};

/// One process, nothing to reduce.
struct no_parallel {
  void finish() noexcept {}
};
static_assert(parallel_policy<no_parallel>);

/// A model train_step can run: an nn::module<T, Device> (its forward runs through
/// amp::forward<Precision>; an nn::sequential also through the recompute policy).
template <class M>
concept step_model = requires {
  typename M::value_type;
  typename M::device_type;
}
&&std::derived_from<M, nn::module<typename M::value_type, typename M::device_type>>;

/// A step_model whose forward takes integer token ids (tensor<int64, Device>, e.g. [B, T]) - a
/// language model with nn::embedding first. train_step and evaluate run it on token batches.
template <class M>
concept token_model = step_model<M> && requires(M& m, const tensor<std::int64_t, typename M::device_type>& t) {
  { m.forward(t) } -> std::convertible_to<autograd::var<typename M::value_type, typename M::device_type>>;
};

/// An optimizer train_step can drive: optim::optimizer plus params() (the scaler unscales them and
/// clipping reads them).
template <class O>
concept step_optimizer = requires(const O& o) {
  { o.params() } -> std::convertible_to<const std::vector<typename O::var_type>&>;
};

}  // namespace trainkit::train
