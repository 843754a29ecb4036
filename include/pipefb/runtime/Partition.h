#pragma once
// Stage partition: which contiguous layer range [first, last) each stage runs.
// Torch-free: the runtime passes per-layer costs (parameter bytes until the planner
// exists), the tests pass literal numbers.
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/config/Config.h"

namespace pipefb::runtime {

struct StageRange {
  int64_t first = 0;  // first layer of the stage
  int64_t last = 0;   // one past its last layer
  bool operator==(const StageRange& o) const { return first == o.first && last == o.last; }
};

/// Contiguous, non-empty stages minimising the largest stage cost (ties: the earliest
/// cut). A stage count outside [1, costs.size()] is a UserError naming pipeline.stages.
std::vector<StageRange> balancedPartition(const std::vector<int64_t>& layerCosts, int numStages);

/// Stages from explicit cut points (the first layer of stages 1..S-1, strictly
/// increasing, each in [1, numLayers-1]); a bad list is a UserError naming
/// pipeline.partition.
std::vector<StageRange> partitionFromCuts(const std::vector<int64_t>& cuts, int64_t numLayers);

/// The stage count a config asks for: pipeline.stages, else partition.size()+1, else the
/// placement's, else derived from devices.count (config::pipelineStages: S devices, 2S for
/// pipefb-*, S/v for interleaved-1f1b and interleaved-zb, S/2 for zbv). UserError if they disagree.
int stagesFor(const config::Config& config);

/// Note [Replicated pipelines]: the rule for processes. `worldSize` is the size of the
/// process group, 0 without one (a single process). R > 1 replicas need one process per
/// device of every replica, and with a group its size must be devices x R. UserError naming
/// `source` otherwise (pipefb_train checks it before loading data; the engine again).
void checkProcesses(const std::string& source, int64_t devices, int64_t replicas,
                    int64_t worldSize);

/// "[0,3) [3,7) [7,9)"
std::string toString(const std::vector<StageRange>& partition);

}  // namespace pipefb::runtime
