#pragma once
// The planner inside pipefb_train (issue 6, "Plan files and explanations"): a plan file
// turned into the run config (`pipefb_train --plan`), and the planner's partition for a
// config that names a pipeline schedule but no pipeline.partition. Torch-free.
//
// Note [Plan policies in the runtime]
// The runtime takes one pipeline.stash for every stage. A plan whose stages agree is
// applied as that policy; a mixed plan is refused (UserError). On a split PipeFB stage
// the planner's "offload" is what the runtime calls "keep" (the graph moves to the
// backward device through the host), and "keep" there means offload as well
// (docs/planner.md, "Cost model"), so both map to the runtime's keep; checkpoint and
// checkpoint-offload both move the stage input through the host on a split stage.
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/config/Config.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Solver.h"

namespace pipefb::planner {

/// The runtime's pipeline.stash for a plan's per-stage policies (Note [Plan policies in
/// the runtime]); UserError naming `source` when the stages disagree.
std::string runtimeStashPolicy(const PlanSpec& spec, const std::string& source);

/// Sets the pipeline of `config` from a plan: schedule, stages, partition, microbatches,
/// stash, lookahead, devices.count; then re-validates it. UserError (one line, naming
/// `source`) when the plan is for another model or layer count, or another batch.
void applyPlan(config::Config& config, const PlanSpec& spec, const std::string& source);

/// The planner's partition for the config's pipeline shape (schedule, `stages`,
/// pipeline.microbatches, pipeline.stash, lookahead), devices 0..D-1 in order.
struct PlannedPartition {
  std::vector<std::int64_t> cuts;  // pipeline.partition
  Plan plan;                       // with its predicted times and memory
  bool withinLimits = true;        // false: nothing fits devices.memory; planned without it
};
PlannedPartition plannerPartition(const CostModel& model, const config::Config& config,
                                  int stages);

/// "[0,3) [3,7) [7,9)"
std::string rangesText(const Plan& plan);

}  // namespace pipefb::planner
