#pragma once
// The partition pipefb_train runs when a config names a pipeline schedule but no
// pipeline.partition (pipeline.partition_by: planner), planned on a measured profile
// (Note [Planner partition in pipefb_train]). Torch-free: the caller measures the
// profile (Profiler.h, loadOrMeasureProfile) and passes its file.
#include <string>

#include "pipefb/config/Config.h"
#include "pipefb/planner/TrainPlan.h"

namespace pipefb::planner {

struct ConfigPartition {
  PlannedPartition partition;
  std::string profileText;  // "measured <file>"
  std::string planYaml;     // the plan as pipefb_plan writes it (for RUN_DIR/plan.yaml)
};

/// Sets config.pipeline.partition and .stages to plannerPartition's for the config's
/// shape with `stages` stages (runtime::stagesFor), planned on the profile file
/// `profilePath`. `configPath` names the config in the
/// plan; `configsDir` holds devices/ and clusters/ ("" = next to the config).
ConfigPartition setPlannerPartition(config::Config& config, int stages,
                                    const std::string& profilePath, const std::string& configPath,
                                    const std::string& configsDir = "");

}  // namespace pipefb::planner
