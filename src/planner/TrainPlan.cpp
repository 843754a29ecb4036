// The planner inside pipefb_train (TrainPlan.h).
#include "pipefb/planner/TrainPlan.h"

#include <algorithm>
#include <numeric>

#include "pipefb/common/Error.h"
#include "pipefb/planner/AnalyticProfile.h"

namespace pipefb::planner {

namespace {

// A plan's model key is the profile's: the analytic key, plus " optimizer=..." for a
// measured profile (Profiler.h). The config's model matches when it is a prefix ending
// at a word.
bool sameModel(const std::string& planModel, const std::string& configModel) {
  if (planModel.compare(0, configModel.size(), configModel) != 0) return false;
  return planModel.size() == configModel.size() || planModel[configModel.size()] == ' ';
}

}  // namespace

std::vector<std::string> runtimeStashPolicies(const PlanSpec& spec, const std::string& source) {
  if (spec.stages.empty()) throw UserError(source + ": stages: the plan has no stages");
  std::vector<std::string> out;
  bool uniform = true;
  for (const auto& s : spec.stages) {
    out.push_back(toString(s.policy));
    uniform = uniform && s.policy == spec.stages.front().policy;
  }
  if (uniform) out.resize(1);
  return out;
}

void applyPlan(config::Config& cfg, const PlanSpec& spec, const std::string& source) {
  // A torchscript model's layers are known once it is loaded; its key names the file's bytes.
  const bool script = cfg.model.name == "torchscript";
  const std::string key = model::modelKey(cfg.model);
  const int L = script ? spec.numLayers : static_cast<int>(modelWork(cfg.model).layers.size());
  if (spec.numLayers != L || (!spec.model.empty() && !sameModel(spec.model, key)))
    throw UserError(source + ": the plan is for '" + spec.model + "' (" +
                    std::to_string(spec.numLayers) + " layers) but the config's model is '" + key +
                    "'" + (script ? "" : " (" + std::to_string(L) + " layers)") +
                    "; re-plan with pipefb_plan --config " + cfg.source);
  if (toString(spec.precision) != cfg.training.precision)  // Note [Half-precision training]
    throw UserError(source + ": precision: the plan is for " + toString(spec.precision) +
                    " but training.precision is " + cfg.training.precision + "; --set " +
                    "training.precision=" + toString(spec.precision) + " or re-plan");
  // Note [Autocast] (model/Model.h): a measured bf16 profile has autocast's bytes; the
  // analytic one charges Note [Half-precision training]'s half copy, which autocast is not.
  if (spec.precision != Precision::FP32 && spec.profile.rfind("measured", 0) != 0)
    throw UserError(source + ": precision: " + toString(spec.precision) + ": the plan is on " +
                    (spec.profile.empty() ? std::string("no measured profile") : spec.profile) +
                    ", whose half-precision bytes are the half weight copy of Note [Half-precision "
                    "training], not autocast's; plan on a profile measured at " +
                    toString(spec.precision) + " (pipefb_profile --set training.precision=" +
                    toString(spec.precision) + ", then pipefb_plan --profile)");
  if (spec.batch != cfg.training.batch)
    throw UserError(source + ": batch: the plan is for a batch of " + std::to_string(spec.batch) +
                    " but training.batch is " + std::to_string(cfg.training.batch) +
                    "; --set training.batch=" + std::to_string(spec.batch) + " or re-plan");
  const std::vector<std::string> stash = runtimeStashPolicies(spec, source);
  auto& p = cfg.pipeline;
  p.schedule = spec.schedule;
  p.stages = static_cast<std::int64_t>(spec.stages.size());
  p.partition = spec.partition();
  p.microbatches = spec.microbatches;
  p.lookahead = spec.lookahead;
  p.replicas = spec.replicas;  // Note [Replicated pipelines]
  // Note [Planned async lag]: the lag the plan was made for, as its other pipeline keys;
  // a plan file written before plans carried it leaves the config's.
  if (spec.asyncLag) p.async_lag = *spec.asyncLag;
  p.stash = stash.front();  // Note [Plan policies in the runtime]
  p.stage_stash = stash.size() > 1 ? stash : std::vector<std::string>{};
  // Note [Optimizer placement search]: the plan's placement per stage ("host" when any
  // is); a plan file written before plans carried it leaves the config's.
  if (spec.optimizerGiven) {
    const std::vector<std::string> opt = spec.optimizerOffload();
    p.optimizer_offload = std::find(opt.begin(), opt.end(), "host") != opt.end() ? "host" : "none";
    p.stage_optimizer_offload = opt.size() > 1 ? opt : std::vector<std::string>{};
  }
  // The plan's placement is the pipeline's (Note [Folded placements]: a folded PipeFB plan
  // runs S stages on S devices); it says how many devices the run needs.
  const schedules::Placement placement = spec.placement();
  p.placement = placement == schedules::Placement::defaultFor(p.schedule, p.stages)
                    ? std::string()
                    : placement.toString();
  cfg.devices.count = placement.numDevices();
  try {
    config::validate(cfg);
  } catch (const UserError& e) {
    throw UserError(source + ": the plan does not make a valid config: " + e.what());
  }
}

// Note [Planner partition of a placement] (TrainPlan.h).
bool plannerPartitions(const config::Config& cfg, int stages) {
  const ScheduleKind kind = parseScheduleKind(cfg.pipeline.schedule);
  if (!plannerModels(kind)) return false;
  // Note [Shared devices]: the planner plans the interleaved kinds with v = 2 only.
  if (schedules::info(kind).placement == schedules::DefaultPlacement::Looped &&
      cfg.pipeline.virtual_stages != 0 &&
      cfg.pipeline.virtual_stages != schedules::Placement::kDefaultVirtualStages)
    return false;
  if (cfg.pipeline.placement.empty()) return true;
  const auto given = schedules::Placement::parse(cfg.pipeline.placement, cfg.source);
  return given == schedules::Placement::defaultFor(kind, stages) ||
         (isSplit(kind) && given == schedules::Placement::folded(stages));
}

void checkStagesFitLayers(const config::Config& cfg, int stages, int numLayers) {
  if (stages > numLayers)
    throw UserError(cfg.source + ": pipeline.stages: " + std::to_string(stages) +
                    " stages but the model has only " + std::to_string(numLayers) +
                    " layers; lower pipeline.stages or devices.count");
}

void checkStagesFitLayers(const config::Config& cfg, int stages) {
  // A torchscript model's layers are counted when it is loaded (the runtime checks then).
  if (cfg.model.name == "torchscript") return;
  checkStagesFitLayers(cfg, stages, static_cast<int>(modelWork(cfg.model).layers.size()));
}

PlannedPartition plannerPartition(const CostModel& model, const config::Config& cfg, int stages) {
  PipelineShape shape;
  shape.kind = parseScheduleKind(cfg.pipeline.schedule);
  shape.stages = stages;
  shape.microbatches = static_cast<int>(cfg.pipeline.microbatches);
  // Note [Replicated pipelines]: each of pipeline.replicas copies runs batch / replicas.
  shape.replicas = static_cast<int>(std::max<std::int64_t>(1, cfg.pipeline.replicas));
  shape.microbatchSize =
      std::max<std::int64_t>(1, cfg.training.batch / (cfg.pipeline.microbatches * shape.replicas));
  shape.lookahead = static_cast<int>(cfg.pipeline.lookahead);
  shape.offloadWeights = cfg.pipeline.offload_weights != "none";  // Note [Weight-version offload]
  shape.asyncLag = static_cast<int>(cfg.pipeline.async_lag);      // Note [Planned async lag]
  // Note [Optimizer offload in the cost model]: one flag for all stages, so a per-stage
  // list counts as "host" only when every stage is.
  const auto& perStage = cfg.pipeline.stage_optimizer_offload;
  shape.optimizerOnHost = perStage.empty()
                              ? cfg.pipeline.optimizer_offload == "host"
                              : std::all_of(perStage.begin(), perStage.end(),
                                            [](const std::string& v) { return v == "host"; });
  PIPEFB_ASSERT(plannerPartitions(cfg, stages),
                "plannerPartition plans default and folded placements only (plannerPartitions)");
  // Note [Folded placements]: a folded pipeline.placement plans the folded shape.
  shape.folded = isSplit(shape.kind) && !cfg.pipeline.placement.empty() &&
                 schedules::Placement::parse(cfg.pipeline.placement, cfg.source) ==
                     schedules::Placement::folded(stages);
  shape.chain.resize(shape.chainLength());
  std::iota(shape.chain.begin(), shape.chain.end(), 0);
  if (shape.chainLength() > model.cluster().numDevices())
    throw UserError(cfg.source +
                    ": devices.count: " + std::to_string(model.cluster().numDevices()) +
                    " devices but " + cfg.pipeline.schedule + " with " + std::to_string(stages) +
                    " stages needs " + std::to_string(shape.chainLength()));
  checkStagesFitLayers(cfg, stages, model.numLayers());
  // Each stage keeps the policy the config gives it (one for all, or one per stage); the
  // solver chooses only the partition.
  const std::vector<StashPolicy> asked = config::stashPerStage(cfg, stages);
  std::vector<StashPolicy> policies;  // distinct, for the solver
  for (int k = 0; k < stages; ++k) {
    const StashPolicy policy = schedules::effectivePolicy(asked[k], shape.splits(k));
    shape.stagePolicies.push_back(policy);
    if (std::find(policies.begin(), policies.end(), policy) == policies.end())
      policies.push_back(policy);
    // Note [Devices and processes]: the runtime refuses a graph stash across processes
    // too; saying so here keeps the planner from being asked for a plan that cannot exist.
    if (!schedules::isCheckpoint(policy) && inputStashOnly(model.cluster(), shape, k))
      throw UserError(cfg.source + ": pipeline.stash: " + toString(asked[k]) +
                      " cannot cross processes: stage " + std::to_string(k) + " runs F on rank " +
                      std::to_string(shape.forwardDevice(k)) + " and B on rank " +
                      std::to_string(shape.backwardDevice(k)) +
                      " and an autograd graph cannot move between processes; allowed: "
                      "checkpoint, checkpoint-offload");
  }
  std::vector<std::int64_t> limits;
  for (const auto& d : model.cluster().devices) limits.push_back(d.capacity);
  PlannedPartition out;
  auto plan = solveShape(model, shape, policies, limits, model.cluster().hostPool, Objective::Time);
  if (!plan) {
    // Nothing fits devices.memory for this shape: still the fastest partition, so the
    // runtime reports the out-of-memory error with a real partition.
    out.withinLimits = false;
    std::vector<std::int64_t> none(limits.size(), -1);
    if (auto least =
            solveShape(model, shape, policies, none, model.cluster().hostPool, Objective::Memory))
      out.minimalBudget = least->peakMemory;
    plan = solveShape(model, shape, policies, none, -1, Objective::Time);
  }
  PIPEFB_ASSERT(plan.has_value(), "an unlimited shape always has a plan");
  out.plan = *plan;
  for (size_t k = 1; k < plan->stages.size(); ++k) out.cuts.push_back(plan->stages[k].first);
  return out;
}

std::string rangesText(const Plan& plan) {
  std::string s;
  for (const auto& st : plan.stages)
    s += (s.empty() ? "[" : " [") + std::to_string(st.first) + "," + std::to_string(st.last) + ")";
  return s;
}

}  // namespace pipefb::planner
