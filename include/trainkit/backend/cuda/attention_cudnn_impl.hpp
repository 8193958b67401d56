// trainkit/backend/cuda/attention_cudnn_impl.hpp - the definitions of attention_cudnn.hpp through
// the cuDNN frontend graph API (header-only C++; PyPI's nvidia-cudnn-frontend ships it). Plain C++:
// included by attention_cudnn.cpp only, once per program.
//
// A forward graph and its backward graph are built together, once per problem (shapes, strides,
// scale, causal, type, device), and kept for the process; a problem cuDNN does not support on this
// GPU is remembered as such and goes to trainkit's own kernels, forward and backward alike. (A
// backward whose upstream gradient lies otherwise than the output finds a pair of its own; should
// cuDNN refuse that one, trainkit's backward reads cuDNN's statistics, which are the contract's
// log-sum-exp.)
#pragma once

#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "trainkit/backend/cuda/attention_cudnn.hpp"
#include "trainkit/core/error.hpp"

namespace trainkit::backend::gpu::cudnn_attention {

namespace fe = cudnn_frontend;

struct plan {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  std::int64_t fwd_workspace = 0, bwd_workspace = 0;
};

namespace detail {
enum : std::int64_t { uid_q = 1, uid_k, uid_v, uid_o, uid_stats, uid_do, uid_dq, uid_dk, uid_dv };

/// Whether an operand's rows are 16-byte aligned (pointer and strides, in 2-byte elements).
inline bool aligned_rows(const operand& x) {
  return reinterpret_cast<std::uintptr_t>(x.p) % 16 == 0 && x.sb % 8 == 0 && x.sh % 8 == 0 && x.st % 8 == 0;
}

inline std::vector<std::int64_t> strides_of(const operand& x) { return {x.sb, x.sh, x.st, 1}; }

inline std::unique_ptr<plan> build(bool bf16, const attention_problem& p, const operand& q, const operand& k,
                                   const operand& v, const operand& out, const operand& dout, bool deterministic,
                                   cudnnHandle_t h) {
  const std::int64_t B = p.batch, H = p.heads, Tq = p.tq, Tk = p.tk, D = p.d, Dv = p.dv;
  const std::vector<std::int64_t> stats_stride{H * Tq, Tq, 1, 1};
  const fe::DataType_t io = bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  auto graph = [io] {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  };
  auto input = [](fe::graph::Graph& g, const char* name, std::int64_t uid, std::vector<std::int64_t> dims,
                  std::vector<std::int64_t> strides) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
  };
  auto ready = [h](fe::graph::Graph& g) {
    return g.validate().is_good() && g.build_operation_graph(h).is_good() &&
           g.create_execution_plans({fe::HeurMode_t::A}).is_good() && g.check_support(h).is_good() &&
           g.build_plans(h).is_good();
  };

  auto pl = std::make_unique<plan>();
  pl->fwd = graph();
  {
    auto Q = input(*pl->fwd, "Q", uid_q, {B, H, Tq, D}, strides_of(q));
    auto K = input(*pl->fwd, "K", uid_k, {B, H, Tk, D}, strides_of(k));
    auto V = input(*pl->fwd, "V", uid_v, {B, H, Tk, Dv}, strides_of(v));
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("sdpa")
                     .set_generate_stats(true)
                     .set_attn_scale(float(p.scale))
                     .set_causal_mask(p.causal);
    auto [O, stats] = pl->fwd->sdpa(Q, K, V, attrs);
    O->set_output(true).set_uid(uid_o).set_dim({B, H, Tq, Dv}).set_stride(strides_of(out));
    stats->set_output(true).set_uid(uid_stats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, Tq, 1}).set_stride(
        stats_stride);
  }
  pl->bwd = graph();
  {
    auto Q = input(*pl->bwd, "Q", uid_q, {B, H, Tq, D}, strides_of(q));
    auto K = input(*pl->bwd, "K", uid_k, {B, H, Tk, D}, strides_of(k));
    auto V = input(*pl->bwd, "V", uid_v, {B, H, Tk, Dv}, strides_of(v));
    auto O = input(*pl->bwd, "O", uid_o, {B, H, Tq, Dv}, strides_of(out));
    auto dO = input(*pl->bwd, "dO", uid_do, {B, H, Tq, Dv}, strides_of(dout));
    auto stats = input(*pl->bwd, "stats", uid_stats, {B, H, Tq, 1}, stats_stride);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(float(p.scale))
                     .set_causal_mask(p.causal)
                     .set_deterministic_algorithm(deterministic);
    auto [dQ, dK, dV] = pl->bwd->sdpa_backward(Q, K, V, O, dO, stats, attrs);
    dQ->set_output(true).set_uid(uid_dq).set_dim({B, H, Tq, D}).set_stride({H * Tq * D, Tq * D, D, 1});
    dK->set_output(true).set_uid(uid_dk).set_dim({B, H, Tk, D}).set_stride({H * Tk * D, Tk * D, D, 1});
    dV->set_output(true).set_uid(uid_dv).set_dim({B, H, Tk, Dv}).set_stride({H * Tk * Dv, Tk * Dv, Dv, 1});
  }
  if (!ready(*pl->fwd) || !ready(*pl->bwd)) return nullptr;
  if (pl->fwd->get_workspace_size(pl->fwd_workspace).is_bad() || pl->bwd->get_workspace_size(pl->bwd_workspace).is_bad())
    return nullptr;
  return pl;
}

inline void run(const fe::graph::Graph& g, cudnnHandle_t h, std::unordered_map<std::int64_t, void*>& pack,
                void* workspace, const char* what) {
  if (auto st = g.execute(h, pack, workspace); st.is_bad())
    throw runtime_failure(std::string("cuda: ") + what + " failed: " + st.get_message());
}
}  // namespace detail

const plan* find(bool bf16, const attention_problem& p, const operand& q, const operand& k, const operand& v,
                 const operand& out, const operand& dout, int device, bool deterministic, cudnnHandle_t h) {
  using detail::aligned_rows;
  if (p.dropout_p != 0 || p.d % 8 != 0 || p.dv % 8 != 0 || p.d > 128 || p.dv > 128 || p.tk == 0 || p.tq == 0)
    return nullptr;
  if (!aligned_rows(q) || !aligned_rows(k) || !aligned_rows(v) || !aligned_rows(out) || !aligned_rows(dout))
    return nullptr;
  std::ostringstream key;
  key << device << ' ' << bf16 << ' ' << p.batch << ' ' << p.heads << ' ' << p.tq << ' ' << p.tk << ' ' << p.d << ' '
      << p.dv << ' ' << p.causal << ' ' << p.scale << ' ' << deterministic;
  auto strides = [&key](const operand& x) { key << ' ' << x.sb << ' ' << x.sh << ' ' << x.st; };
  strides(q), strides(k), strides(v), strides(out), strides(dout);
  static std::mutex mu;
  static auto* cache = new std::unordered_map<std::string, std::unique_ptr<plan>>;  // outlives the runtime at exit
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key.str());
  if (it == cache->end()) it = cache->emplace(key.str(), detail::build(bf16, p, q, k, v, out, dout, deterministic, h)).first;
  return it->second.get();
}

std::int64_t forward_workspace(const plan& pl) { return pl.fwd_workspace; }
std::int64_t backward_workspace(const plan& pl) { return pl.bwd_workspace; }

void forward(const plan& pl, cudnnHandle_t h, const operand& q, const operand& k, const operand& v, void* out,
             float* lse, void* workspace) {
  using namespace detail;
  std::unordered_map<std::int64_t, void*> pack{{uid_q, const_cast<void*>(q.p)}, {uid_k, const_cast<void*>(k.p)},
                                               {uid_v, const_cast<void*>(v.p)}, {uid_o, out},
                                               {uid_stats, lse}};
  run(*pl.fwd, h, pack, workspace, "cuDNN attention forward");
}

void backward(const plan& pl, cudnnHandle_t h, const operand& q, const operand& k, const operand& v,
              const operand& out, const float* lse, const operand& dout, void* dq, void* dk, void* dv,
              void* workspace) {
  using namespace detail;
  std::unordered_map<std::int64_t, void*> pack{
      {uid_q, const_cast<void*>(q.p)},      {uid_k, const_cast<void*>(k.p)}, {uid_v, const_cast<void*>(v.p)},
      {uid_o, const_cast<void*>(out.p)},    {uid_stats, const_cast<float*>(lse)},
      {uid_do, const_cast<void*>(dout.p)},  {uid_dq, dq}, {uid_dk, dk}, {uid_dv, dv}};
  run(*pl.bwd, h, pack, workspace, "cuDNN attention backward");
}

}  // namespace trainkit::backend::gpu::cudnn_attention
