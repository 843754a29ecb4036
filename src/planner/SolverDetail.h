// What the solver's files share beyond Solver.h (private to src/planner).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "pipefb/planner/Solver.h"

namespace pipefb::planner::detail {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Note [Optimizer placement search]: the placements the DP tries for each stage of `shape`
/// (SolverOptions.cpp).
std::vector<bool> placementsOf(const PipelineShape& shape);

/// The paired searches (PairSearch.cpp), as solveShape() for a folded shape (Note [Folded
/// search]) and for one whose devices each hold two stages (Note [Shared search]).
std::optional<Plan> solveFoldedShape(const CostModel& model, const PipelineShape& shape,
                                     const std::vector<StashPolicy>& policies,
                                     const std::vector<std::int64_t>& limits,
                                     std::int64_t hostLimit, Objective objective, double bound);
std::optional<Plan> solveSharedShape(const CostModel& model, const PipelineShape& shape,
                                     const std::vector<StashPolicy>& policies,
                                     const std::vector<std::int64_t>& limits,
                                     std::int64_t hostLimit, Objective objective, double bound);

/// Note [Prefetch distance in re-scoring] (Rescoring.cpp): a simulated plan that offloads,
/// re-simulated with up to two more actions of lookahead; the faster kept where it fits.
void prefetchFurther(const CostModel& model, Plan& plan, const std::vector<std::int64_t>& limits,
                     std::int64_t hostLimit, int lookahead);

}  // namespace pipefb::planner::detail
