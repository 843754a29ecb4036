#pragma once
// What the runtime benches (runtime_bench, bind_bench) share: their pipeline and the
// partition pipefb_train would take for it.
#include <string>

#include "pipefb/config/Config.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/TrainPlan.h"
#include "pipefb/runtime/Partition.h"

namespace pipefb::test {

/// VGG16 width 1/4 on Fashion-MNIST shapes (1x32x32, 10 classes), batch 32, `schedule`
/// with `stash` in `M` microbatches on `devices` virtual devices.
inline config::Config benchConfig(const std::string& schedule, const std::string& stash, int M,
                                  int devices) {
  config::Config c;
  c.model.name = "vgg16";
  c.model.width = 0.25;
  c.model.input_size = 32;
  c.model.channels = 1;
  c.model.num_classes = 10;
  c.training.batch = 32;
  c.pipeline.schedule = schedule;
  c.pipeline.microbatches = M;
  c.pipeline.stash = stash;
  c.devices.count = devices;
  return c;
}

/// Sets the planner's partition (from the analytic CPU profile), as pipefb_train does
/// without pipeline.partition (Note [Planner partition in pipefb_train]).
inline void usePlannerPartition(config::Config& c) {
  planner::SetupOptions setup;
  setup.configsDir = PIPEFB_SOURCE_DIR "/configs";
  setup.profileMicrobatch = c.training.batch / c.pipeline.microbatches;
  auto planning = planner::setupPlanning(c, setup);
  const int S = runtime::stagesFor(c);
  c.pipeline.partition = planner::plannerPartition(*planning.model, c, S).cuts;
  c.pipeline.stages = S;
}

}  // namespace pipefb::test
