// trainkit/autograd/grad_mode.hpp - whether ops record a graph on this thread.
#pragma once

namespace trainkit::autograd {

namespace detail {
inline bool& grad_mode_flag() noexcept {
  thread_local bool enabled = true;
  return enabled;
}
inline bool& recompute_flag() noexcept {
  thread_local bool recomputing = false;
  return recomputing;
}
}  // namespace detail

/// True while gradient checkpointing re-runs a forward in backward on this thread: layers with
/// side effects on their state (batch norm's running statistics) skip them, so a recomputed
/// segment leaves the model as a stored one does.
inline bool is_recomputing() noexcept { return detail::recompute_flag(); }

/// RAII scope of a recomputation (checkpoint/function.hpp sets it).
class recomputing {
 public:
  recomputing() noexcept : prev_(detail::recompute_flag()) { detail::recompute_flag() = true; }
  ~recomputing() { detail::recompute_flag() = prev_; }
  recomputing(const recomputing&) = delete;
  recomputing& operator=(const recomputing&) = delete;

 private:
  bool prev_;
};

/// True when ops on vars that require grad record the graph (the default).
inline bool is_grad_enabled() noexcept { return detail::grad_mode_flag(); }

/// RAII scope in which no graph is recorded (evaluation, optimizer updates), like torch.no_grad().
class no_grad {
 public:
  no_grad() noexcept : prev_(detail::grad_mode_flag()) { detail::grad_mode_flag() = false; }
  ~no_grad() { detail::grad_mode_flag() = prev_; }
  no_grad(const no_grad&) = delete;
  no_grad& operator=(const no_grad&) = delete;

 private:
  bool prev_;
};

/// RAII scope that turns recording back on inside a no_grad scope (gradient checkpointing needs it).
class enable_grad {
 public:
  enable_grad() noexcept : prev_(detail::grad_mode_flag()) { detail::grad_mode_flag() = true; }
  ~enable_grad() { detail::grad_mode_flag() = prev_; }
  enable_grad(const enable_grad&) = delete;
  enable_grad& operator=(const enable_grad&) = delete;

 private:
  bool prev_;
};

}  // namespace trainkit::autograd
