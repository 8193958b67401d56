// trainkit/checkpoint/sequential.hpp - recomputation over a chain of modules - an nn::sequential, or
// any module that names its segments (segmented_module: a user's residual network, say) -
// apply_recompute(policy, model, x), checkpoint_sequential(seq, segments, x), and the
// --checkpoint none|sqrt|every:N bridge.
//
//   auto y = checkpoint::apply_recompute(checkpoint::sqrt_segments{}, *net, x);       // fp32
//   auto y = checkpoint::apply_recompute(checkpoint::sqrt_segments{}, *net, x,
//                                        amp::module_forward<amp::mixed_bf16>{});     // + bf16
//
// Each recomputed segment becomes one checkpoint() whose function runs the segment's layers; the
// generators of the nn::dropout layers inside it (and the default generator) are replayed, so the
// recomputed masks are the forward ones. The layers are called through layer(module, x) -
// module.forward(x) by default, amp::module_forward<P> to run them under a precision policy.
#pragma once

#include <charconv>  // std::from_chars
#include <concepts>
#include <cstddef>   // std::size_t
#include <cstdint>   // std::int64_t: token ids
#include <string>
#include <string_view>
#include <system_error>  // std::errc
#include <variant>
#include <vector>

#include "trainkit/autograd/grad_mode.hpp"
#include "trainkit/autograd/var.hpp"
#include "trainkit/checkpoint/concepts.hpp"
#include "trainkit/checkpoint/function.hpp"
#include "trainkit/checkpoint/policies.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/nn/attention.hpp"
#include "trainkit/nn/dropout.hpp"
#include "trainkit/nn/module.hpp"
#include "trainkit/nn/sequential.hpp"

namespace trainkit::checkpoint {

/// The per-layer call apply_recompute uses unless given another: the layer's own forward.
struct default_layer_forward {
  template <class T, class D>
  autograd::var<T, D> operator()(nn::module<T, D>& m, const autograd::var<T, D>& x) const {
    return m.forward(x);
  }
};

/// A module that names its segments: its forward(x) is segments()[0], [1], ... applied in turn,
/// so a recompute policy can split them like the layers of an nn::sequential (a residual network:
/// stem, stages, head - each stage any module, its residual connections inside it).
template <class M>
concept segmented_module = requires(M& m) {
  typename M::value_type;
  typename M::device_type;
  { m.segments() } -> std::convertible_to<std::vector<nn::module<typename M::value_type, typename M::device_type>*>>;
};

/// A model of token ids that names its segments: forward(tokens) is segments()[0], [1], ...
/// applied in turn to embed(tokens) (a language model: embed = token + position embeddings,
/// segments = the blocks - or finer, attention and MLP halves of each block - then the head), so a
/// recompute policy can split them; the embedding's output is stored.
template <class M>
concept segmented_token_module = segmented_module<M> &&
    requires(M& m, const tensor<std::int64_t, typename M::device_type>& tokens) {
  { m.embed(tokens) } -> std::convertible_to<autograd::var<typename M::value_type, typename M::device_type>>;
};

namespace detail {
/// The default generator plus the generator of every nn::dropout and nn::multi_head_attention
/// (its attention dropout) inside layers [b, e).
template <class T, class D>
preserve_rng rng_of(const std::vector<nn::module<T, D>*>& layers, std::size_t b, std::size_t e) {
  preserve_rng r;
  for (std::size_t i = b; i < e; ++i)
    for (const auto& [name, m] : layers[i]->named_modules())
      if (const auto* d = dynamic_cast<const nn::dropout<T, D>*>(m))
        r.generators.push_back(&d->rng());
      else if (const auto* a = dynamic_cast<const nn::multi_head_attention<T, D>*>(m))
        r.generators.push_back(&a->rng());
  return r;
}
template <class T, class D>
std::vector<nn::module<T, D>*> layers_of(nn::sequential<T, D>& seq) {
  std::vector<nn::module<T, D>*> v;
  for (std::size_t i = 0; i < seq.size(); ++i) v.push_back(seq[i].get());
  return v;
}

/// Checks that a policy's segments cover [0, n) in order.
inline void check_segments(const std::vector<segment>& segs, std::size_t n, std::string_view policy) {
  std::size_t at = 0;
  for (const auto& s : segs) {
    TRAINKIT_CHECK(s.begin == at && s.end > s.begin && s.end <= n, value_error, "apply_recompute",
                   "policy '" << policy << "' returned segment [" << s.begin << ", " << s.end << ") after "
                              << at << " layers of " << n << "; segments must cover [0, " << n
                              << ") in order");
    at = s.end;
  }
  TRAINKIT_CHECK(at == n, value_error, "apply_recompute",
                 "policy '" << policy << "' covered " << at << " of " << n << " layers");
}
}  // namespace detail

/// The chain `layers` applied to x, split into segments by policy: recomputed segments run under
/// checkpoint(), the others normally. Under no_grad it is the plain chain through layer. The
/// modules (and layer) must outlive the backward pass.
/// \tparam R a recompute_policy
/// \tparam Layer callable (nn::module<T, D>&, const var<T, D>&) -> var<T, D>
template <recompute_policy R, class T, class D, class Layer = default_layer_forward>
autograd::var<T, D> apply_recompute(const R& policy, const std::vector<nn::module<T, D>*>& layers,
                                    const autograd::var<T, D>& x, Layer layer = {}) {
  using var_type = autograd::var<T, D>;
  const std::vector<segment> segs = policy.segments(layers.size());
  detail::check_segments(segs, layers.size(), R::name);
  var_type y = x;
  for (const auto& s : segs) {
    auto run = [mods = std::vector<nn::module<T, D>*>(layers.begin() + static_cast<std::ptrdiff_t>(s.begin),
                                                     layers.begin() + static_cast<std::ptrdiff_t>(s.end)),
                layer](const var_type& in) {
      var_type h = in;
      for (auto* m : mods) h = layer(*m, h);
      return h;
    };
    if (s.recompute && autograd::is_grad_enabled())
      y = checkpoint(detail::rng_of(layers, s.begin, s.end), std::move(run), y);
    else
      y = run(y);
  }
  return y;
}

/// seq(x) with its layers split into segments by policy (see above).
template <recompute_policy R, class T, class D, class Layer = default_layer_forward>
autograd::var<T, D> apply_recompute(const R& policy, nn::sequential<T, D>& seq, const autograd::var<T, D>& x,
                                    Layer layer = {}) {
  return apply_recompute(policy, detail::layers_of(seq), x, std::move(layer));
}

/// m(x) for a module that names its segments, split by policy (see above).
template <recompute_policy R, segmented_module M, class Layer = default_layer_forward>
  requires(!std::derived_from<M, nn::sequential<typename M::value_type, typename M::device_type>>)
autograd::var<typename M::value_type, typename M::device_type> apply_recompute(
    const R& policy, M& m, const autograd::var<typename M::value_type, typename M::device_type>& x, Layer layer = {}) {
  return apply_recompute(policy, m.segments(), x, std::move(layer));
}

/// m(tokens) for a model of token ids that names its segments, split by policy (see above); embed
/// runs normally (under the caller's autocast scope, if any).
template <recompute_policy R, segmented_token_module M, class Layer = default_layer_forward>
autograd::var<typename M::value_type, typename M::device_type> apply_recompute(
    const R& policy, M& m, const tensor<std::int64_t, typename M::device_type>& tokens, Layer layer = {}) {
  return apply_recompute(policy, m.segments(), m.embed(tokens), std::move(layer));
}

/// torch.utils.checkpoint.checkpoint_sequential: seq's layers in `segments` balanced segments,
/// all recomputed but the last.
template <class T, class D, class Layer = default_layer_forward>
autograd::var<T, D> checkpoint_sequential(nn::sequential<T, D>& seq, std::size_t segments,
                                          const autograd::var<T, D>& x, Layer layer = {}) {
  return apply_recompute(fixed_segments{segments}, seq, x, std::move(layer));
}

// ---- the command-line bridge ---------------------------------------------------------------------

/// The recompute policy a program chooses at run time: one of store_all, sqrt_segments, every_n
/// (a std::variant of them: std::get, std::visit and index() work), itself a recompute_policy
/// whose segments are the chosen one's. A train_step over it is one type for every --checkpoint
/// value: one instantiation of a training loop instead of one per policy. Under store_all the
/// chain runs as one stored segment, which is the model's own forward for a model that names its
/// segments.
struct recompute_choice : std::variant<store_all, sqrt_segments, every_n> {
  using std::variant<store_all, sqrt_segments, every_n>::variant;
  static constexpr std::string_view name = "recompute_choice";
  std::vector<segment> segments(std::size_t n) const {
    return std::visit([n](const auto& policy) { return policy.segments(n); },
                      static_cast<const std::variant<store_all, sqrt_segments, every_n>&>(*this));
  }
};
static_assert(recompute_policy<recompute_choice>);

/// Parses the value of --checkpoint: "none" (store_all), "sqrt" (sqrt_segments) or "every:N"
/// (every_n{N}, N >= 1); value_error for anything else.
inline recompute_choice parse_recompute(std::string_view s) {
  if (s == "none") return store_all{};
  if (s == "sqrt") return sqrt_segments{};
  constexpr std::string_view every = "every:";
  if (s.substr(0, every.size()) == every) {
    const std::string_view num = s.substr(every.size());
    std::size_t k = 0;
    const auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), k);
    TRAINKIT_CHECK(!num.empty() && ec == std::errc() && ptr == num.data() + num.size() && k >= 1, value_error,
                   "parse_recompute", "'" << s << "': N in every:N must be an integer >= 1");
    return every_n{k};
  }
  TRAINKIT_CHECK(false, value_error, "parse_recompute",
                 "unknown checkpoint policy '" << s << "'; expected none, sqrt or every:N");
  return store_all{};
}

/// The spelling parse_recompute reads back ("none", "sqrt", "every:4").
inline std::string to_string(const recompute_choice& c) {
  if (std::holds_alternative<store_all>(c)) return "none";
  if (std::holds_alternative<sqrt_segments>(c)) return "sqrt";
  return "every:" + std::to_string(std::get<every_n>(c).k);
}

}  // namespace trainkit::checkpoint
