// trainkit/autograd/ops/pool.hpp - 2-D max and average pooling (kernels in backend/pool.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>

#include "trainkit/autograd/function.hpp"
#include "trainkit/backend/pool.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

/// Window of max_pool2d / avg_pool2d ({h, w} per field); a zero stride means "the kernel size",
/// as PyTorch's stride=None.
struct pool2d_options {
  std::array<index_t, 2> kernel{2, 2}, stride{0, 0} /*0 = kernel*/, padding{0, 0};
};

namespace detail {
/// Checks x [N, C, H, W] (already batched) and returns the pooling geometry; `op` names the caller.
inline backend::pool2d_geometry pool2d_geometry_of(const shape& x, const pool2d_options& o, const char* op) {
  TRAINKIT_CHECK(x.size() == 4, shape_error, op, "input must be [N, C, H, W] or [C, H, W], got sizes " << to_string(x));
  backend::pool2d_geometry g;
  g.height = x[2];
  g.width = x[3];
  g.kernel_h = o.kernel[0];
  g.kernel_w = o.kernel[1];
  g.stride_h = o.stride[0] == 0 ? o.kernel[0] : o.stride[0];
  g.stride_w = o.stride[1] == 0 ? o.kernel[1] : o.stride[1];
  g.pad_h = o.padding[0];
  g.pad_w = o.padding[1];
  TRAINKIT_CHECK(g.kernel_h >= 1 && g.kernel_w >= 1 && g.stride_h >= 1 && g.stride_w >= 1, value_error, op,
                 "kernel and stride must be positive, got kernel {" << o.kernel[0] << ", " << o.kernel[1]
                                                                     << "}, stride {" << o.stride[0] << ", "
                                                                     << o.stride[1] << "}");
  TRAINKIT_CHECK(g.pad_h >= 0 && g.pad_w >= 0 && 2 * g.pad_h <= g.kernel_h && 2 * g.pad_w <= g.kernel_w, value_error,
                 op,
                 "padding must be between 0 and half the kernel, got padding {"
                     << o.padding[0] << ", " << o.padding[1] << "} for kernel {" << o.kernel[0] << ", " << o.kernel[1]
                     << "}");
  const index_t ph = g.height + 2 * g.pad_h, pw = g.width + 2 * g.pad_w;
  TRAINKIT_CHECK(g.kernel_h <= ph && g.kernel_w <= pw, shape_error, op,
                 "kernel {" << g.kernel_h << ", " << g.kernel_w << "} is larger than the padded input (" << ph << ", "
                            << pw << ") of sizes " << to_string(x));
  g.out_h = (ph - g.kernel_h) / g.stride_h + 1;
  g.out_w = (pw - g.kernel_w) / g.stride_w + 1;
  return g;
}
/// x's sizes ([N, C, H, W] or [C, H, W]) with the pooled height and width.
inline shape pooled_sizes(shape x, const backend::pool2d_geometry& g) {
  x[x.size() - 2] = g.out_h;
  x[x.size() - 1] = g.out_w;
  return x;
}
}  // namespace detail

namespace ops {
template <class T, class D>
struct max_pool2d {
  static constexpr std::string_view name = "max_pool2d";
  tensor<std::int64_t, D> argmax;  // index within each input plane of the winner of every window
  shape x_sizes;
  backend::pool2d_geometry g;
  index_t planes = 0;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& grad, const std::vector<bool>&) const {
    return {scatter(grad.contiguous())};
  }
  /// A bf16 gradient stays bf16 where no two windows overlap (each input gets at most one value:
  /// exact); with overlaps the sums are made in T.
  std::array<grad_flow<T, D>, 1> backward_flow(const grad_flow<T, D>& grad, const std::vector<bool>& needs) const {
    if constexpr (std::is_same_v<D, cpu>)
      if (grad.is_narrow() && g.stride_h >= g.kernel_h && g.stride_w >= g.kernel_w)
        return {grad_flow<T, D>::narrow(scatter(grad.bf16.contiguous()))};
    return {grad_flow<T, D>(backward(grad.widened(), needs)[0])};
  }

 private:
  template <class G>
  tensor<G, D> scatter(const tensor<G, D>& gy) const {
    auto gx = tensor<G, D>::empty(x_sizes);
    backend::pool<D>::max_backward(g, planes, gy.data(), argmax.data(), gx.data());
    return gx;
  }
};
template <class T, class D>
struct avg_pool2d {
  static constexpr std::string_view name = "avg_pool2d";
  shape x_sizes;
  backend::pool2d_geometry g;
  index_t planes = 0;
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& grad, const std::vector<bool>&) const {
    const tensor<T, D> gy = grad.contiguous();
    auto gx = tensor<T, D>::empty(x_sizes);
    backend::pool<D>::avg_backward(g, planes, gy.data(), gx.data());
    return {gx};
  }
};
}  // namespace ops

/// torch.nn.functional.max_pool2d (dilation 1, floor mode): x [N, C, H, W] or [C, H, W].
/// Padding never wins a window; a NaN does. Saves the argmax of every window for backward.
/// A var held in bfloat16 gives one held in bfloat16 (CPU).
template <class T, class D>
var<T, D> max_pool2d(const var<T, D>& x, pool2d_options o = {}) {
  // y and the argmax for x's values as they are held (X: T, or bfloat16).
  auto pool = [&]<class X>(const tensor<X, D>& held) {
    const tensor<X, D> xv = (x.dim() == 3 ? held.unsqueeze(0) : held).contiguous();
    const auto g = detail::pool2d_geometry_of(xv.sizes(), o, "max_pool2d");
    const index_t planes = xv.size(0) * xv.size(1);
    const shape os = detail::pooled_sizes(x.sizes(), g);
    auto y = tensor<X, D>::empty(os);
    auto idx = tensor<std::int64_t, D>::empty(os);
    backend::pool<D>::max_forward(g, planes, xv.data(), y.data(), idx.data());
    return std::make_pair(std::move(y), ops::max_pool2d<T, D>{std::move(idx), x.sizes(), g, planes});
  };
  if constexpr (std::is_same_v<D, cpu>) {
    if (x.holds_bf16()) {
      auto [y, op] = pool(x.value_bf16());
      return record_bf16(std::move(op), std::move(y), x);
    }
  }
  auto [y, op] = pool(x.value());
  auto out = record(std::move(op), std::move(y), x);
  out.set_precision(x.precision());  // its values are some of x's
  return out;
}

/// torch.nn.functional.avg_pool2d with count_include_pad=true (the divisor is always
/// kernel_h * kernel_w) and floor mode: x [N, C, H, W] or [C, H, W].
template <class T, class D>
var<T, D> avg_pool2d(const var<T, D>& x, pool2d_options o = {}) {
  const tensor<T, D> xv = (x.dim() == 3 ? x.value().unsqueeze(0) : x.value()).contiguous();
  const auto g = detail::pool2d_geometry_of(xv.sizes(), o, "avg_pool2d");
  const index_t planes = xv.size(0) * xv.size(1);
  auto y = tensor<T, D>::empty(detail::pooled_sizes(x.sizes(), g));
  backend::pool<D>::avg_forward(g, planes, xv.data(), y.data());
  return record(ops::avg_pool2d<T, D>{x.sizes(), g, planes}, std::move(y), x);
}

}  // namespace trainkit::autograd
