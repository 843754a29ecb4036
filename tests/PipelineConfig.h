#pragma once
// The config the pipeline tests (tests/runtime, tests/dist) build their cases from.
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/config/Config.h"
#include "pipefb/schedules/Placement.h"

namespace pipefb::test {

/// The mlp model on `inputSize` features (one channel) with `hidden` layer widths and 5
/// classes: hidden.size() + 1 layers.
inline model::ModelOptions mlpOptions(int64_t inputSize, std::vector<int64_t> hidden) {
  model::ModelOptions o;
  o.name = "mlp";
  o.input_size = inputSize;
  o.channels = 1;
  o.num_classes = 5;
  o.hidden = std::move(hidden);
  return o;
}

/// SGD 0.05 with momentum 0.9, S stages x M microbatches of `batch` under `stash`, on the
/// devices of the schedule's default placement (Note [Stages per device]: S, 2S for
/// pipefb-*, S/2 for interleaved-1f1b and zbv).
inline config::Config pipelineConfig(const model::ModelOptions& m, const std::string& schedule,
                                     int S, int M, const std::string& stash, int64_t batch,
                                     const std::string& source = "<test>") {
  config::Config c;
  c.source = source;
  c.model = m;
  c.training.optimizer = "sgd";
  c.training.lr = 0.05;
  c.training.momentum = 0.9;
  c.training.batch = batch;
  c.pipeline.schedule = schedule;
  c.pipeline.stages = S;
  c.pipeline.microbatches = M;
  c.pipeline.stash = stash;
  c.devices.count = schedules::Placement::devicesFor(schedules::parseScheduleKind(schedule), S);
  return c;
}

/// PipeFB folded onto S devices (Note [Folded placements]): device d runs F of stage d and
/// B of stage S-1-d.
inline void fold(config::Config& c) {
  const int S = static_cast<int>(c.pipeline.stages);
  c.pipeline.placement = schedules::Placement::folded(S).toString();
  c.devices.count = S;
}

/// A given pipeline.placement ("0/1 0/2 0/3", Note [Decoupled partitions]) on the devices
/// it names.
inline void place(config::Config& c, const std::string& placement) {
  c.pipeline.placement = placement;
  c.devices.count = schedules::Placement::parse(placement, "test").numDevices();
}

/// interleaved-1f1b with v stages per device: S/v devices.
inline void interleave(config::Config& c, int v) {
  c.pipeline.virtual_stages = v;
  c.devices.count = c.pipeline.stages / v;
}

}  // namespace pipefb::test
