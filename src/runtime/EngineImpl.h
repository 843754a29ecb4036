#pragma once
// Private to src/runtime: the state of a PipelineEngine (its Impl) and the types its
// parts share. PipelineEngine.cpp builds it and runs the public API; each concept's
// actions live in a file of its own (see the Notes named below).
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "Channels.h"
#include "GradBuckets.h"
#include "Stash.h"
#include "WeightVersions.h"
#include "pipefb/common/Error.h"
#include "pipefb/common/NumericalError.h"
#include "pipefb/dist/ProcessGroup.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/model/SplitBackward.h"
#include "pipefb/offload/SavedTensorHooks.h"
#include "pipefb/offload/TransferManager.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/schedules/PipelinePlan.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/train/LossScaler.h"

namespace pipefb::runtime {

using schedules::Action;
using schedules::ActionType;
using schedules::StashKind;
using Tensor = torch::Tensor;

using Key = std::pair<int, int>;  // (stage, microbatch)
using model::DeferredWeightGrad;
using model::inputGradient;
using model::restoreBuffersUnversioned;
using model::weightGradients;

template <class V>
V takeFrom(std::map<Key, V>& m, Key k, const char* what) {
  auto it = m.find(k);
  PIPEFB_ASSERT(it != m.end(), what << " of (" << k.first << "," << k.second << ") is missing");
  V v = std::move(it->second);
  m.erase(it);
  return v;
}

struct DeviceState {
  int id = 0;
  memory::MemoryDomain* domain = nullptr;
  std::map<Key, Tensor> acts;     // stage outputs made here or received: (stage, mb)
  std::map<Key, Tensor> grads;    // gradients w.r.t. a stage's input: (stage, mb)
  std::map<Key, Tensor> inputs;   // stage-0 inputs from step()
  std::map<Key, Tensor> targets;  // targets from step()
  std::map<Key, StashPtr> stashes;
  std::set<Key> heldOffloads;  // Note [Held offloads] (schedules/HeldOffloads.h)
  // Note [Copies held through the next compute] (WeightVersions.cpp): the offloads
  // issued since the device's last compute action whose device copies it holds.
  std::vector<offload::TransferKey> heldThroughCompute;
  // Note [Prefetches across a flush] (schedules/HeldOffloads.h): PREs issued before the device's
  // last compute of the previous iteration.
  std::set<Key> laterPrefetches;
  // Note [Split backward in the runtime]: what W(s,m) needs from I(s,m).
  struct PendingW {
    DeferredWeightGrad grad;
    ReplicaPtr rep;  // the weights I ran on (the graph reads them)
  };
  std::map<Key, PendingW> deferred;
  // Stage inputs coming from another process (Note [Channels across processes]).
  std::map<Key, std::future<std::vector<Tensor>>> remoteStash;
  std::vector<schedules::ActionSpan> records;  // [j]: action j of its list  // guarded by Impl::mu_
  // Note [Busy seconds]
  // The wall time of the device's compute actions and STEPs (memory.json's busy_seconds,
  // which the report's imbalance warning compares across devices, Note [Why stages are
  // imbalanced]), less what they waited for another device: pipefb-async's STEP on a
  // split stage waits until the forward device has received the previous weights, and
  // counted whole it made a backward device that steps fc8 look busy for 53 ms per step
  // (decoupled vgg16/8, 1 microbatch of 64). waitedNs is the running action's wait; only
  // this device's thread touches it.
  double busy = 0;  // guarded by Impl::mu_
  int64_t waitedNs = 0;
  // Note [Optimizer offload]: when compute waited for its own copies (guarded by Impl::mu_).
  std::vector<offload::CopyInterval> waits;
};

struct StageState {
  int index = 0;
  StageRange range;
  int fDev = 0, bDev = 0;
  bool split = false;
  bool recompute = false;     // checkpoint kinds
  bool offloadSaved = false;  // effective policy offload: saved tensors through the hooks
  // Note [Copies held through the next compute]: F and B on one device, and the schedule
  // moves its weight versions (OFFW).
  bool holdsThroughCompute = false;
  // F leaves its output for a later action of its device: the next stage's F, its own B, or
  // a send. Not for a last stage whose B recomputes on another device (Note [Recomputed
  // last output]): the lowered schedule sends that output nowhere.
  bool keepsOutput = true;
  ReplicaPtr master;  // on bDev
  ReplicaPtr fwd;     // split: the forward copy on fDev
  // Note [Forward device memory] (planner/CostModel.h): pipefb-async with a graph stash
  // holds the copy before fwd until the next RecvWeights (execRecvWeights).
  ReplicaPtr previousFwd;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  bool gradsStale = false;  // a STEP ran since the last backward: zero before accumulating
  int masterVersion = 0;
  // Note [Weights, versions and replicas]: per microbatch, the weight version F and B see.
  std::vector<int> fVersion, bVersion;
  std::weak_ptr<Replica> snapshot;     // same device: the snapshot of the current version
  std::map<int, ReplicaPtr> versions;  // split + checkpoint: kept on bDev
  // Note [Weight-version offload in the runtime]: the schedule moves this stage's stashed
  // versions (pipeline.offload_weights auto with an offload kind); same-device snapshots
  // are then kept in `versions` too, until DROPW. `away`: offloaded, not acquired yet.
  bool offloadWeights = false;
  std::set<int> away;
  // Note [Weight prediction]: split stages of pipefb-async with pipeline.weight_prediction.
  bool predict = false;
  ReplicaPtr predicted;  // on bDev: what RecvWeights of masterVersion hands the forwards
  // Note [Weights by reference]: the last RecvWeights done on fDev (its index), guarded by mu.
  int weightsReceived = -1;
  std::map<int, int> lastUse;  // version -> last microbatch whose B needs it
  // Note [Optimizer offload]: pipeline.optimizer_offload: host.
  bool optimizerOnHost = false;
  std::vector<Tensor> hostParams;        // host pool: master copies, the optimizer's parameters
  std::vector<Tensor> hostGrads;         // host pool: where STEP copies the device's .grad
  int64_t stashBytesPerMb = -1;          // measured at the first F
  std::unique_ptr<GradBuckets> buckets;  // Note [Gradient buckets]
};

inline int64_t tensorBytes(const Tensor& t) {
  return static_cast<int64_t>(t.numel() * t.element_size());
}

// "nan", "inf" or "-inf" for the first non-finite element of t, "" when all are finite.
inline std::string nonFinite(const Tensor& t) {
  if (!t.defined() || !t.is_floating_point()) return "";
  torch::NoGradGuard noGrad;
  Tensor bad = torch::isfinite(t).logical_not();
  if (!bad.any().item<bool>()) return "";
  if (t.isnan().any().item<bool>()) return "nan";
  return t.masked_select(bad)[0].item<double>() > 0 ? "inf" : "-inf";
}

struct PipelineEngine::Impl {
  model::Model& model;
  schedules::PipelinePlan pipeline;  // Note [The plan is the program]
  EngineOptions options;
  std::string kind;                        // its name, for messages and reports
  schedules::ScheduleKind scheduleKind{};  // traits: pipefb/schedules/ScheduleKind.h
  int S = 0, M = 0, D = 0;
  int64_t K = 0;
  bool async = false;
  std::vector<StageRange> partition;
  schedules::SchedulePlan plan;  // lowered
  std::vector<StageState> stages;
  std::vector<DeviceState> devices;
  memory::MemoryDomain* host = nullptr;
  std::unique_ptr<offload::TransferManager> transfers;  // Note [Asynchronous host copies]
  std::shared_ptr<ShellPool> pool;
  Channels channels;
  // Note [Message rendezvous] (schedules/Messages.h): per device.
  std::vector<int> passes;
  int64_t t0 = 0;  // memory::nowNs() when the workers started: the records' 0 s
  // The records' seconds (schedules::ActionSpan) from and to memory::nowNs()'s clock.
  double secondsSinceOrigin(int64_t ns) const { return static_cast<double>(ns - t0) * 1e-9; }
  int64_t originNs(double seconds) const { return t0 + std::llround(seconds * 1e9); }

  // Note [Channels across processes] (Channels.h): a device of this process?
  bool isLocal(int d) const;
  // Hybrid data + pipeline parallelism (pipeline.replicas = R): rank = replica x D + device;
  // AR(s) all-reduces stage s's gradients over replicaGroup, the ranks of this device.
  int R = 1, myDevice = -1, myReplica = 0;
  std::shared_ptr<dist::ProcessGroup> replicaGroup;
  // Note [Gradient buckets]: the B actions (stage, microbatch) that complete a stage's
  // gradients before its AR, and what the buckets did (guarded by mu).
  std::set<std::pair<int, int>> finalBackward;
  std::vector<BucketRecord> bucketLog;
  void findFinalBackwards();
  GradBuckets* hookBuckets(DeviceState& dev, StageState& st, const Action& a, const Replica& rep,
                           const Tensor& output);
  GradBuckets& bucketsOf(DeviceState& dev, StageState& st);
  void beginBuckets(DeviceState& dev, StageState& st);
  void bucketReady(StageState& st, int param);
  void startBuckets(StageState& st, int64_t step);
  std::string published;  // this rank's failure as published to the store
  int rankOf(int d) const { return myReplica * D + d; }
  void post(int peer, const ChanKey& k, std::vector<Tensor> tensors);
  std::vector<Tensor> receive(int peer, const ChanKey& k);
  // An activation or gradient, at its receive when rendezvous (Note [Rendezvous hand-over]).
  void sendAt(DeviceState& dev, const Action& a, const ChanKey& key, Tensor t);

  // Progress, failure and losses: guarded by mu_.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> done;               // actions finished per device
  std::vector<std::vector<int>> need;  // [device][iteration]: actions that end it
  std::vector<int> feedAt;  // [iteration]: actions of the first device before its first one of
                            // that iteration (Note [Overlapping iterations])
  int64_t progress = 0;
  std::vector<double> loss;  // per iteration
  std::vector<int> lossCount;
  struct Failure {
    int device = -1;
    int action = -1;
    std::exception_ptr error;
    std::string stall;  // non-empty for a watchdog stall
  };
  std::optional<Failure> failure;
  std::vector<std::atomic<int>> current;  // the action each worker is at
  std::atomic<bool> aborted{false};
  std::vector<std::thread> workers;
  bool joined = false;
  int64_t fed = 0;

  // Memory events for the trace.
  bool recording = false;
  std::vector<memory::MemoryEvent> events;
  std::map<int, CategoryBytes> eventBase;  // domain id -> live per category at start
  int64_t eventBaseNs = 0;

  Impl(model::Model& m, schedules::PipelinePlan p, EngineOptions o)
      : model(m), pipeline(std::move(p)), options(std::move(o)), current(0) {}

  // ---------------------------------------------------------------- set-up
  void build();
  void joinProcesses();
  void buildLossScale();  // Note [Loss scaling]
  void buildDevices();
  void buildStage(int s);
  void planProgress();
  void planHeldOffloads();     // Note [Held offloads] (schedules/HeldOffloads.h)
  void planLaterPrefetches();  // Note [Prefetches across a flush] (schedules/HeldOffloads.h)
  int prefetchEpoch(int microbatch) const;
  void precomputeVersions(StageState& st);
  int iterationOf(const Action& a) const;

  // ---------------------------------------------------------------- running
  void workerMain(int d);
  void fetchExternal(DeviceState& dev, const Action& a);
  void execute(DeviceState& dev, const Action& a);
  void execForward(DeviceState& dev, const Action& a);
  void execBackward(DeviceState& dev, const Action& a);
  void execSendAct(DeviceState& dev, const Action& a);
  void execRecvAct(DeviceState& dev, const Action& a);
  void execSendGrad(DeviceState& dev, const Action& a);
  void execRecvGrad(DeviceState& dev, const Action& a);
  void execOffload(DeviceState& dev, const Action& a);
  void execPrefetch(DeviceState& dev, const Action& a);
  void execDrop(DeviceState& dev, const Action& a);
  void execStep(DeviceState& dev, const Action& a);
  void execSyncWeights(DeviceState& dev, const Action& a);
  void execRecvWeights(DeviceState& dev, const Action& a);
  void execAllReduce(DeviceState& dev, const Action& a);
  void execInputGrad(DeviceState& dev, const Action& a);   // Note [Split backward in the
  void execWeightGrad(DeviceState& dev, const Action& a);  // runtime] (model/SplitBackward.h)

  // What B(s,m) and I(s,m) start from: the stash taken (and recomputed), the weights it
  // ran on, and the gradient of the loss w.r.t. the stage output (the last stage's loss
  // is computed and counted here).
  struct BackwardStart {
    ReplicaPtr rep;
    Tensor input, output, gradOut;
    std::vector<Tensor> savedBuffers;  // recompute: buffers as they were before it
  };
  BackwardStart startBackward(DeviceState& dev, const Action& a);
  // Note [In-place weight gradients] (StageCompute.cpp): B on the master's weights.
  void backwardInPlace(DeviceState& dev, StageState& st, const Action& a, Tensor input,
                       Tensor output, Tensor gradOut, const std::vector<Tensor>& savedBuffers);
  // A STEP ran since the stage's last backward: its .grad starts from zero again.
  void zeroStaleGrads(StageState& st);
  // After the last backward of (s,m): a kept weight version may be done with (split
  // stage, checkpoint).
  void releaseVersion(StageState& st, int mb);

  // The stash registry (Stash.h).
  StashPtr takeStash(DeviceState& dev, int stage, int mb);
  void bringToDevice(DeviceState& dev, StashEntry& e);
  ReplicaPtr forwardReplica(StageState& st, int mb);
  ReplicaPtr backwardReplica(StageState& st, int mb, const StashEntry& e);
  // Note [Weight-version offload in the runtime]: OFFW, PREW, DROPW and B's acquire.
  void bringVersionBack(StageState& st, int version);
  void offloadVersion(DeviceState& dev, const Action& a);
  void prefetchVersion(DeviceState& dev, const Action& a);
  void dropVersion(DeviceState& dev, const Action& a);
  // Note [Copies held through the next compute]: offload with it, end it after each
  // compute action, or before a prefetch of the same key.
  void offloadThroughCompute(DeviceState& dev, offload::TransferKey key,
                             std::vector<Tensor> tensors, MemoryCategory category);
  void releaseHeldThroughCompute(DeviceState& dev);
  void releaseHeldThroughCompute(DeviceState& dev, offload::TransferKey key);
  // Note [Weights, versions and replicas] and [Weight prediction], around STEP.
  void keepVersionsBeforeStep(DeviceState& dev, StageState& st);
  void predictAfterStep(StageState& st);
  void stepOnHost(DeviceState& dev, StageState& st, int index);  // Note [Optimizer offload]
  void waitCopy(DeviceState& dev, const std::shared_future<void>& copy);

  // Note [Loss scaling] (train/LossScaler.h): training.precision fp16. Guarded by mu.
  bool scaled = false;
  train::LossScale lossScale;  // after the last verdict
  struct Verdict {
    int checked = 0;     // stages checked
    int firstBad = -1;   // the first stage found with a non-finite gradient
    double scale = 1.0;  // the scale iteration k's backwards seeded with
  };
  std::map<int, Verdict> verdicts;    // per iteration of this engine
  std::vector<int> checkedIteration;  // per device: the last iteration its stages were checked
  std::shared_ptr<dist::ProcessGroup> stepGroup;  // across processes: the ranks that step
  // The scale the backwards of iteration k seed with (1 without fp16).
  double seedScale(int k);
  // At a STEP of iteration k: checks the device's stages once, waits until every stage was
  // checked; true when every stage may step.
  bool agreeOnStep(DeviceState& dev, int k);

  // Note [Numerics check] (pipefb/common/NumericalError.h): checkAll for activations
  // and gradients, checkLoss for the loss; mb is the run-wide microbatch index.
  bool checkAll() const { return options.training.check_numerics == "all"; }
  // Under fp16 a non-finite gradient skips the step instead (Note [Loss scaling]).
  bool checkGrads() const { return checkAll() && !scaled; }
  bool checkLoss() const { return options.training.check_numerics != "off"; }
  void check(const Tensor& t, const std::string& what, int stage, int mb) const {
    std::string v = nonFinite(t);
    if (!v.empty()) throw NumericalError(what, v, options.firstStep + mb / M + 1, stage, mb % M, M);
  }
  void fail(int d, int i, std::exception_ptr e);
  template <class Pred>
  void waitFor(Pred pred, const char* what);
  [[noreturn]] void raiseFailure();
  void stopWorkers();
  void drainEvents();
};

}  // namespace pipefb::runtime
