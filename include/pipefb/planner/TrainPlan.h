#pragma once
// The planner inside pipefb_train (issue 6, "Plan files and explanations"): a plan file
// turned into the run config (`pipefb_train --plan`), and the planner's partition for a
// config that names a pipeline schedule but no pipeline.partition. Torch-free.
//
// Note [Plan policies in the runtime]
// Every stage runs its own stash policy (issue 15): a plan's per-stage policies become
// pipeline.stash as a list with one per stage (one value when they agree), and the
// runtime lowers and runs each stage with its own (schedules::PipelinePlan). On a split
// PipeFB stage keep and offload both move the graph to the backward device through the
// host, and checkpoint and checkpoint-offload both move the stage input there
// (schedules::effectivePolicy, Note [PipeFB hand-off]); the runtime and the planner's
// cost model apply that one rule.
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/config/Config.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Solver.h"

namespace pipefb::planner {

/// The runtime's pipeline.stash for a plan's per-stage policies (Note [Plan policies in
/// the runtime]): one per stage, or one value when they all agree.
std::vector<std::string> runtimeStashPolicies(const PlanSpec& spec, const std::string& source);

/// Sets the pipeline of `config` from a plan: schedule, stages, partition, microbatches,
/// stash, lookahead, devices.count; then re-validates it. UserError (one line, naming
/// `source`) when the plan is for another model or layer count, or another batch.
void applyPlan(config::Config& config, const PlanSpec& spec, const std::string& source);

/// Note [Planner partition of a placement]
/// plannerPartition() plans S stages on the devices of the schedule's default placement,
/// or of the folded one (Note [Folded placements]): the shapes whose devices it can name
/// stage by stage. A decoupled placement (Note [Decoupled partitions]: a range of several
/// stages on one device, such as "0/1 0/2 0/3") or any other given placement is a shape
/// the solver plans only as a whole (pipefb_plan, Note [Decoupled search]: every layer a
/// segment), so pipefb_train balances such a placement's S stages by parameter bytes,
/// as it does for the kinds the planner does not model. Whether the config's pipeline is
/// one plannerPartition() plans: its kind is modelled and its placement is the default or
/// the folded one.
bool plannerPartitions(const config::Config& config, int stages);

/// Cheap checks first (issue 33): `stages` against the model's layers, UserError (one
/// line naming pipeline.stages) when there are more stages than layers. The second form
/// counts the layers of the analytic model (modelWork), so pipefb_train refuses before
/// it measures a profile; plannerPartition() applies the first with the profile's count.
void checkStagesFitLayers(const config::Config& config, int stages, int numLayers);
void checkStagesFitLayers(const config::Config& config, int stages);

/// The planner's partition for the config's pipeline shape (schedule, `stages`,
/// pipeline.microbatches, pipeline.stash, lookahead), devices 0..D-1 in order.
struct PlannedPartition {
  std::vector<std::int64_t> cuts;  // pipeline.partition
  Plan plan;                       // with its predicted times and memory
  bool withinLimits = true;        // false: nothing fits devices.memory; planned without it
  /// When !withinLimits: the smallest per-device budget at which this shape has a plan
  /// (the memory-minimal partition's peak, host pool as configured); -1 if none has.
  std::int64_t minimalBudget = -1;
};
PlannedPartition plannerPartition(const CostModel& model, const config::Config& config, int stages);

/// "[0,3) [3,7) [7,9)"
std::string rangesText(const Plan& plan);

}  // namespace pipefb::planner
