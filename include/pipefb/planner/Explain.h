#pragma once
// Plans in words: the per-stage table and what binds (issue 6, "Plan files and
// explanations"). Torch-free.
#include <cstdint>
#include <optional>
#include <string>

#include "pipefb/planner/Solver.h"

namespace pipefb::planner {

/// One row per stage: layers, device(s), policy, F/B time, pace and its resource, memory by
/// category on the stage's devices, total; then the predicted iteration and throughput.
std::string stageTable(const CostModel& model, const Plan& plan, std::int64_t budget);

/// Why this plan: which resource of which stage sets the pace, which device is closest to
/// its memory limit and what fills it, why each non-keep policy (what keep would need),
/// and what the budget costs compared to `unconstrained` (the best plan without budget).
std::string explainPlan(const CostModel& model, const Plan& plan, std::int64_t budget,
                        const std::optional<Plan>& unconstrained);

/// "layers 0-6 (embed..block5)".
std::string layerRange(const Profile& profile, int first, int last);
std::string formatSeconds(double s);

}  // namespace pipefb::planner
