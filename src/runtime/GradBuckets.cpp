// Gradient buckets of pipeline.replicas (Note [Gradient buckets], GradBuckets.h).
#include "GradBuckets.h"

#include <torch/csrc/autograd/function_hook.h>

#include "EngineImpl.h"
#include "pipefb/memory/MemoryScope.h"

namespace pipefb::runtime {

// The last B of each stage before each of its ARs.
void PipelineEngine::Impl::findFinalBackwards() {
  if (pipeline.replicas <= 1 || !options.overlap) return;
  for (const auto& list : plan.schedule.devices)
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].type != ActionType::AllReduce) continue;
      for (size_t j = i; j-- > 0;)
        if (list[j].type == ActionType::Backward && list[j].stage == list[i].stage) {
          finalBackward.insert({list[j].stage, list[j].index});
          break;
        }
    }
}

// The B of (stage, a.index) that completes the stage's gradients before AR (finalBackward):
// post hooks on the nodes that feed each parameter's accumulator fill the buckets and start
// them while autograd runs. Null for any other B.
GradBuckets* PipelineEngine::Impl::hookBuckets(DeviceState& dev, StageState& st, const Action& a,
                                               const Replica& rep, const Tensor& output) {
  if (!replicaGroup || !finalBackward.count({a.stage, a.index})) return nullptr;
  GradBuckets* gb = &bucketsOf(dev, st);
  torch::NoGradGuard noGrad;
  zeroStaleGrads(st);
  beginBuckets(dev, st);
  gb->backwardAction = current[dev.id].load();
  // The nodes whose outputs feed a parameter's accumulator; a parameter fed by exactly
  // one edge is final when that node ran.
  std::map<const torch::autograd::Node*, int> paramOf;
  for (size_t i = 0; i < rep.params.size(); ++i)
    if (rep.params[i].requires_grad())
      if (auto acc = torch::autograd::impl::try_get_grad_accumulator(rep.params[i]))
        paramOf[acc.get()] = static_cast<int>(i);
  std::vector<std::pair<torch::autograd::Node*, std::pair<size_t, int>>> feeds;
  std::vector<int> edges(rep.params.size(), 0);
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (output.grad_fn()) todo.push_back(output.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    const auto& next = n->next_edges();
    for (size_t o = 0; o < next.size(); ++o) {
      if (!next[o].function) continue;
      auto it = paramOf.find(next[o].function.get());
      if (it != paramOf.end()) {
        ++edges[it->second];
        feeds.push_back({n, {o, it->second}});
      } else {
        todo.push_back(next[o].function.get());
      }
    }
  }
  struct Hook final : torch::autograd::FunctionPostHook {
    std::vector<std::pair<size_t, int>> slots;  // (output, parameter)
    std::function<void(int, const Tensor&)> ready;
    torch::autograd::variable_list operator()(
        const torch::autograd::variable_list& outputs,
        const torch::autograd::variable_list& /*inputs*/) override {
      for (const auto& [o, i] : slots)
        if (o < outputs.size() && outputs[o].defined()) ready(i, outputs[o]);
      return outputs;
    }
  };
  std::map<torch::autograd::Node*, std::unique_ptr<Hook>> hooks;
  for (const auto& [n, slot] : feeds) {
    if (edges[slot.second] != 1) continue;
    auto& h = hooks[n];
    if (!h) {
      h = std::make_unique<Hook>();
      h->ready = [this, &st, step = iterationOf(a)](int i, const Tensor& grad) {
        torch::NoGradGuard noGrad;
        st.master->params[i].mutable_grad().add_(grad);
        bucketReady(st, i);
        startBuckets(st, step);
      };
    }
    h->slots.push_back(slot);
  }
  // The hooks die with the graph, which this B frees (retain_graph false).
  for (auto& [n, h] : hooks) n->add_post_hook(std::move(h));
  gb->inAutograd = true;
  return gb;
}

// Note [Gradient buckets]
GradBuckets& PipelineEngine::Impl::bucketsOf(DeviceState& dev, StageState& st) {
  if (st.buckets) return *st.buckets;
  auto gb = std::make_unique<GradBuckets>();
  const auto& params = st.master->params;
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(options.bucketMb * (1 << 20)));
  gb->bucketOf.assign(params.size(), -1);
  gb->slotOf.assign(params.size(), -1);
  gb->ready.assign(params.size(), 0);
  int64_t bytes = 0, elements = 0;
  for (size_t k = params.size(); k-- > 0;) {  // reverse: backward's order
    const Tensor& p = params[k];
    if (gb->buckets.empty() || bytes >= cap) {
      gb->buckets.emplace_back();
      bytes = elements = 0;
    }
    auto& b = gb->buckets.back();
    gb->bucketOf[k] = static_cast<int>(gb->buckets.size()) - 1;
    gb->slotOf[k] = static_cast<int>(b.params.size());
    b.params.push_back(static_cast<int>(k));
    b.offsets.push_back(elements);
    elements += p.numel();
    bytes += p.numel() * p.element_size();
  }
  memory::MemoryScope scope(*dev.domain, MemoryCategory::CommBuffers);
  for (auto& b : gb->buckets) {
    int64_t n = 0;
    for (int k : b.params) n += params[k].numel();
    b.flat = torch::empty({n}, params[b.params.front()].options().requires_grad(false));
  }
  st.buckets = std::move(gb);
  return *st.buckets;
}

void PipelineEngine::Impl::beginBuckets(DeviceState& dev, StageState& st) {
  GradBuckets& gb = bucketsOf(dev, st);
  PIPEFB_ASSERT(!gb.active, "stage " << st.index << ": gradient buckets filled twice before AR");
  std::fill(gb.ready.begin(), gb.ready.end(), 0);
  for (auto& b : gb.buckets) {
    b.missing = static_cast<int>(b.params.size());
    b.work.reset();
    b.startNs = 0;
  }
  gb.next = 0;
  gb.active = true;
  gb.backwardAction = -1;
  gb.backwardDoneNs = 0;
}

// Parameter `param`'s .grad is final: into its bucket.
void PipelineEngine::Impl::bucketReady(StageState& st, int param) {
  GradBuckets& gb = *st.buckets;
  if (gb.ready[param]) return;
  gb.ready[param] = 1;
  auto& b = gb.buckets[gb.bucketOf[param]];
  const Tensor& g = st.master->params[param].grad();
  torch::NoGradGuard noGrad;
  b.flat.narrow(0, b.offsets[gb.slotOf[param]], g.numel()).copy_(g.reshape({-1}));
  --b.missing;
}

// Starts the complete buckets, in order.
void PipelineEngine::Impl::startBuckets(StageState& st, int64_t step) {
  GradBuckets& gb = *st.buckets;
  while (gb.next < static_cast<int>(gb.buckets.size()) && gb.buckets[gb.next].missing == 0) {
    auto& b = gb.buckets[gb.next++];
    b.startNs = memory::nowNs();
    b.work = replicaGroup->allreduceAsync({b.flat});
    BucketRecord r;
    r.stage = st.index;
    r.step = step;
    r.bucket = gb.next - 1;
    r.bytes = b.flat.numel() * b.flat.element_size();
    r.startNs = b.startNs;
    r.backwardAction = gb.backwardAction;
    r.duringBackward = gb.inAutograd;
    std::lock_guard<std::mutex> lock(mu);
    b.record = bucketLog.size();
    bucketLog.push_back(r);
  }
}

void PipelineEngine::Impl::execAllReduce(DeviceState& dev, const Action& a) {
  if (replicaGroup) {  // pipeline.replicas: the mean of the replicas' stage gradients
    StageState& st = stages[a.stage];
    GradBuckets& gb = bucketsOf(dev, st);
    if (!gb.active) {  // distributed.overlap false: every bucket starts here
      beginBuckets(dev, st);
      for (size_t i = 0; i < st.master->params.size(); ++i) bucketReady(st, static_cast<int>(i));
      startBuckets(st, a.index);
    }
    PIPEFB_ASSERT(gb.next == static_cast<int>(gb.buckets.size()),
                  "stage " << st.index << ": a gradient bucket never started");
    torch::NoGradGuard noGrad;
    for (size_t k = 0; k < gb.buckets.size(); ++k) {
      auto& b = gb.buckets[k];
      b.work->wait();
      b.work.reset();
      {
        std::lock_guard<std::mutex> lock(mu);
        bucketLog[b.record].backwardDoneNs = gb.backwardDoneNs;
        bucketLog[b.record].doneNs = memory::nowNs();
      }
      b.flat.div_(R);
      for (size_t j = 0; j < b.params.size(); ++j) {
        Tensor g = st.master->params[b.params[j]].mutable_grad();
        g.copy_(b.flat.narrow(0, b.offsets[j], g.numel()).view_as(g));
      }
    }
    gb.active = false;
    return;
  }
  throw UserError("AR" + std::to_string(a.stage) + "." + std::to_string(a.index) +
                  ": data-parallel all-reduce is not supported by the virtual-device runtime");
}

}  // namespace pipefb::runtime
