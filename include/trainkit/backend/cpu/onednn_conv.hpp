// trainkit/backend/cpu/onednn_conv.hpp - the CNN kernels of the CPU backend through oneDNN
// primitives: conv2d forward / backward-data / backward-weights, max and average pooling, batch
// norm; and the choice between them and the built-in host kernels (TRAINKIT_CPU_CONV).
//
// trainkit keeps its tensors plain (NCHW, OIHW). A convolution primitive is created with
// format_tag::any, so oneDNN picks its blocked layouts, and reorders move the operands in and the
// result out. The primitives and their reorders are created once per (op, shape, stride,
// padding, dilation, groups, type) and kept in a bounded cache (creation costs 0.1-1 ms). Types:
// float and bfloat16 (fp32 accumulation); double and half keep the built-in kernels, as does
// anything oneDNN would only run on its reference implementation. The oneDNN part exists only
// with TRAINKIT_HAS_ONEDNN (CMake: TRAINKIT_ONEDNN); the route selection exists in every build.
#pragma once

#include <atomic>
#include <cstdlib>  // std::getenv
#include <string_view>

#include "trainkit/backend/cpu/onednn.hpp"  // TRAINKIT_HAS_ONEDNN, onednn_context, onednn_thread_state
#include "trainkit/backend/im2col.hpp"      // conv2d_geometry
#include "trainkit/backend/pool.hpp"        // pool2d_geometry
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"

#if TRAINKIT_HAS_ONEDNN
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>  // std::memcpy
#include <functional>  // std::hash
#include <limits>
#include <memory>
#include <mutex>
#include <new>  // std::align_val_t
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>  // std::move
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/dtype.hpp"
#endif

namespace trainkit::backend {

/// Which kernels run the CPU's convolutions, poolings and batch norms. im2col: the built-in host
/// kernels (convolution as im2col + GEMM); onednn: oneDNN primitives where they exist for the
/// type and shape, the built-in kernels elsewhere; automatic (the default): oneDNN for bfloat16,
/// where its AVX512-BF16 kernels were 1.5-1.8x faster than im2col, the built-in kernels for fp32,
/// where oneDNN's forward+backward lost (0.4x on the CNN's first layer, one thread; its per-primitive
/// parallel regions and reorders cost more than they save on 2 cores). Without oneDNN every
/// setting means im2col.
enum class cpu_conv_route { automatic, im2col, onednn };

namespace detail {
/// "auto" / "" / unset (automatic), "im2col", "onednn"; anything else is a value_error.
inline cpu_conv_route parse_cpu_conv_route(const char* value) {
  return parse_route<cpu_conv_route>(value, "TRAINKIT_CPU_CONV", "im2col");
}

/// The route in force: TRAINKIT_CPU_CONV read once, at the first use; set_cpu_conv_route changes it.
inline std::atomic<cpu_conv_route>& cpu_conv_route_state() {
  static std::atomic<cpu_conv_route> route{parse_cpu_conv_route(std::getenv("TRAINKIT_CPU_CONV"))};
  return route;
}
}  // namespace detail

/// The route the CPU convolutions, poolings and batch norms take now.
inline cpu_conv_route get_cpu_conv_route() { return detail::cpu_conv_route_state().load(std::memory_order_relaxed); }

/// Overrides TRAINKIT_CPU_CONV for the rest of the process (tests, benchmarks). Without oneDNN,
/// onednn is stored but the built-in kernels run.
inline void set_cpu_conv_route(cpu_conv_route r) { detail::cpu_conv_route_state().store(r, std::memory_order_relaxed); }

#if TRAINKIT_HAS_ONEDNN

namespace detail {

/// The element types the oneDNN CNN primitives take here.
template <class T>
inline constexpr bool onednn_cnn_type = std::is_same_v<T, float> || std::is_same_v<T, bfloat16>;

/// Whether T's CNN kernels go to oneDNN now (the route, then the type).
template <class T>
bool use_onednn_cnn() {
  if constexpr (!onednn_cnn_type<T>) {
    return false;
  } else {
    const cpu_conv_route r = get_cpu_conv_route();
    return r == cpu_conv_route::onednn || (r == cpu_conv_route::automatic && std::is_same_v<T, bfloat16>);
  }
}

/// Whether a batch norm of X activations with W parameters goes to oneDNN now. A bf16 scope's
/// batch norm (bfloat16 activations, float parameters) takes oneDNN only on the onednn route: under
/// the automatic one the built-in kernel runs, as the CNN's bf16 step took 61 ms with oneDNN's
/// batch norm (plain nchw bf16) against 25 ms with the built-in one (2 threads).
template <class X, class W>
bool use_onednn_bnorm() {
  if constexpr (std::is_same_v<X, W>)
    return use_onednn_cnn<X>();
  else
    return onednn_cnn_type<X> && get_cpu_conv_route() == cpu_conv_route::onednn;
}

enum class onednn_cnn_op : int {
  conv_forward,
  conv_backward_data,
  conv_backward_weights,
  max_pool_forward,
  avg_pool_forward,
  avg_pool_backward,
  bnorm_forward_training,
  bnorm_forward_inference,
  bnorm_backward,
  bnorm_backward_global_stats
};

/// What identifies a primitive: the op, the type and up to 16 integers of geometry.
struct onednn_cnn_key {
  onednn_cnn_op op;
  dnnl::memory::data_type type;
  std::array<index_t, 16> v{};
  bool operator==(const onednn_cnn_key&) const = default;
};
struct onednn_cnn_key_hash {
  std::size_t operator()(const onednn_cnn_key& key) const noexcept {
    std::size_t h = std::hash<int>()(int(key.op) * 16 + int(key.type));
    for (index_t x : key.v) h ^= std::hash<index_t>()(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
  }
};

/// A primitive with its plain operands: inputs that may need a reorder into the primitive's
/// layout (plain -> blocked, and type conversion), an output that may need one out of it, and
/// operands passed as they are (bias, statistics, workspace). supported is false where oneDNN
/// has no kernel better than its reference one; the caller then runs the built-in kernel.
struct onednn_cnn_entry {
  struct operand {
    operand() = default;
    operand(int a, dnnl::memory::desc u) : arg(a), user(std::move(u)) {}
    int arg = 0;                 // DNNL_ARG_*
    dnnl::memory::desc user;     // trainkit's plain layout
    dnnl::memory::desc prim;     // the primitive's
    dnnl::reorder reorder;       // user -> prim (inputs) or prim -> user (output); empty if the same
    bool reordered = false;
  };
  bool supported = false;
  dnnl::primitive primitive;
  std::vector<operand> inputs;
  operand output;
  std::vector<std::pair<int, dnnl::memory::desc>> direct;  // passed through, in call order
  std::size_t scratchpad_bytes = 0;                          // the most any of the steps needs
  std::string impl;                                          // oneDNN's implementation name
};

/// The oneDNN CNN primitives of the process, bounded (cleared when full). Entries are
/// shared_ptr: clearing never pulls a primitive from under a thread that is running it.
class onednn_cnn_cache {
 public:
  static onednn_cnn_cache& get() {
    static onednn_cnn_cache cache;
    return cache;
  }

  template <class Create>
  std::shared_ptr<const onednn_cnn_entry> find(const onednn_cnn_key& key, Create&& create) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    }
    auto entry = std::make_shared<onednn_cnn_entry>();
    try {
      create(*entry);  // outside the lock: another thread may create the same one, harmless
    } catch (const dnnl::error& err) {
      // No kernel, or a combination oneDNN refuses (e.g. batch norm flags): the built-in kernel runs.
      if (err.status != dnnl_unimplemented && err.status != dnnl_invalid_arguments) throw;
      *entry = onednn_cnn_entry{};
    }
    std::lock_guard lock(mutex_);
    if (cache_.size() >= max_entries) cache_.clear();
    return cache_.emplace(key, std::move(entry)).first->second;
  }

  std::size_t size() {
    std::lock_guard lock(mutex_);
    return cache_.size();
  }

  static constexpr std::size_t max_entries = 512;

 private:
  std::mutex mutex_;
  std::unordered_map<onednn_cnn_key, std::shared_ptr<const onednn_cnn_entry>, onednn_cnn_key_hash> cache_;
};

inline dnnl::primitive_attr onednn_user_scratchpad() {
  dnnl::primitive_attr attr;
  // User scratchpad: this libdnnl is built without DNNL_ENABLE_CONCURRENT_EXEC (onednn.hpp).
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

/// Fills in e's operands from a created primitive descriptor; queries for the primitive's layout.
template <class PD>
void onednn_finish_entry(onednn_cnn_entry& e, const PD& pd) {
  auto& eng = onednn_context::get().engine();
  e.impl = pd.impl_info_str();
  if (e.impl.rfind("ref", 0) == 0) return;  // slower than the built-in kernels: stay unsupported
  e.scratchpad_bytes = pd.scratchpad_desc().get_size();
  auto link = [&](onednn_cnn_entry::operand& op, bool input) {
    op.prim = pd.query_md(dnnl::query::exec_arg_md, op.arg);
    if (op.prim == op.user) return;
    dnnl::reorder::primitive_desc rpd = input ? dnnl::reorder::primitive_desc(eng, op.user, eng, op.prim, onednn_user_scratchpad())
                                              : dnnl::reorder::primitive_desc(eng, op.prim, eng, op.user, onednn_user_scratchpad());
    e.scratchpad_bytes = std::max(e.scratchpad_bytes, rpd.scratchpad_desc().get_size());
    op.reorder = dnnl::reorder(rpd);
    op.reordered = true;
  };
  for (auto& op : e.inputs) link(op, true);
  link(e.output, false);
  e.supported = true;
}

/// 64-byte aligned memory that grows as needed and is kept: the blocked copies of a thread's
/// operands live in its own buffers (a fresh multi-MB allocation per call costs its page faults).
struct onednn_buffer {
  std::unique_ptr<std::byte[], void (*)(std::byte*)> p{nullptr, [](std::byte*) {}};
  std::size_t size = 0;
  void* get(std::size_t bytes) {
    if (bytes > size || !p) {
      p = {static_cast<std::byte*>(::operator new(bytes ? bytes : 1, std::align_val_t(64))),
           [](std::byte* q) { ::operator delete(q, std::align_val_t(64)); }};
      size = bytes;
    }
    return p.get();
  }
};

/// The calling thread's operand buffers (inputs, then the output).
inline std::array<onednn_buffer, 3>& onednn_operand_buffers() {
  thread_local std::array<onednn_buffer, 3> buffers;
  return buffers;
}

/// Runs e: reorders the inputs in, executes, reorders the output out. inputs / direct follow the
/// order of e.inputs / e.direct.
inline void onednn_run(const onednn_cnn_entry& e, std::initializer_list<const void*> inputs, void* output,
                       std::initializer_list<void*> direct) {
  auto& eng = onednn_context::get().engine();
  auto& state = onednn_thread_state::get();
  void* scratch = state.scratch(std::max<std::size_t>(e.scratchpad_bytes, 1));
  const dnnl::memory pad(dnnl::memory::desc({dnnl::memory::dim(std::max<std::size_t>(e.scratchpad_bytes, 1))},
                                            dnnl::memory::data_type::u8, dnnl::memory::format_tag::a),
                         eng, scratch);
  auto& buffers = onednn_operand_buffers();  // e has at most two reordered inputs
  std::unordered_map<int, dnnl::memory> args;
  auto in = inputs.begin();
  for (std::size_t i = 0; i < e.inputs.size(); ++i, ++in) {
    const auto& op = e.inputs[i];
    dnnl::memory user(op.user, eng, const_cast<void*>(*in));
    if (!op.reordered) {
      args.emplace(op.arg, user);
      continue;
    }
    dnnl::memory prim(op.prim, eng, buffers[i].get(op.prim.get_size()));
    op.reorder.execute(state.stream, {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, prim}, {DNNL_ARG_SCRATCHPAD, pad}});
    args.emplace(op.arg, prim);
  }
  auto d = direct.begin();
  for (std::size_t i = 0; i < e.direct.size(); ++i, ++d)
    args.emplace(e.direct[i].first, dnnl::memory(e.direct[i].second, eng, *d));
  dnnl::memory user_out(e.output.user, eng, output);
  dnnl::memory prim_out = e.output.reordered ? dnnl::memory(e.output.prim, eng, buffers[2].get(e.output.prim.get_size()))
                                             : user_out;
  args.emplace(e.output.arg, prim_out);
  args.emplace(DNNL_ARG_SCRATCHPAD, pad);
  e.primitive.execute(state.stream, args);
  if (e.output.reordered)
    e.output.reorder.execute(state.stream, {{DNNL_ARG_FROM, prim_out}, {DNNL_ARG_TO, user_out}, {DNNL_ARG_SCRATCHPAD, pad}});
  state.stream.wait();
}

// ---- convolution -------------------------------------------------------------------------------

/// The right padding that makes oneDNN's output size the one trainkit computed (floor mode; it
/// may be negative: the last rows/columns are then never read).
inline index_t onednn_pad_r(index_t in, index_t out, index_t kernel, index_t stride, index_t pad, index_t dilation) {
  return (out - 1) * stride + (kernel - 1) * dilation + 1 - in - pad;
}

inline onednn_cnn_key onednn_conv_key(onednn_cnn_op op, dnnl::memory::data_type type, const conv2d_geometry& g,
                                      index_t groups, index_t batch, index_t out_channels, bool bias) {
  return {op,
          type,
          {batch, g.channels, g.height, g.width, out_channels, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h,
           g.pad_w, g.dilation_h, g.dilation_w, groups, index_t(bias), 0}};
}

/// Creates the primitive of one convolution pass (key.op) into e. T: the element type.
template <class T>
void onednn_conv_create(onednn_cnn_entry& e, const onednn_cnn_key& key, const conv2d_geometry& g, index_t groups,
                        index_t batch, index_t out_channels, bool bias) {
  using dims = dnnl::memory::dims;
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  auto& eng = onednn_context::get().engine();
  const dt type = onednn_type<T>();
  const dims src_dims{batch, g.channels, g.height, g.width}, dst_dims{batch, out_channels, g.out_h, g.out_w};
  const dims w_dims = groups == 1 ? dims{out_channels, g.channels, g.kernel_h, g.kernel_w}
                                  : dims{groups, out_channels / groups, g.channels / groups, g.kernel_h, g.kernel_w};
  const tag w_tag = groups == 1 ? tag::oihw : tag::goihw;
  const dims strides{g.stride_h, g.stride_w}, dilates{g.dilation_h - 1, g.dilation_w - 1}, pad_l{g.pad_h, g.pad_w};
  const dims pad_r{onednn_pad_r(g.height, g.out_h, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h),
                   onednn_pad_r(g.width, g.out_w, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w)};
  const dnnl::memory::desc src_any(src_dims, type, tag::any), w_any(w_dims, type, tag::any),
      dst_any(dst_dims, type, tag::any), bias_md(dims{out_channels}, type, tag::x);
  const dnnl::memory::desc src_user(src_dims, type, tag::nchw), w_user(w_dims, type, w_tag),
      dst_user(dst_dims, type, tag::nchw);
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto attr = onednn_user_scratchpad();
  // The forward descriptor, also the hint of the backward ones (with the bias the forward call has).
  auto fwd_desc = [&](bool with_bias) {
    return with_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any, w_any, bias_md,
                                                       dst_any, strides, dilates, pad_l, pad_r)
                     : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any, w_any, dst_any,
                                                       strides, dilates, pad_l, pad_r);
  };
  switch (key.op) {
    case onednn_cnn_op::conv_forward: {
      const dnnl::convolution_forward::primitive_desc pd(fwd_desc(bias), attr, eng);
      e.inputs = {{DNNL_ARG_SRC, src_user}, {DNNL_ARG_WEIGHTS, w_user}};
      e.output = {DNNL_ARG_DST, dst_user};
      if (bias) e.direct = {{DNNL_ARG_BIAS, bias_md}};
      onednn_finish_entry(e, pd);
      if (e.supported) e.primitive = dnnl::convolution_forward(pd);
      break;
    }
    case onednn_cnn_op::conv_backward_data: {
      const dnnl::convolution_forward::primitive_desc hint(fwd_desc(false), eng);
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(algo, src_any, w_any, dst_any, strides, dilates, pad_l, pad_r), attr,
          eng, hint);
      e.inputs = {{DNNL_ARG_DIFF_DST, dst_user}, {DNNL_ARG_WEIGHTS, w_user}};
      e.output = {DNNL_ARG_DIFF_SRC, src_user};
      onednn_finish_entry(e, pd);
      if (e.supported) e.primitive = dnnl::convolution_backward_data(pd);
      break;
    }
    case onednn_cnn_op::conv_backward_weights: {
      const dnnl::convolution_forward::primitive_desc hint(fwd_desc(false), eng);
      // 16-bit inputs: the weight gradient is summed over the batch and kept in fp32, rounded to T
      // once by the reorder out.
      const dnnl::memory::desc gw_any(w_dims, dt::f32, tag::any);
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(algo, src_any, gw_any, dst_any, strides, dilates, pad_l, pad_r),
          attr, eng, hint);
      e.inputs = {{DNNL_ARG_SRC, src_user}, {DNNL_ARG_DIFF_DST, dst_user}};
      e.output = {DNNL_ARG_DIFF_WEIGHTS, w_user};
      onednn_finish_entry(e, pd);
      if (e.supported) e.primitive = dnnl::convolution_backward_weights(pd);
      break;
    }
    default: break;
  }
}

inline std::string onednn_conv_shapes(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels) {
  std::ostringstream s;
  s << "input [" << batch << ", " << g.channels << ", " << g.height << ", " << g.width << "], weight [" << out_channels
    << ", " << g.channels / groups << ", " << g.kernel_h << ", " << g.kernel_w << "], stride {" << g.stride_h << ", "
    << g.stride_w << "}, padding {" << g.pad_h << ", " << g.pad_w << "}, dilation {" << g.dilation_h << ", "
    << g.dilation_w << "}, groups " << groups;
  return s.str();
}

/// One convolution pass through oneDNN; false (nothing computed) where oneDNN has no kernel for
/// it. a, b: the pass's inputs in e.inputs order; out: its output (overwritten).
template <class T>
bool onednn_conv_pass(onednn_cnn_op op, const char* what, const conv2d_geometry& g, index_t groups, index_t batch,
                      index_t out_channels, const T* a, const T* b, const T* bias, T* out) {
  if constexpr (!onednn_cnn_type<T>) {
    return false;
  } else {
    const auto key = onednn_conv_key(op, onednn_type<T>(), g, groups, batch, out_channels, bias != nullptr);
    try {
      auto entry = onednn_cnn_cache::get().find(key, [&](onednn_cnn_entry& e) {
        onednn_conv_create<T>(e, key, g, groups, batch, out_channels, bias != nullptr);
      });
      if (!entry->supported) return false;
      if (bias) onednn_run(*entry, {a, b}, out, {const_cast<T*>(bias)});
      else onednn_run(*entry, {a, b}, out, {});
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, what,
                     dtype_name<T>() << " " << onednn_conv_shapes(g, groups, batch, out_channels) << ": " << e.what()
                                     << " (status " << int(e.status) << ")");
    }
    return true;
  }
}

}  // namespace detail

/// convolution<cpu>'s passes through oneDNN (backend/im2col.hpp has the contract); each returns
/// false, computing nothing, where oneDNN has no kernel for T or the shape.
template <class T>
bool onednn_conv2d_forward(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels, const T* x,
                           const T* w, const T* bias, T* y) {
  return detail::onednn_conv_pass<T>(detail::onednn_cnn_op::conv_forward, "conv2d forward (oneDNN)", g, groups, batch,
                                     out_channels, x, w, bias, y);
}
template <class T>
bool onednn_conv2d_backward_input(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                                  const T* gy, const T* w, T* gx) {
  return detail::onednn_conv_pass<T>(detail::onednn_cnn_op::conv_backward_data, "conv2d backward input (oneDNN)", g,
                                     groups, batch, out_channels, gy, w, static_cast<const T*>(nullptr), gx);
}
template <class T>
bool onednn_conv2d_backward_weight(const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                                   const T* gy, const T* x, T* gw) {
  return detail::onednn_conv_pass<T>(detail::onednn_cnn_op::conv_backward_weights, "conv2d backward weight (oneDNN)",
                                     g, groups, batch, out_channels, x, gy, static_cast<const T*>(nullptr), gw);
}

/// The oneDNN implementation a convolution pass runs on ("" where none): tests, benchmarks.
template <class T>
std::string onednn_conv2d_impl(int pass, const conv2d_geometry& g, index_t groups, index_t batch, index_t out_channels,
                               bool bias = false) {
  const auto op = detail::onednn_cnn_op(pass);
  const auto key = detail::onednn_conv_key(op, detail::onednn_type<T>(), g, groups, batch, out_channels, bias);
  auto entry = detail::onednn_cnn_cache::get().find(key, [&](detail::onednn_cnn_entry& e) {
    detail::onednn_conv_create<T>(e, key, g, groups, batch, out_channels, bias);
  });
  return entry->supported ? entry->impl : std::string();
}

// ---- pooling -----------------------------------------------------------------------------------

namespace detail {

inline onednn_cnn_key onednn_pool_key(onednn_cnn_op op, dnnl::memory::data_type type, const pool2d_geometry& g,
                                      index_t planes) {
  return {op,
          type,
          {planes, g.height, g.width, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.out_h, g.out_w}};
}

/// The planes are the channels of one image [1, planes, H, W] (plain NCHW: a blocked layout
/// would cost two reorders on a memory-bound op).
template <class T>
void onednn_pool_create(onednn_cnn_entry& e, onednn_cnn_op op, const pool2d_geometry& g, index_t planes) {
  using dims = dnnl::memory::dims;
  using tag = dnnl::memory::format_tag;
  auto& eng = onednn_context::get().engine();
  const auto type = onednn_type<T>();
  const dnnl::memory::desc src({1, planes, g.height, g.width}, type, tag::nchw),
      dst({1, planes, g.out_h, g.out_w}, type, tag::nchw);
  const dims strides{g.stride_h, g.stride_w}, kernel{g.kernel_h, g.kernel_w}, pad_l{g.pad_h, g.pad_w};
  const dims pad_r{onednn_pad_r(g.height, g.out_h, g.kernel_h, g.stride_h, g.pad_h, 1),
                   onednn_pad_r(g.width, g.out_w, g.kernel_w, g.stride_w, g.pad_w, 1)};
  // count_include_pad = true: the divisor is always kernel_h * kernel_w.
  const auto algo = op == onednn_cnn_op::max_pool_forward ? dnnl::algorithm::pooling_max
                                                          : dnnl::algorithm::pooling_avg_include_padding;
  const auto attr = onednn_user_scratchpad();
  const dnnl::pooling_forward::desc fwd(op == onednn_cnn_op::avg_pool_forward ? dnnl::prop_kind::forward_inference
                                                                              : dnnl::prop_kind::forward_training,
                                        algo, src, dst, strides, kernel, pad_l, pad_r);
  if (op == onednn_cnn_op::avg_pool_backward) {
    const dnnl::pooling_forward::primitive_desc hint(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, algo, src, dst, strides, kernel, pad_l, pad_r),
        eng);
    const dnnl::pooling_backward::primitive_desc pd(
        dnnl::pooling_backward::desc(algo, src, dst, strides, kernel, pad_l, pad_r), attr, eng, hint);
    e.inputs = {{DNNL_ARG_DIFF_DST, dst}};
    e.output = {DNNL_ARG_DIFF_SRC, src};
    onednn_finish_entry(e, pd);
    if (e.supported) e.primitive = dnnl::pooling_backward(pd);
    return;
  }
  const dnnl::pooling_forward::primitive_desc pd(fwd, attr, eng);
  e.inputs = {{DNNL_ARG_SRC, src}};
  e.output = {DNNL_ARG_DST, dst};
  if (op == onednn_cnn_op::max_pool_forward) {
    // The workspace holds, per output, the window position kh * kernel_w + kw of the winner, in
    // dst's (plain) layout: u8, or s32 for windows over 255 elements.
    const auto ws = pd.workspace_desc();
    const auto wt = ws.data_type();
    const std::size_t elem = wt == dnnl::memory::data_type::u8 ? 1 : wt == dnnl::memory::data_type::s32 ? 4 : 0;
    if (elem == 0 || ws.get_size() != std::size_t(planes * g.out_h * g.out_w) * elem) return;  // unknown: unsupported
    e.direct = {{DNNL_ARG_WORKSPACE, ws}};
  }
  onednn_finish_entry(e, pd);
  if (e.supported) e.primitive = dnnl::pooling_forward(pd);
}

inline std::string onednn_pool_shapes(const pool2d_geometry& g, index_t planes) {
  std::ostringstream s;
  s << planes << " planes of " << g.height << "x" << g.width << ", kernel {" << g.kernel_h << ", " << g.kernel_w
    << "}, stride {" << g.stride_h << ", " << g.stride_w << "}, padding {" << g.pad_h << ", " << g.pad_w << "}";
  return s.str();
}

template <class T>
std::shared_ptr<const onednn_cnn_entry> onednn_pool_entry(onednn_cnn_op op, const pool2d_geometry& g, index_t planes) {
  const auto key = onednn_pool_key(op, onednn_type<T>(), g, planes);
  return onednn_cnn_cache::get().find(key, [&](onednn_cnn_entry& e) { onednn_pool_create<T>(e, op, g, planes); });
}

/// Whether every element is finite (oneDNN's max pooling skips NaN and starts from the lowest
/// finite value; the built-in kernel, as PyTorch, lets a NaN win and returns -inf for -inf windows).
template <class T>
bool all_finite(const T* x, index_t n) {
  int bad = 0;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for simd reduction(| : bad) schedule(static) if (n >= (1 << 16))
#endif
  for (index_t i = 0; i < n; ++i) {
    const float v = float(x[i]);
    bad |= int(!(v - v == 0.0f));
  }
  return bad == 0;
}

}  // namespace detail

/// pool<cpu>'s passes through oneDNN (backend/pool.hpp has the contract); each returns false,
/// computing nothing, where oneDNN has no kernel for T or the shape. Max pooling backward stays
/// the built-in scatter of gy by argmax (what oneDNN's backward does with its workspace).
template <class T>
bool onednn_max_pool2d_forward(const pool2d_geometry& g, index_t planes, const T* x, T* y, std::int64_t* argmax) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (planes == 0 || !detail::all_finite(x, planes * g.height * g.width)) return false;
    try {
      auto entry = detail::onednn_pool_entry<T>(detail::onednn_cnn_op::max_pool_forward, g, planes);
      if (!entry->supported) return false;
      const auto& ws_md = entry->direct.front().second;
      detail::onednn_buffer ws;
      void* wp = ws.get(ws_md.get_size());
      detail::onednn_run(*entry, {x}, y, {wp});
      const bool u8 = ws_md.data_type() == dnnl::memory::data_type::u8;
      const index_t per = g.out_h * g.out_w;
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (planes * per >= 32768)
#endif
      for (index_t p = 0; p < planes; ++p)
        for (index_t oh = 0; oh < g.out_h; ++oh)
          for (index_t ow = 0; ow < g.out_w; ++ow) {
            const index_t i = p * per + oh * g.out_w + ow;
            const index_t k = u8 ? index_t(static_cast<const std::uint8_t*>(wp)[i]) : index_t(static_cast<const std::int32_t*>(wp)[i]);
            argmax[i] = (oh * g.stride_h - g.pad_h + k / g.kernel_w) * g.width + (ow * g.stride_w - g.pad_w + k % g.kernel_w);
          }
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, "max_pool2d (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_pool_shapes(g, planes) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

template <class T>
bool onednn_avg_pool2d(bool backward, const pool2d_geometry& g, index_t planes, const T* in, T* out) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (planes == 0) return false;
    try {
      auto entry = detail::onednn_pool_entry<T>(
          backward ? detail::onednn_cnn_op::avg_pool_backward : detail::onednn_cnn_op::avg_pool_forward, g, planes);
      if (!entry->supported) return false;
      detail::onednn_run(*entry, {in}, out, {});
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, backward ? "avg_pool2d backward (oneDNN)" : "avg_pool2d (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_pool_shapes(g, planes) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

// ---- batch norm --------------------------------------------------------------------------------

namespace detail {

/// x viewed as [n, c, 1, s] (plain); scale and shift always given (1 and 0 without weight / bias).
template <class T>
void onednn_bnorm_create(onednn_cnn_entry& e, onednn_cnn_op op, index_t n, index_t c, index_t s, double eps) {
  using tag = dnnl::memory::format_tag;
  auto& eng = onednn_context::get().engine();
  const dnnl::memory::desc data({n, c, 1, s}, onednn_type<T>(), tag::nchw);
  const dnnl::memory::desc stat({c}, dnnl::memory::data_type::f32, tag::x);
  const bool global = op == onednn_cnn_op::bnorm_forward_inference || op == onednn_cnn_op::bnorm_backward_global_stats;
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  if (global) flags = flags | dnnl::normalization_flags::use_global_stats;
  const auto attr = onednn_user_scratchpad();
  e.inputs = {{DNNL_ARG_SRC, data}};
  if (op == onednn_cnn_op::bnorm_forward_training || op == onednn_cnn_op::bnorm_forward_inference) {
    const dnnl::batch_normalization_forward::primitive_desc pd(
        dnnl::batch_normalization_forward::desc(global ? dnnl::prop_kind::forward_inference
                                                       : dnnl::prop_kind::forward_training,
                                                data, float(eps), flags),
        attr, eng);
    e.output = {DNNL_ARG_DST, data};
    e.direct = {{DNNL_ARG_SCALE, stat}, {DNNL_ARG_SHIFT, stat}, {DNNL_ARG_MEAN, stat}, {DNNL_ARG_VARIANCE, stat}};
    onednn_finish_entry(e, pd);
    if (e.supported) e.primitive = dnnl::batch_normalization_forward(pd);
    return;
  }
  const dnnl::batch_normalization_forward::primitive_desc hint(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data, float(eps), flags), eng);
  const dnnl::batch_normalization_backward::primitive_desc pd(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, data, data, float(eps), flags), attr, eng,
      hint);
  e.inputs.push_back({DNNL_ARG_DIFF_DST, data});
  e.output = {DNNL_ARG_DIFF_SRC, data};
  e.direct = {{DNNL_ARG_MEAN, stat},
              {DNNL_ARG_VARIANCE, stat},
              {DNNL_ARG_SCALE, stat},
              {DNNL_ARG_SHIFT, stat},  // unread, but an argument of the primitive
              {DNNL_ARG_DIFF_SCALE, stat},
              {DNNL_ARG_DIFF_SHIFT, stat}};
  onednn_finish_entry(e, pd);
  if (e.supported) e.primitive = dnnl::batch_normalization_backward(pd);
}

template <class T>
std::shared_ptr<const onednn_cnn_entry> onednn_bnorm_entry(onednn_cnn_op op, index_t n, index_t c, index_t s, double eps) {
  index_t eps_bits = 0;
  static_assert(sizeof(eps_bits) == sizeof(eps));
  std::memcpy(&eps_bits, &eps, sizeof(eps));
  const onednn_cnn_key key{op, onednn_type<T>(), {n, c, s, eps_bits}};
  return onednn_cnn_cache::get().find(key, [&](onednn_cnn_entry& e) { onednn_bnorm_create<T>(e, op, n, c, s, eps); });
}

template <class T>
void onednn_affine_params(index_t c, const T* weight, const T* bias, std::vector<float>& scale, std::vector<float>& shift) {
  scale.resize(std::size_t(c));
  shift.resize(std::size_t(c));
  for (index_t ch = 0; ch < c; ++ch) {
    scale[std::size_t(ch)] = weight ? float(weight[ch]) : 1.0f;
    shift[std::size_t(ch)] = bias ? float(bias[ch]) : 0.0f;
  }
}

inline std::string onednn_bnorm_shapes(index_t n, index_t c, index_t s) {
  std::ostringstream o;
  o << "x viewed as [" << n << ", " << c << ", " << s << "]";
  return o.str();
}

}  // namespace detail

/// norm<cpu>'s batch norm passes through oneDNN (backend/norm.hpp has the contract): the
/// normalisation (biased variance) and its gradients are oneDNN's; the saved invstd and the
/// running statistics (unbiased variance, momentum) are computed here from oneDNN's fp32 mean and
/// variance. Each returns false, computing nothing, where oneDNN has no kernel for T or the shape
/// (or an empty batch).
template <class T, class W, class S>
bool onednn_batch_norm_train(const T* x, index_t n, index_t c, index_t s, const W* weight, const W* bias, double eps,
                             double momentum, W* running_mean, W* running_var, T* y, S* save_mean, S* save_invstd) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (n * s == 0 || c == 0) return false;
    try {
      auto entry = detail::onednn_bnorm_entry<T>(detail::onednn_cnn_op::bnorm_forward_training, n, c, s, eps);
      if (!entry->supported) return false;
      std::vector<float> scale, shift, mean(static_cast<std::size_t>(c)), var(static_cast<std::size_t>(c));
      detail::onednn_affine_params(c, weight, bias, scale, shift);
      detail::onednn_run(*entry, {x}, y, {scale.data(), shift.data(), mean.data(), var.data()});
      const double m = double(n * s);
      for (index_t ch = 0; ch < c; ++ch) {
        const double mu = mean[std::size_t(ch)], v = var[std::size_t(ch)];
        save_mean[ch] = S(mu);
        save_invstd[ch] = S(1.0 / std::sqrt(v + eps));
        if (running_mean) running_mean[ch] = W((1.0 - momentum) * double(running_mean[ch]) + momentum * mu);
        if (running_var) {
          const double unbiased = m > 1 ? v * m / (m - 1) : std::numeric_limits<double>::quiet_NaN();
          running_var[ch] = W((1.0 - momentum) * double(running_var[ch]) + momentum * unbiased);
        }
      }
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, "batch_norm (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_bnorm_shapes(n, c, s) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

template <class T, class W, class S>
bool onednn_batch_norm_eval(const T* x, index_t n, index_t c, index_t s, const W* weight, const W* bias,
                            const W* running_mean, const W* running_var, double eps, T* y, S* save_mean,
                            S* save_invstd) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (n * s == 0 || c == 0) return false;
    try {
      auto entry = detail::onednn_bnorm_entry<T>(detail::onednn_cnn_op::bnorm_forward_inference, n, c, s, eps);
      if (!entry->supported) return false;
      std::vector<float> scale, shift, mean(static_cast<std::size_t>(c)), var(static_cast<std::size_t>(c));
      detail::onednn_affine_params(c, weight, bias, scale, shift);
      for (index_t ch = 0; ch < c; ++ch) {
        mean[std::size_t(ch)] = float(running_mean[ch]);
        var[std::size_t(ch)] = float(running_var[ch]);
        save_mean[ch] = S(running_mean[ch]);
        save_invstd[ch] = S(1.0 / std::sqrt(double(running_var[ch]) + eps));
      }
      detail::onednn_run(*entry, {x}, y, {scale.data(), shift.data(), mean.data(), var.data()});
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, "batch_norm eval (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_bnorm_shapes(n, c, s) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

/// Needs dx (without it the built-in kernel's two sums are all there is to do). oneDNN wants the
/// variance and eps: it gets 1 / invstd^2 and eps = 0, the saved invstd being what the
/// gradient uses.
template <class T, class W, class S>
bool onednn_batch_norm_backward(const T* g, const T* x, index_t n, index_t c, index_t s, const W* weight,
                                const S* save_mean, const S* save_invstd, bool training, T* dx, W* dweight, W* dbias) {
  if constexpr (!detail::onednn_cnn_type<T>) {
    return false;
  } else {
    if (!dx || n * s == 0 || c == 0) return false;
    try {
      auto entry = detail::onednn_bnorm_entry<T>(
          training ? detail::onednn_cnn_op::bnorm_backward : detail::onednn_cnn_op::bnorm_backward_global_stats, n, c, s,
          0.0);
      if (!entry->supported) return false;
      std::vector<float> scale, shift, mean(static_cast<std::size_t>(c)), var(static_cast<std::size_t>(c)), dscale(static_cast<std::size_t>(c)),
          dshift(static_cast<std::size_t>(c));
      detail::onednn_affine_params(c, weight, static_cast<const W*>(nullptr), scale, shift);
      for (index_t ch = 0; ch < c; ++ch) {
        const double is = double(save_invstd[ch]);
        mean[std::size_t(ch)] = float(save_mean[ch]);
        var[std::size_t(ch)] = float(1.0 / (is * is));
      }
      detail::onednn_run(*entry, {x, g}, dx, {mean.data(), var.data(), scale.data(), shift.data(), dscale.data(), dshift.data()});
      for (index_t ch = 0; ch < c; ++ch) {
        if (dweight) dweight[ch] = W(dscale[std::size_t(ch)]);
        if (dbias) dbias[ch] = W(dshift[std::size_t(ch)]);
      }
    } catch (const dnnl::error& e) {
      TRAINKIT_CHECK(false, runtime_failure, "batch_norm backward (oneDNN)",
                     dtype_name<T>() << " " << detail::onednn_bnorm_shapes(n, c, s) << ": " << e.what() << " (status "
                                     << int(e.status) << ")");
    }
    return true;
  }
}

#endif  // TRAINKIT_HAS_ONEDNN

}  // namespace trainkit::backend
