// trainkit/autograd/autocast.hpp - the hook through which a precision scope reaches every GEMM op.
//
// autograd::linear, matmul, conv2d, scaled_dot_product_attention and packed_self_attention ask
// current_autocast<T, D>() first: inside an amp::autocast scope (amp/autocast.hpp) it holds the
// scope's mixed-precision versions of them, so any module - a user's included, whatever its
// structure - runs its GEMMs in the compute type without knowing it. autograd/ does not depend on
// amp/: it only keeps the per-thread table the scope installs, and counts the ops that ran through
// it (how amp tells "mixed precision did nothing" apart).
#pragma once

#include <cstdint>

#include "trainkit/autograd/var.hpp"

namespace trainkit::autograd {

struct conv2d_options;
template <class T, class D>
struct attention_options;

/// The ops a precision scope replaces on vars of T on D (a null entry: the plain op).
template <class T, class D>
struct autocast_ops {
  var<T, D> (*linear)(const var<T, D>& x, const var<T, D>& weight, const var<T, D>& bias) = nullptr;
  var<T, D> (*matmul)(const var<T, D>& a, const var<T, D>& b) = nullptr;
  var<T, D> (*conv2d)(const var<T, D>& x, const var<T, D>& weight, const var<T, D>& bias,
                      const conv2d_options& o) = nullptr;
  var<T, D> (*attention)(const var<T, D>& q, const var<T, D>& k, const var<T, D>& v,
                         const attention_options<T, D>& o) = nullptr;
  var<T, D> (*packed_attention)(const var<T, D>& qkv, index_t heads, const attention_options<T, D>& o) = nullptr;
};

namespace detail {
template <class T, class D>
inline const autocast_ops<T, D>*& autocast_slot() noexcept {
  thread_local const autocast_ops<T, D>* ops = nullptr;
  return ops;
}
inline std::uint64_t& autocast_counter() noexcept {
  thread_local std::uint64_t n = 0;
  return n;
}
}  // namespace detail

/// The ops of the innermost precision scope on this thread for vars of T on D, or null.
template <class T, class D>
const autocast_ops<T, D>* current_autocast() noexcept {
  return detail::autocast_slot<T, D>();
}

/// Ops this thread has run in a lower-precision compute type so far (the scopes' ops add to it).
inline std::uint64_t autocast_op_count() noexcept { return detail::autocast_counter(); }

/// RAII: installs `ops` (null: none, the plain ops) for vars of T on D on this thread; restores
/// the previous table at the end of the scope. The scope's ops call this with null around their
/// own work, so that they are not dispatched to themselves.
template <class T, class D>
class autocast_guard {
 public:
  explicit autocast_guard(const autocast_ops<T, D>* ops) noexcept : previous_(detail::autocast_slot<T, D>()) {
    detail::autocast_slot<T, D>() = ops;
  }
  ~autocast_guard() { detail::autocast_slot<T, D>() = previous_; }
  autocast_guard(const autocast_guard&) = delete;
  autocast_guard& operator=(const autocast_guard&) = delete;

 private:
  const autocast_ops<T, D>* previous_;
};

}  // namespace trainkit::autograd
