// trainkit/backend/cpu/onednn_context.hpp - what every oneDNN kernel family of the CPU backend
// starts from: the process's CPU engine (TRAINKIT_MAX_CPU_ISA handed to oneDNN's dispatch), each
// thread's stream and scratchpad, the element types, and the bounded cache of the CNN primitives
// (convolution, pooling, batch norm) with the reorders between trainkit's plain layouts (NCHW,
// OIHW) and the blocked ones the primitives pick (format_tag::any). Creating a primitive costs
// 0.1-1 ms, so each is created once per (op, shape, type) and kept. Exists only with
// TRAINKIT_HAS_ONEDNN (backend/cpu/onednn_route.hpp).
#pragma once

#include "trainkit/backend/cpu/onednn_route.hpp"  // TRAINKIT_HAS_ONEDNN, get_cpu_conv_route
#include "trainkit/core/wait_governor.hpp"  // start_wait_governor

#if TRAINKIT_HAS_ONEDNN
#include <dnnl.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>  // std::hash
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>  // std::align_val_t
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>  // std::move
#include <vector>

#include "trainkit/backend/cpu/cpu_features.hpp"
#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/device.hpp"  // detail::dependent_false
#include "trainkit/core/half.hpp"
#include "trainkit/core/shape.hpp"  // index_t

namespace trainkit::backend::detail {

template <class T>
constexpr dnnl::memory::data_type onednn_type() {
  if constexpr (std::is_same_v<T, float>) return dnnl::memory::data_type::f32;
  else if constexpr (std::is_same_v<T, bfloat16>) return dnnl::memory::data_type::bf16;
  else if constexpr (std::is_same_v<T, half>) return dnnl::memory::data_type::f16;
  else static_assert(::trainkit::detail::dependent_false<T>, "oneDNN GEMM: float, bfloat16 or half");
}
static_assert(sizeof(bfloat16) == 2 && sizeof(half) == 2, "16-bit floats must be their bits (oneDNN reads them)");

/// The process's CPU engine. oneDNN fixes its ISA at the first primitive, so the engine hands
/// TRAINKIT_MAX_CPU_ISA over before that (oneDNN reads its own ONEDNN_MAX_CPU_ISA itself).
class onednn_context {
 public:
  static onednn_context& get() {
    static onednn_context ctx;
    return ctx;
  }

  dnnl::engine& engine() { return engine_; }

 private:
  onednn_context() : engine_((hand_over_isa_limit(), dnnl::engine(dnnl::engine::kind::cpu, 0))) {
    ::trainkit::detail::start_wait_governor();
  }

  /// TRAINKIT_MAX_CPU_ISA limits oneDNN too (its own ONEDNN_MAX_CPU_ISA it reads itself). Before the
  /// first primitive: oneDNN fixes its ISA then.
  static void hand_over_isa_limit() {
    using cpu_features::isa;
    if (cpu_features::limit_variable() != "TRAINKIT_MAX_CPU_ISA" || cpu_features::max_isa() == isa::all) return;
    static constexpr dnnl::cpu_isa to_onednn[] = {
        dnnl::cpu_isa::sse41,       dnnl::cpu_isa::avx,
        dnnl::cpu_isa::avx2,        dnnl::cpu_isa::avx2_vnni,
        dnnl::cpu_isa::avx512_core, dnnl::cpu_isa::avx512_core_vnni,
        dnnl::cpu_isa::avx512_core_bf16, dnnl::cpu_isa::avx512_core_bf16,  // oneDNN 2.x has no fp16 tier
        dnnl::cpu_isa::avx512_core_amx,  dnnl::cpu_isa::all};
    try {
      dnnl::set_max_cpu_isa(to_onednn[std::size_t(cpu_features::max_isa())]);
    } catch (const dnnl::error&) {
      // oneDNN built without DNNL_ENABLE_MAX_CPU_ISA, or it already dispatched: its own choice stands
    }
  }

  dnnl::engine engine_;
};

/// Per-thread stream and scratchpad (64-byte aligned, grown as needed).
struct onednn_thread_state {
  dnnl::stream stream{onednn_context::get().engine()};
  std::unique_ptr<std::byte[], void (*)(std::byte*)> scratchpad{nullptr, [](std::byte*) {}};
  std::size_t scratchpad_bytes = 0;

  void* scratch(std::size_t bytes) {
    if (bytes > scratchpad_bytes) {
      scratchpad = {static_cast<std::byte*>(::operator new(bytes, std::align_val_t(64))),
                    [](std::byte* p) { ::operator delete(p, std::align_val_t(64)); }};
      scratchpad_bytes = bytes;
    }
    return scratchpad.get();
  }
  static onednn_thread_state& get() {
    thread_local onednn_thread_state state;
    return state;
  }
};

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

/// The right padding that makes oneDNN's output size the one trainkit computed (floor mode; it
/// may be negative: the last rows/columns are then never read).
inline index_t onednn_pad_r(index_t in, index_t out, index_t kernel, index_t stride, index_t pad, index_t dilation) {
  return (out - 1) * stride + (kernel - 1) * dilation + 1 - in - pad;
}

}  // namespace trainkit::backend::detail

#endif  // TRAINKIT_HAS_ONEDNN
