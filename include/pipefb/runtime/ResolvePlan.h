#pragma once
// The one resolver (Note [The plan is the program], pipefb/schedules/PipelinePlan.h): a
// config (after --plan, if any, was applied to it) becomes the PipelinePlan the engine
// runs, checked once. User errors are one-line UserErrors naming the config and the key.
// No LibTorch: the caller passes the model's layer sizes.
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/config/Config.h"
#include "pipefb/schedules/PipelinePlan.h"

namespace pipefb::runtime {

/// What the resolver needs to know about the model.
struct ModelLayers {
  std::string name;                      // for messages
  std::vector<std::int64_t> paramBytes;  // per layer (pipeline.partition_by params)
};

/// The config's pipeline for `iterations` iterations: partition (pipeline.partition, or
/// balanced by parameter bytes), placement (pipeline.placement or the kind's default),
/// per stage its stash (pipeline.stash: one value or one per stage), lookahead and
/// optimizer placement, per device its capacity (devices.memory: one value or one per
/// device), the host pool's (devices.host_memory); lowered and validated (lowerPlan).
/// `log`: say the partition when it was balanced here.
schedules::PipelinePlan resolvePlan(const config::Config& config, const ModelLayers& model,
                                    std::int64_t iterations, bool log = false);

}  // namespace pipefb::runtime
