#pragma once
// Hybrid data + pipeline parallelism (issue 8, pipeline.replicas): a lowering pass.
#include "pipefb/schedules/Schedule.h"

namespace pipefb::schedules {

/// R replicas of a pipeline each run `schedule`; before every STEP(s, n) the device that
/// owns stage s's master weights all-reduces their gradients with its replicas: inserts
/// AR(s, n) before each STEP(s, n), as Note [All-reduces before the steps] places it. (The
/// runtime's gradient buckets start the all-reduce during the last backward, Note [Gradient
/// buckets]; AR waits for them.)
///
/// Note [All-reduces before the steps]
/// STEPs that follow one another on a device, with nothing between them but sends and other
/// non-compute actions (pipefb-sync's SW), get their ARs together before the first of them:
/// "AR(s1) AR(s2) STEP(s1) SW(s1) STEP(s2)", not "AR(s1) STEP(s1) SW(s1) AR(s2) STEP(s2)".
/// Under fp16 a device checks all its stages' gradients at its first STEP of the iteration
/// (Note [Loss scaling] in train/LossScaler.h), and it must check the all-reduced ones: then
/// every replica reaches the same verdict from the same bytes. A STEP alone (one stage a
/// device; pipedream's per-microbatch STEPs) keeps its AR right before it.
Schedule addAllReduce(const Schedule& schedule);

}  // namespace pipefb::schedules
