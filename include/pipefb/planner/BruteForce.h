#pragma once
// Exhaustive search over the solver's space: schedules x microbatches x stage counts x
// every injective device chain x every contiguous partition x every per-stage policy,
// scored by the same CostModel. For tests on small cases (<= 10 layers, <= 4 devices).
#include <optional>

#include "pipefb/planner/Solver.h"

namespace pipefb::planner {

struct BruteForceResult {
  bool feasible = false;
  double objective = 0;  // iteration time (Time) or largest device memory (Memory)
  Plan plan;
  long visited = 0;
};

BruteForceResult bruteForce(const CostModel& model, const SolverOptions& options);

}  // namespace pipefb::planner
