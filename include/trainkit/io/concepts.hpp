// trainkit/io/concepts.hpp - what can go into a snapshot: the shapes of state the library's
// components already expose, recognised by their members (no registration, no base class).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>  // std::size_t
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>  // std::pair, std::index_sequence
#include <vector>

#include "trainkit/core/tensor.hpp"

namespace trainkit::io {

namespace detail {

template <class X>
struct is_named_tensor_list : std::false_type {};
/// std::vector<std::pair<std::string, tensor<T, D>>>: nn::state_dict, compression::compression_state.
template <class T, class D>
struct is_named_tensor_list<std::vector<std::pair<std::string, tensor<T, D>>>> : std::true_type {
  using value_type = T;
  using device_type = D;
};

/// Converts to anything; only used unevaluated, to count the fields of an aggregate.
struct any_init {
  template <class U>
  operator U() const noexcept;  // NOLINT: declared only
};

template <class S, std::size_t... I>
constexpr bool brace_initializable(std::index_sequence<I...>) {
  return requires { S{((void)I, any_init{})...}; };
}

/// The number of fields of aggregate S (Boost.PFR's trick: the longest braced list of any_init
/// S accepts). Bounded by 12, the most state_fields decomposes.
template <class S, std::size_t N = 0>
constexpr std::size_t field_count() {
  if constexpr (N > 12)
    return N;
  else if constexpr (brace_initializable<S>(std::make_index_sequence<N + 1>{}))
    return field_count<S, N + 1>();
  else
    return N;
}

}  // namespace detail

/// A type with a textual name per field: either the member `S::snapshot_field_names` (an array of
/// string_view, one per field) or a specialisation of `state_field_names<S>`. Without one, the
/// fields are stored as records "0", "1", ...
template <class S>
struct state_field_names {};

/// A value a snapshot stores record by record: an arithmetic type, an enum, std::string, or an
/// aggregate (a plain struct such as generator::state, schedule_state, batch_iterator::state,
/// the loss scalers' state) of at most 12 such values, nested aggregates included.
template <class S>
concept state_value = std::is_arithmetic_v<S> || std::is_enum_v<S> || std::same_as<S, std::string> ||
    (std::is_aggregate_v<S> && !std::is_array_v<S> && std::is_default_constructible_v<S> &&
     detail::field_count<S>() <= 12);

/// An nn::module-like object: state_dict() gives (name, tensor) pairs and load_state_dict takes them.
template <class M>
concept has_tensor_state_dict = requires(const M& cm, M& m) {
  requires detail::is_named_tensor_list<std::remove_cvref_t<decltype(cm.state_dict())>>::value;
  m.load_state_dict(cm.state_dict());
};

/// An optimizer: state_dict() gives {tensors, counters, scalars} (optim::optimizer_state_dict).
template <class O>
concept has_optimizer_state_dict = requires(const O& co, O& o) {
  requires detail::is_named_tensor_list<std::remove_cvref_t<decltype(co.state_dict().tensors)>>::value;
  { co.state_dict().counters } -> std::convertible_to<std::vector<std::pair<std::string, std::int64_t>>>;
  { co.state_dict().scalars } -> std::convertible_to<std::vector<std::pair<std::string, double>>>;
  o.load_state_dict(co.state_dict());
};

/// A policy whose state is named tensors through state()/load_state() (dist compression:
/// error-feedback residuals).
template <class C>
concept has_named_tensor_state = requires(const C& cc, C& c) {
  requires detail::is_named_tensor_list<std::remove_cvref_t<decltype(cc.state())>>::value;
  c.load_state(cc.state());
};

/// Anything with get_state() -> a state_value and set_state(that value): generators, schedules,
/// batch iterators and samplers, loss scalers.
template <class X>
concept has_value_state = requires(const X& cx, X& x) {
  requires state_value<std::remove_cvref_t<decltype(cx.get_state())>>;
  x.set_state(cx.get_state());
};

/// A per-rank component with named tensor state that can be redistributed over another number of
/// ranks: reshard_state(x, old_states, rank, world), found by argument-dependent lookup, loads
/// rank `rank` of `world` from every old rank's state() (compression::reshard_state for the gradient
/// compressions: error-feedback residuals). training_state uses it on a resume on another world size.
template <class C>
concept reshardable = has_named_tensor_state<C> &&
    requires(C& c, const std::vector<std::remove_cvref_t<decltype(std::declval<const C&>().state())>>& old, int r) {
      reshard_state(c, old, r, r);
    };

/// What io::save_state / io::load_state and training_state::add accept (tried in this order):
/// has_tensor_state_dict, has_optimizer_state_dict, has_named_tensor_state, has_value_state, and
/// a bare state_value.
template <class X>
concept snapshottable = has_tensor_state_dict<X> || has_optimizer_state_dict<X> ||
    has_named_tensor_state<X> || has_value_state<X> || state_value<X>;

}  // namespace trainkit::io
