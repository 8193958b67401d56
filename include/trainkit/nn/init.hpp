// trainkit/nn/init.hpp - parameter initialisers (torch.nn.init), drawn from a trainkit::generator
// so that a seed reproduces a model bit for bit on every device.
//
// The formulas are PyTorch's; the random stream is trainkit's (Philox, core/generator.hpp), so
// values match torch in distribution, not element by element.
#pragma once

#include <cmath>        // std::sqrt
#include <cstddef>      // std::size_t
#include <type_traits>  // std::is_same_v

#include "trainkit/core/device.hpp"
#include "trainkit/ops/elementwise.hpp"  // copy_, fill_, cast
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"  // generator, default_generator, fill_uniform, fill_normal
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit::nn::init {

/// Which fan kaiming_* preserves: fan_in keeps the forward variance, fan_out the backward's.
enum class fan_mode { fan_in, fan_out };

/// The nonlinearity a gain is computed for (torch.nn.init.calculate_gain).
enum class nonlinearity { linear, conv1d, conv2d, conv3d, sigmoid, tanh, relu, leaky_relu, selu };

/// Fan-in and fan-out of a weight: [out, in, k...] -> in * prod(k), out * prod(k).
struct fans {
  index_t fan_in;
  index_t fan_out;
};

/// torch.nn.init._calculate_fan_in_and_fan_out: needs at least two dimensions.
inline fans calculate_fans(const shape& s) {
  TRAINKIT_CHECK(s.size() >= 2, value_error, "calculate_fans",
                 "fan in and fan out need a tensor with at least 2 dimensions, got sizes " << to_string(s));
  index_t receptive = 1;
  for (std::size_t i = 2; i < s.size(); ++i) receptive *= s[i];
  return {s[1] * receptive, s[0] * receptive};
}

/// The recommended gain for a nonlinearity; param is leaky_relu's negative slope.
inline double calculate_gain(nonlinearity nl, double param = 0.01) {
  switch (nl) {
    case nonlinearity::linear:
    case nonlinearity::conv1d:
    case nonlinearity::conv2d:
    case nonlinearity::conv3d:
    case nonlinearity::sigmoid:
      return 1.0;
    case nonlinearity::tanh:
      return 5.0 / 3.0;
    case nonlinearity::relu:
      return std::sqrt(2.0);
    case nonlinearity::leaky_relu:
      return std::sqrt(2.0 / (1.0 + param * param));
    case nonlinearity::selu:
      return 3.0 / 4.0;
  }
  return 1.0;
}

namespace detail {
/// Runs fill(ptr, n) on a dense host buffer of t's elements and writes it into t. Writes directly
/// when t is dense on the host and the element type is float or double; half and bfloat16 draw
/// in float and round once (as fill_uniform does); other devices get a host buffer copied over.
template <class T, class D, class Fill>
void host_fill(tensor<T, D>& t, Fill fill) {
  const auto n = static_cast<std::size_t>(t.numel());
  if (n == 0) return;
  constexpr bool direct_type = std::is_same_v<T, float> || std::is_same_v<T, double>;
  if constexpr (std::is_same_v<D, cpu> && direct_type) {
    if (t.is_contiguous()) {
      fill(t.data(), n);
      return;
    }
  }
  using draw_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
  auto host = tensor<draw_t, cpu>::empty(t.sizes());
  fill(host.data(), n);
  auto converted = cast<T>(host);
  if constexpr (std::is_same_v<D, cpu>) {
    copy_(t, converted);
  } else {
    copy_(t, converted.template to<D>());
  }
}
}  // namespace detail

/// U(low, high) in place; returns t (which shares storage with the argument).
template <class T, class D>
tensor<T, D> uniform_(tensor<T, D> t, double low = 0.0, double high = 1.0,
                      generator& gen = default_generator()) {
  TRAINKIT_CHECK(low <= high, value_error, "uniform_",
                 "low must not exceed high, got low = " << low << ", high = " << high);
  detail::host_fill(t, [&](auto* p, std::size_t n) {
    using E = std::remove_pointer_t<decltype(p)>;
    fill_uniform<E>(gen, p, n, static_cast<E>(low), static_cast<E>(high));
  });
  return t;
}

/// N(mean, std^2) in place.
template <class T, class D>
tensor<T, D> normal_(tensor<T, D> t, double mean = 0.0, double std = 1.0,
                     generator& gen = default_generator()) {
  TRAINKIT_CHECK(std >= 0.0, value_error, "normal_", "std must be >= 0, got " << std);
  detail::host_fill(t, [&](auto* p, std::size_t n) {
    using E = std::remove_pointer_t<decltype(p)>;
    fill_normal<E>(gen, p, n, static_cast<E>(mean), static_cast<E>(std));
  });
  return t;
}

/// Every element = value.
template <class T, class D>
tensor<T, D> constant_(tensor<T, D> t, double value) {
  fill_(t, static_cast<T>(value));
  return t;
}
template <class T, class D>
tensor<T, D> zeros_(tensor<T, D> t) {
  return constant_(std::move(t), 0.0);
}
template <class T, class D>
tensor<T, D> ones_(tensor<T, D> t) {
  return constant_(std::move(t), 1.0);
}

/// Kaiming He et al. (2015): U(-b, b) with b = gain * sqrt(3 / fan), gain from the nonlinearity
/// (a is leaky_relu's negative slope). a = sqrt(5) with fan_in gives b = 1 / sqrt(fan_in), the
/// default of torch's Linear and Conv layers.
template <class T, class D>
tensor<T, D> kaiming_uniform_(tensor<T, D> t, double a = 0.0, fan_mode mode = fan_mode::fan_in,
                              nonlinearity nl = nonlinearity::leaky_relu,
                              generator& gen = default_generator()) {
  const fans f = calculate_fans(t.sizes());
  const index_t fan = mode == fan_mode::fan_in ? f.fan_in : f.fan_out;
  TRAINKIT_CHECK(fan > 0, value_error, "kaiming_uniform_",
                 "initializing a tensor with a zero fan (sizes " << to_string(t.sizes()) << ")");
  const double bound = std::sqrt(3.0) * calculate_gain(nl, a) / std::sqrt(static_cast<double>(fan));
  return uniform_(std::move(t), -bound, bound, gen);
}

/// N(0, std^2) with std = gain / sqrt(fan).
template <class T, class D>
tensor<T, D> kaiming_normal_(tensor<T, D> t, double a = 0.0, fan_mode mode = fan_mode::fan_in,
                             nonlinearity nl = nonlinearity::leaky_relu,
                             generator& gen = default_generator()) {
  const fans f = calculate_fans(t.sizes());
  const index_t fan = mode == fan_mode::fan_in ? f.fan_in : f.fan_out;
  TRAINKIT_CHECK(fan > 0, value_error, "kaiming_normal_",
                 "initializing a tensor with a zero fan (sizes " << to_string(t.sizes()) << ")");
  const double std = calculate_gain(nl, a) / std::sqrt(static_cast<double>(fan));
  return normal_(std::move(t), 0.0, std, gen);
}

/// Glorot & Bengio (2010): U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
template <class T, class D>
tensor<T, D> xavier_uniform_(tensor<T, D> t, double gain = 1.0, generator& gen = default_generator()) {
  const fans f = calculate_fans(t.sizes());
  TRAINKIT_CHECK(f.fan_in + f.fan_out > 0, value_error, "xavier_uniform_",
                 "initializing a tensor with zero fans (sizes " << to_string(t.sizes()) << ")");
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(f.fan_in + f.fan_out));
  return uniform_(std::move(t), -bound, bound, gen);
}

/// N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
template <class T, class D>
tensor<T, D> xavier_normal_(tensor<T, D> t, double gain = 1.0, generator& gen = default_generator()) {
  const fans f = calculate_fans(t.sizes());
  TRAINKIT_CHECK(f.fan_in + f.fan_out > 0, value_error, "xavier_normal_",
                 "initializing a tensor with zero fans (sizes " << to_string(t.sizes()) << ")");
  const double std = gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out));
  return normal_(std::move(t), 0.0, std, gen);
}

}  // namespace trainkit::nn::init
