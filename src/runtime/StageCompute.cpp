// The compute actions of a stage: F(s,m), B(s,m), and the split backward's I(s,m) and
// W(s,m) (Note [Split backward in the runtime], model/SplitBackward.h). What they take from and
// leave for other actions goes through the stash registry (Stash.h), the weight versions
// (WeightVersions.h) and, on the B that completes a stage's gradients, the gradient
// buckets (GradBuckets.h).
#include <cmath>

#include "EngineImpl.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/schedules/Lowering.h"

namespace pipefb::runtime {

void PipelineEngine::Impl::execForward(DeviceState& dev, const Action& a) {
  StageState& st = stages[a.stage];
  const Key in{a.stage - 1, a.index};
  Tensor x = a.stage == 0 ? takeFrom(dev.inputs, {0, a.index}, "input")
                          : takeFrom(dev.acts, in, "activation");
  ReplicaPtr rep = forwardReplica(st, a.index);
  // Note [Dropout streams]: the recompute in B(s,m) draws the same masks.
  model::DropoutKey masks(options.training.seed, options.firstStep * M + a.index);
  auto entry = std::make_shared<StashEntry>();
  const int64_t stashBefore = dev.domain->liveBytes(MemoryCategory::Stash);
  model::Autocast autocast(options.training.precision, x.device().type());  // Note [Autocast]
  Tensor out;
  if (!st.recompute) {
    // keep: the autograd graph is the stash; everything F leaves alive is charged to it.
    memory::MemoryScope scope(MemoryCategory::Stash);
    Tensor xin = (a.stage > 0 && x.is_floating_point()) ? x.detach().requires_grad_(true) : x;
    if (st.offloadSaved) {
      // offload: autograd's saved tensors are caught for OFF; the resident weights not.
      entry->saved = std::make_shared<offload::SavedTensorGroup>();
      for (const auto& t : rep->params) entry->saved->skip(t);
      for (const auto& t : rep->buffers) entry->saved->skip(t);
      offload::StashScope hooks(entry->saved);
      out = rep->forward(xin);
    } else {
      out = rep->forward(xin);
    }
    entry->graph = true;
    // An input that needs no gradient (stage 0's data) is the graph's to keep, if it saves
    // it: under bf16 the first convolution saves autocast's bf16 cast and not the fp32
    // input (Note [Autocast]), and holding it here kept both (resnet50/8 1f1b's device 0
    // 2.7% above its plan, the profile measuring only the cast).
    if (xin.requires_grad()) entry->input = xin;
    entry->output = out;
    entry->replica = rep;
    out = out.detach();
    if (st.offloadSaved) {
      // The graph's input leaf and root are needed for their identity and shape only (the
      // values autograd needs are in entry->saved): let their storage go, holding nothing
      // in its place (Note [Hollow graph ends]). `out` (the activation sent on / the last
      // stage's loss input) keeps its own reference.
      torch::NoGradGuard noGrad;
      if (xin.requires_grad())
        xin.set_data(offload::hollowLike(xin));
      else
        entry->input = Tensor();
      entry->output.set_data(offload::hollowLike(entry->output));
    }
  } else {
    // checkpoint: only the stage input stays; B recomputes.
    {
      memory::MemoryScope scope(MemoryCategory::Stash);
      entry->input = x.clone();
    }
    torch::NoGradGuard noGrad;
    out = rep->forward(x);
    if (rep != st.master && !st.split) entry->replica = rep;  // a snapshot (same device)
  }
  if (checkAll()) check(out, "activation", a.stage, a.index);
  if (st.stashBytesPerMb < 0)
    st.stashBytesPerMb = dev.domain->liveBytes(MemoryCategory::Stash) - stashBefore;
  dev.stashes[{a.stage, a.index}] = entry;
  if (st.keepsOutput) dev.acts[{a.stage, a.index}] = out;
}

PipelineEngine::Impl::BackwardStart PipelineEngine::Impl::startBackward(DeviceState& dev,
                                                                        const Action& a) {
  StageState& st = stages[a.stage];
  const int mb = a.index;
  StashPtr e = takeStash(dev, a.stage, mb);
  BackwardStart b;
  b.rep = backwardReplica(st, mb, *e);
  const ReplicaPtr& rep = b.rep;
  Tensor &input = b.input, &output = b.output;
  std::vector<Tensor>& savedBuffers = b.savedBuffers;
  const bool recomputes = !e->graph;
  if (e->graph) {
    input = e->input;
    output = e->output;
  } else {
    // Recompute the forward with grad (its activations are this action's working set).
    input = e->input.detach();
    if (a.stage > 0 && input.is_floating_point()) input.requires_grad_(true);
    {
      torch::NoGradGuard noGrad;
      for (const auto& b : rep->buffers) savedBuffers.push_back(b.clone());
    }
    model::DropoutKey masks(options.training.seed, options.firstStep * M + a.index);
    // I's recompute outlives the action (until W): it is the stash again.
    memory::MemoryScope scope(a.type == ActionType::InputGrad ? MemoryCategory::Stash
                                                              : MemoryCategory::WorkingSet);
    model::Autocast autocast(options.training.precision, input.device().type());
    output = rep->forward(input);
  }
  e.reset();

  Tensor& gradOut = b.gradOut;
  if (a.stage == S - 1) {
    // The loss, scaled so that the summed gradients are those of the batch mean.
    Tensor target = takeFrom(dev.targets, {S - 1, mb}, "target");
    const int64_t n = static_cast<int64_t>(M) * target.size(0);  // microbatches are equal
    const double scale = static_cast<double>(target.size(0)) / n;
    // Received (or made here), or else recomputed just now (Note [Recomputed last output]).
    auto it = dev.acts.find({S - 1, mb});
    Tensor l;
    model::Autocast autocast(options.training.precision, target.device().type());
    if (it == dev.acts.end() &&
        schedules::lossInRecomputedGraph(recomputes, a.type == ActionType::InputGrad)) {
      // Note [Loss in the recomputed graph]: B's root is the loss; the output goes now.
      l = model.loss(output, target) * scale;
      output = l;
      gradOut = torch::full_like(l, seedScale(mb / M));  // Note [Loss scaling]
    } else {
      Tensor o;
      if (it != dev.acts.end()) {
        o = it->second.detach();
        dev.acts.erase(it);
      } else {
        o = output.detach();
      }
      o.requires_grad_(true);
      l = model.loss(o, target) * scale;
      gradOut = torch::autograd::grad({l}, {o}, {torch::full_like(l, seedScale(mb / M))})[0];
    }
    double v = l.item<double>();
    if (checkLoss() && !std::isfinite(v)) check(l, "loss", a.stage, mb);
    {
      std::lock_guard<std::mutex> lock(mu);
      const int k = mb / M;
      loss[k] += v;
      ++lossCount[k];
    }
    cv.notify_all();
  } else {
    gradOut = takeFrom(dev.grads, {a.stage + 1, mb}, "gradient");
  }
  return b;
}

void PipelineEngine::Impl::zeroStaleGrads(StageState& st) {
  if (!st.gradsStale) return;
  torch::NoGradGuard noGrad;
  for (auto& p : st.master->params) p.mutable_grad().zero_();
  st.gradsStale = false;
}

void PipelineEngine::Impl::execBackward(DeviceState& dev, const Action& a) {
  StageState& st = stages[a.stage];
  const int mb = a.index;
  BackwardStart start = startBackward(dev, a);
  const ReplicaPtr rep = std::move(start.rep);
  Tensor input = std::move(start.input), output = std::move(start.output),
         gradOut = std::move(start.gradOut);
  const std::vector<Tensor> savedBuffers = std::move(start.savedBuffers);

  std::vector<Tensor> wrt;
  for (const auto& p : rep->params)
    if (p.requires_grad()) wrt.push_back(p);
  const bool wantInput = input.defined() && input.requires_grad();
  if (wantInput) wrt.push_back(input);
  if (wrt.empty() || !output.requires_grad()) {
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < savedBuffers.size(); ++i) rep->buffers[i].copy_(savedBuffers[i]);
    return;
  }
  // Note [Gradient buckets]: the B that completes the stage's gradients starts their
  // all-reduce from hooks while autograd still runs.
  GradBuckets* gb = hookBuckets(dev, st, a, *rep, output);
  if (!gb && rep == st.master)
    return backwardInPlace(dev, st, a, std::move(input), std::move(output), std::move(gradOut),
                           savedBuffers);
  auto g = torch::autograd::grad({output}, wrt, {gradOut}, /*retain_graph=*/false,
                                 /*create_graph=*/false, /*allow_unused=*/true);
  output = Tensor();
  if (gb) {
    gb->inAutograd = false;
    gb->backwardDoneNs = memory::nowNs();
  }
  if (checkGrads()) {
    size_t gi = 0;
    for (size_t i = 0; i < rep->params.size(); ++i)
      if (rep->params[i].requires_grad()) check(g[gi++], "weight gradient", a.stage, mb);
    if (wantInput) check(g.back(), "input gradient", a.stage, mb);
  }
  torch::NoGradGuard noGrad;
  // The recompute must not count twice in BatchNorm statistics. Restored only now:
  // batch_norm's backward reads the running statistics it saved (version check).
  for (size_t i = 0; i < savedBuffers.size(); ++i) rep->buffers[i].copy_(savedBuffers[i]);
  zeroStaleGrads(st);
  size_t j = 0;
  for (size_t i = 0; i < rep->params.size(); ++i) {
    if (!rep->params[i].requires_grad()) continue;
    // A hook already added it (Note [Gradient buckets]).
    if (g[j].defined() && !(gb && gb->ready[i])) st.master->params[i].mutable_grad().add_(g[j]);
    ++j;
  }
  if (gb) {  // what no hook saw is final now: the remaining buckets start
    for (size_t i = 0; i < st.master->params.size(); ++i)
      if (!gb->ready[i]) bucketReady(st, static_cast<int>(i));
    startBuckets(st, iterationOf(a));
  }
  if (wantInput) dev.grads[{a.stage, mb}] = g.back();
  releaseVersion(st, mb);
}

// Note [In-place weight gradients]
// B on the master's own weights (same-device stages, and split stages that recompute:
// every checkpoint kind of pipefb-sync) lets autograd accumulate each parameter's
// gradient into its .grad as soon as it is computed (torch::autograd::backward with
// `inputs`; AccumulateGrad adds in place into a defined .grad), so a fresh gradient lives
// only until its accumulation, and a linear layer's weight gradient not at all (Note
// [Weight gradients into .grad] in model/Model.h). torch::autograd::grad instead gathers every
// parameter's gradient of the stage until the whole backward is done, beside the working set the
// profiler measures with in-place accumulation (planner/Profiler.cpp). Measured: the
// decoupled pipefb-sync plan of experiments/pipefb_memory_measured.sh went out of memory at
// its own budget in B of ResNet50's layer4.0 (device 2 peaked at 4178648 bytes against
// 4138424 planned); accumulating in place it peaks at 4020952 and runs. The sum is the
// same float additions as add_ after the fact. B on another copy (a kept graph of a split
// stage built on the forward copy, a weight version, a prediction) and B with gradient
// buckets keep the gathered form: their gradients belong to other tensors. The cost model
// charges each B in the form it runs in (CostModel::gradientsInPlace, Note [Gathered
// weight gradients] in planner/CostModel.h).
void PipelineEngine::Impl::backwardInPlace(DeviceState& dev, StageState& st, const Action& a,
                                           Tensor input, Tensor output, Tensor gradOut,
                                           const std::vector<Tensor>& savedBuffers) {
  const int mb = a.index;
  zeroStaleGrads(st);
  std::vector<Tensor> inputs;
  for (const auto& p : st.master->params)
    if (p.requires_grad()) inputs.push_back(p);
  const bool wantInput = input.defined() && input.requires_grad();
  if (wantInput) inputs.push_back(input);
  {
    // Linear layers add their weight gradients straight into .grad (Note [Weight
    // gradients into .grad] in model/Model.h): no weight-sized transient.
    model::WeightGradientsIntoGrad into;
    torch::autograd::backward({output}, {gradOut}, /*retain_graph=*/false,
                              /*create_graph=*/false, inputs);
  }
  output = Tensor();
  gradOut = Tensor();
  torch::NoGradGuard noGrad;
  // The recompute must not count twice in BatchNorm statistics (as execBackward).
  for (size_t i = 0; i < savedBuffers.size(); ++i) st.master->buffers[i].copy_(savedBuffers[i]);
  if (checkGrads())  // the sum so far: it turns non-finite at the microbatch that made it so
    for (const auto& p : st.master->params)
      if (p.requires_grad()) check(p.grad(), "weight gradient", a.stage, mb);
  if (wantInput) {
    Tensor g = input.grad();
    input.mutable_grad() = Tensor();
    if (checkGrads()) check(g, "input gradient", a.stage, mb);
    dev.grads[{a.stage, mb}] = std::move(g);
  }
  releaseVersion(st, mb);
}

// Note [Split backward in the runtime] (model/SplitBackward.h).
void PipelineEngine::Impl::execInputGrad(DeviceState& dev, const Action& a) {
  const int mb = a.index;
  BackwardStart start = startBackward(dev, a);
  // IR's recompute advanced the BatchNorm statistics: back as they were, without the
  // version bump W's unpack would refuse.
  restoreBuffersUnversioned(start.rep->buffers, start.savedBuffers);
  DeferredWeightGrad w;
  w.output = std::move(start.output);
  w.gradOut = std::move(start.gradOut);
  Tensor gin = inputGradient(w, start.input, start.rep->params);
  if (gin.defined()) {
    if (checkGrads()) check(gin, "input gradient", a.stage, mb);
    dev.grads[{a.stage, mb}] = std::move(gin);
  }
  dev.deferred[{a.stage, mb}] = {std::move(w), std::move(start.rep)};
}

void PipelineEngine::Impl::execWeightGrad(DeviceState& dev, const Action& a) {
  StageState& st = stages[a.stage];
  const int mb = a.index;
  auto w = takeFrom(dev.deferred, {a.stage, mb}, "the I");
  // Note [In-place weight gradients]: W on the master's own weights, on the device of the
  // stage's F and B, accumulates into .grad (CostModel::weightGradientsInPlace says the
  // same to the planner); W on a forward copy (pipefb-zb) gathers.
  if (w.rep == st.master && st.fDev == st.bDev) {
    zeroStaleGrads(st);
    {
      model::WeightGradientsIntoGrad into;
      model::accumulateWeightGradients(w.grad, st.master->params);
    }
    if (checkGrads())  // the sum so far, as execBackward's
      for (const auto& p : st.master->params)
        if (p.requires_grad()) check(p.grad(), "weight gradient", a.stage, mb);
    releaseVersion(st, mb);
    return;
  }
  const auto g = weightGradients(w.grad, w.rep->params);
  if (checkGrads())
    for (const auto& t : g)
      if (t.defined()) check(t, "weight gradient", a.stage, mb);
  torch::NoGradGuard noGrad;
  zeroStaleGrads(st);
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i].defined()) st.master->params[i].mutable_grad().add_(g[i]);
  releaseVersion(st, mb);
}

}  // namespace pipefb::runtime
