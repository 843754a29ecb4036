// The planner's partition for a config (ConfigPartition.h).
#include "pipefb/planner/ConfigPartition.h"

#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Setup.h"

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

}  // namespace pipefb::planner
