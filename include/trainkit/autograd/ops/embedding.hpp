// trainkit/autograd/ops/embedding.hpp - lookup of rows of a weight table by integer index.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "trainkit/autograd/function.hpp"
#include "trainkit/autograd/ops/nn_detail.hpp"
#include "trainkit/backend/gather.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

namespace ops {
/// The gradient of a lookup: each output row's gradient is added to the row it came from.
template <class T, class D>
struct embedding {
  static constexpr std::string_view name = "embedding";
  tensor<std::int64_t, D> indices;  // dense
  shape weight_sizes;
  backend::index_check check;  // what a device that checks indices reports (and bounds the rows by)
  std::array<tensor<T, D>, 1> backward(const tensor<T, D>& grad, const std::vector<bool>&) const {
    const tensor<T, D> g = grad.contiguous();
    auto gw = tensor<T, D>::zeros(weight_sizes);
    backend::gather<D>::scatter_add_rows(g.data(), weight_sizes[1], indices.data(), indices.numel(), gw.data(),
                                         &check);
    return {gw};
  }
};
}  // namespace ops

/// torch.nn.functional.embedding: weight [num_embeddings, dim], indices of any shape with
/// values in [0, num_embeddings); returns [*indices.sizes(), dim]. An index out of range is an
/// index_error naming it, its position and num_embeddings: at once on the host; on a device that
/// checks indices in its kernels (CUDA), at the next read of a value on the host (item(),
/// to_vector(), gpu::check_device_errors()), the row looked up meanwhile being zeros.
template <class T, class D>
var<T, D> embedding(const tensor<std::int64_t, D>& indices, const var<T, D>& weight) {
  TRAINKIT_CHECK(weight.dim() == 2, shape_error, "embedding",
                 "weight must be [num_embeddings, embedding_dim], got sizes " << to_string(weight.sizes()));
  const index_t num = weight.size(0), dim = weight.size(1);
  const tensor<std::int64_t, D> idx = indices.contiguous();
  const auto check = backend::index_check::rows("embedding", num, indices.sizes(), weight.sizes());
  if (!backend::gather<D>::checks_on_device || !backend::index_check::fits(indices.sizes(), weight.sizes())) {
    // Validated on the host: a bad index must be an exception, not a wild read.
    const auto v = idx.to_vector();
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] < 0 || v[i] >= num)
        backend::throw_bad_index(check.kind, "embedding", "", num, v[i], index_t(i), indices.sizes(), weight.sizes());
  }
  shape os = indices.sizes();
  os.push_back(dim);
  auto out = tensor<T, D>::empty(os);
  const tensor<T, D> w = weight.value().contiguous();
  if (out.numel() > 0) backend::gather<D>::gather_rows(w.data(), dim, idx.data(), idx.numel(), out.data(), &check);
  return record(ops::embedding<T, D>{idx, weight.sizes(), check}, std::move(out), weight);
}

}  // namespace trainkit::autograd
