// trainkit/backend/cpu/onednn_gemm.hpp - CPU GEMM through oneDNN's matmul primitive (the route
// between it and OpenBLAS: backend/cpu/onednn_route.hpp, TRAINKIT_CPU_GEMM).
//
// Why: Debian's OpenBLAS 0.3.21 exports no sbgemm, so without oneDNN a bfloat16 GEMM widens its
// operands to fp32; oneDNN multiplies bfloat16 natively where the CPU can (AVX512-BF16/AMX brgemm
// kernels, fp32 accumulation) and is faster than sgemm on small fp32 products (figures:
// benchmarks/README.md).
#pragma once

#include "trainkit/backend/cpu/onednn_route.hpp"  // TRAINKIT_HAS_ONEDNN, cpu_gemm_route
#include "trainkit/core/shape.hpp"                // index_t

#if TRAINKIT_HAS_ONEDNN
#include <cstddef>
#include <functional>  // std::hash
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "trainkit/backend/cpu/onednn_context.hpp"
#include "trainkit/core/dtype.hpp"  // dtype_name
#include "trainkit/core/error.hpp"
#endif

namespace trainkit::backend {

#if TRAINKIT_HAS_ONEDNN

namespace detail {

/// What identifies a matmul primitive: shapes, layouts, type, and the alpha/beta baked into it.
struct onednn_gemm_key {
  index_t m, n, k, lda, ldb, ldc;
  bool trans_a, trans_b;
  dnnl::memory::data_type type;    // A and B
  dnnl::memory::data_type c_type;  // C (the accumulator's rounding: type, or f32 for 16-bit A and B)
  double alpha, beta;
  bool operator==(const onednn_gemm_key&) const = default;
};
struct onednn_gemm_key_hash {
  std::size_t operator()(const onednn_gemm_key& key) const noexcept {
    std::size_t h = std::hash<int>()((int(key.type) * 32 + int(key.c_type)) * 4 + int(key.trans_a) * 2 + int(key.trans_b));
    auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (index_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix(std::hash<index_t>()(v));
    mix(std::hash<double>()(key.alpha));
    mix(std::hash<double>()(key.beta));
    return h;
  }
};

/// A created primitive, or none where oneDNN has no kernel for it (f16 without AVX512-FP16).
struct onednn_gemm_entry {
  bool supported = false;
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c;
  std::size_t scratchpad_bytes = 0;
};

/// The matmul primitives of the process, bounded (cleared when full; creating one costs 10-100
/// us, more than a small GEMM). Entries are shared_ptr: clearing the cache never pulls a primitive
/// from under a thread that is running it.
class onednn_gemm_cache {
 public:
  static onednn_gemm_cache& get() {
    static onednn_gemm_cache cache;
    return cache;
  }

  /// The primitive for `key`, created on first use. Primitive creation errors other than
  /// "unimplemented" propagate as dnnl::error.
  std::shared_ptr<const onednn_gemm_entry> find(const onednn_gemm_key& key) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    }
    auto entry = create(key);  // outside the lock: another thread may create the same one, harmless
    std::lock_guard lock(mutex_);
    if (cache_.size() >= max_entries) cache_.clear();
    return cache_.emplace(key, std::move(entry)).first->second;
  }

  std::size_t size() {
    std::lock_guard lock(mutex_);
    return cache_.size();
  }

  static constexpr std::size_t max_entries = 1024;

 private:
  std::shared_ptr<const onednn_gemm_entry> create(const onednn_gemm_key& key) {
    using dims = dnnl::memory::dims;
    auto e = std::make_shared<onednn_gemm_entry>();
    // Row-major with row strides lda/ldb/ldc; a transposed operand is the same memory with the
    // strides swapped.
    e->a = dnnl::memory::desc(dims{key.m, key.k}, key.type, key.trans_a ? dims{1, key.lda} : dims{key.lda, 1});
    e->b = dnnl::memory::desc(dims{key.k, key.n}, key.type, key.trans_b ? dims{1, key.ldb} : dims{key.ldb, 1});
    e->c = dnnl::memory::desc(dims{key.m, key.n}, key.c_type, dims{key.ldc, 1});
    dnnl::primitive_attr attr;
    // User scratchpad: this libdnnl is built without DNNL_ENABLE_CONCURRENT_EXEC, so its own
    // scratchpad is shared between primitives, and the CPU backend runs GEMMs from several threads.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.alpha != 1.0) attr.set_output_scales(0, {float(key.alpha)});  // scales the fp32 accumulator
    if (key.beta != 0.0) {  // C = alpha * A B + beta * C, summed in fp32 and rounded once
      dnnl::post_ops ops;
      ops.append_sum(float(key.beta));
      attr.set_post_ops(ops);
    }
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e->a, e->b, e->c), attr, onednn_context::get().engine());
      e->scratchpad_bytes = pd.scratchpad_desc().get_size();
      e->primitive = dnnl::matmul(pd);
      e->supported = true;
    } catch (const dnnl::error& err) {
      if (err.status != dnnl_unimplemented) throw;
    }
    return e;
  }

  std::mutex mutex_;
  std::unordered_map<onednn_gemm_key, std::shared_ptr<const onednn_gemm_entry>, onednn_gemm_key_hash> cache_;
};

/// A matmul ready to run on this thread: memory objects made once, whose data handles each call
/// sets, and the argument map over them. Making three dnnl::memory objects and a map per call cost
/// about 1.3 us - a fifth of a 64 x 64 x 64 product, the fused attention's tile.
struct onednn_gemm_prepared {
  onednn_gemm_key key;
  std::shared_ptr<const onednn_gemm_entry> entry;
  dnnl::memory a, b, c, scratch;
  std::unordered_map<int, dnnl::memory> args;
};

/// The matmuls this thread ran last (a kernel's tiles cycle through a handful of shapes), replaced
/// round-robin.
struct onednn_gemm_recent {
  static constexpr std::size_t capacity = 16;
  std::vector<onednn_gemm_prepared> items;
  std::size_t next = 0;

  onednn_gemm_prepared* find(const onednn_gemm_key& key) {
    for (auto& item : items)
      if (item.key == key) return &item;
    return nullptr;
  }
  onednn_gemm_prepared& add(const onednn_gemm_key& key, std::shared_ptr<const onednn_gemm_entry> entry) {
    auto& eng = onednn_context::get().engine();
    onednn_gemm_prepared p{key, std::move(entry), {}, {}, {}, {}, {}};
    p.a = dnnl::memory(p.entry->a, eng, DNNL_MEMORY_NONE);
    p.b = dnnl::memory(p.entry->b, eng, DNNL_MEMORY_NONE);
    p.c = dnnl::memory(p.entry->c, eng, DNNL_MEMORY_NONE);
    p.args = {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}};
    if (p.entry->scratchpad_bytes > 0) {
      const dnnl::memory::desc sd({dnnl::memory::dim(p.entry->scratchpad_bytes)}, dnnl::memory::data_type::u8,
                                  dnnl::memory::format_tag::a);
      p.scratch = dnnl::memory(sd, eng, DNNL_MEMORY_NONE);
      p.args.emplace(DNNL_ARG_SCRATCHPAD, p.scratch);
    }
    if (items.size() < capacity) return items.emplace_back(std::move(p));
    onednn_gemm_prepared& slot = items[next];
    next = (next + 1) % capacity;
    return slot = std::move(p);
  }
  static onednn_gemm_recent& get() {
    thread_local onednn_gemm_recent recent;
    return recent;
  }
};

}  // namespace detail

/// C = alpha * op(A) op(B) + beta * C through a cached oneDNN matmul, with the conventions of
/// blas<cpu>::gemm (row-major, op(A) M x K, op(B) K x N, row strides lda/ldb/ldc). T is float,
/// bfloat16 or half; the products accumulate in fp32 and C is rounded to TC (T, or float: a
/// 16-bit product kept in fp32, as the fused attention's tiles) once. Returns false, computing
/// nothing, where oneDNN has no kernel for it (half on most CPUs, K = 0): the caller falls back
/// to OpenBLAS. Any other oneDNN failure is a runtime_failure naming the shapes.
template <class T, class TC = T>
bool onednn_gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const T* a, index_t lda,
                 const T* b, index_t ldb, double beta, TC* c, index_t ldc) {
  if (m == 0 || n == 0) return true;
  if (k == 0) return false;  // C = beta * C: no matmul to describe
  const detail::onednn_gemm_key key{m,       n,       k, lda, ldb, ldc, trans_a, trans_b, detail::onednn_type<T>(),
                                    detail::onednn_type<TC>(), alpha, beta};
  try {
    auto& recent = detail::onednn_gemm_recent::get();
    detail::onednn_gemm_prepared* call = recent.find(key);
    if (call == nullptr) {
      auto entry = detail::onednn_gemm_cache::get().find(key);
      if (!entry->supported) return false;
      call = &recent.add(key, std::move(entry));
    }
    auto& state = detail::onednn_thread_state::get();
    call->a.set_data_handle(const_cast<T*>(a));
    call->b.set_data_handle(const_cast<T*>(b));
    call->c.set_data_handle(c);
    if (call->entry->scratchpad_bytes > 0) call->scratch.set_data_handle(state.scratch(call->entry->scratchpad_bytes));
    call->entry->primitive.execute(state.stream, call->args);
    state.stream.wait();
  } catch (const dnnl::error& e) {
    TRAINKIT_CHECK(false, runtime_failure, "gemm (oneDNN matmul)",
                   dtype_name<T>() << (std::is_same_v<T, TC> ? "" : " to fp32") << " M=" << m << " N=" << n << " K=" << k << " trans_a=" << trans_a
                                   << " trans_b=" << trans_b << " lda=" << lda << " ldb=" << ldb << " ldc=" << ldc
                                   << " alpha=" << alpha << " beta=" << beta << ": " << e.what() << " (status "
                                   << int(e.status) << ")");
  }
  return true;
}

/// Whether oneDNN runs T's GEMM on this CPU (half needs AVX512-FP16 or AMX-FP16 in oneDNN 2.x).
template <class T>
bool onednn_supports() {
  static const bool ok = [] {
    const detail::onednn_gemm_key key{16,  16,  16, 16, 16, 16, false, false, detail::onednn_type<T>(),
                                      detail::onednn_type<T>(), 1.0, 0.0};
    return detail::onednn_gemm_cache::get().find(key)->supported;
  }();
  return ok;
}

#else

/// Without oneDNN no type has a oneDNN GEMM.
template <class T>
bool onednn_supports() {
  return false;
}

#endif  // TRAINKIT_HAS_ONEDNN

}  // namespace trainkit::backend
