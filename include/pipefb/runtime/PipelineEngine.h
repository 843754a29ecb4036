#pragma once
// The pipeline runtime on memory-accounted virtual devices (DESIGN.md, "Runtime").
//
// A PipelineEngine takes a model, splits it into stages, lowers and validates the
// schedule of pipeline.schedule for `iterations` iterations, and runs it: every
// virtual device cpu:d is a worker thread (one intra-op thread) that executes its
// action list through one exhaustive switch (execute() in PipelineEngine.cpp).
// step(batch) feeds one iteration's microbatches and returns its mean loss.
//
// The model passed in IS the master copy: each stage's layers stay the model's own
// modules, their tensors moved into the memory domain of the stage's backward device,
// so model.parameters() (and their .grad) are what the optimizer of each stage updates.
// Forward copies (split PipeFB stages) and weight versions (pipedream, pipefb-async)
// are separate modules. See Note [Weights, versions and replicas] in PipelineEngine.cpp.
#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/config/Config.h"
#include "pipefb/data/Dataset.h"
#include "pipefb/memory/MemoryStats.h"
#include "pipefb/memory/OutOfMemoryError.h"
#include "pipefb/model/Model.h"
#include "pipefb/runtime/Partition.h"
#include "pipefb/schedules/ActionSpan.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/PipelinePlan.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/train/LossScaler.h"

namespace pipefb::dist {
class ProcessGroup;
}
namespace pipefb::memory {
class MemoryDomain;
}

namespace pipefb::runtime {

/// Options of the engine itself; the pipeline is the PipelinePlan (Note [The plan is the
/// program], pipefb/schedules/PipelinePlan.h).
struct EngineOptions {
  /// Iterations the schedule is generated for (the config constructor resolves the plan for
  /// this many); step() may be called this many times.
  int64_t iterations = 1;
  /// The optimizer, learning-rate schedule, seed (dropout masks) and check_numerics.
  config::TrainingOptions training;
  /// devices.bind: none | cores (Note [Device binding]).
  std::string bind = "none";
  /// pipeline.replicas: gradient buckets of about this many MiB, started while backward
  /// runs (overlap) or all at AR (Note [Gradient buckets]).
  double bucketMb = 25.0;
  bool overlap = true;
  /// Split stages of an asynchronous schedule hand the forwards predicted weights (Note
  /// [Weight prediction]; pipeline.weight_prediction auto or linear).
  bool weightPrediction = true;
  /// Names the config or plan in user errors.
  std::string source = "<plan>";
  /// Optimizer steps of the whole run, for the learning-rate schedule (0: iterations).
  int64_t totalSteps = 0;
  /// Optimizer steps done before this engine's first iteration (a resumed run, or the
  /// next segment of a checkpointed asynchronous run): the lr schedule and the step
  /// named in errors count from it.
  int64_t firstStep = 0;
  /// The watchdog: a step() during which no device finishes an action for this long
  /// fails with a PipelineError that marks every device's current action.
  double stallTimeoutSeconds = 60.0;
  /// Record the memory event stream (ALLOC/FREE) for `traceIterations` iterations from
  /// iteration `traceFirstIteration` (0-based, of this engine), for trace.json. Action
  /// spans and per-action memory samples are always recorded.
  bool recordMemoryEvents = true;
  int64_t traceIterations = 2;
  int64_t traceFirstIteration = 0;
  /// Log the partition and the schedule shape (spdlog info).
  bool log = true;
  /// Note [Overlapping iterations] (PipelineEngine.cpp): step() returns once the
  /// iteration's losses are known, as an asynchronous schedule's does, so that the next
  /// iteration's forwards fill this one's drain (zb-h2's steady state). A synchronous
  /// schedule stays exact; .grad and the weights are final only after finish().
  bool overlapIterations = false;
  /// Fault injection for tests: called on the device's worker thread before each of its
  /// actions (device, index into schedule().devices[device]). May throw or sleep.
  std::function<void(int, int)> beforeAction;
  /// One process per device (issue 8): this process runs device group->rank() only and
  /// exchanges messages with the other ranks' devices through c10d (Note [Channels
  /// across processes] in PipelineEngine.cpp). Null: every device is a thread here.
  /// With pipeline.replicas = R the group has devices x R ranks, rank = replica x
  /// devices + device.
  std::shared_ptr<dist::ProcessGroup> group;
  /// training.precision fp16: the loss scaler's state to start from (Note [Loss scaling]
  /// in train/LossScaler.h); unset: training.loss_scale, as a new run.
  std::optional<train::LossScale> lossScale;
};

/// Measured memory of one device (or the host pool) since the engine was built.
struct DeviceStats {
  std::string name;                // "cpu:1", "host"
  int64_t capacity = -1;           // bytes, -1 = unlimited
  int64_t live = 0;                // bytes now
  int64_t peak = 0;                // bytes
  CategoryBytes atPeak{};          // breakdown at the instant of the peak
  CategoryBytes peakByCategory{};  // each category's own peak
  double busySeconds = 0;          // time inside F/B/STEP
  int64_t actions = 0;             // actions executed
};

/// Data-transfer counters of one device (issue 5; pipefb/offload/TransferManager.h).
struct TransferStats {
  std::string name;          // "cpu:1"
  int64_t bytesD2H = 0;      // sum: offloaded by this device's copy engine
  int64_t bytesH2D = 0;      // sum: prefetched into this device
  int64_t offloads = 0;      // count
  int64_t prefetches = 0;    // count
  double copySeconds = 0;    // sum: time its copy engine was copying
  double hiddenSeconds = 0;  // of copySeconds, the part under this device's F/B/STEP
  double stallSeconds = 0;   // sum: compute waiting for a prefetch (acquire)
};

/// The host pool (devices.host_memory).
struct HostPoolSummary {
  std::string kind;  // "pinned" | "locked" | "plain"
  int64_t peakBytes = 0, liveBytes = 0, blockBytes = 0, allocations = 0, reuses = 0;
};

/// One gradient all-reduce bucket of pipeline.replicas (Note [Gradient buckets] in
/// PipelineEngine.cpp), on this rank. Times on memory::nowNs()'s clock.
struct BucketRecord {
  int stage = 0;
  int64_t step = 0;
  int bucket = 0;  // in start order (reverse parameter order)
  int64_t bytes = 0;
  int64_t startNs = 0;  // its all-reduce started
  int64_t doneNs = 0;   // AR finished waiting for it
  int backwardAction =
      -1;  // the B that filled it (index into schedule().devices[d]), or -1: AR did
  bool duringBackward = false;  // started by a hook while that B's autograd call ran
  int64_t backwardDoneNs = 0;   // when that B's autograd call returned
};

/// A worker failed (or the watchdog fired). what() names the device and the action and
/// shows the step x device grid with it marked.
class PipelineError : public std::runtime_error {
 public:
  PipelineError(const std::string& message, int device, int actionIndex, std::exception_ptr cause);
  int device() const { return device_; }
  int actionIndex() const { return actionIndex_; }
  /// The worker's original exception (null for a stall).
  std::exception_ptr cause() const { return cause_; }

 private:
  int device_;
  int actionIndex_;
  std::exception_ptr cause_;
};

/// A device ran out of memory inside the pipeline. It IS an OutOfMemoryError (info()
/// has the domain, bytes, categories, capacity and hint); what() adds the action and
/// the schedule grid.
class PipelineOutOfMemoryError : public OutOfMemoryError {
 public:
  PipelineOutOfMemoryError(OomInfo info, std::string message, int device, int actionIndex);
  const char* what() const noexcept override { return message_.c_str(); }
  int device() const { return device_; }
  int actionIndex() const { return actionIndex_; }

 private:
  std::string message_;
  int device_;
  int actionIndex_;
};

class PipelineEngine {
 public:
  /// Builds stages and devices from the plan and starts the workers. Configures the
  /// domains cpu:0..D-1 (plan.deviceCapacity) and host (plan.hostCapacity) and resets
  /// their peaks. `plan` must be lowered (schedules::lowerPlan or runtime::resolvePlan).
  PipelineEngine(model::Model& model, schedules::PipelinePlan plan, EngineOptions options);
  /// The config's pipeline (runtime::resolvePlan for options.iterations) with the
  /// config's training, devices.bind, distributed and weight-prediction options
  /// (engineOptions). Invalid settings are UserErrors.
  PipelineEngine(model::Model& model, const config::Config& config, EngineOptions options = {});
  ~PipelineEngine();
  PipelineEngine(const PipelineEngine&) = delete;
  PipelineEngine& operator=(const PipelineEngine&) = delete;

  /// Runs one iteration on `batch` (split into pipeline.microbatches) and returns its
  /// mean loss. Synchronous schedules return after every device finished the
  /// iteration (the stages' optimizer steps included; .grad keeps the iteration's
  /// gradients until the next iteration's first backward). Asynchronous ones return
  /// once the iteration's losses are known; the rest runs on. Re-raises the first
  /// worker error (PipelineError / PipelineOutOfMemoryError).
  double step(const data::Batch& batch);
  /// Waits until every device finished its list (all iterations must have been fed),
  /// then copies the forward devices' buffers (e.g. BatchNorm statistics) of split
  /// stages into the model. After it the model is safe to read.
  void finish();
  /// Iterations fed so far.
  int64_t iterationsDone() const;

  // State access for checkpoints (pipefb/train/Checkpoint.h). Only while no worker runs:
  // between step()s of a synchronous schedule, or after finish().
  int numStages() const;
  /// The optimizer of a stage (over the model's own parameters of its layers).
  torch::optim::Optimizer& optimizer(int stage);
  /// `names` (the model's named parameters) as the stage's optimizer knows them: the same
  /// tensors, or under pipeline.optimizer_offload: host the stage's host master copies
  /// with the model's names (Note [Optimizer offload] in PipelineEngine.cpp). For
  /// train::optimizerState() / loadOptimizerState() on optimizer(stage).
  std::vector<std::pair<std::string, torch::Tensor>> optimizerParameters(
      int stage, const std::vector<std::pair<std::string, torch::Tensor>>& names) const;
  /// Where the stage's optimizer state lives: its backward device, or the host pool.
  memory::MemoryDomain& optimizerDomain(int stage) const;
  /// A stage's buffers as forwards see them: the forward copy's on a split stage (its
  /// BatchNorm statistics run ahead of the master's until finish()), else the master's;
  /// in the order of the stage's layers' buffers().
  std::vector<torch::Tensor> stageBuffers(int stage) const;
  /// Optimizer steps applied to a stage's master weights (its weight version).
  int64_t weightVersion(int stage) const;
  /// fp16: the loss scaler's state after the iterations run so far (Note [Loss scaling]).
  train::LossScale lossScale() const;
  /// The device a stage's master weights, grads and optimizer state live on (the
  /// optimizer state and a master copy are in the host pool under optimizer offload).
  int backwardDevice(int stage) const;
  int forwardDevice(int stage) const;

  const schedules::Schedule& schedule() const;
  /// What the engine runs (its lowered action lists are schedule() and contract()).
  const schedules::PipelinePlan& plan() const;
  const schedules::MemoryContract& contract() const;
  const std::vector<StageRange>& partition() const;
  int numDevices() const;

  /// pipeline.replicas: this rank's gradient all-reduce buckets, in start order.
  std::vector<BucketRecord> bucketRecords() const;

  /// Per device, then the host pool last.
  std::vector<DeviceStats> deviceStats() const;
  /// Per device: what its copy engine moved, and how much of it hid under compute.
  std::vector<TransferStats> transferStats() const;
  HostPoolSummary hostPool() const;
  /// Per device: peak bytes of the stash category (its own peak).
  std::vector<int64_t> peakStashBytes() const;
  /// Per stage: live stash bytes one forward left behind (measured at its first F).
  std::vector<int64_t> stashBytesPerMicrobatch() const;
  /// What each device executed so far: records()[d][j] is action j of schedule().devices[d]
  /// (the simulator's type: seconds from clockOriginNs()).
  std::vector<std::vector<schedules::ActionSpan>> records() const;
  /// memory::nowNs() when the workers started: 0 s of records().
  int64_t clockOriginNs() const;
  /// Chrome trace event format (Perfetto, chrome://tracing): one process per device
  /// with a compute track ("X" per action) and memory counters ("C" per category),
  /// plus the host pool's counters. Only what overlaps [fromNs, toNs] (memory::nowNs()
  /// clock) is written: the trace window (output.trace_steps).
  void writeTrace(const std::string& path, int64_t fromNs = 0,
                  int64_t toNs = std::numeric_limits<int64_t>::max()) const;
  /// Peaks per device and category, for summary.json.
  std::string summaryJson() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipefb::runtime
