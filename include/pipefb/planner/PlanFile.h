#pragma once
// Plan files: what pipefb_plan writes and `pipefb_train --plan` reads (format in
// docs/planner.md, "Plan files"). Torch-free.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipefb/planner/Solver.h"
#include "pipefb/schedules/Placement.h"

namespace pipefb::planner {

/// Where a plan came from, for the file's header and the report.
struct PlanContext {
  std::string config;            // config path
  std::string model;             // profile key
  std::string profile;           // "analytic t4-16g" | "measured <file>"
  std::string cluster;           // cluster name
  std::int64_t budget = -1;      // per device; -1 = capacities
  std::int64_t hostBudget = -1;  // -1 = the cluster's host pool
};

/// The plan as YAML text (every stage with its layer range, devices, policy and predicted
/// memory by category; the predicted and simulated totals; the equivalent config keys).
std::string planToYaml(const CostModel& model, const Plan& plan, const PlanContext& context);
void writePlanFile(const std::string& path, const CostModel& model, const Plan& plan,
                   const PlanContext& context);

/// What a runtime needs from a plan file.
struct PlanStage {
  int first = 0, last = 0;
  int forwardDevice = 0, backwardDevice = 0;
  schedules::StashPolicy policy = schedules::StashPolicy::Keep;
  bool optimizerOnHost = false;  // `optimizer: host` (Note [Optimizer placement search])
  double predictedStepTime = 0;  // `predicted.step_time`: s per microbatch; absent: 0
};
struct PlanSpec {
  std::string model;     // the profile's model key ("vgg16 width=0.25 ... [optimizer=sgd]")
  std::string schedule;  // schedule kind name
  /// `precision:` (Note [Half-precision training] in common/Precision.h); absent: fp32.
  Precision precision = Precision::FP32;
  std::string profile;  // `profile:` "analytic <device>" | "measured <file>" | ...; may be empty
  int microbatches = 1;
  std::int64_t microbatchSize = 1;
  std::int64_t batch = 1;  // replicas x microbatches x microbatchSize
  int lookahead = 1;
  int replicas = 1;  // pipeline.replicas (Note [Replicated pipelines], Solver.h)
  /// pipefb-async: the async_lag it was planned at (Note [Planned async lag]); absent (a
  /// plan file before it, or another kind): nullopt, and the config's pipeline.async_lag runs.
  std::optional<int> asyncLag;
  int numLayers = 0;
  std::vector<PlanStage> stages;
  double predictedIterationTime = 0;
  std::vector<std::int64_t> predictedPeak;  // per device
  std::vector<std::string> overrides;       // the plan's `overrides` ("key=value")
  bool optimizerGiven = false;  // some stage says `optimizer:` (plan files before it do not)

  /// pipeline.partition: the first layer of stages 1..S-1.
  std::vector<std::int64_t> partition() const;
  /// The stages' forward/backward devices.
  schedules::Placement placement() const;
  /// PipeFB folded onto S devices (Note [Folded placements]): B(k) runs where F(S-1-k) does.
  bool folded() const;
  /// PipeFB with decoupled partitions (Note [Decoupled search], Solver.h): some device
  /// runs the forwards, or the backwards, of more than one stage.
  bool decoupled() const;
  /// pipeline.optimizer_offload per stage ("host" | "none"), one value when all agree.
  std::vector<std::string> optimizerOffload() const;
};

/// Reads and checks a plan file (contiguous stages covering [0, layers), known schedule
/// and policies, devices matching the schedule's placement). Errors are UserError naming
/// the file and key.
PlanSpec parsePlan(const std::string& yaml, const std::string& source);
/// The text of a plan file; a missing or unreadable file is a UserError naming it.
std::string readPlanText(const std::string& path);
PlanSpec readPlanFile(const std::string& path);

/// The solver's Plan for a plan file under a cost model (to re-check or re-explain it).
Plan planFromSpec(const CostModel& model, const PlanSpec& spec);

}  // namespace pipefb::planner
