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

/// Note [The planner's whole plan in pipefb_train]
/// A PipeFB schedule (pipefb-sync, pipefb-async: isSplit) has three shapes on the same
/// devices: 2S (stage s's F on device s, its B on 2S-1-s), folded (device d runs F of stage
/// d and B of stage S-1-d, Note [Folded placements]) and decoupled (forward and backward
/// partitions of their own, Note [Decoupled partitions]). A config that names none of them
/// (no pipeline.placement, pipeline.stages or pipeline.partition) asks for the best one,
/// and the 2S default is the one whose forward devices idle half the time (B is about 2F):
/// the default VGG16 ran 2S on 4 devices and its report warned "imbalanced stages: cpu:2
/// computed 10.669 s, cpu:0 4.992 s (2.14x)". So pipefb_train runs, for such a config, the
/// plan `pipefb_plan --schedules <schedule>-<stash> --microbatches <M>` writes on the same
/// profile (the whole shape: placement, stages, devices, cuts), through the same path as
/// `--plan` (the plan is the program). It keeps what the config fixes: the schedule, the
/// microbatches, the stash policy, the optimizer's place, lookahead and async_lag; the
/// planner may use fewer devices than devices.count when that is faster. One process only
/// (with one per device the ranks are the devices), one stash policy for all stages.
bool plansWholePipeline(const config::Config& config);

struct WholePlan {
  std::string planYaml;     // "" when nothing fits devices.memory (plan the partition then)
  std::string profileText;  // "measured <file>"
  std::string summary;      // "pipefb-sync folded, 2 stages on 2 devices (0/1 1/0), ..."
  /// When nothing fits: the smallest per-device budget that fits (-1: not even the
  /// devices' capacities), as pipefb_plan prints it.
  std::int64_t minimalBudget = -1;
};
/// pipefb_plan's best plan for the config's schedule, stash and microbatches, on the
/// profile file `profilePath` (plansWholePipeline(config) must hold).
WholePlan planWholePipeline(const config::Config& config, const std::string& profilePath,
                            const std::string& configPath, const std::string& configsDir = "");

}  // namespace pipefb::planner
