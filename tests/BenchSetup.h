#pragma once
// What the runtime benches (runtime_bench, bind_bench) share: their pipeline and the
// partition pipefb_train would take for it.
#include <string>

#include "pipefb/config/Config.h"
#include "pipefb/planner/ConfigPartition.h"
#include "pipefb/planner/Profiler.h"
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

/// Sets the planner's partition as pipefb_train does without pipeline.partition, on the
/// measured profile (cached; measured on first use; Note [Planner partition in
/// pipefb_train]).
inline void usePlannerPartition(config::Config& c) {
  const auto profile = planner::loadOrMeasureProfile(c, planner::ProfilerOptions{});
  planner::setPlannerPartition(c, runtime::stagesFor(c), profile.path, "bench",
                               PIPEFB_SOURCE_DIR "/configs");
}

}  // namespace pipefb::test
