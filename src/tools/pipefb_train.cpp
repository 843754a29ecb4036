// pipefb_train --config configs/vgg16.yaml [--set section.key=value ...] [--plan plan.yaml]
//
// --plan: a plan file written by pipefb_plan sets the pipeline (schedule, stages,
// partition, microbatches, stash policy, lookahead, devices.count; TrainPlan.h). Without
// it, a pipeline schedule with no pipeline.partition runs the planner's partition for the
// configured shape (pipeline.partition_by: planner, the default), from a cached measured
// profile (pipefb_profile) when there is one, else the analytic profile; `params` keeps
// the runtime's parameter-bytes balance.
//
// Exit codes: 0 success; 2 bad input (config, flag, data or plan file), with one line on
// stderr naming the key or file; 1 any other failure (out of memory, numerical).
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>

#include "pipefb/common/Program.h"
#include "pipefb/common/Size.h"
#include "pipefb/config/Config.h"
#include "pipefb/planner/Explain.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Profiler.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/TrainPlan.h"
#include "pipefb/runtime/Partition.h"
#include "pipefb/train/Trainer.h"

namespace {

// Note [Planner partition in pipefb_train]: the runtime would balance parameter bytes,
// which puts VGG's conv layers (little weight, most of the time and activations) in one
// stage. The planner's DP balances the cost model's stage time under devices.memory.
void usePlannerPartition(pipefb::config::Config& config) {
  using namespace pipefb::planner;
  const int stages = pipefb::runtime::stagesFor(config);
  SetupOptions setup;
  setup.profileMicrobatch = config.training.batch / config.pipeline.microbatches;
  const std::string cached = defaultProfilePath(profileHeader(config, ProfilerOptions{}));
  if (std::filesystem::exists(cached)) setup.profile = cached;
  Planning planning = setupPlanning(config, setup);
  PlannedPartition p = plannerPartition(*planning.model, config, stages);
  config.pipeline.partition = p.cuts;
  config.pipeline.stages = stages;
  spdlog::info(
      "pipeline: partition by the planner ({} profile): {}; predicted {} per iteration, peak {}"
      "{} (pipeline.partition_by: params for the parameter-bytes balance)",
      planning.profileText, rangesText(p.plan),
      pipefb::planner::formatSeconds(p.plan.iterationTime), pipefb::formatBytes(p.plan.peakMemory),
      p.withinLimits ? "" : "; nothing fits devices.memory, planned without it");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipefb_train: pipeline-parallel training for devices short of memory"};
  std::string configPath, planPath;
  std::vector<std::string> overrides;
  pipefb::addConfigOptions(app, configPath, overrides);
  app.add_option("--plan", planPath,
                 "plan file from pipefb_plan: sets schedule, stages, partition, microbatches, "
                 "stash policy, lookahead and devices.count");
  return pipefb::runProgram("pipefb_train", app, argc, argv, [&] {
    pipefb::config::Config config = pipefb::config::loadConfig(configPath, overrides);
    if (!planPath.empty()) {
      const auto spec = pipefb::planner::readPlanFile(planPath);
      pipefb::planner::applyPlan(config, spec, planPath);
      spdlog::info("plan {}: {} x {} stages, {} microbatches, stash {}, partition {}", planPath,
                   config.pipeline.schedule, config.pipeline.stages, config.pipeline.microbatches,
                   config.pipeline.stash,
                   pipefb::runtime::toString(pipefb::runtime::partitionFromCuts(
                       config.pipeline.partition, spec.numLayers)));
    } else if (config.pipeline.schedule != "none" && config.pipeline.partition.empty() &&
               config.pipeline.partition_by == "planner") {
      usePlannerPartition(config);
    }
    pipefb::train::Trainer trainer(std::move(config));
    auto summary = trainer.run();
    if (summary.test_accuracy >= 0) std::cout << "test_accuracy " << summary.test_accuracy << "\n";
    return 0;
  });
}
