#pragma once
// The runtime's one input (issue 15, "the plan is the program"). LibTorch-free, so the
// planner (which must stay LibTorch-free) converts its Plan into it, and the resolver
// (pipefb/runtime/ResolvePlan.h) builds it from a config or a plan file.
//
// Note [The plan is the program]
// A PipelinePlan says everything the engine runs: the schedule kind; per stage its layer
// range, forward and backward device, stash policy, prefetch lookahead and optimizer
// placement; microbatches, iterations and replicas; each device's capacity and the host
// pool's; and the lowered, validated action lists with their memory contract. The engine
// (runtime::PipelineEngine) reads nothing else about the pipeline: no config, no names.
// Stages carry their devices one by one, so a device may run one stage's forward and
// another stage's backward, or several stages (virtual stages); whether a generator can
// make such a placement is the generator's check (Placement::checkFor), not the plan's.
// Where a stage's F and B run on different devices it is split (PipelineStage::split),
// and its stash goes through the host pool (effectivePolicy, Note [PipeFB hand-off]).
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Placement.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/schedules/StashPolicy.h"

namespace pipefb::schedules {

/// Where a stage's optimizer state and master weights live (Note [Optimizer offload]).
enum class OptimizerPlacement {
  BackwardDevice,  // beside the master weights on the stage's backward device
  Host,            // the host pool (ZeRO-Offload): pipeline.optimizer_offload: host
};
const char* toString(OptimizerPlacement p);

/// Bytes; a capacity without a limit.
inline constexpr std::int64_t kNoLimit = -1;

struct PipelineStage {
  std::int64_t first = 0, last = 0;  // layers [first, last)
  int forwardDevice = 0;
  int backwardDevice = 0;
  StashPolicy stash = StashPolicy::Keep;  // as asked; the stage runs effectiveStash()
  int lookahead = 1;                      // PRE this many compute actions before B
  OptimizerPlacement optimizer = OptimizerPlacement::BackwardDevice;

  bool split() const { return forwardDevice != backwardDevice; }
  StashPolicy effectiveStash() const { return effectivePolicy(stash, split()); }
  bool operator==(const PipelineStage& o) const;
};

struct PipelinePlan {
  ScheduleKind kind = ScheduleKind::GPipe;
  std::vector<PipelineStage> stages;
  int microbatches = 1;        // M, per iteration
  int iterations = 1;          // K: the action lists cover K iterations
  int replicas = 1;            // copies of the pipeline (Note [Replicated pipelines])
  int asyncLag = -1;           // pipefb-async: pipeline.async_lag (-1: a whole iteration)
  bool offloadWeights = true;  // Note [Weight-version offload] (pipeline.offload_weights)
  /// Per device 0..numDevices()-1: its capacity in bytes, kNoLimit for none.
  std::vector<std::int64_t> deviceCapacity;
  std::int64_t hostCapacity = kNoLimit;  // the host pool
  /// The lowered, validated action lists and their memory contract (lowerPlan()).
  SchedulePlan lowered;

  int numStages() const { return static_cast<int>(stages.size()); }
  /// 1 + the largest device a stage uses.
  int numDevices() const;
  Placement placement() const;
  std::vector<StashPolicy> stashPolicies() const;
  std::vector<int> lookaheads() const;
  /// "[0,3) [3,7) [7,9)"
  std::string rangesText() const;
  /// "keep" when every stage asks for keep, else "keep,offload,checkpoint" (per stage).
  std::string stashText() const;
};

/// Checks the plan (UserError starting with `where`: stages contiguous from layer 0 and
/// non-empty, M >= 1, K >= 1, replicas >= 1, lookahead >= 0, one capacity per device),
/// then generates the kind's schedule on its placement, lowers it with every stage's own
/// stash policy and lookahead (offload, communication, weight offload, all-reduce with
/// replicas) and validates it with its contract; sets `lowered`.
void lowerPlan(PipelinePlan& plan, const std::string& where);

}  // namespace pipefb::schedules
