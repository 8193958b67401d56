// trainkit/autograd/backward.hpp - reverse-mode traversal of the recorded graph.
#pragma once

#include <queue>
#include <unordered_map>
#include <vector>

#include "trainkit/autograd/var.hpp"
#include "trainkit/ops/elementwise.hpp"

namespace trainkit::autograd {

/// Backpropagates grad (ones for a one-element root) from root through the graph: each node
/// runs once, after every node that feeds it has run (reverse topological order, latest node
/// first among the ready ones); gradients reaching a node along several paths are summed;
/// saved tensors are released as each node finishes unless retain_graph.
template <class T, class D>
void backward(const var<T, D>& root, tensor<T, D> grad = {}, bool retain_graph = false) {
  using node_ptr = std::shared_ptr<node<T, D>>;
  node_ptr start = root.gradient_edge();
  TRAINKIT_CHECK(start != nullptr, usage_error, "backward",
                 "the tensor does not require grad and has no grad_fn");
  if (!grad.defined()) {
    TRAINKIT_CHECK(root.numel() == 1, usage_error, "backward",
                   "grad can be implicitly created only for one-element outputs; sizes are "
                       << to_string(root.sizes()));
    grad = tensor<T, D>::ones(root.sizes());
  } else {
    TRAINKIT_CHECK(grad.sizes() == root.sizes(), shape_error, "backward",
                   "gradient of sizes " << to_string(grad.sizes()) << " for an output of sizes "
                                        << to_string(root.sizes()));
  }

  // Count, for every reachable node, how many edges point at it (iterative DFS: deep graphs
  // such as a 1000-step RNN must not overflow the stack).
  std::unordered_map<node<T, D>*, int> deps;
  {
    std::vector<node<T, D>*> stack{start.get()};
    deps[start.get()] = 0;
    while (!stack.empty()) {
      node<T, D>* n = stack.back();
      stack.pop_back();
      for (auto& nx : n->next) {
        if (!nx) continue;
        auto [it, fresh] = deps.try_emplace(nx.get(), 0);
        ++it->second;
        if (fresh) stack.push_back(nx.get());
      }
    }
  }

  struct later_first {
    bool operator()(const node_ptr& a, const node_ptr& b) const { return a->sequence < b->sequence; }
  };
  std::priority_queue<node_ptr, std::vector<node_ptr>, later_first> ready;
  // Gradients wait here until their node runs; a gradient of bfloat16 values stays bf16 while it
  // arrives along one path (grad_flow), two paths are summed in T.
  std::unordered_map<node<T, D>*, grad_flow<T, D>> buffer;
  buffer[start.get()] = grad_flow<T, D>(std::move(grad));
  ready.push(start);

  while (!ready.empty()) {
    node_ptr n = ready.top();
    ready.pop();
    grad_flow<T, D> g;
    if (auto it = buffer.find(n.get()); it != buffer.end()) {
      g = std::move(it->second);
      buffer.erase(it);
    }
    std::vector<grad_flow<T, D>> in_grads;
    if (g.defined()) {
      if (auto out = n->retained_output.lock()) {
        if (out->grad.defined())
          add_(out->grad, g.widened());
        else
          out->grad = g.is_narrow() ? g.widened() : g.full.clone();  // widening already copies
      }
      in_grads = n->apply_flow(std::move(g));
    }
    if (!retain_graph) n->release();
    for (std::size_t i = 0; i < n->next.size(); ++i) {
      auto& nx = n->next[i];
      if (!nx) continue;
      if (i < in_grads.size() && in_grads[i].defined()) {
        auto& b = buffer[nx.get()];
        if (!b.defined())
          b = std::move(in_grads[i]);
        else
          b = grad_flow<T, D>(b.widened() + in_grads[i].widened());  // out of place: b may alias a saved tensor
      }
      if (--deps[nx.get()] == 0) ready.push(nx);
    }
  }
}

template <class T, class Device>
void var<T, Device>::backward(const tensor_type& grad, bool retain_graph) const {
  autograd::backward(*this, grad, retain_graph);
}

}  // namespace trainkit::autograd
