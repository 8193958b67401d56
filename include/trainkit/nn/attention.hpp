// trainkit/nn/attention.hpp - multi-head attention (torch.nn.MultiheadAttention) on the fused
// scaled_dot_product_attention.
//
//   nn::multi_head_attention<float> attn(/*embed_dim=*/256, /*num_heads=*/8, /*dropout=*/0.1,
//                                        /*bias=*/true, /*batch_first=*/true);
//   var<float> y = attn(x, x, x, {.is_causal = true});    // x [N, L, E] -> y [N, L, E]
//
// The projections are torch's: one packed in_proj_weight [3E, E] (q, k, v rows in that order) and
// in_proj_bias [3E] - applied as one GEMM when query, key and value are one var (self-attention, as
// torch's fast path; packed_self_attention), else each block as its own GEMM - then out_proj (a
// linear E -> E); the state dict names and order are torch's (in_proj_weight, in_proj_bias,
// out_proj.weight, out_proj.bias), so weights load across.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include "trainkit/autograd/ops/attention.hpp"
#include "trainkit/autograd/ops/linear.hpp"
#include "trainkit/autograd/ops/shape.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/generator.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/module.hpp"

namespace trainkit::nn {

/// The masks of multi_head_attention::forward, torch's forward arguments. Boolean masks follow
/// torch.nn.MultiheadAttention (true: NOT allowed to attend), the opposite of the boolean mask of
/// scaled_dot_product_attention; float masks are added to the scores (-inf hides).
template <class T, class Device>
struct attention_masks {
  /// [N, S] (unbatched: [S]): keys to ignore, per batch element.
  tensor<bool, Device> key_padding_mask{};
  /// The same as an additive float mask.
  tensor<T, Device> key_padding_mask_float{};
  /// [L, S] or [N * num_heads, L, S]: true hides key s from query l.
  tensor<bool, Device> attn_mask{};
  /// The same as an additive float mask.
  tensor<T, Device> attn_mask_float{};
  /// Query l sees keys s <= l (top-left). Unlike torch (where it is only a hint that attn_mask is
  /// causal), it needs no attn_mask; with other masks, all of them apply.
  bool is_causal = false;
};

/// Multi-head attention: softmax((x Wq) (x Wk)^T / sqrt(E / H) + masks) (x Wv) per head, heads
/// concatenated, then out_proj. Inputs [L, N, E] ([N, L, E] with batch_first; unbatched [L, E]);
/// key and value [S, N, E] likewise. Dropout (training only) acts on the attention probabilities,
/// drawn from gen's Philox stream, so recomputation replays it. Initialised as torch:
/// in_proj_weight xavier_uniform_, biases 0, out_proj.weight as a linear's.
/// Not provided: kdim/vdim other than embed_dim, add_bias_kv, add_zero_attn, and the attention
/// weights (need_weights): the fused kernel never forms them. A query row that every key is masked
/// from gives out_proj's bias (attention output 0), where torch's math path gives NaN.
/// \tparam T element type
/// \tparam Device device
template <class T = float, class Device = cpu>
class multi_head_attention : public module<T, Device> {
  using base = module<T, Device>;

 public:
  using typename base::tensor_type;
  using typename base::var_type;
  using masks_type = attention_masks<T, Device>;

  multi_head_attention(index_t embed_dim, index_t num_heads, double dropout = 0.0, bool bias = true,
                       bool batch_first = false, generator& gen = default_generator())
      : embed_(embed_dim), heads_(num_heads), dropout_(dropout), batch_first_(batch_first), gen_(&gen) {
    TRAINKIT_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0, value_error, "multi_head_attention",
                   "embed_dim must be a positive multiple of num_heads, got embed_dim " << embed_dim << " and num_heads "
                                                                                         << num_heads);
    TRAINKIT_CHECK(dropout >= 0 && dropout <= 1, value_error, "multi_head_attention",
                   "dropout must be in [0, 1], got " << dropout);
    in_proj_weight_ = &this->register_parameter("in_proj_weight", tensor_type::empty({3 * embed_dim, embed_dim}));
    if (bias) in_proj_bias_ = &this->register_parameter("in_proj_bias", tensor_type::zeros({3 * embed_dim}));
    out_proj_ = this->register_module("out_proj", std::make_shared<linear<T, Device>>(embed_dim, embed_dim, bias, gen));
    init::xavier_uniform_(in_proj_weight_->value(), 1.0, gen);
    if (bias) init::zeros_(out_proj_->bias().value());
  }

  std::string_view type_name() const override { return "multi_head_attention"; }

  /// Self-attention without masks: forward(x, x, x).
  var_type forward(const var_type& x) override { return forward(x, x, x); }

  /// Attention of query [L, N, E] over key/value [S, N, E] (batch_first: [N, L, E], [N, S, E];
  /// unbatched: [L, E], [S, E]); returns the query's layout.
  var_type forward(const var_type& query, const var_type& key, const var_type& value, const masks_type& m = {}) {
    namespace ag = autograd;
    constexpr const char* op = "multi_head_attention";
    const bool batched = query.dim() == 3;
    TRAINKIT_CHECK((query.dim() == 3 || query.dim() == 2) && key.dim() == query.dim() && value.dim() == query.dim(),
                   shape_error, op,
                   "query, key and value must all be 3-D (batched) or 2-D (unbatched); got query "
                       << to_string(query.sizes()) << ", key " << to_string(key.sizes()) << ", value "
                       << to_string(value.sizes()));
    TRAINKIT_CHECK(query.size(-1) == embed_ && key.size(-1) == embed_ && value.size(-1) == embed_, shape_error, op,
                   "the last dimension of query, key and value must be embed_dim = "
                       << embed_ << "; got query " << to_string(query.sizes()) << ", key " << to_string(key.sizes())
                       << ", value " << to_string(value.sizes()));
    // [N, L, E] views of the inputs.
    auto nle = [&](const var_type& x) {
      if (!batched) return ag::unsqueeze(x, 0);
      return batch_first_ ? x : ag::transpose(x, 0, 1);
    };
    const var_type q_in = nle(query), k_in = nle(key), v_in = nle(value);
    const index_t n = q_in.size(0), l = q_in.size(1), s = k_in.size(1), hd = embed_ / heads_;
    TRAINKIT_CHECK(k_in.size(0) == n && v_in.size(0) == n && v_in.size(1) == s, shape_error, op,
                   "key and value must have the query's batch size and one length; got query "
                       << to_string(query.sizes()) << ", key " << to_string(key.sizes()) << ", value "
                       << to_string(value.sizes()) << (batch_first_ ? " (batch_first)" : ""));
    const var_type w = *in_proj_weight_, b = in_proj_bias_ ? *in_proj_bias_ : var_type();
    autograd::attention_options<T, Device> o;
    o.dropout_p = this->is_training() ? dropout_ : 0.0;
    o.gen = gen_;
    const bool other_masks = m.key_padding_mask.defined() || m.key_padding_mask_float.defined() ||
                             m.attn_mask.defined() || m.attn_mask_float.defined();
    if (other_masks)
      o.attn_mask = combined_mask(m, n, l, s, batched);
    else
      o.is_causal = m.is_causal;
    var_type attn;  // [N, H, L, hd]
    if (packs(query, key, value)) {
      // Self-attention: one GEMM projects q, k and v ([N, L, 3E]), whose heads the attention reads
      // where they lie and whose gradient its backward writes as one tensor (packed_self_attention).
      attn = ag::packed_self_attention(ag::linear(q_in, w, b), heads_, o);
    } else {
      // Each projection is the slice of in_proj_weight for it, reshaped and permuted to [N, H, L, hd]:
      // a view whose features are contiguous, which the attention reads where it lies.
      std::vector<var_type> qkv;
      const var_type* in[3] = {&q_in, &k_in, &v_in};
      for (index_t i = 0; i < 3; ++i) {
        const var_type wi = ag::slice(w, 0, i * embed_, (i + 1) * embed_);
        const var_type bi = b.defined() ? ag::slice(b, 0, i * embed_, (i + 1) * embed_) : var_type();
        const index_t t = in[i]->size(1);
        qkv.push_back(ag::permute(ag::reshape(ag::linear(*in[i], wi, bi), {n, t, heads_, hd}), {0, 2, 1, 3}));
      }
      attn = ag::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], o);
    }
    var_type out = (*out_proj_)(ag::reshape(ag::permute(attn, {0, 2, 1, 3}), {n, l, embed_}));
    if (!batched) return ag::squeeze(out, 0);
    return batch_first_ ? out : ag::contiguous(ag::transpose(out, 0, 1));
  }

  /// Whether forward projects query, key and value with one GEMM (packed_self_attention): they are
  /// one var, and the device's attention backward writes its gradients where they lie (the CPU; on
  /// a GPU, whose kernels write dense gradients, three projections keep the copies away).
  static bool packs(const var_type& query, const var_type& key, const var_type& value) noexcept {
    return backend::attention<Device>::strided_gradients && query.same(key) && key.same(value);
  }

  var_type operator()(const var_type& query, const var_type& key, const var_type& value, const masks_type& m = {}) {
    return forward(query, key, value, m);
  }
  using base::operator();

  var_type in_proj_weight() const { return *in_proj_weight_; }
  /// The packed bias, or an undefined var when the layer has none.
  var_type in_proj_bias() const { return in_proj_bias_ ? *in_proj_bias_ : var_type(); }
  linear<T, Device>& out_proj() const { return *out_proj_; }
  index_t embed_dim() const noexcept { return embed_; }
  index_t num_heads() const noexcept { return heads_; }
  index_t head_dim() const noexcept { return embed_ / heads_; }
  double dropout() const noexcept { return dropout_; }
  bool batch_first() const noexcept { return batch_first_; }
  generator& rng() const noexcept { return *gen_; }

 private:
  /// Every mask as one additive [N, 1 or H, L, S] mask (0 / -inf for the boolean ones), checked;
  /// combined on the host (a GPU's masks are read back once per call).
  tensor_type combined_mask(const masks_type& m, index_t n, index_t l, index_t s, bool batched) const {
    constexpr const char* op = "multi_head_attention";
    const T ninf = -std::numeric_limits<T>::infinity();
    TRAINKIT_CHECK(!(m.attn_mask.defined() && m.attn_mask_float.defined()), usage_error, op,
                   "give attn_mask (boolean) or attn_mask_float, not both");
    TRAINKIT_CHECK(!(m.key_padding_mask.defined() && m.key_padding_mask_float.defined()), usage_error, op,
                   "give key_padding_mask (boolean) or key_padding_mask_float, not both");
    // The attention mask: [L, S] for every (batch, head), or [N * H, L, S].
    index_t mh = 1;
    std::vector<T> am;
    const shape as = m.attn_mask.defined() ? m.attn_mask.sizes() : m.attn_mask_float.sizes();
    if (m.attn_mask.defined() || m.attn_mask_float.defined()) {
      const bool ok2 = as == shape{l, s}, ok3 = batched && as == shape{n * heads_, l, s};
      TRAINKIT_CHECK(ok2 || ok3, shape_error, op,
                     "attn_mask " << to_string(as) << " must be [L, S] = " << to_string(shape{l, s})
                                  << (batched ? " or [N * num_heads, L, S] = " + to_string(shape{n * heads_, l, s}) : ""));
      if (ok3) mh = heads_;
      am = (m.attn_mask.defined() ? autograd::detail::additive_mask<T>(m.attn_mask, /*hidden=*/true)
                                  : m.attn_mask_float.contiguous())
               .to_vector();
    }
    // The key padding mask: [N, S] ([S] unbatched).
    std::vector<T> kp;
    if (m.key_padding_mask.defined() || m.key_padding_mask_float.defined()) {
      const shape ks = m.key_padding_mask.defined() ? m.key_padding_mask.sizes() : m.key_padding_mask_float.sizes();
      const shape want = batched ? shape{n, s} : shape{s};
      TRAINKIT_CHECK(ks == want, shape_error, op,
                     "key_padding_mask " << to_string(ks) << " must be " << (batched ? "[N, S] = " : "[S] = ")
                                         << to_string(want));
      kp = (m.key_padding_mask.defined() ? autograd::detail::additive_mask<T>(m.key_padding_mask, /*hidden=*/true)
                                         : m.key_padding_mask_float.contiguous())
               .to_vector();
    }
    auto out = tensor<T, cpu>::empty({n, mh, l, s});
    T* o = out.data();
    for (index_t b = 0; b < n; ++b)
      for (index_t h = 0; h < mh; ++h)
        for (index_t i = 0; i < l; ++i)
          for (index_t j = 0; j < s; ++j) {
            T x = 0;
            if (!am.empty()) x += am[std::size_t(((mh == 1 ? 0 : b * mh + h) * l + i) * s + j)];
            if (!kp.empty()) x += kp[std::size_t(b * s + j)];
            if (m.is_causal && j > i) x = ninf;
            *o++ = x;
          }
    if constexpr (std::is_same_v<Device, cpu>)
      return out;
    else
      return out.template to<Device>();
  }

  index_t embed_, heads_;
  double dropout_;
  bool batch_first_;
  generator* gen_;
  var_type* in_proj_weight_ = nullptr;
  var_type* in_proj_bias_ = nullptr;
  std::shared_ptr<linear<T, Device>> out_proj_;
};

}  // namespace trainkit::nn
