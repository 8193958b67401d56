// trainkit/compression/codecs.hpp - the gradient_compression concept and its models: none, fp16,
// bf16, int8_block<B>, sign_1bit_block<B> (alias sign_1bit), each lossy one with error feedback.
//
// A compression policy is a codec on flat fp32 runs (encode/decode a multiple of its block) plus
// the state the quantized allreduce (compression/quantized_allreduce.hpp) keeps between steps:
//   - error feedback: per bucket, the worker residual (what this rank meant to send minus what it
//     sent, added to the next step's gradient) and the server residual (the same for the chunk this
//     rank reduces and re-quantizes, DeepSpeed 1-bit Adam's second compression stage);
//   - a wire counter: bytes this rank put on the wire, which every allreduce adds to.
// The per-element math is in compression/detail/kernels.hpp as TRAINKIT_HD functors.
#pragma once

#include <atomic>       // std::atomic: the comm thread adds to the counter while the loop reads it
#include <concepts>     // std::same_as, std::convertible_to
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint8_t, std::uint64_t, std::uintptr_t
#include <cstring>      // std::memcpy
#include <memory>       // std::shared_ptr: an attached feedback_store
#include <string>       // state keys
#include <string_view>  // name
#include <utility>      // std::pair
#include <vector>

#include "trainkit/ops/elementwise.hpp"  // tensor's fill_/copy_ (the residuals as tensors)
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/compression/detail/kernels.hpp"
#include "trainkit/backend/cpu/convert16.hpp"  // fp16 on F16C

namespace trainkit::compression {

/// The error-feedback residuals of a policy as named fp32 tensors ("worker.<bucket>",
/// "server.<bucket>"), in the shape of a state dict so snapshots store it like model state.
using compression_state = std::vector<std::pair<std::string, tensor<float>>>;

/// Bytes one rank put on the wire. Atomic because the communication thread adds while the
/// training loop reads; copying a policy copies the current figures.
class wire_counter {
 public:
  wire_counter() = default;
  wire_counter(const wire_counter& o) noexcept : bytes_(o.bytes()), calls_(o.calls()) {}
  wire_counter& operator=(const wire_counter& o) noexcept {
    bytes_.store(o.bytes(), std::memory_order_relaxed);
    calls_.store(o.calls(), std::memory_order_relaxed);
    return *this;
  }
  /// Called once per allreduce with what it sent.
  void add(std::uint64_t bytes) noexcept {
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    calls_.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  std::uint64_t calls() const noexcept { return calls_.load(std::memory_order_relaxed); }
  void reset() noexcept {
    bytes_.store(0, std::memory_order_relaxed);
    calls_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> calls_{0};
};

class error_feedback;

/// Residuals kept somewhere else than host memory (a GPU's, by data_parallel<..., cuda>): while
/// one is attached, error_feedback::state() and load_state() go through it, so snapshots hold the
/// device residuals like host ones.
class feedback_store {
 public:
  feedback_store() = default;
  feedback_store(const feedback_store&) = delete;
  feedback_store& operator=(const feedback_store&) = delete;
  virtual ~feedback_store() = default;
  /// The residuals as host tensors, keys as error_feedback::state() names them.
  virtual compression_state state() const = 0;
  /// Takes the residuals error_feedback::load_state() parsed (per bucket; empty = none).
  virtual void load(const std::vector<std::vector<float>>& worker, const std::vector<std::vector<float>>& server) = 0;
};

/// Per-bucket residual buffers of error feedback. A residual is tied to the length it was made
/// for: asking for bucket b with another length starts a fresh (zero) one.
class error_feedback {
 public:
  /// Routes state()/load_state() to `store` (null: back to the host buffers here).
  void attach(std::shared_ptr<feedback_store> store) noexcept { store_ = std::move(store); }
  const std::shared_ptr<feedback_store>& store() const noexcept { return store_; }

  /// The worker-side residual of bucket b (n elements, zero the first time).
  float* worker(std::size_t b, index_t n) { return get(worker_, b, n); }
  /// The server-side residual of bucket b (the n elements of the chunk this rank reduces).
  float* server(std::size_t b, index_t n) { return get(server_, b, n); }

  void clear() {
    worker_.clear();
    server_.clear();
    if (store_) store_->load({}, {});
  }

  /// The layout the residuals were made for, when it is not the flat quantized allreduce's:
  /// compression::hierarchical sets "hierarchical" (state() records it as an empty tensor
  /// "layout.<name>"), and reshard_feedback refuses such residuals.
  void set_layout(std::string_view layout) {
    if (layout_ != layout) layout_ = std::string(layout);
  }
  const std::string& layout() const noexcept { return layout_; }

  compression_state state() const {
    compression_state s = store_ ? store_->state() : compression_state{};
    if (!store_) {
      put(s, "worker.", worker_);
      put(s, "server.", server_);
    }
    if (!layout_.empty()) s.emplace_back("layout." + layout_, tensor<float>::zeros({0}));
    return s;
  }
  /// Appends the residuals v as 1-D tensors named prefix + bucket (what state() returns).
  static void put(compression_state& s, const char* prefix, const std::vector<std::vector<float>>& v) {
    for (std::size_t b = 0; b < v.size(); ++b)
      if (!v[b].empty())
        s.emplace_back(prefix + std::to_string(b),
                       tensor<float>::from_vector(v[b], {static_cast<index_t>(v[b].size())}));
  }
  /// Restores what state() returned; a key that is neither "worker.<b>" nor "server.<b>" or a
  /// tensor that is not 1-D is a value_error naming it.
  void load_state(const compression_state& s) {
    std::vector<std::vector<float>> w, sv;
    std::string layout;
    for (const auto& [key, t] : s) {
      if (key.starts_with("layout.")) {
        layout = key.substr(7);
        continue;
      }
      std::vector<std::vector<float>>* dst = nullptr;
      std::string_view rest;
      if (key.starts_with("worker.")) {
        dst = &w;
        rest = std::string_view(key).substr(7);
      } else if (key.starts_with("server.")) {
        dst = &sv;
        rest = std::string_view(key).substr(7);
      }
      TRAINKIT_CHECK(dst != nullptr && !rest.empty() && rest.find_first_not_of("0123456789") == std::string_view::npos,
                     value_error, "error_feedback::load_state",
                     "unexpected key '" << key << "' (expected worker.<bucket> or server.<bucket>)");
      TRAINKIT_CHECK(t.defined() && t.dim() == 1, value_error, "error_feedback::load_state",
                     "residual '" << key << "' must be a 1-D tensor, got sizes "
                                  << (t.defined() ? trainkit::to_string(t.sizes()) : std::string("undefined")));
      const std::size_t b = std::stoul(std::string(rest));
      if (dst->size() <= b) dst->resize(b + 1);
      (*dst)[b] = t.contiguous().to_vector();
    }
    layout_ = std::move(layout);
    if (store_) {
      store_->load(w, sv);
      return;
    }
    worker_ = std::move(w);
    server_ = std::move(sv);
  }

 private:
  static float* get(std::vector<std::vector<float>>& v, std::size_t b, index_t n) {
    if (v.size() <= b) v.resize(b + 1);
    if (static_cast<index_t>(v[b].size()) != n) v[b].assign(static_cast<std::size_t>(n), 0.0f);
    return v[b].data();
  }
  std::vector<std::vector<float>> worker_, server_;
  std::shared_ptr<feedback_store> store_;
  std::string layout_;
};

/// What every compression model holds: the residuals and the wire counter.
class compression_base {
 public:
  error_feedback& feedback() noexcept { return feedback_; }
  const error_feedback& feedback() const noexcept { return feedback_; }
  wire_counter& counter() noexcept { return counter_; }
  const wire_counter& counter() const noexcept { return counter_; }
  /// Bytes this rank has sent through allreduces with this policy.
  std::uint64_t bytes_sent() const noexcept { return counter_.bytes(); }

  /// The residuals, for snapshots (empty for lossless policies).
  compression_state state() const { return feedback_.state(); }
  void load_state(const compression_state& s) { feedback_.load_state(s); }

 private:
  error_feedback feedback_;
  wire_counter counter_;
};

/// A gradient compression policy: a codec on runs of fp32 values plus error-feedback state.
/// A model provides
///   C::name              string_view, for messages and logs;
///   C::lossy             whether decode(encode(x)) may differ from x (lossy ones keep residuals);
///   C::block             encode/decode take a multiple of this many elements;
///   C::wire_bytes(n)     the encoded size of n elements (n a multiple of block);
///   C::encode(x, n, w)   n floats -> wire_bytes(n) bytes at w (any alignment);
///   C::decode(w, n, y)   the reverse;
///   block after block:   the encoding of k blocks is the k blocks' encodings one after the other
///                        (wire_bytes(k * block) == k * wire_bytes(block)), so a run can be encoded
///                        and decoded in pieces of whole blocks (the quantized allreduce does);
///   feedback(), counter(), state(), load_state()   as compression_base gives them;
/// and optionally C::encode_residual(x, n, w, r): encode plus r = x - decode(w) in one pass, and
/// C::decode_add(w, n, acc): acc += decode(w) (the quantized allreduce then saves a decode and a
/// pass per error-feedback step and per rank summed).
/// `none` is the one lossless model: the allreduce of it is the communicator's own fp32 one.
template <class C>
concept gradient_compression =
    requires(C& c, const C& cc, const float* x, float* y, std::uint8_t* w, const std::uint8_t* cw, index_t n,
             const compression_state& s) {
      { C::name } -> std::convertible_to<std::string_view>;
      { C::lossy } -> std::convertible_to<bool>;
      { C::block } -> std::convertible_to<index_t>;
      { C::wire_bytes(n) } -> std::same_as<std::size_t>;
      { C::encode(x, n, w) } -> std::same_as<void>;
      { C::decode(cw, n, y) } -> std::same_as<void>;
      { c.feedback() } -> std::same_as<error_feedback&>;
      { c.counter() } -> std::same_as<wire_counter&>;
      { cc.state() } -> std::same_as<compression_state>;
      c.load_state(s);
    } && (C::block >= 1) && (C::wire_bytes(3 * C::block) == 3 * C::wire_bytes(C::block));

/// No compression: fp32 on the wire through the communicator's own allreduce. The default.
struct none : compression_base {
  static constexpr std::string_view name = "none";
  static constexpr bool lossy = false;
  static constexpr index_t block = 1;
  static constexpr std::size_t wire_bytes(index_t n) { return static_cast<std::size_t>(n) * 4; }
  static void encode(const float* x, index_t n, std::uint8_t* w) {
    if (n > 0) std::memcpy(w, x, static_cast<std::size_t>(n) * 4);
  }
  static void decode(const std::uint8_t* w, index_t n, float* y) {
    if (n > 0) std::memcpy(y, w, static_cast<std::size_t>(n) * 4);
  }
};

namespace detail {
#if TRAINKIT_CPU_F16C_DISPATCH
/// compress_fp16_encode_fn 8 at a time on F16C: finite values clamped to +-65504 first (the
/// saturation; what lies between 65504 and 65520 rounds to 65504 either way), inf passed through,
/// a group holding a NaN by the scalar rule (its one quiet NaN).
__attribute__((target("avx,f16c"))) inline void compress_fp16_encode_f16c(const float* x, index_t n, std::uint16_t* out) {
  const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i), a = _mm256_and_ps(v, magnitude);
    if (_mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)) != 0) {
      for (index_t k = i; k < i + 8; ++k) out[k] = compress_fp16_encode_fn{}(x[k]);
      continue;
    }
    const __m256 c = _mm256_blendv_ps(_mm256_max_ps(_mm256_min_ps(v, hi), lo), v, _mm256_cmp_ps(a, inf, _CMP_EQ_OQ));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = compress_fp16_encode_fn{}(x[i]);
}
#endif
}  // namespace detail

/// IEEE half on the wire (finite values beyond +-65504 saturate), with error feedback.
struct fp16 : compression_base {
  static constexpr std::string_view name = "fp16";
  static constexpr bool lossy = true;
  static constexpr index_t block = 1;
  static constexpr std::size_t wire_bytes(index_t n) { return static_cast<std::size_t>(n) * 2; }
  // On F16C where the wire is 2-byte aligned, as the allreduce's is: the same bits as the integer
  // rule, 8 per instruction (the 25 MiB quantized allreduce's compute on 2 ranks: 73 -> 19 ms).
  static void encode(const float* x, index_t n, std::uint8_t* w) {
#if TRAINKIT_CPU_F16C_DISPATCH
    if (reinterpret_cast<std::uintptr_t>(w) % 2 == 0 && backend::cpu_convert::has_f16c()) {
      detail::compress_fp16_encode_f16c(x, n, reinterpret_cast<std::uint16_t*>(w));
      return;
    }
#endif
    detail::compress_encode_16bit(x, n, w, detail::compress_fp16_encode_fn{});
  }
  static void decode(const std::uint8_t* w, index_t n, float* y) {
#if TRAINKIT_CPU_F16C_DISPATCH
    if (reinterpret_cast<std::uintptr_t>(w) % 2 == 0 && backend::cpu_convert::has_f16c()) {
      backend::cpu_convert::f16_to_f32_f16c(reinterpret_cast<const std::uint16_t*>(w), y, n);
      return;
    }
#endif
    detail::compress_decode_16bit(w, n, y, detail::compress_fp16_decode_fn{});
  }
};

/// bfloat16 on the wire (fp32's range, 8 significant bits), with error feedback.
struct bf16 : compression_base {
  static constexpr std::string_view name = "bf16";
  static constexpr bool lossy = true;
  static constexpr index_t block = 1;
  static constexpr std::size_t wire_bytes(index_t n) { return static_cast<std::size_t>(n) * 2; }
  static void encode(const float* x, index_t n, std::uint8_t* w) {
    detail::compress_encode_16bit(x, n, w, detail::compress_bf16_encode_fn{});
  }
  static void decode(const std::uint8_t* w, index_t n, float* y) {
    detail::compress_decode_16bit(w, n, y, detail::compress_bf16_decode_fn{});
  }
};

/// int8 with one fp32 scale per block of B: scale = max|x| / 127, q = round-to-nearest-even(x / scale),
/// symmetric. 1 + 4/B bytes per element (B = 128: 0.258x of fp32). With error feedback.
/// \tparam B elements per scale
template <index_t B = 128>
struct int8_block : compression_base {
  static_assert(B >= 1, "int8_block<B>: B must be at least 1");
  static constexpr std::string_view name = "int8";
  static constexpr bool lossy = true;
  static constexpr index_t block = B;
  static constexpr std::size_t wire_bytes(index_t n) { return static_cast<std::size_t>(n + 4 * (n / B)); }
  static void encode(const float* x, index_t n, std::uint8_t* w) { detail::compress_encode_int8(x, n, B, w); }
  static void decode(const std::uint8_t* w, index_t n, float* y) { detail::compress_decode_int8(w, n, B, y); }
  /// encode, and residual = x - decode(wire) in the same pass (optional; see gradient_compression).
  static void encode_residual(const float* x, index_t n, std::uint8_t* w, float* residual) {
    detail::compress_encode_int8_residual(x, n, B, w, residual);
  }
  /// acc += decode(w) (optional; see gradient_compression).
  static void decode_add(const std::uint8_t* w, index_t n, float* acc) { detail::compress_decode_add_int8(w, n, B, acc); }
};

/// One sign bit per element (packed 8 to a byte) and one fp32 scale per block of B, the mean |x|
/// of the block: x is sent as sign(x) * mean|x|. 1/8 + 4/B bytes per element (B = 256: 0.035x of
/// fp32). Only useful with error feedback, which it has.
/// \tparam B elements per scale, a multiple of 8
template <index_t B = 256>
struct sign_1bit_block : compression_base {
  static_assert(B >= 8 && B % 8 == 0, "sign_1bit_block<B>: B must be a positive multiple of 8");
  static constexpr std::string_view name = "sign_1bit";
  static constexpr bool lossy = true;
  static constexpr index_t block = B;
  static constexpr std::size_t wire_bytes(index_t n) { return static_cast<std::size_t>(n / 8 + 4 * (n / B)); }
  static void encode(const float* x, index_t n, std::uint8_t* w) { detail::compress_encode_sign(x, n, B, w); }
  static void decode(const std::uint8_t* w, index_t n, float* y) { detail::compress_decode_sign(w, n, B, y); }
  /// encode, and residual = x - decode(wire) in the same pass (optional; see gradient_compression).
  static void encode_residual(const float* x, index_t n, std::uint8_t* w, float* residual) {
    detail::compress_encode_sign_residual(x, n, B, w, residual);
  }
  /// acc += decode(w) (optional; see gradient_compression).
  static void decode_add(const std::uint8_t* w, index_t n, float* acc) { detail::compress_decode_add_sign(w, n, B, acc); }
};

/// The int8 and 1-bit policies with their default blocks.
using int8 = int8_block<>;
using sign_1bit = sign_1bit_block<>;

static_assert(gradient_compression<none> && gradient_compression<fp16> && gradient_compression<bf16> &&
              gradient_compression<int8> && gradient_compression<sign_1bit>);

namespace detail {
/// Elements per chunk (a multiple of the block) when n elements are split over w ranks: the chunk
/// of a bucket each rank reduces in the quantized allreduce (its server residual's length).
constexpr index_t compress_chunk(index_t n, int w, index_t block) {
  const index_t per_rank = (n + w - 1) / w;
  return (per_rank + block - 1) / block * block;
}
/// The 1-D residual under `key` in s, or null.
inline const tensor<float>* find_residual(const compression_state& s, const std::string& key) {
  for (const auto& [k, t] : s)
    if (k == key) return &t;
  return nullptr;
}
}  // namespace detail

/// Error-feedback residuals for rank `rank` of `world` from the residuals of the old.size() ranks
/// of a snapshot (a resume on another world size), so that nothing owed is lost:
///   worker residuals (one per rank, the bucket's length): new rank j takes the sum of old ranks
///     i = j, j + world, j + 2 world, ... (ranks past the old count start at zero): the sum over the
///     ranks is preserved (exactly when world >= old.size(), up to fp32 rounding of the additions
///     otherwise);
///   server residuals (rank i holds chunk i of the bucket): reassembled into the bucket's length
///     and cut into the chunks of the new world size, element for element.
/// A residual whose length does not fit the layout is a value_error naming the rank and key.
template <gradient_compression C>
compression_state reshard_feedback(const std::vector<compression_state>& old, int rank, int world) {
  TRAINKIT_CHECK(world >= 1 && rank >= 0 && rank < world && !old.empty(), value_error, "reshard_feedback",
                 C::name << ": rank " << rank << " of " << world << " from " << old.size() << " old rank(s)");
  const int n_old = static_cast<int>(old.size());
  // The buckets and their lengths, from any old rank's worker residuals (and no other layout).
  std::vector<index_t> len;
  for (int i = 0; i < n_old; ++i)
    for (const auto& [key, t] : old[static_cast<std::size_t>(i)]) {
      TRAINKIT_CHECK(!key.starts_with("layout."), value_error, "reshard_feedback",
                     C::name << ": the residuals were made for a " << key.substr(7)
                             << " allreduce (old rank " << i
                             << "), whose slices depend on the world size; resume on the same world size "
                                "(or start error feedback afresh)");
      if (!key.starts_with("worker.")) continue;
      const std::size_t b = std::stoul(key.substr(7));
      if (len.size() <= b) len.resize(b + 1, -1);
      TRAINKIT_CHECK(len[b] < 0 || len[b] == t.numel(), value_error, "reshard_feedback",
                     C::name << ": old rank " << i << "'s '" << key << "' has " << t.numel()
                             << " elements, another rank's has " << len[b]);
      len[b] = t.numel();
    }
  compression_state out;
  for (std::size_t b = 0; b < len.size(); ++b) {
    const index_t n = len[b];
    if (n < 0) continue;
    const std::string wkey = "worker." + std::to_string(b), skey = "server." + std::to_string(b);
    // Worker: the sum of the old ranks this rank stands for.
    std::vector<float> w;
    for (int i = rank; i < n_old; i += world)
      if (const auto* t = detail::find_residual(old[static_cast<std::size_t>(i)], wkey)) {
        const auto v = t->contiguous().to_vector();
        if (w.empty()) w.assign(static_cast<std::size_t>(n), 0.0f);
        for (index_t e = 0; e < n; ++e) w[static_cast<std::size_t>(e)] += v[static_cast<std::size_t>(e)];
      }
    // Server: old chunk i -> [i c_old, ...) of the bucket -> this rank's new chunk.
    const index_t c_old = detail::compress_chunk(n, n_old, C::block), c_new = detail::compress_chunk(n, world, C::block);
    std::vector<float> full(static_cast<std::size_t>(n), 0.0f);
    bool any_server = false;
    for (int i = 0; i < n_old; ++i)
      if (const auto* t = detail::find_residual(old[static_cast<std::size_t>(i)], skey)) {
        TRAINKIT_CHECK(t->numel() == c_old, value_error, "reshard_feedback",
                       C::name << ": old rank " << i << "'s '" << skey << "' has " << t->numel()
                               << " elements; a chunk of bucket " << b << " (" << n << " elements over " << n_old
                               << " ranks) has " << c_old);
        const auto v = t->contiguous().to_vector();
        for (index_t e = 0, lo = i * c_old; e < c_old && lo + e < n; ++e)
          full[static_cast<std::size_t>(lo + e)] = v[static_cast<std::size_t>(e)];
        any_server = true;
      }
    if (!w.empty()) out.emplace_back(wkey, tensor<float>::from_vector(w, {n}));
    if (any_server) {
      std::vector<float> mine(static_cast<std::size_t>(c_new), 0.0f);
      for (index_t e = 0, lo = rank * c_new; e < c_new && lo + e < n; ++e)
        mine[static_cast<std::size_t>(e)] = full[static_cast<std::size_t>(lo + e)];
      out.emplace_back(skey, tensor<float>::from_vector(mine, {c_new}));
    }
  }
  return out;
}

/// Loads into c what reshard_feedback<C> makes for rank `rank` of `world` from the old ranks'
/// states: the customization point io::training_state calls for a per-rank component when a
/// snapshot of another world size is restored.
template <gradient_compression C>
void reshard_state(C& c, const std::vector<compression_state>& old, int rank, int world) {
  c.load_state(reshard_feedback<C>(old, rank, world));
}

/// One error-feedback step of a codec on its own, without communication: meant = x + residual is
/// encoded into wire (C::wire_bytes(n) bytes), sent = decode(wire) is written to `sent`, and the
/// residual becomes meant - sent. n must be a multiple of C::block. residual may be null (no
/// feedback). This is the worker side of the quantized allreduce, exposed for tests and for users
/// who move gradients some other way.
template <gradient_compression C>
void encode_with_feedback(const float* x, index_t n, float* residual, std::uint8_t* wire, float* sent) {
  TRAINKIT_CHECK(n >= 0 && n % C::block == 0, value_error, "encode_with_feedback",
                 C::name << ": n = " << n << " is not a multiple of the block " << C::block);
  if (residual == nullptr) {
    C::encode(x, n, wire);
    C::decode(wire, n, sent);
    return;
  }
  // The residual buffer holds what is meant until the last pass turns it into the new residual.
  detail::compress_accumulate(x, n, residual);
  C::encode(residual, n, wire);
  C::decode(wire, n, sent);
  detail::compress_update_residual(residual, sent, n, residual);
}

}  // namespace trainkit::compression
