// trainkit/autograd/ops/conv.hpp - 2-D convolution (torch.nn.functional.conv2d), forward and backward.
//
// The passes are the device's convolution kernels (backend/im2col.hpp). On the host each image's
// patches are unfolded into a column matrix [C/groups * kh * kw, OH * OW], so the convolution is
// W_g [O/groups, C/groups * kh * kw] @ col_g per group; grad input is W_g^T @ dy folded back
// (col2im); grad weight is dy @ col^T summed over the images.
#pragma once

#include <algorithm>
#include <array>
#include <string_view>
#include <vector>

#include "trainkit/autograd/autocast.hpp"
#include "trainkit/autograd/function.hpp"
#include "trainkit/backend/im2col.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

/// Hyper-parameters of conv2d, as in torch.nn.functional.conv2d (per dimension: {h, w}).
struct conv2d_options {
  std::array<index_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  index_t groups = 1;
};

namespace detail {

/// Checks x [N, C, H, W] against weight [O, C/groups, kh, kw] and returns the geometry.
inline backend::conv2d_geometry conv2d_geometry_of(const shape& x, const shape& w, const conv2d_options& o) {
  TRAINKIT_CHECK(x.size() == 4, shape_error, "conv2d",
                 "input must be [N, C, H, W] (or [C, H, W]), got sizes " << to_string(x));
  TRAINKIT_CHECK(w.size() == 4, shape_error, "conv2d",
                 "weight must be [out_channels, in_channels / groups, kh, kw], got sizes " << to_string(w));
  TRAINKIT_CHECK(o.groups >= 1, value_error, "conv2d", "groups must be >= 1, got " << o.groups);
  for (int i = 0; i < 2; ++i) {
    TRAINKIT_CHECK(o.stride[std::size_t(i)] >= 1 && o.dilation[std::size_t(i)] >= 1 && o.padding[std::size_t(i)] >= 0,
                   value_error, "conv2d",
                   "stride and dilation must be >= 1 and padding >= 0, got stride {"
                       << o.stride[0] << ", " << o.stride[1] << "}, dilation {" << o.dilation[0] << ", "
                       << o.dilation[1] << "}, padding {" << o.padding[0] << ", " << o.padding[1] << "}");
  }
  const index_t c = x[1];
  TRAINKIT_CHECK(c % o.groups == 0, shape_error, "conv2d",
                 "input of sizes " << to_string(x) << " has " << c << " channels, not divisible by groups = "
                                   << o.groups);
  TRAINKIT_CHECK(w[0] % o.groups == 0, shape_error, "conv2d",
                 "weight of sizes " << to_string(w) << " has " << w[0]
                                    << " output channels, not divisible by groups = " << o.groups);
  TRAINKIT_CHECK(w[1] * o.groups == c, shape_error, "conv2d",
                 "weight of sizes " << to_string(w) << " expects " << w[1] * o.groups
                                    << " input channels (in_channels / groups = " << w[1] << ", groups = " << o.groups
                                    << ") but the input of sizes " << to_string(x) << " has " << c);
  backend::conv2d_geometry g;
  g.channels = c;
  g.height = x[2];
  g.width = x[3];
  g.kernel_h = w[2];
  g.kernel_w = w[3];
  g.stride_h = o.stride[0];
  g.stride_w = o.stride[1];
  g.pad_h = o.padding[0];
  g.pad_w = o.padding[1];
  g.dilation_h = o.dilation[0];
  g.dilation_w = o.dilation[1];
  const index_t eh = g.dilation_h * (g.kernel_h - 1) + 1, ew = g.dilation_w * (g.kernel_w - 1) + 1;
  const index_t ph = g.height + 2 * g.pad_h, pw = g.width + 2 * g.pad_w;
  TRAINKIT_CHECK(g.kernel_h >= 1 && g.kernel_w >= 1 && eh <= ph && ew <= pw, shape_error, "conv2d",
                 "kernel of size (" << g.kernel_h << ", " << g.kernel_w << ") (dilated: (" << eh << ", " << ew
                                    << ")) is larger than the padded input (" << ph << ", " << pw
                                    << "); input sizes " << to_string(x) << ", weight sizes " << to_string(w));
  g.out_h = (ph - eh) / g.stride_h + 1;
  g.out_w = (pw - ew) / g.stride_w + 1;
  return g;
}

}  // namespace detail

namespace ops {
template <class T, class D>
struct conv2d {
  static constexpr std::string_view name = "conv2d";
  tensor<T, D> x, w;  // dense input [N, C, H, W] and weight
  shape x_sizes;      // as the caller passed it ([C, H, W] when unbatched)
  backend::conv2d_geometry g;
  index_t groups = 1;
  bool has_bias = false;

  std::vector<tensor<T, D>> backward(const tensor<T, D>& grad, const std::vector<bool>& needs) const {
    std::vector<tensor<T, D>> r(needs.size());
    const index_t n = x.size(0), o = w.size(0);
    const tensor<T, D> gy = grad.reshape({n, o, g.col_cols()}).contiguous();
    if (has_bias && needs[2]) {
      r[2] = tensor<T, D>::empty({o});
      backend::convolution<D>::backward_bias(n, o, g.col_cols(), gy.data(), r[2].data());
    }
    if (needs[0]) {
      auto gx = tensor<T, D>::empty(x.sizes());
      if (gx.numel() > 0) backend::convolution<D>::backward_input(g, groups, n, o, gy.data(), w.data(), gx.data());
      r[0] = gx.view(x_sizes);
    }
    if (needs[1]) {
      auto gw = tensor<T, D>::empty(w.sizes());
      if (n > 0) backend::convolution<D>::backward_weight(g, groups, n, o, gy.data(), x.data(), gw.data());
      else zero_(gw);
      r[1] = gw;
    }
    return r;
  }
};
}  // namespace ops

/// torch.nn.functional.conv2d: x [N, C, H, W] (or unbatched [C, H, W]), weight
/// [O, C/groups, kh, kw], bias [O] or an undefined var; returns [N, O, OH, OW] with
/// OH = (H + 2 pad - dilation (kh - 1) - 1) / stride + 1.
template <class T, class D>
var<T, D> conv2d(const var<T, D>& x, const var<T, D>& weight, const var<T, D>& bias = {}, conv2d_options o = {}) {
  if (const auto* ac = current_autocast<T, D>(); ac != nullptr && ac->conv2d != nullptr)
    return ac->conv2d(x, weight, bias, o);  // inside a precision scope (amp::autocast)
  const bool unbatched = x.dim() == 3;
  tensor<T, D> xv = unbatched ? x.value().unsqueeze(0) : x.value();
  const auto g = detail::conv2d_geometry_of(xv.sizes(), weight.sizes(), o);
  if (bias.defined())
    TRAINKIT_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), shape_error, "conv2d",
                   "bias of sizes " << to_string(bias.sizes()) << " does not match weight sizes "
                                    << to_string(weight.sizes()) << " (expected [" << weight.size(0) << "])");
  xv = xv.contiguous();
  const tensor<T, D> wv = weight.value().contiguous();
  const tensor<T, D> bv = bias.defined() ? bias.value().contiguous() : tensor<T, D>();
  auto y = tensor<T, D>::empty({xv.size(0), wv.size(0), g.out_h, g.out_w});
  if (y.numel() > 0)
    backend::convolution<D>::forward(g, o.groups, xv.size(0), wv.size(0), xv.data(), wv.data(),
                                     bv.defined() ? bv.data() : nullptr, y.data());
  if (unbatched) y = y.squeeze(0);
  ops::conv2d<T, D> op{xv, wv, x.sizes(), g, o.groups, bias.defined()};
  if (bias.defined()) return record(std::move(op), std::move(y), x, weight, bias);
  return record(std::move(op), std::move(y), x, weight);
}

}  // namespace trainkit::autograd
