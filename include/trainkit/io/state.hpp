// trainkit/io/state.hpp - save_state / load_state: one section of a snapshot per component of the
// training state, for anything io::snapshottable (io/concepts.hpp).
//
//   io::save_state(snap, "model", *model);            // state_dict(): parameters and buffers
//   io::save_state(snap, "optimizer", opt);           // state_dict(): buffers, step counters, options
//   io::save_state(snap, "schedule", schedule);       // get_state(): the step counter
//   io::save_state(snap, "scaler", scaler);           // get_state(): scale and growth tracker
//   io::save_state(snap, "batches", batches);         // get_state(): seed, epoch, position
//   io::save_state(snap, "rng.default", default_generator());
//   io::save_state(snap, "compression", ddp.compression());   // state(): error-feedback residuals
//   ...
//   io::load_state(snap, "model", *model);            // the same calls with load_state
//
// How each kind is stored (the record names docs/snapshots.md lists):
//   state dict       one tensor record per key ("0.weight", "1.running_mean");
//   optimizer        tensor records for its buffers, integer records for its counters ("step",
//                    "<i>.step"), real records for its hyper-parameters ("lr", "momentum");
//   named tensors    one tensor record per key ("worker.0", "server.0");
//   value state      an aggregate field by field: records named by state_field_names, else "0",
//                    "1", ... (nested aggregates as "1.0", "1.1"); integers and enums as integer
//                    records (64-bit two's complement), floating-point as real, std::string as string.
// Loading checks kinds, element types and shapes against what the object holds now, and that the
// section has no records the object does not know; errors name the record, the section and file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/io/concepts.hpp"
#include "trainkit/io/snapshot.hpp"
#include "trainkit/optim/schedule.hpp"  // schedule_state: named fields

namespace trainkit::io {

template <>
struct state_field_names<generator::state> {
  static constexpr std::array<std::string_view, 2> names = {"seed", "offset"};
};
template <>
struct state_field_names<optim::schedule_state> {
  static constexpr std::array<std::string_view, 1> names = {"step"};
};

namespace detail {

/// Calls f(field...) with references to the fields of aggregate s, in declaration order.
template <class S, class F>
constexpr void for_fields(S& s, F&& f) {
  constexpr std::size_t n = field_count<std::remove_const_t<S>>();
  static_assert(n <= 12,
                "trainkit::io: state structs with more than 12 fields are not supported; split them");
  if constexpr (n == 0) {
    (void)s;
    f();
  } else if constexpr (n == 1) {
    auto& [a] = s;
    f(a);
  } else if constexpr (n == 2) {
    auto& [a, b] = s;
    f(a, b);
  } else if constexpr (n == 3) {
    auto& [a, b, c] = s;
    f(a, b, c);
  } else if constexpr (n == 4) {
    auto& [a, b, c, d] = s;
    f(a, b, c, d);
  } else if constexpr (n == 5) {
    auto& [a, b, c, d, e] = s;
    f(a, b, c, d, e);
  } else if constexpr (n == 6) {
    auto& [a, b, c, d, e, g] = s;
    f(a, b, c, d, e, g);
  } else if constexpr (n == 7) {
    auto& [a, b, c, d, e, g, h] = s;
    f(a, b, c, d, e, g, h);
  } else if constexpr (n == 8) {
    auto& [a, b, c, d, e, g, h, i] = s;
    f(a, b, c, d, e, g, h, i);
  } else if constexpr (n == 9) {
    auto& [a, b, c, d, e, g, h, i, j] = s;
    f(a, b, c, d, e, g, h, i, j);
  } else if constexpr (n == 10) {
    auto& [a, b, c, d, e, g, h, i, j, k] = s;
    f(a, b, c, d, e, g, h, i, j, k);
  } else if constexpr (n == 11) {
    auto& [a, b, c, d, e, g, h, i, j, k, l] = s;
    f(a, b, c, d, e, g, h, i, j, k, l);
  } else {
    auto& [a, b, c, d, e, g, h, i, j, k, l, m] = s;
    f(a, b, c, d, e, g, h, i, j, k, l, m);
  }
}

/// The record name of field i of S under prefix.
template <class S>
std::string field_name(const std::string& prefix, std::size_t i) {
  std::string leaf;
  if constexpr (requires { S::snapshot_field_names; }) {
    static_assert(std::size(S::snapshot_field_names) == field_count<S>(),
                  "trainkit::io: snapshot_field_names must name every field");
    leaf = std::string(S::snapshot_field_names[i]);
  } else if constexpr (requires { state_field_names<S>::names; }) {
    static_assert(state_field_names<S>::names.size() == field_count<S>(),
                  "trainkit::io: state_field_names<S> must name every field");
    leaf = std::string(state_field_names<S>::names[i]);
  } else {
    leaf = std::to_string(i);
  }
  return prefix.empty() ? leaf : prefix + "." + leaf;
}

template <class V>
constexpr bool is_scalar_value =
    std::is_arithmetic_v<V> || std::is_enum_v<V> || std::is_same_v<V, std::string>;

/// The record name of a whole value: "value" for a scalar, none (fields use their own) for a struct.
template <class V>
std::string root_name() {
  return is_scalar_value<V> ? std::string("value") : std::string();
}

template <class V>
void save_value(snapshot_section& sec, const std::string& name, const V& v) {
  if constexpr (std::is_same_v<V, bool>) {
    sec.put_int(name, v ? 1 : 0);
  } else if constexpr (std::is_enum_v<V>) {
    sec.put_int(name, static_cast<std::int64_t>(static_cast<std::underlying_type_t<V>>(v)));
  } else if constexpr (std::is_integral_v<V>) {
    sec.put_int(name, static_cast<std::int64_t>(v));  // uint64: the bit pattern
  } else if constexpr (std::is_floating_point_v<V>) {
    sec.put_real(name, static_cast<double>(v));
  } else if constexpr (std::is_same_v<V, std::string>) {
    sec.put_string(name, v);
  } else {
    static_assert(
        std::is_aggregate_v<V>,
        "trainkit::io: a state field must be arithmetic, an enum, std::string or a plain struct of those");
    std::size_t i = 0;
    for_fields(v, [&](const auto&... f) { (save_value(sec, field_name<V>(name, i++), f), ...); });
  }
}

/// The names save_value(sec, name, V{}) puts (for the unknown-record check).
template <class V>
void value_names(const std::string& name, std::unordered_set<std::string>& out) {
  if constexpr (is_scalar_value<V>) {
    out.insert(name);
  } else {
    V v{};
    std::size_t i = 0;
    for_fields(v, [&](const auto&... f) {
      (value_names<std::remove_cvref_t<decltype(f)>>(field_name<V>(name, i++), out), ...);
    });
  }
}

template <class V>
void load_value(const snapshot_section& sec, const std::string& name, V& v) {
  if constexpr (std::is_same_v<V, bool>) {
    const std::int64_t x = sec.get_int(name);
    TRAINKIT_CHECK(x == 0 || x == 1, io_error, "load_state",
                   sec.describe(name) << " holds " << x << ", expected 0 or 1");
    v = x != 0;
  } else if constexpr (std::is_enum_v<V>) {
    v = static_cast<V>(static_cast<std::underlying_type_t<V>>(sec.get_int(name)));
  } else if constexpr (std::is_integral_v<V>) {
    const std::int64_t x = sec.get_int(name);
    if constexpr (std::is_same_v<V, std::uint64_t> || std::is_same_v<V, std::int64_t>) {
      v = static_cast<V>(x);
    } else {
      TRAINKIT_CHECK(std::in_range<V>(x), io_error, "load_state",
                     sec.describe(name) << " holds " << x << ", out of range for the field's type");
      v = static_cast<V>(x);
    }
  } else if constexpr (std::is_floating_point_v<V>) {
    v = static_cast<V>(sec.get_real(name));
  } else if constexpr (std::is_same_v<V, std::string>) {
    v = sec.get_string(name);
  } else {
    std::size_t i = 0;
    for_fields(v, [&](auto&... f) { (load_value(sec, field_name<V>(name, i++), f), ...); });
  }
}

/// io_error listing the records of sec that are not in `known`.
inline void check_no_unknown(const snapshot_section& sec, const std::unordered_set<std::string>& known) {
  std::string extra;
  std::size_t count = 0;
  for (const auto& n : sec.names())
    if (!known.count(n)) {
      if (count < 8) extra += (count ? ", '" : "'") + n + "'";
      ++count;
    }
  TRAINKIT_CHECK(count == 0, io_error, "load_state",
                 "section '" << sec.name() << "'" << sec.origin() << " holds " << count
                             << " record(s) the object does not have: " << extra << (count > 8 ? ", ..." : "")
                             << " (a snapshot of a different model or configuration?)");
}

}  // namespace detail

/// Writes x's state into sec (records as the top of this file describes).
template <class X>
void save_state(snapshot_section& sec, const X& x) {
  static_assert(snapshottable<X>,
                "trainkit::io::save_state: the type is not io::snapshottable - give it state_dict()/"
                "load_state_dict(), get_state()/set_state() with a plain struct, or state()/load_state()");
  if constexpr (has_tensor_state_dict<X>) {
    for (const auto& [k, t] : x.state_dict()) sec.put_tensor(k, t);
  } else if constexpr (has_optimizer_state_dict<X>) {
    const auto sd = x.state_dict();
    for (const auto& [k, t] : sd.tensors) sec.put_tensor(k, t);
    for (const auto& [k, v] : sd.counters) sec.put_int(k, v);
    for (const auto& [k, v] : sd.scalars) sec.put_real(k, v);
  } else if constexpr (has_named_tensor_state<X>) {
    for (const auto& [k, t] : x.state()) sec.put_tensor(k, t);
  } else if constexpr (has_value_state<X>) {
    const auto st = x.get_state();
    detail::save_value(sec, detail::root_name<std::remove_cvref_t<decltype(st)>>(), st);
  } else {
    detail::save_value(sec, detail::root_name<X>(), x);
  }
}

/// Restores x from sec. Tensors must have the element type and (for state dicts) the shapes x
/// holds now; records x does not know are an io_error, as are missing ones.
template <class X>
void load_state(const snapshot_section& sec, X& x) {
  static_assert(snapshottable<X>,
                "trainkit::io::load_state: the type is not io::snapshottable - give it state_dict()/"
                "load_state_dict(), get_state()/set_state() with a plain struct, or state()/load_state()");
  if constexpr (has_tensor_state_dict<X>) {
    auto sd = x.state_dict();
    using list = std::remove_cvref_t<decltype(sd)>;
    using T = typename detail::is_named_tensor_list<list>::value_type;
    using D = typename detail::is_named_tensor_list<list>::device_type;
    std::unordered_set<std::string> known;
    list loaded;
    loaded.reserve(sd.size());
    for (const auto& [k, t] : sd) {
      known.insert(k);
      loaded.emplace_back(k, sec.template get_tensor<T, D>(k, t.sizes()));
    }
    detail::check_no_unknown(sec, known);
    x.load_state_dict(loaded);
  } else if constexpr (has_optimizer_state_dict<X>) {
    auto sd = x.state_dict();  // for its type; the loaded one is built from the records
    using list = std::remove_cvref_t<decltype(sd.tensors)>;
    using T = typename detail::is_named_tensor_list<list>::value_type;
    using D = typename detail::is_named_tensor_list<list>::device_type;
    decltype(sd) loaded;
    for (const auto& n : sec.names()) {
      switch (sec.info(n).kind) {
        case record_kind::tensor:
          loaded.tensors.emplace_back(n, sec.template get_tensor<T, D>(n));
          break;
        case record_kind::integer:
          loaded.counters.emplace_back(n, sec.get_int(n));
          break;
        case record_kind::real:
          loaded.scalars.emplace_back(n, sec.get_real(n));
          break;
        case record_kind::string:
          TRAINKIT_CHECK(false, io_error, "load_state",
                         sec.describe(n) << " is a string; an optimizer's state has none");
      }
    }
    try {
      x.load_state_dict(loaded);
    } catch (const error& e) {
      TRAINKIT_CHECK(
          false, io_error, "load_state",
          "section '" << sec.name() << "'" << sec.origin() << " does not fit the optimizer: " << e.what());
    }
  } else if constexpr (has_named_tensor_state<X>) {
    using list = std::remove_cvref_t<decltype(x.state())>;
    using T = typename detail::is_named_tensor_list<list>::value_type;
    using D = typename detail::is_named_tensor_list<list>::device_type;
    list loaded;
    for (const auto& n : sec.names()) loaded.emplace_back(n, sec.template get_tensor<T, D>(n));
    try {
      x.load_state(loaded);
    } catch (const error& e) {
      TRAINKIT_CHECK(false, io_error, "load_state",
                     "section '" << sec.name() << "'" << sec.origin() << " does not fit: " << e.what());
    }
  } else if constexpr (has_value_state<X>) {
    using S = std::remove_cvref_t<decltype(x.get_state())>;
    S st = x.get_state();
    detail::load_value(sec, detail::root_name<S>(), st);
    std::unordered_set<std::string> known;
    detail::value_names<S>(detail::root_name<S>(), known);
    detail::check_no_unknown(sec, known);
    x.set_state(st);
  } else {
    const std::string root = detail::root_name<X>();
    X v = x;
    detail::load_value(sec, root, v);
    std::unordered_set<std::string> known;
    detail::value_names<X>(root, known);
    detail::check_no_unknown(sec, known);
    x = std::move(v);
  }
}

/// Loads rank `rank` of `world` of a reshardable x from the sections of every rank of a snapshot
/// written by old.size() ranks (training_state's resume on another world size).
template <reshardable X>
void reshard_from(const std::vector<const snapshot_section*>& old, X& x, int rank, int world) {
  using list = std::remove_cvref_t<decltype(x.state())>;
  using T = typename detail::is_named_tensor_list<list>::value_type;
  using D = typename detail::is_named_tensor_list<list>::device_type;
  std::vector<list> states;
  for (const snapshot_section* sec : old) {
    list l;
    for (const auto& n : sec->names()) l.emplace_back(n, sec->template get_tensor<T, D>(n));
    states.push_back(std::move(l));
  }
  try {
    reshard_state(x, states, rank, world);
  } catch (const error& e) {
    TRAINKIT_CHECK(false, io_error, "load_state",
                   "sections '" << old.front()->name() << "' ... of " << old.size() << " ranks"
                                << old.front()->origin() << " do not fit rank " << rank << " of " << world << ": "
                                << e.what());
  }
}

/// save_state into a new section `section` of snap.
template <class X>
void save_state(snapshot& snap, std::string section, const X& x) {
  save_state(snap.add_section(std::move(section)), x);
}

/// load_state from the section `section` of snap (io_error naming the file when it is absent).
template <class X>
void load_state(const snapshot& snap, std::string_view section, X& x) {
  load_state(snap.section(section), x);
}

}  // namespace trainkit::io
