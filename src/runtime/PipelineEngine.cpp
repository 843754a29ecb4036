#include "pipefb/runtime/PipelineEngine.h"

#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "EngineImpl.h"
#include "pipefb/common/Error.h"
#include "pipefb/common/NumericalError.h"
#include "pipefb/common/Precision.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/dist/ProcessGroup.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/model/SplitBackward.h"
#include "pipefb/offload/SavedTensorHooks.h"
#include "pipefb/offload/TransferManager.h"
#include "pipefb/report/ChromeTrace.h"
#include "pipefb/runtime/DeviceBinding.h"
#include "pipefb/runtime/DeviceKind.h"
#include "pipefb/schedules/DataParallel.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/Messages.h"
#include "pipefb/schedules/PipelinePlan.h"
#include "pipefb/schedules/ScheduleError.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/schedules/StashPolicy.h"
#include "pipefb/schedules/Validator.h"
#include "pipefb/train/Optimizer.h"

namespace pipefb::runtime {

PipelineError::PipelineError(const std::string& message, int device, int actionIndex,
                             std::exception_ptr cause)
    : std::runtime_error(message), device_(device), actionIndex_(actionIndex), cause_(cause) {}

PipelineOutOfMemoryError::PipelineOutOfMemoryError(OomInfo info, std::string message, int device,
                                                   int actionIndex)
    : OutOfMemoryError(std::move(info)),
      message_(std::move(message)),
      device_(device),
      actionIndex_(actionIndex) {}

// ------------------------------------------------------------------------ set-up

int PipelineEngine::Impl::iterationOf(const Action& a) const {
  return schedules::iterationOf(a, schedules::stepsPerMicrobatch(scheduleKind), M);
}

void PipelineEngine::Impl::build() {
  // Note [The plan is the program]: everything below comes from `pipeline` (checked and
  // lowered by schedules::lowerPlan) and `options`; nothing is re-derived here.
  scheduleKind = pipeline.kind;
  kind = schedules::toString(scheduleKind);
  async = schedules::isAsync(scheduleKind);
  S = pipeline.numStages();
  M = pipeline.microbatches;
  K = pipeline.iterations;
  if (options.totalSteps <= 0) options.totalSteps = K;
  offload::installSavedTensorHooks();  // Note [Saved-tensor hooks]
  if (static_cast<size_t>(pipeline.stages.back().last) != model.numLayers())
    throw UserError(options.source + ": the pipeline covers layers [0," +
                    std::to_string(pipeline.stages.back().last) + ") but model " +
                    model.options().name + " has " + std::to_string(model.numLayers()) +
                    " layers; re-plan for this model");
  for (const auto& st : pipeline.stages) partition.push_back({st.first, st.last});
  const auto placement = pipeline.placement();
  plan = pipeline.lowered;
  PIPEFB_ASSERT(plan.schedule.numStages == S,
                "PipelinePlan::lowered is for its stages (lowerPlan)");
  findFinalBackwards();  // Note [Gradient buckets]
  D = plan.schedule.numDevices();
  R = pipeline.replicas;
  joinProcesses();
  buildLossScale();
  if (options.log)
    spdlog::info(
        "pipeline: {} with {} stages x {} microbatches on {} devices ({}), stash {}, "
        "{} iterations, {} actions",
        kind, S, M, D, placement.toString(), pipeline.stashText(), K, plan.schedule.numActions());

  buildDevices();
  // Stages: the master replica is the model's own layers, moved to the backward device.
  pool = std::make_shared<ShellPool>(model.options(), partition, true);
  stages.resize(S);
  for (int s = 0; s < S; ++s) buildStage(s);
  planProgress();
  planHeldOffloads();
  planLaterPrefetches();
  passes = schedules::rendezvousPasses(plan.schedule);
  t0 = memory::nowNs();
  for (int d = 0; d < D; ++d)
    if (isLocal(d)) workers.emplace_back([this, d] { workerMain(d); });
}

// Note [Loss scaling] (train/LossScaler.h): fp16, and the pipelines it cannot run.
void PipelineEngine::Impl::buildLossScale() {
  scaled = options.training.precision == "fp16";
  if (!scaled) return;
  const std::string refusal = fp16Refusal(options.source, async, kind);
  if (!refusal.empty()) throw UserError(refusal);
  lossScale = options.lossScale.value_or(train::LossScale{options.training.loss_scale, 0, 0});
  verdicts[0].scale = lossScale.scale;
  checkedIteration.assign(D, -1);
  if (!options.group) return;
  // Across processes the ranks that step a stage, in every replica (rank = replica x D +
  // device), agree through an all-reduce of their verdicts; a rank that only runs forwards
  // never steps. Each checks the all-reduced gradients (Note [All-reduces before the
  // steps]), so the replicas' flags agree; reducing them all costs one collective.
  std::set<int> stepping;
  for (const auto& st : pipeline.stages) stepping.insert(st.backwardDevice);
  std::vector<int> ranks;
  for (int r = 0; r < R; ++r)
    for (int d : stepping) ranks.push_back(r * D + d);
  if (stepping.count(myDevice)) stepGroup = options.group->subgroup("fp16-verdicts", ranks);
}

// Note [Channels across processes]: this process's device and replica, and the plans
// that cannot run across processes.
void PipelineEngine::Impl::joinProcesses() {
  checkProcesses(options.source, D, R, options.group ? options.group->size() : 0);
  if (options.group) {
    myDevice = options.group->rank() % D;
    myReplica = options.group->rank() / D;
    if (R > 1) {
      std::vector<int> ranks;
      for (int r = 0; r < R; ++r) ranks.push_back(r * D + myDevice);
      replicaGroup = options.group->subgroup("replicas-of-cpu" + std::to_string(myDevice), ranks);
    }
    for (int s = 0; s < S; ++s) {
      const auto& st = pipeline.stages[s];
      if (st.split() && !schedules::isCheckpoint(st.stash))
        throw UserError(options.source + ": pipeline.stash: " + toString(st.stash) +
                        " cannot cross processes: stage " + std::to_string(s) + " runs F on rank " +
                        std::to_string(st.forwardDevice) + " and B on rank " +
                        std::to_string(st.backwardDevice) +
                        " and an autograd graph cannot move between processes; allowed: "
                        "checkpoint, checkpoint-offload");
    }
  }
}

void PipelineEngine::Impl::buildDevices() {
  memory::installTrackingAllocator();
  devices.resize(D);
  for (int d = 0; d < D; ++d) {
    devices[d].id = d;
    devices[d].domain =
        &memory::configureDomain(memory::virtualDeviceName(d), pipeline.deviceCapacity.at(d));
    devices[d].domain->resetPeak();
  }
  host = &memory::configureDomain(memory::kHostDomain, pipeline.hostCapacity);
  host->resetPeak();
  transfers = std::make_unique<offload::TransferManager>(
      *host, offload::TransferOptions{D, true, schedules::kOffloadsInFlight});
}

void PipelineEngine::Impl::buildStage(int s) {
  StageState& st = stages[s];
  st.index = s;
  st.range = partition[s];
  const schedules::PipelineStage& planned = pipeline.stages[s];
  st.fDev = planned.forwardDevice;
  st.bDev = planned.backwardDevice;
  st.split = planned.split();
  // Note [Plan policies in the runtime]: each stage runs its own policy.
  st.recompute = schedules::isCheckpoint(planned.stash);
  st.offloadSaved = planned.effectiveStash() == schedules::StashPolicy::Offload;
  st.offloadWeights = pipeline.offloadWeights && schedules::isOffloaded(planned.effectiveStash());
  // Note [Recomputed last output]: the last stage keeps F's output for the loss only when
  // its B does not recompute it (a split one only when it is sent to the backward device).
  st.keepsOutput = s + 1 < S || (!st.split && !st.recompute);
  for (const Action& a : plan.schedule.devices.at(st.fDev))
    st.keepsOutput = st.keepsOutput || (a.type == ActionType::SendAct && a.stage == s);
  auto master = std::make_shared<Replica>();
  master->stage = s;
  for (int64_t i = st.range.first; i < st.range.last; ++i)
    master->layers.push_back(model.layer(static_cast<size_t>(i)));
  collectTensors(master->layers, master->params, master->buffers);
  memory::MemoryDomain& bDom = *devices[st.bDev].domain;
  {
    memory::MemoryScope scope(bDom, MemoryCategory::Weights);
    torch::NoGradGuard noGrad;
    for (auto& t : master->params) t.set_data(t.detach().clone());
    for (auto& t : master->buffers) t.set_data(t.detach().clone());
  }
  {
    memory::MemoryScope scope(bDom, MemoryCategory::Grads);
    for (auto& t : master->params) t.mutable_grad() = torch::zeros_like(t);
  }
  st.master = master;
  st.optimizerOnHost = planned.optimizer == schedules::OptimizerPlacement::Host;
  if (st.optimizerOnHost) {  // Note [Optimizer offload]
    {
      memory::MemoryScope scope(*host, MemoryCategory::Weights);
      torch::NoGradGuard noGrad;
      for (auto& t : master->params) st.hostParams.push_back(t.detach().clone());
    }
    memory::MemoryScope scope(*host, MemoryCategory::Grads);
    for (auto& t : master->params) st.hostGrads.push_back(torch::zeros_like(t));
  }
  st.optimizer =
      train::makeOptimizer(options.training, st.optimizerOnHost ? st.hostParams : master->params);
  if (st.split)
    st.fwd = makeReplica(pool, s, 0, master->params, master->buffers, *devices[st.fDev].domain,
                         MemoryCategory::Weights);
  st.predict = st.split && async && options.weightPrediction;
  precomputeVersions(st);
}

// When each iteration is over on each device (synchronous schedules wait for it).
void PipelineEngine::Impl::planProgress() {
  done.assign(D, 0);
  feedAt.assign(K, 0);
  need.assign(D, std::vector<int>(K, 0));
  for (int d = 0; d < D; ++d) {
    const auto& list = plan.schedule.devices[d];
    std::vector<int> last(K, 0);
    int previous = 0;
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      int k = iterationOf(list[i]);
      k = previous = k < 0 ? previous : static_cast<int>(std::min<int64_t>(k, K - 1));
      last[k] = std::max(last[k], i + 1);
    }
    int run = 0;
    for (int64_t k = 0; k < K; ++k) need[d][k] = run = std::max(run, last[k]);
    if (d == stages[0].fDev && !stages[0].split) {  // Note [Overlapping iterations]
      feedAt.assign(K, static_cast<int>(list.size()));
      for (int i = static_cast<int>(list.size()) - 1; i >= 0; --i) {
        const int k = iterationOf(list[i]);
        if (k >= 0 && k < K) feedAt[k] = i;
      }
    }
    if (!isLocal(d)) {  // another process runs it
      need[d].assign(K, 0);
      done[d] = static_cast<int>(list.size());
    }
  }
  loss.assign(K, 0.0);
  lossCount.assign(K, 0);
  current = std::vector<std::atomic<int>>(D);
  for (auto& c : current) c = 0;
}

template <class Pred>
void PipelineEngine::Impl::waitFor(Pred pred, const char* what) {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mu);
  int64_t seen = progress;
  auto since = Clock::now();
  for (;;) {
    if (failure) {
      lock.unlock();
      raiseFailure();
    }
    if (pred()) return;
    cv.wait_for(lock, std::chrono::milliseconds(100));
    if (progress != seen) {
      seen = progress;
      since = Clock::now();
    } else if (std::chrono::duration<double>(Clock::now() - since).count() >
               options.stallTimeoutSeconds) {
      failure = Failure{-1, -1, nullptr,
                        std::string("pipeline ") + kind + " stalled while " + what +
                            ": no device finished an action for " +
                            std::to_string(options.stallTimeoutSeconds) +
                            " s (pipeline.stall_timeout); the marked actions are "
                            "where each device waits"};
      lock.unlock();
      raiseFailure();
    }
  }
}

void PipelineEngine::Impl::drainEvents() {
  if (!recording) return;
  std::vector<int> ids;
  for (auto& d : devices) ids.push_back(d.domain->id());
  ids.push_back(host->id());
  for (auto& ev : memory::drainEvents())
    if (std::find(ids.begin(), ids.end(), ev.domain) != ids.end()) events.push_back(ev);
}

// ------------------------------------------------------------------------ public

PipelineEngine::PipelineEngine(model::Model& model, schedules::PipelinePlan plan,
                               EngineOptions options)
    : impl_(std::make_unique<Impl>(model, std::move(plan), std::move(options))) {
  impl_->build();
}

PipelineEngine::~PipelineEngine() {
  Impl& I = *impl_;
  {
    std::lock_guard<std::mutex> lock(I.mu);
    bool allDone = true;
    for (int d = 0; d < I.D; ++d)
      allDone = allDone && I.done[d] == static_cast<int>(I.plan.schedule.devices[d].size());
    if (allDone) I.aborted = true;  // nothing left: workers are returning anyway
  }
  I.stopWorkers();
  if (I.recording) memory::setRecording(false);
  I.stages.clear();
}

// Note [Overlapping iterations]
// A synchronous step() returns when every device finished the iteration, so the next
// iteration's microbatches reach device 0 only after the last device's last action: a
// flush. zb-h2 needs none (Note [Lagged W], schedules/ZeroBubble.h): each stage steps after
// its own last W, and its device's next forwards come after that STEP in its list, so
// they may start while later devices still run this iteration's deferred W's. With
// EngineOptions::overlapIterations step() returns once the losses are known (the last
// stage's I's ran) and the caller's next step() feeds the next iteration. Nothing else changes:
// each device runs its list in order, so every forward still sees its stage's weights
// after all the steps before it, and the result is the flushed run's (tests/runtime,
// PipelineOverlap). Only finish() (or the last step()) waits for every device.
// An asynchronous schedule (pipedream, pipefb-async) returns from step() as early. When
// stage 0 runs its F and B on one device, step() then feeds an iteration's inputs only
// once that device has run every action before its first one of the iteration: they wait
// beside that forward, never beside the earlier microbatches' backwards.
// Fed as soon as step() returned, pipedream's device 0 (resnet50/8, S = 4, M = 4) held
// the 4 new inputs beside the 3 stashes still in flight and F(0,8) (or B(0,4) when it ran
// late): 6.13 MB against 5.15 planned, out of memory at its planned budget. What this
// leaves is charged by Note [Comm buffers in the cost model]. The first device now waits
// at that forward for the M copies, which it used to find done. A split stage 0's
// forward device runs no B, and is charged the M inputs beside its forwards (Note [Comm
// buffers in the cost model]): it is fed as before (fed later, resnet50/8 pipefb-async-keep S=2
// M=4's backward devices peaked 13% and 17% below their plan, PlanRunsTest seed 0 instance 21).
double PipelineEngine::step(const data::Batch& batch) {
  Impl& I = *impl_;
  if (I.joined)
    throw std::logic_error("PipelineEngine::step: the pipeline has stopped after an error");
  if (I.fed >= I.K)
    throw std::logic_error("PipelineEngine::step: the schedule was built for " +
                           std::to_string(I.K) + " iterations (EngineOptions::iterations)");
  const int64_t k = I.fed;
  if (k == I.options.traceFirstIteration && I.options.recordMemoryEvents &&
      I.options.traceIterations > 0 && !memory::isRecording()) {
    I.eventBaseNs = memory::nowNs();
    for (auto& d : I.devices) I.eventBase[d.domain->id()] = d.domain->stats().liveByCategory();
    I.eventBase[I.host->id()] = I.host->stats().liveByCategory();
    memory::setRecording(true);
    I.recording = true;
  }
  // pipeline.replicas: each replica runs its share of the batch.
  torch::Tensor input = batch.input, target = batch.target;
  if (I.R > 1) {
    if (batch.input.size(0) % I.R != 0)
      throw UserError("pipeline.replicas: " + std::to_string(I.R) + " replicas do not divide a " +
                      "batch of " + std::to_string(batch.input.size(0)) +
                      " samples; training.batch must be a multiple of replicas x microbatches");
    input = batch.input.chunk(I.R, 0)[I.myReplica];
    target = batch.target.chunk(I.R, 0)[I.myReplica];
  }
  auto inputs = input.chunk(I.M, 0);
  auto targets = target.chunk(I.M, 0);
  if (static_cast<int>(inputs.size()) != I.M)
    throw UserError("pipeline.microbatches: " + std::to_string(I.M) +
                    " microbatches from a batch of " + std::to_string(batch.input.size(0)) +
                    " samples; the batch must have at least as many samples");
  const int first = I.stages[0].fDev, last = I.stages[I.S - 1].bDev;
  const bool feedFirst = I.isLocal(first), feedLast = I.isLocal(last);
  // Note [Overlapping iterations]: not before the first device is ready for them.
  if (feedFirst) I.waitFor([&] { return I.done[first] >= I.feedAt[k]; }, "feeding an iteration");
  // Copy every microbatch onto its device before posting any, so the devices' own
  // allocations never race with this thread's (an OOM here is the caller's, not a
  // worker's, and which one it is must not depend on thread timing).
  std::vector<torch::Tensor> onFirst, onLast;
  // With one process per device, each rank feeds only its own device.
  for (int j = 0; j < I.M; ++j) {
    if (feedFirst)
      onFirst.push_back(copyInto(inputs[j], *I.devices[first].domain, MemoryCategory::CommBuffers));
    if (feedLast)
      onLast.push_back(copyInto(targets[j], *I.devices[last].domain, MemoryCategory::CommBuffers));
  }
  // The message owns the only reference: a braced list ({{t}, nullptr}) copies t into the
  // vector, and the list's own copy lives to the end of the statement, after put() woke the
  // receiver. On a busy machine this thread was preempted there while device 0 ran F0 of
  // the iteration's first microbatch and F1 after it: the input that F0 had consumed stayed
  // as comm_buffers beside F1, one input more than the plan charges (resnet50/8
  // pipefb-sync-checkpoint went out of memory at its own budget in some runs).
  auto sole = [](Tensor t) {
    Message m;
    m.tensors.push_back(std::move(t));
    return m;
  };
  for (int j = 0; j < I.M; ++j) {
    const int mb = static_cast<int>(k) * I.M + j;
    if (feedFirst) I.channels.put({Chan::Input, 0, mb, first}, sole(std::move(onFirst[j])));
    if (feedLast) I.channels.put({Chan::Target, I.S - 1, mb, last}, sole(std::move(onLast[j])));
  }
  ++I.fed;
  const bool lastIteration = k + 1 == I.K;
  I.waitFor(
      [&] {
        if ((I.async || I.options.overlapIterations) && !lastIteration && feedLast)
          return I.lossCount[k] == I.M;
        for (int d = 0; d < I.D; ++d)
          if (I.done[d] < I.need[d][k]) return false;
        return true;
      },
      "running an iteration");
  if (I.recording && k + 1 >= I.options.traceFirstIteration + I.options.traceIterations) {
    I.drainEvents();
    memory::setRecording(false);
    I.recording = false;
  }
  if (I.options.group) {  // Note [Channels across processes]: only the last rank has it
    double v = 0;
    {
      std::lock_guard<std::mutex> lock(I.mu);
      if (feedLast) v = I.loss[k];
    }
    std::vector<torch::Tensor> t{torch::tensor({v}, torch::kFloat64)};
    I.options.group->allreduce(t);
    if (lastIteration) I.options.group->flush();
    std::lock_guard<std::mutex> lock(I.mu);
    I.loss[k] = t[0].item<double>() / I.R;  // each replica's last rank added its mean
  }
  std::lock_guard<std::mutex> lock(I.mu);
  return I.loss[k];
}

void PipelineEngine::finish() {
  Impl& I = *impl_;
  if (I.fed < I.K)
    throw std::logic_error("PipelineEngine::finish: only " + std::to_string(I.fed) + " of " +
                           std::to_string(I.K) + " iterations were fed");
  if (!I.joined)
    I.waitFor(
        [&] {
          for (int d = 0; d < I.D; ++d)
            if (I.done[d] < static_cast<int>(I.plan.schedule.devices[d].size())) return false;
          return true;
        },
        "finishing");
  if (I.options.group) I.options.group->flush();
  // The forward copies ran every forward of split stages: their buffers (BatchNorm
  // running statistics) are the model's.
  torch::NoGradGuard noGrad;
  for (auto& st : I.stages)
    if (st.split && st.fwd)
      for (size_t i = 0; i < st.master->buffers.size(); ++i)
        st.master->buffers[i].copy_(st.fwd->buffers[i]);
}

int64_t PipelineEngine::iterationsDone() const { return impl_->fed; }
int PipelineEngine::numStages() const { return impl_->S; }
train::LossScale PipelineEngine::lossScale() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lossScale;
}
std::vector<std::pair<std::string, torch::Tensor>> PipelineEngine::optimizerParameters(
    int stage, const std::vector<std::pair<std::string, torch::Tensor>>& names) const {
  const auto& st = impl_->stages.at(stage);
  if (!st.optimizerOnHost) return names;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, t] : names)
    for (size_t i = 0; i < st.master->params.size(); ++i)
      if (t.unsafeGetTensorImpl() == st.master->params[i].unsafeGetTensorImpl())
        out.emplace_back(name, st.hostParams[i]);
  return out;
}
memory::MemoryDomain& PipelineEngine::optimizerDomain(int stage) const {
  const auto& st = impl_->stages.at(stage);
  return st.optimizerOnHost ? *impl_->host : *impl_->devices.at(st.bDev).domain;
}
torch::optim::Optimizer& PipelineEngine::optimizer(int stage) {
  return *impl_->stages.at(stage).optimizer;
}
std::vector<torch::Tensor> PipelineEngine::stageBuffers(int stage) const {
  const StageState& st = impl_->stages.at(stage);
  return st.split && st.fwd ? st.fwd->buffers : st.master->buffers;
}
int64_t PipelineEngine::weightVersion(int stage) const {
  return impl_->stages.at(stage).masterVersion;
}
int PipelineEngine::backwardDevice(int stage) const { return impl_->stages.at(stage).bDev; }
int PipelineEngine::forwardDevice(int stage) const { return impl_->stages.at(stage).fDev; }
const schedules::PipelinePlan& PipelineEngine::plan() const { return impl_->pipeline; }

const schedules::Schedule& PipelineEngine::schedule() const { return impl_->plan.schedule; }
const schedules::MemoryContract& PipelineEngine::contract() const { return impl_->plan.contract; }
const std::vector<StageRange>& PipelineEngine::partition() const { return impl_->partition; }
int PipelineEngine::numDevices() const { return impl_->D; }
std::vector<BucketRecord> PipelineEngine::bucketRecords() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->bucketLog;
}

std::vector<DeviceStats> PipelineEngine::deviceStats() const {
  Impl& I = *impl_;
  std::vector<DeviceStats> out;
  auto fill = [](memory::MemoryDomain& dom) {
    memory::MemoryStats st = dom.stats();
    DeviceStats d;
    d.name = dom.name();
    d.capacity = dom.unlimited() ? -1 : dom.capacity();
    d.live = st.bytes.current;
    d.peak = st.bytes.peak;
    d.atPeak = st.bytes_at_peak;
    for (size_t c = 0; c < kNumMemoryCategories; ++c)
      d.peakByCategory[c] = st.category_bytes[c].peak;
    return d;
  };
  std::lock_guard<std::mutex> lock(I.mu);
  for (auto& dev : I.devices) {
    DeviceStats d = fill(*dev.domain);
    d.busySeconds = dev.busy;
    d.actions = static_cast<int64_t>(dev.records.size());
    out.push_back(d);
  }
  out.push_back(fill(*I.host));
  return out;
}

std::vector<TransferStats> PipelineEngine::transferStats() const {
  Impl& I = *impl_;
  auto recs = records();
  std::vector<TransferStats> out;
  for (int d = 0; d < I.D; ++d) {
    offload::TransferCounters c = I.transfers->counters(d);
    std::vector<offload::CopyInterval> compute;
    std::vector<offload::CopyInterval> waits;
    {
      std::lock_guard<std::mutex> lock(I.mu);
      waits = I.devices[d].waits;
    }
    // Note [Optimizer offload]: compute waiting for its own copies hides none of them.
    size_t w = 0;
    for (size_t j = 0; j < recs[d].size(); ++j) {
      const Action& a = I.plan.schedule.devices[d][j];
      if (!a.isCompute() && a.type != ActionType::Step) continue;
      const int64_t startNs = I.originNs(recs[d][j].start), endNs = I.originNs(recs[d][j].end);
      int64_t from = startNs;
      while (w < waits.size() && waits[w].endNs <= from) ++w;
      for (size_t k = w; k < waits.size() && waits[k].startNs < endNs; ++k) {
        if (waits[k].startNs > from) compute.push_back({from, waits[k].startNs});
        from = std::max(from, waits[k].endNs);
      }
      if (from < endNs) compute.push_back({from, endNs});
    }
    TransferStats t;
    t.name = I.devices[d].domain->name();
    t.bytesD2H = c.bytesD2H;
    t.bytesH2D = c.bytesH2D;
    t.offloads = c.offloads;
    t.prefetches = c.prefetches;
    t.copySeconds = c.copySeconds;
    t.hiddenSeconds = offload::TransferManager::overlapSeconds(c.intervals, compute);
    t.stallSeconds = c.stallSeconds;
    out.push_back(t);
  }
  return out;
}

HostPoolSummary PipelineEngine::hostPool() const {
  Impl& I = *impl_;
  auto st = I.transfers->hostPoolStats();
  HostPoolSummary h;
  h.kind = offload::toString(I.transfers->hostMemoryKind());
  h.peakBytes = st.peakBytes;
  h.liveBytes = st.liveBytes;
  h.blockBytes = st.blockBytes;
  h.allocations = st.allocations;
  h.reuses = st.reuses;
  return h;
}

std::vector<int64_t> PipelineEngine::peakStashBytes() const {
  std::vector<int64_t> out;
  for (auto& dev : impl_->devices) out.push_back(dev.domain->stats()[MemoryCategory::Stash].peak);
  return out;
}

std::vector<int64_t> PipelineEngine::stashBytesPerMicrobatch() const {
  std::vector<int64_t> out;
  for (auto& st : impl_->stages) out.push_back(st.stashBytesPerMb);
  return out;
}

int64_t PipelineEngine::clockOriginNs() const { return impl_->t0; }

std::vector<std::vector<schedules::ActionSpan>> PipelineEngine::records() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::vector<schedules::ActionSpan>> out;
  for (auto& d : impl_->devices) out.push_back(d.records);
  return out;
}

void PipelineEngine::writeTrace(const std::string& path, int64_t fromNs, int64_t toNs) const {
  // Note [Chrome trace] (pipefb/report/ChromeTrace.h) describes the layout.
  Impl& I = *impl_;
  I.drainEvents();
  report::ChromeTrace trace(I.t0);
  auto records = this->records();
  for (int d = 0; d <= I.D; ++d) {
    trace.addProcess(d, d < I.D ? I.devices[d].domain->name() : std::string("host"));
    if (d < I.D) trace.addThread(d, 0, "compute");
    if (d < I.D) trace.addThread(d, 1, "copy engine");
  }
  std::map<int, int> pidOfDomain;
  for (int d = 0; d < I.D; ++d) pidOfDomain[I.devices[d].domain->id()] = d;
  pidOfDomain[I.host->id()] = I.D;
  for (int d = 0; d < I.D; ++d) {
    const auto& list = I.plan.schedule.devices[d];
    for (size_t j = 0; j < records[d].size(); ++j) {
      const Action& a = list[j];
      const auto& r = records[d][j];
      const int64_t startNs = I.originNs(r.start), endNs = I.originNs(r.end);
      if (endNs < fromNs || startNs > toNs) continue;  // outside the trace window
      trace.addSpan(d, 0, schedules::toString(a), schedules::typeName(a.type), startNs, endNs,
                    {{"stage", a.stage}, {"index", a.index}, {"step", static_cast<int>(j)}});
      // sampled at every action's end
      trace.addMemoryCounter(d, "memory", endNs, r.liveAfter);
    }
    // The device's copy engine: each offload (D2H) and prefetch (H2D) copy job.
    for (const auto& c : I.transfers->counters(d).intervals)
      if (c.endNs >= fromNs && c.startNs <= toNs)
        trace.addSpan(d, 1,
                      std::string(c.toHost ? "D2H " : "H2D ") + std::to_string(c.key.stage) + "." +
                          std::to_string(c.key.index),
                      c.toHost ? "offload" : "prefetch", c.startNs, c.endNs,
                      {{"bytes", c.bytes},
                       {"stage", c.key.stage},
                       {"index", c.key.index},
                       {"what", c.key.kind == 0   ? "stash"
                                : c.key.kind == 2 ? "optimizer"
                                                  : "weight version"}});
  }
  // The event stream (first iterations): a counter per allocation and free.
  trace.addMemoryEvents(I.events, I.eventBase, pidOfDomain);  // recorded in the window
  trace.write(path, {{"schedule", I.kind},
                     {"stages", I.S},
                     {"microbatches", I.M},
                     {"partition", toString(I.partition)}});
}

std::string PipelineEngine::summaryJson() const {
  using nlohmann::json;
  json devs = json::array();
  for (const auto& d : deviceStats()) {
    json atPeak = json::object(), peaks = json::object();
    for (MemoryCategory c : kAllMemoryCategories) {
      atPeak[toString(c)] = d.atPeak[index(c)];
      peaks[toString(c)] = d.peakByCategory[index(c)];
    }
    devs.push_back({{"name", d.name},
                    {"capacity_bytes", d.capacity >= 0 ? json(d.capacity) : json(nullptr)},
                    {"peak_bytes", d.peak},
                    {"peak_by_category", atPeak},
                    {"category_peaks", peaks},
                    {"busy_seconds", d.busySeconds}});
  }
  const auto& c = impl_->plan.contract;
  json j = {{"schedule", impl_->kind},
            {"partition", toString(impl_->partition)},
            {"devices", devs},
            {"contract",
             {{"in_flight", c.inFlight},
              {"resident_forward", c.residentForward},
              {"resident_backward", c.residentBackward},
              {"weight_versions", c.weightVersions},
              {"resident_weight_versions", c.residentWeightVersions}}},
            {"stash_bytes_per_microbatch", stashBytesPerMicrobatch()}};
  // Data-transfer counters per device (issue 5); overlap = copy time under F/B/STEP.
  json transfers = json::array();
  for (const auto& t : transferStats())
    transfers.push_back(
        {{"name", t.name},
         {"bytes_d2h", t.bytesD2H},
         {"bytes_h2d", t.bytesH2D},
         {"offloads", t.offloads},
         {"prefetches", t.prefetches},
         {"copy_seconds", t.copySeconds},
         {"hidden_seconds", t.hiddenSeconds},
         {"overlap_pct",
          t.copySeconds > 0 ? json(100.0 * t.hiddenSeconds / t.copySeconds) : json(nullptr)},
         {"stall_seconds", t.stallSeconds}});
  const HostPoolSummary hp = hostPool();
  j["transfers"] = transfers;
  j["host_pool"] = {{"kind", hp.kind},
                    {"peak_bytes", hp.peakBytes},
                    {"block_bytes", hp.blockBytes},
                    {"allocations", hp.allocations},
                    {"reuses", hp.reuses}};
  return j.dump(2);
}

}  // namespace pipefb::runtime
