// trainkit/nn/module.hpp - module<T, Device>: named parameters, buffers and submodules, the
// state dict that snapshots save, and the train/eval switch.
//
// Naming follows PyTorch exactly, so a state dict reads like torch's: a parameter "weight" of the
// submodule registered as "0" inside the one registered as "features" is "features.0.weight".
// Orders follow PyTorch too:
//   parameters()/named_parameters(): own parameters in registration order, then each child's,
//                                    depth first (PyTorch's named_modules() pre-order);
//   state_dict():                    per module, own parameters, then own persistent buffers, then
//                                    the children recursively (torch's _save_to_state_dict order).
//
// Not yet here: to<Device>() (a module's device is part of its type, so moving a model means
// building a module<T, cuda> and load_state_dict() from the cpu one; a converting helper comes
// with the CUDA backend).
#pragma once

#include <concepts>  // std::derived_from
#include <cstddef>   // std::size_t
#include <deque>     // std::deque: references to registered entries stay valid as more arrive
#include <memory>    // std::shared_ptr
#include <string>
#include <string_view>
#include <unordered_map>  // load_state_dict's lookup by key
#include <unordered_set>  // de-duplication of shared parameters
#include <utility>        // std::pair, std::move
#include <vector>

#include "trainkit/autograd/var.hpp"
#include "trainkit/core/device.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/ops/elementwise.hpp"  // copy_, fill_ (load_state_dict, zero_grad(false))
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit::nn {

/// An ordered list of (dotted name, tensor): what a module saves and loads. The tensors alias the
/// module's own (as torch's state_dict does): clone them to keep a copy that later training steps
/// do not change (clone_state_dict below).
template <class T, class Device = cpu>
using state_dict = std::vector<std::pair<std::string, tensor<T, Device>>>;

/// A deep copy of a state dict (every tensor cloned).
template <class T, class Device>
state_dict<T, Device> clone_state_dict(const state_dict<T, Device>& sd) {
  state_dict<T, Device> r;
  r.reserve(sd.size());
  for (const auto& [k, v] : sd) r.emplace_back(k, v.clone());
  return r;
}

/// What load_state_dict(..., strict = false) could not match (strict loads throw instead).
struct load_result {
  std::vector<std::string> missing_keys;     // in the module, absent from the state dict
  std::vector<std::string> unexpected_keys;  // in the state dict, absent from the module
};

/// The base of every layer and model. Parameters are var leaves (requires_grad by default);
/// buffers are plain tensors that the state dict saves (running statistics, counters); children
/// are shared modules. Modules are held by std::shared_ptr (make_shared) and are neither copied
/// nor moved: parameters and buffers live inside the module and layers keep pointers to them.
/// \tparam T floating-point element type of the parameters and activations
/// \tparam Device cpu or cuda
template <class T = float, class Device = cpu>
class module {
  static_assert(floating_element<T>, "nn::module<T, Device>: T must be a floating-point element type");
  static_assert(device<Device>, "nn::module<T, Device>: Device must be a device tag such as trainkit::cpu");

 public:
  using value_type = T;
  using device_type = Device;
  using var_type = autograd::var<T, Device>;
  using tensor_type = tensor<T, Device>;
  using module_ptr = std::shared_ptr<module>;
  using state_dict_type = nn::state_dict<T, Device>;

  module() = default;
  virtual ~module() = default;
  module(const module&) = delete;
  module& operator=(const module&) = delete;
  module(module&&) = delete;
  module& operator=(module&&) = delete;

  /// The layer's kind ("linear", "batch_norm2d"...) for messages; models override it too.
  virtual std::string_view type_name() const { return "module"; }

  /// The forward pass of a single-input module. The base throws: modules with other inputs
  /// (embedding takes indices) provide their own forward and are not usable inside sequential.
  virtual var_type forward(const var_type& /*x*/) {
    TRAINKIT_CHECK(false, usage_error, "module::forward",
                   "module of type '" << type_name() << "' has no single-input forward(var)");
    return {};
  }
  var_type operator()(const var_type& x) { return forward(x); }

  // ---- registration ---------------------------------------------------------------------------
  /// Adds a parameter: a new leaf over value. Returns a reference that stays valid for the life
  /// of the module (layers keep a pointer to it).
  var_type& register_parameter(std::string name, tensor_type value, bool requires_grad = true) {
    check_new_name(name, "register_parameter");
    params_.push_back({std::move(name), var_type(std::move(value), requires_grad)});
    return params_.back().value;
  }
  /// Adds an existing leaf as a parameter (weight tying: the same var in two modules). It is
  /// listed once by parameters() and under both names by state_dict(), as in PyTorch.
  var_type& register_parameter(std::string name, const var_type& v) {
    check_new_name(name, "register_parameter");
    TRAINKIT_CHECK(v.defined() && v.is_leaf(), usage_error, "register_parameter",
                   "parameter '" << name << "' must be a defined leaf var");
    params_.push_back({std::move(name), v});
    return params_.back().value;
  }

  /// Adds a buffer. Persistent buffers are part of the state dict; others (caches) are not.
  tensor_type& register_buffer(std::string name, tensor_type value, bool persistent = true) {
    check_new_name(name, "register_buffer");
    buffers_.push_back({std::move(name), std::move(value), persistent});
    return buffers_.back().value;
  }

  /// Adds a child module; its names get the prefix "name.". Returns the child.
  template <class M>
  requires std::derived_from<M, module> std::shared_ptr<M> register_module(std::string name,
                                                                           std::shared_ptr<M> child) {
    check_new_name(name, "register_module");
    TRAINKIT_CHECK(child != nullptr, usage_error, "register_module", "child module '" << name << "' is null");
    TRAINKIT_CHECK(static_cast<const module*>(child.get()) != this, usage_error, "register_module",
                   "a module cannot be its own child ('" << name << "')");
    children_.push_back({std::move(name), child});
    return child;
  }

  // ---- access ---------------------------------------------------------------------------------
  /// Every parameter (own first, then the children's, depth first); a var shared under two names
  /// appears once, at its first position.
  std::vector<var_type> parameters(bool recurse = true) const {
    std::vector<var_type> r;
    for (auto& [n, v] : named_parameters(recurse)) r.push_back(v);
    return r;
  }
  std::vector<std::pair<std::string, var_type>> named_parameters(bool recurse = true) const {
    std::vector<std::pair<std::string, var_type>> r;
    std::unordered_set<const void*> seen;
    collect_parameters("", recurse, seen, r);
    return r;
  }
  /// Every buffer (persistent or not) with its dotted name, own first, then the children's.
  std::vector<std::pair<std::string, tensor_type>> named_buffers(bool recurse = true) const {
    std::vector<std::pair<std::string, tensor_type>> r;
    collect_buffers("", recurse, r);
    return r;
  }
  std::vector<tensor_type> buffers(bool recurse = true) const {
    std::vector<tensor_type> r;
    for (auto& [n, b] : named_buffers(recurse)) r.push_back(b);
    return r;
  }
  /// Direct children in registration order.
  std::vector<std::pair<std::string, module_ptr>> named_children() const {
    std::vector<std::pair<std::string, module_ptr>> r;
    for (auto& c : children_) r.emplace_back(c.name, c.value);
    return r;
  }
  /// This module (name "") and every descendant, pre-order, with dotted names.
  std::vector<std::pair<std::string, const module*>> named_modules() const {
    std::vector<std::pair<std::string, const module*>> r;
    collect_modules("", r);
    return r;
  }
  /// The descendant at a dotted path ("features.0"); usage_error naming the missing part.
  module_ptr submodule(std::string_view path) const {
    const module* m = this;
    module_ptr found;
    while (!path.empty()) {
      const std::size_t dot = path.find('.');
      const std::string_view part = path.substr(0, dot);
      found = m->find_child(part);
      TRAINKIT_CHECK(found != nullptr, usage_error, "module::submodule",
                     "module of type '" << m->type_name() << "' has no child named '" << part << "'");
      m = found.get();
      path = dot == std::string_view::npos ? std::string_view{} : path.substr(dot + 1);
    }
    TRAINKIT_CHECK(found != nullptr, usage_error, "module::submodule", "empty path");
    return found;
  }
  /// The parameter at a dotted name ("0.weight"); usage_error when there is none.
  var_type& parameter(std::string_view dotted) {
    auto [owner, leaf] = resolve(dotted, "module::parameter");
    for (auto& p : owner->params_)
      if (p.name == leaf) return p.value;
    TRAINKIT_CHECK(false, usage_error, "module::parameter", "no parameter named '" << dotted << "'");
    return params_.front().value;  // unreachable
  }
  /// The buffer at a dotted name ("1.running_mean"); usage_error when there is none.
  tensor_type& buffer(std::string_view dotted) {
    auto [owner, leaf] = resolve(dotted, "module::buffer");
    for (auto& b : owner->buffers_)
      if (b.name == leaf) return b.value;
    TRAINKIT_CHECK(false, usage_error, "module::buffer", "no buffer named '" << dotted << "'");
    return buffers_.front().value;  // unreachable
  }
  /// Number of parameter elements (shared parameters counted once).
  index_t num_parameters() const {
    index_t n = 0;
    for (auto& p : parameters()) n += p.numel();
    return n;
  }

  // ---- state dict -----------------------------------------------------------------------------
  /// (dotted name, tensor) of every parameter value and persistent buffer, in PyTorch's order.
  /// The tensors alias the module's (see nn::state_dict).
  state_dict_type state_dict() const {
    state_dict_type r;
    collect_state("", r);
    return r;
  }

  /// Copies the values of sd into this module's parameters and buffers, in place (optimizers
  /// and views that hold them keep seeing the module's tensors). Every key is checked before
  /// anything is copied, so a failed load leaves the module unchanged. A shape mismatch is a
  /// shape_error naming the key and both shapes; with strict, missing or unexpected keys are a
  /// value_error that lists them all; without strict they are returned.
  load_result load_state_dict(const state_dict_type& sd, bool strict = true) {
    std::unordered_map<std::string, const tensor_type*> given;
    for (const auto& [k, v] : sd) {
      TRAINKIT_CHECK(given.emplace(k, &v).second, value_error, "load_state_dict",
                     "key '" << k << "' appears more than once in the state dict");
    }
    std::vector<std::pair<std::string, tensor_type*>> mine;
    collect_state_targets("", mine);

    load_result res;
    std::vector<std::pair<tensor_type*, const tensor_type*>> copies;
    std::unordered_set<std::string> known;
    for (auto& [k, dst] : mine) {
      known.insert(k);
      auto it = given.find(k);
      if (it == given.end()) {
        res.missing_keys.push_back(k);
        continue;
      }
      const tensor_type& src = *it->second;
      TRAINKIT_CHECK(src.defined(), value_error, "load_state_dict",
                     "the tensor for key '" << k << "' is undefined");
      TRAINKIT_CHECK(src.sizes() == dst->sizes(), shape_error, "load_state_dict",
                     "size mismatch for '" << k << "': copying a tensor of shape " << to_string(src.sizes())
                                           << " from the state dict, the shape in the current " << type_name()
                                           << " is " << to_string(dst->sizes()));
      copies.emplace_back(dst, &src);
    }
    for (const auto& [k, v] : sd)
      if (!known.count(k)) res.unexpected_keys.push_back(k);
    if (strict && (!res.missing_keys.empty() || !res.unexpected_keys.empty())) {
      std::string msg = "error(s) in loading the state dict of a " + std::string(type_name()) + ":";
      if (!res.missing_keys.empty()) msg += " missing key(s): " + join(res.missing_keys) + ".";
      if (!res.unexpected_keys.empty()) msg += " unexpected key(s): " + join(res.unexpected_keys) + ".";
      TRAINKIT_CHECK(false, value_error, "load_state_dict", msg);
    }
    for (auto& [dst, src] : copies) {
      if (dst->shares_storage_with(*src) && dst->data() == src->data() && dst->strides() == src->strides())
        continue;  // loading a module's own state dict
      copy_(*dst, *src);
    }
    return res;
  }

  // ---- modes and gradients --------------------------------------------------------------------
  /// Training mode for this module and every descendant (dropout drops, batch norm uses batch
  /// statistics); train(false) is eval().
  virtual void train(bool on = true) {
    training_ = on;
    for (auto& c : children_) c.value->train(on);
  }
  void eval() { train(false); }
  bool is_training() const noexcept { return training_; }

  /// Drops every parameter's gradient (set_to_none, PyTorch's default), or zeroes it in place.
  void zero_grad(bool set_to_none = true) {
    for (auto& p : parameters()) {
      if (set_to_none) {
        p.zero_grad();
      } else if (p.has_grad()) {
        fill_(p.grad(), T(0));
      }
    }
  }

 private:
  template <class V>
  struct entry {
    std::string name;
    V value;
  };
  struct buffer_entry {
    std::string name;
    tensor_type value;
    bool persistent;
  };

  void check_new_name(const std::string& name, const char* op) const {
    TRAINKIT_CHECK(!name.empty(), usage_error, op, "names must not be empty");
    TRAINKIT_CHECK(name.find('.') == std::string::npos, usage_error, op,
                   "name '" << name << "' must not contain '.' (dots separate submodules)");
    bool taken = find_child(name) != nullptr;
    for (auto& p : params_) taken = taken || p.name == name;
    for (auto& b : buffers_) taken = taken || b.name == name;
    TRAINKIT_CHECK(!taken, usage_error, op,
                   "'" << name << "' is already a parameter, buffer or child of this " << type_name());
  }

  module_ptr find_child(std::string_view name) const {
    for (auto& c : children_)
      if (c.name == name) return c.value;
    return nullptr;
  }

  /// The module that owns the last component of a dotted name, and that component.
  std::pair<module*, std::string_view> resolve(std::string_view dotted, const char* op) {
    const std::size_t dot = dotted.rfind('.');
    if (dot == std::string_view::npos) return {this, dotted};
    TRAINKIT_CHECK(dot + 1 < dotted.size(), usage_error, op, "name '" << dotted << "' ends with '.'");
    module_ptr owner = submodule(dotted.substr(0, dot));
    return {owner.get(), dotted.substr(dot + 1)};
  }

  void collect_parameters(const std::string& prefix, bool recurse, std::unordered_set<const void*>& seen,
                          std::vector<std::pair<std::string, var_type>>& out) const {
    for (auto& p : params_)
      if (seen.insert(p.value.get()).second) out.emplace_back(prefix + p.name, p.value);
    if (!recurse) return;
    for (auto& c : children_) c.value->collect_parameters(prefix + c.name + ".", true, seen, out);
  }
  void collect_buffers(const std::string& prefix, bool recurse,
                       std::vector<std::pair<std::string, tensor_type>>& out) const {
    for (auto& b : buffers_) out.emplace_back(prefix + b.name, b.value);
    if (!recurse) return;
    for (auto& c : children_) c.value->collect_buffers(prefix + c.name + ".", true, out);
  }
  void collect_modules(const std::string& prefix,
                       std::vector<std::pair<std::string, const module*>>& out) const {
    out.emplace_back(prefix.empty() ? std::string() : prefix.substr(0, prefix.size() - 1), this);
    for (auto& c : children_) c.value->collect_modules(prefix + c.name + ".", out);
  }
  void collect_state(const std::string& prefix, state_dict_type& out) const {
    for (auto& p : params_) out.emplace_back(prefix + p.name, p.value.value());
    for (auto& b : buffers_)
      if (b.persistent) out.emplace_back(prefix + b.name, b.value);
    for (auto& c : children_) c.value->collect_state(prefix + c.name + ".", out);
  }
  void collect_state_targets(const std::string& prefix,
                             std::vector<std::pair<std::string, tensor_type*>>& out) {
    for (auto& p : params_) out.emplace_back(prefix + p.name, &p.value.value());
    for (auto& b : buffers_)
      if (b.persistent) out.emplace_back(prefix + b.name, &b.value);
    for (auto& c : children_) c.value->collect_state_targets(prefix + c.name + ".", out);
  }
  static std::string join(const std::vector<std::string>& keys) {
    std::string r;
    for (std::size_t i = 0; i < keys.size(); ++i) r += (i ? ", '" : "'") + keys[i] + "'";
    return r;
  }

  std::deque<entry<var_type>> params_;
  std::deque<buffer_entry> buffers_;
  std::vector<entry<module_ptr>> children_;
  bool training_ = true;
};

}  // namespace trainkit::nn
