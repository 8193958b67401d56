// scaled_dot_product_attention and nn::multi_head_attention against PyTorch on the inputs of
// tests/reference/attention.txt (dropout off): outputs, input gradients and, for the module, the
// parameter gradients of sum(out * R), with torch's weights loaded by their state-dict names.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "../support/reference.hpp"

using namespace trainkit;
namespace ag = trainkit::autograd;
using V = ag::var<float>;

// One named namespace for the whole file: the unity build shares its translation unit with the
// other parity files, which have their own ref().
namespace attention_parity {
const test::reference& ref() {
  static test::reference r("attention.txt");
  return r;
}

tensor<bool> bool_mask(const std::string& name) {
  const auto v = ref()[name].to_vector();
  auto m = tensor<bool>::empty(ref()[name].sizes());
  for (std::size_t i = 0; i < v.size(); ++i) m.data()[i] = v[i] != 0;
  return m;
}

void check_sdpa(const std::string& name, const ag::attention_options<float, cpu>& o) {
  V q(ref()[name + ".in0"].clone(), true), k(ref()[name + ".in1"].clone(), true), v(ref()[name + ".in2"].clone(), true);
  const V out = ag::scaled_dot_product_attention(q, k, v, o);
  test::require_close(out.value(), ref()[name + ".out"], name + " forward");
  ag::sum(out * V(ref()[name + ".r"])).backward();
  test::require_close(q.grad(), ref()[name + ".grad0"], name + " grad q");
  test::require_close(k.grad(), ref()[name + ".grad1"], name + " grad k");
  test::require_close(v.grad(), ref()[name + ".grad2"], name + " grad v");
}

/// Loads torch's state dict into m and checks out and every gradient.
void check_mha(const std::string& name, nn::multi_head_attention<float>& m, std::vector<V> inputs, const V& out) {
  test::require_close(out.value(), ref()[name + ".out"], name + " forward");
  ag::sum(out * V(ref()[name + ".r"])).backward();
  for (std::size_t i = 0; i < inputs.size(); ++i)
    test::require_close(inputs[i].grad(), ref()[name + ".grad" + std::to_string(i)], name + " grad input " + std::to_string(i));
  for (auto& [n, p] : m.named_parameters())
    test::require_close(p.grad(), ref()[name + ".grad." + n], name + " grad " + n);
}

void load(const std::string& name, nn::multi_head_attention<float>& m) {
  for (auto& [n, p] : m.named_parameters()) { auto dst = p.value(); copy_(dst, ref()[name + "." + n]); }
}

TEST_CASE("scaled_dot_product_attention matches PyTorch: plain, causal, additive mask with scale, boolean mask",
          "[parity][attention]") {
  check_sdpa("sdpa", {});
  ag::attention_options<float, cpu> causal;
  causal.is_causal = true;
  check_sdpa("sdpa_causal", causal);
  ag::attention_options<float, cpu> masked;
  masked.attn_mask = ref()["sdpa_mask.mask"];
  masked.scale = 0.5;
  check_sdpa("sdpa_mask", masked);
  ag::attention_options<float, cpu> boolean;
  boolean.attn_bool_mask = bool_mask("sdpa_bool.mask");
  check_sdpa("sdpa_bool", boolean);
}

TEST_CASE("multi_head_attention matches torch.nn.MultiheadAttention: self-attention, key padding, causal",
          "[parity][attention]") {
  const std::string name = "mha_self";
  nn::multi_head_attention<float> m(8, 2, 0.0, true, /*batch_first=*/true);
  {
    std::vector<std::string> names;
    for (auto& [n, p] : m.named_parameters()) names.push_back(n);
    CHECK(names == std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  }
  // The causal mask given as torch's boolean attn_mask, and as is_causal: the same result.
  for (bool flag : {false, true}) {
    INFO("is_causal flag " << flag);
    load(name, m);
    m.zero_grad();
    V x(ref()[name + ".in0"].clone(), true);
    nn::attention_masks<float, cpu> masks;
    masks.key_padding_mask = bool_mask(name + ".key_padding_mask");
    if (flag)
      masks.is_causal = true;
    else
      masks.attn_mask = bool_mask(name + ".attn_mask");
    check_mha(name, m, {x}, m(x, x, x, masks));
  }
}

TEST_CASE("multi_head_attention matches torch.nn.MultiheadAttention: cross-attention, [L, N, E], float mask",
          "[parity][attention]") {
  const std::string name = "mha_cross";
  nn::multi_head_attention<float> m(8, 4);
  load(name, m);
  V q(ref()[name + ".in0"].clone(), true), k(ref()[name + ".in1"].clone(), true), v(ref()[name + ".in2"].clone(), true);
  nn::attention_masks<float, cpu> masks;
  masks.attn_mask_float = ref()[name + ".attn_mask"];
  check_mha(name, m, {q, k, v}, m(q, k, v, masks));
}

}  // namespace attention_parity
