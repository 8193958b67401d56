// trainkit/nn/embedding.hpp - a lookup table of learned vectors (torch.nn.Embedding).
#pragma once

#include <cstdint>  // std::int64_t

#include "trainkit/autograd/ops/embedding.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// Embedding: weight [num_embeddings, embedding_dim] initialised N(0, 1) as PyTorch does; forward
/// maps int64 indices [*] to [*, embedding_dim]. It takes indices, not a var, so it has no
/// single-input forward(var) and cannot sit inside a sequential (put it first, by hand).
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class embedding : public module<T, Device> {
  using base = module<T, Device>;

 public:
  using typename base::tensor_type;
  using typename base::var_type;
  using index_tensor = tensor<std::int64_t, Device>;

  embedding(index_t num_embeddings, index_t embedding_dim, generator& gen = default_generator())
      : num_(num_embeddings), dim_(embedding_dim) {
    TRAINKIT_CHECK(num_embeddings > 0 && embedding_dim > 0, value_error, "embedding",
                   "num_embeddings and embedding_dim must be positive, got " << num_embeddings << " and "
                                                                             << embedding_dim);
    weight_ = &this->register_parameter("weight", tensor_type::empty({num_embeddings, embedding_dim}));
    init::normal_(weight_->value(), 0.0, 1.0, gen);
  }

  std::string_view type_name() const override { return "embedding"; }
  using base::forward;
  var_type forward(const index_tensor& indices) { return autograd::embedding(indices, *weight_); }
  var_type operator()(const index_tensor& indices) { return forward(indices); }

  var_type weight() const { return *weight_; }
  index_t num_embeddings() const noexcept { return num_; }
  index_t embedding_dim() const noexcept { return dim_; }

 private:
  index_t num_, dim_;
  var_type* weight_ = nullptr;
};

}  // namespace trainkit::nn
