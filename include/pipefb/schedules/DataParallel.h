#pragma once
// Hybrid data + pipeline parallelism (issue 8, pipeline.replicas): a lowering pass.
#include "pipefb/schedules/Schedule.h"

namespace pipefb::schedules {

/// R replicas of a pipeline each run `schedule`; before every STEP(s, n) the device that
/// owns stage s's master weights all-reduces their gradients with its replicas:
/// inserts AR(s, n) right before each STEP(s, n). (Unbucketed and not overlapped with
/// the remaining backwards: the all-reduce of a stage waits for its last backward.)
Schedule addAllReduce(const Schedule& schedule);

}  // namespace pipefb::schedules
