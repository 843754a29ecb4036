// The planner's partition for a config (ConfigPartition.h).
#include "pipefb/planner/ConfigPartition.h"

#include "pipefb/common/Size.h"
#include "pipefb/planner/Explain.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/Solver.h"

namespace pipefb::planner {

ConfigPartition setPlannerPartition(config::Config& config, int stages,
                                    const std::string& profilePath, const std::string& configPath,
                                    const std::string& configsDir) {
  SetupOptions setup;
  setup.profile = profilePath;
  setup.configsDir = configsDir;
  setup.profileMicrobatch = config.training.batch / config.pipeline.microbatches;
  Planning planning = setupPlanning(config, setup);
  ConfigPartition out;
  out.partition = plannerPartition(*planning.model, config, stages);
  out.profileText = planning.profileText;
  config.pipeline.partition = out.partition.cuts;
  config.pipeline.stages = stages;
  const PlanContext ctx{configPath, planning.model->profile().model, planning.profileText,
                        planning.model->cluster().name};
  out.planYaml = planToYaml(*planning.model, out.partition.plan, ctx);
  return out;
}

// Note [The planner's whole plan in pipefb_train] (ConfigPartition.h).
bool plansWholePipeline(const config::Config& config) {
  const auto& p = config.pipeline;
  if (p.schedule == "none" || !p.partition.empty() || p.partition_by != "planner") return false;
  const ScheduleKind kind = parseScheduleKind(p.schedule);
  return isSplit(kind) && plannerModels(kind) && p.placement.empty() && p.stages == 0 &&
         p.stage_stash.empty() && p.stage_optimizer_offload.empty() && p.replicas == 1;
}

WholePlan planWholePipeline(const config::Config& config, const std::string& profilePath,
                            const std::string& configPath, const std::string& configsDir) {
  PIPEFB_ASSERT(plansWholePipeline(config), "planWholePipeline: a config plansWholePipeline takes");
  SetupOptions setup;
  setup.profile = profilePath;
  setup.configsDir = configsDir;
  setup.profileMicrobatch = config.training.batch / config.pipeline.microbatches;
  Planning planning = setupPlanning(config, setup);
  // As `pipefb_plan --schedules <schedule>-<stash> --microbatches <M>` (its defaults).
  SolverOptions o = planning.solver;
  o.microbatches = static_cast<int>(config.pipeline.microbatches);
  o.simulateTop = 4;
  o.schedules = parseScheduleFamilies({config.pipeline.schedule + "-" + config.pipeline.stash});
  WholePlan out;
  out.profileText = planning.profileText;
  const SolveResult r = solve(*planning.model, o);
  if (!r.feasible) {
    out.minimalBudget = r.minimalBudget;
    if (config.devices.memory) {
      // The devices' capacities are devices.memory itself: the smallest budget is the
      // peak of the memory-minimal plan on the same devices without it.
      config::Config unbounded = config;
      unbounded.devices.memory = std::nullopt;
      Planning free = setupPlanning(unbounded, setup);
      SolverOptions m = free.solver;
      m.microbatches = o.microbatches;
      m.schedules = o.schedules;
      m.objective = Objective::Memory;
      m.simulateTop = 0;
      const SolveResult least = solve(*free.model, m);
      if (least.feasible) out.minimalBudget = least.best.peakMemory;
    }
    return out;
  }
  const Plan& plan = r.best;
  const PlanContext ctx{configPath, planning.model->profile().model, planning.profileText,
                        planning.model->cluster().name};
  out.planYaml = planToYaml(*planning.model, plan, ctx);
  const int devices = plan.shape.chainLength() * plan.shape.replicas;
  out.summary = config.pipeline.schedule +
                (plan.shape.decoupled()
                     ? " decoupled (" + std::to_string(plan.shape.forwardDevices) + " forward, " +
                           std::to_string(plan.shape.backwardDevices) + " backward devices)"
                 : plan.shape.folded ? " folded"
                                     : "") +
                ", " + std::to_string(plan.shape.stages) + " stages on " + std::to_string(devices) +
                " of " + std::to_string(planning.model->cluster().numDevices()) +
                " devices; predicted " + formatSeconds(plan.iterationTime) +
                " per iteration, peak " + formatBytes(plan.peakMemory);
  return out;
}

}  // namespace pipefb::planner
