// Note [Split backward in the runtime] (pipefb/model/SplitBackward.h).
#include "pipefb/model/SplitBackward.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_map>
#include <unordered_set>

namespace pipefb::model {

namespace {

using torch::autograd::Edge;
using torch::autograd::Node;

/// Every node reachable from `root` that leads to one of `targets` (a target leads to
/// itself; the search does not go past one). Iterative: a stage's graph may be thousands
/// of nodes deep.
std::unordered_set<const Node*> leadingTo(Node* root,
                                          const std::unordered_set<const Node*>& targets) {
  std::unordered_map<const Node*, bool> leads;  // finished nodes
  std::unordered_set<const Node*> open;
  std::vector<std::pair<Node*, size_t>> stack{{root, 0}};
  open.insert(root);
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (targets.count(n) == 0 && next < n->num_outputs()) {
      Node* c = n->next_edge(next++).function.get();
      if (c != nullptr && leads.count(c) == 0 && open.count(c) == 0) {
        open.insert(c);
        stack.emplace_back(c, 0);
      }
      continue;
    }
    bool l = targets.count(n) > 0;
    for (size_t i = 0; !l && i < n->num_outputs(); ++i) {
      const Node* c = n->next_edge(i).function.get();
      l = c != nullptr && leads[c];
    }
    leads[n] = l;
    open.erase(n);
    stack.pop_back();
  }
  std::unordered_set<const Node*> out;
  for (const auto& [n, l] : leads)
    if (l) out.insert(n);
  return out;
}

}  // namespace

torch::Tensor inputGradient(DeferredWeightGrad& w, const torch::Tensor& input,
                            const std::vector<torch::Tensor>& params) {
  if (!input.defined() || !input.requires_grad() || !w.output.requires_grad()) return {};
  const Edge out = torch::autograd::impl::gradient_edge(w.output);
  const Edge in = torch::autograd::impl::gradient_edge(input);
  std::unordered_set<const Node*> paramNodes;
  for (const auto& p : params)
    if (p.requires_grad())
      if (auto acc = torch::autograd::impl::try_get_grad_accumulator(p))
        paramNodes.insert(acc.get());
  const auto onPath = leadingTo(out.function.get(), {in.function.get()});
  const auto toParams = leadingTo(out.function.get(), paramNodes);
  // The weight nodes: on the input's path, with an edge off it towards a parameter.
  torch::autograd::edge_list outputs{in};
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack{out.function};
  seen.insert(out.function.get());
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    bool weightNode = false;
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      const std::shared_ptr<Node>& c = n->next_edge(i).function;
      if (c == nullptr) continue;
      if (onPath.count(c.get()) > 0) {
        if (seen.insert(c.get()).second && c.get() != in.function.get()) stack.push_back(c);
      } else if (toParams.count(c.get()) > 0) {
        weightNode = true;
      }
    }
    if (!weightNode) continue;
    for (size_t i = 0; i < n->num_outputs(); ++i)
      if (onPath.count(n->next_edge(i).function.get()) > 0) w.cut.emplace_back(n, i);
    for (uint32_t k = 0; k < n->num_inputs(); ++k) outputs.emplace_back(n, k);
  }
  auto got = torch::autograd::Engine::get_default_engine().execute(
      {out}, {w.gradOut}, /*keep_graph=*/true, /*create_graph=*/false,
      /*accumulate_grad=*/false, outputs);
  for (size_t j = 1; j < outputs.size(); ++j)
    if (got[j].defined()) {
      w.roots.push_back(outputs[j]);
      w.kept.push_back(std::move(got[j]));
    }
  // The weight nodes (and through them the graph) stay alive in `roots`; the output and
  // its gradient are no longer needed.
  w.output = torch::Tensor();
  w.gradOut = torch::Tensor();
  return got[0];
}

std::int64_t keptBytes(const DeferredWeightGrad& w) {
  std::int64_t n = 0;
  for (const auto& t : w.kept) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

namespace {

// W's autograd call: from the kept gradients (or stage 0's output) to `params`' edges,
// gathered (the gradients returned, in params' order, undefined where a parameter does not
// require grad) or accumulated into .grad (nothing returned).
std::vector<torch::Tensor> runW(DeferredWeightGrad& w, const std::vector<torch::Tensor>& params,
                                bool accumulate) {
  torch::autograd::edge_list wrt;
  std::vector<torch::Tensor> out(accumulate ? 0 : params.size());
  std::vector<size_t> at;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].requires_grad()) {
      wrt.push_back(torch::autograd::impl::gradient_edge(params[i]));
      at.push_back(i);
    }
  const bool fromOutput = w.roots.empty() && w.output.defined() && w.output.requires_grad();
  if (!wrt.empty() && (fromOutput || !w.roots.empty())) {
    // Through next_edges(): set_next_edge refuses a node with a parent, though taking an
    // edge away keeps every topological number valid.
    for (auto& [n, i] : w.cut) n->next_edges()[i] = Edge();
    auto g = fromOutput ? torch::autograd::Engine::get_default_engine().execute(
                              {torch::autograd::impl::gradient_edge(w.output)}, {w.gradOut},
                              /*keep_graph=*/false, /*create_graph=*/false, accumulate, wrt)
                        : torch::autograd::Engine::get_default_engine().execute(
                              w.roots, w.kept, /*keep_graph=*/false, /*create_graph=*/false,
                              accumulate, wrt);
    if (!accumulate)
      for (size_t j = 0; j < at.size(); ++j) out[at[j]] = std::move(g[j]);
  }
  w = DeferredWeightGrad{};  // the graph (and with it the stash) goes here
  return out;
}

}  // namespace

std::vector<torch::Tensor> weightGradients(DeferredWeightGrad& w,
                                           const std::vector<torch::Tensor>& params) {
  return runW(w, params, /*accumulate=*/false);
}

void accumulateWeightGradients(DeferredWeightGrad& w, const std::vector<torch::Tensor>& params) {
  runW(w, params, /*accumulate=*/true);
}

void restoreBuffersUnversioned(const std::vector<torch::Tensor>& dst,
                               const std::vector<torch::Tensor>& src) {
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  for (size_t i = 0; i < dst.size() && i < src.size(); ++i) dst[i].copy_(src[i]);
}

}  // namespace pipefb::model
