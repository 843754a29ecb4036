// STEP(s,k): a stage's optimizer step on its backward device, or in the host pool under
// pipeline.optimizer_offload: host (Note [Optimizer offload], below). The weight versions
// kept around a step are WeightVersions.cpp's.
//
// Note [Optimizer offload]
// pipeline.optimizer_offload: host (per stage) moves a stage's optimizer off its backward
// device, as ZeRO-Offload does: the backward device keeps the weights (the master the
// forwards, versions and predictions read, updated in place) and their .grad, and
// nothing else. The host pool's domain holds master copies of the weights (category
// weights, the optimizer's parameters), a gradient buffer (grads) and the Adam/SGD state
// (optimizer_state). STEP is pipelined tensor by tensor on the device's copy engine:
// all gradients are queued D2H into the host buffer; for each tensor in turn the
// compute thread waits for its gradient (stall), steps the optimizer on that one host
// tensor (the optimizers skip parameters without a gradient; their state is per
// tensor, so this is bit-identical to one step over all), and queues the H2D copy of
// the new weights into the device parameter in place. STEP ends when every H2D copy is
// done, so what runs after it sees the new weights. The time the compute thread waits
// for these copies is stall, and is not counted as compute that hides copies
// (transferStats()). The device's .grad is zeroed by the next backward, as without
// offload. Checkpoints read and restore the host optimizer through
// PipelineEngine::optimizerParameters() / optimizerDomain().
#include <chrono>

#include "EngineImpl.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/train/Optimizer.h"

namespace pipefb::runtime {

void PipelineEngine::Impl::execStep(DeviceState& dev, const Action& a) {
  StageState& st = stages[a.stage];
  // Note [Weights by reference] (WeightVersions.cpp): the last SyncWeights sent these.
  if (async && st.split && !st.recompute && isLocal(st.fDev) && a.index > 0) {
    const int64_t start = memory::nowNs();
    std::unique_lock<std::mutex> lock(mu);
    while (st.weightsReceived < a.index - 1) {
      if (aborted) throw Cancelled{};  // the pipeline stops
      cv.wait_for(lock, std::chrono::milliseconds(100));
    }
    dev.waitedNs += memory::nowNs() - start;  // not compute: Note [Busy seconds]
  }
  keepVersionsBeforeStep(dev, st);  // Note [Weights, versions and replicas]
  const int64_t iteration = schedules::stepsPerMicrobatch(scheduleKind) ? a.index / M : a.index;
  train::setLearningRate(
      *st.optimizer,
      train::learningRate(options.training, options.firstStep + iteration, options.totalSteps));
  // Note [Loss scaling]: every stage steps, or none does.
  const bool steps = !scaled || agreeOnStep(dev, static_cast<int>(iteration));
  if (steps && scaled)
    train::unscaleGrads(st.master->params, seedScale(static_cast<int>(iteration)));
  if (!steps) {
    // skipped: the version still advances, as the same weights
  } else if (st.optimizerOnHost) {
    stepOnHost(dev, st, a.index);
  } else {
    memory::MemoryScope scope(MemoryCategory::OptimizerState);
    st.optimizer->step();
  }
  predictAfterStep(st);  // Note [Weight prediction]
  st.masterVersion = a.index + 1;
  st.gradsStale = true;
}

// Note [Loss scaling] (train/LossScaler.h).
double PipelineEngine::Impl::seedScale(int k) {
  if (!scaled) return 1.0;
  std::unique_lock<std::mutex> lock(mu);
  // The verdict of k-1 came before any forward of k (Note [Loss scaling]): this waits only on a
  // schedule that breaks that.
  while (!verdicts.count(k)) {
    if (aborted) throw Cancelled{};
    cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  return verdicts[k].scale;
}

bool PipelineEngine::Impl::agreeOnStep(DeviceState& dev, int k) {
  if (checkedIteration[dev.id] != k) {
    checkedIteration[dev.id] = k;
    int checked = 0, bad = -1;
    for (const StageState& st : stages) {
      if (st.bDev != dev.id) continue;
      ++checked;
      if (bad < 0 && !train::gradsFinite(st.master->params)) bad = st.index;
    }
    if (stepGroup) {  // the other processes' stages: flags[s] > 0 when stage s is bad
      // S floats, charged to no device: a plan has no line for them.
      memory::MemoryScope scope(memory::unscopedDomain(), MemoryCategory::CommBuffers);
      std::vector<Tensor> flags{torch::zeros({S}, torch::kFloat32)};
      if (bad >= 0) flags[0][bad] = 1;
      stepGroup->allreduce(flags);
      checked = S;
      bad = -1;
      for (int s = S - 1; s >= 0; --s)
        if (flags[0][s].item<float>() > 0) bad = s;
    }
    std::lock_guard<std::mutex> lock(mu);
    Verdict& v = verdicts[k];
    v.checked += checked;
    if (bad >= 0 && (v.firstBad < 0 || bad < v.firstBad)) v.firstBad = bad;
    if (v.checked == S) {  // the last device to report: the scale of iteration k+1
      lossScale = train::afterVerdict(lossScale, v.firstBad, options.training.loss_scale_window,
                                      options.firstStep + k + 1);
      verdicts[k + 1].scale = lossScale.scale;
    }
  }
  cv.notify_all();
  const int64_t start = memory::nowNs();
  std::unique_lock<std::mutex> lock(mu);
  while (verdicts[k].checked < S) {
    if (aborted) throw Cancelled{};
    cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  dev.waitedNs += memory::nowNs() - start;  // not compute: Note [Busy seconds]
  return verdicts[k].firstBad < 0;
}

// Note [Optimizer offload]: the step, pipelined tensor by tensor on the copy engine.
void PipelineEngine::Impl::stepOnHost(DeviceState& dev, StageState& st, int index) {
  const size_t n = st.master->params.size();
  const offload::TransferKey key{2, st.index, index};
  std::vector<std::shared_future<void>> down(n), up(n);
  for (size_t i = 0; i < n; ++i)
    if (st.master->params[i].grad().defined())
      down[i] = transfers->copyInPlace(dev.id, key, {st.hostGrads[i]},
                                       {st.master->params[i].grad()}, /*toHost=*/true);
  for (size_t i = 0; i < n; ++i) {
    if (!down[i].valid()) continue;
    waitCopy(dev, down[i]);
    st.hostParams[i].mutable_grad() = st.hostGrads[i];
    {
      memory::MemoryScope scope(*host, MemoryCategory::OptimizerState);
      st.optimizer->step();  // steps this tensor only: the others have no gradient
    }
    st.hostParams[i].mutable_grad() = Tensor();
    up[i] = transfers->copyInPlace(dev.id, key, {st.master->params[i]}, {st.hostParams[i]},
                                   /*toHost=*/false);
  }
  for (auto& u : up)
    if (u.valid()) waitCopy(dev, u);
}

void PipelineEngine::Impl::waitCopy(DeviceState& dev, const std::shared_future<void>& copy) {
  const int64_t start = memory::nowNs();
  transfers->wait(dev.id, copy);
  const int64_t end = memory::nowNs();
  std::lock_guard<std::mutex> lock(mu);
  dev.waits.push_back({start, end});
}

}  // namespace pipefb::runtime
