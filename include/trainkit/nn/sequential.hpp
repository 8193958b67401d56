// trainkit/nn/sequential.hpp - a chain of single-input modules (torch.nn.Sequential), its
// children named "0", "1", ... so that state dict keys match torch's ("0.weight").
#pragma once

#include <concepts>  // std::derived_from
#include <cstddef>   // std::size_t
#include <initializer_list>
#include <memory>   // std::shared_ptr, std::make_shared
#include <string>   // std::to_string
#include <utility>  // std::move
#include <vector>

#include "trainkit/core/error.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// Runs its modules in order, each one's output the next one's input.
///
///   auto net = nn::make_sequential(std::make_shared<nn::linear<>>(2, 16), std::make_shared<nn::relu<>>(),
///                                  std::make_shared<nn::linear<>>(16, 2));
///
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class sequential : public module<T, Device> {
  using base = module<T, Device>;

 public:
  using typename base::module_ptr;
  using typename base::var_type;

  sequential() = default;
  sequential(std::initializer_list<module_ptr> layers) {
    for (const auto& l : layers) push_back(l);
  }
  template <class... M>
  requires(sizeof...(M) > 0 &&
           (std::derived_from<M, base> && ...)) explicit sequential(std::shared_ptr<M>... layers) {
    (push_back(std::move(layers)), ...);
  }

  /// Appends a module under the next index as its name.
  sequential& push_back(module_ptr m) {
    TRAINKIT_CHECK(m != nullptr, usage_error, "sequential::push_back",
                   "module " << layers_.size() << " is null");
    layers_.push_back(this->register_module(std::to_string(layers_.size()), std::move(m)));
    return *this;
  }

  std::size_t size() const noexcept { return layers_.size(); }
  bool empty() const noexcept { return layers_.empty(); }
  const module_ptr& operator[](std::size_t i) const {
    TRAINKIT_CHECK(i < layers_.size(), index_error, "sequential",
                   "index " << i << " is out of range for a sequential of " << layers_.size() << " modules");
    return layers_[i];
  }
  auto begin() const noexcept { return layers_.begin(); }
  auto end() const noexcept { return layers_.end(); }

  std::string_view type_name() const override { return "sequential"; }
  var_type forward(const var_type& x) override {
    var_type y = x;
    for (auto& l : layers_) y = l->forward(y);
    return y;
  }

 private:
  std::vector<module_ptr> layers_;
};

/// A shared sequential of the given modules; T and Device come from the first one.
template <class M, class... Ms>
auto make_sequential(std::shared_ptr<M> first, std::shared_ptr<Ms>... rest) {
  using S = sequential<typename M::value_type, typename M::device_type>;
  return std::make_shared<S>(std::move(first), std::move(rest)...);
}

}  // namespace trainkit::nn
