#pragma once
// Small builders for planner tests: literal profiles and clusters.
#include <vector>

#include "pipefb/planner/CostModel.h"
#include "pipefb/planner/Solver.h"

namespace pipefb::planner::testing {

/// Layers with forward times `fwd` (backward, recompute, bytes and states zero).
inline Profile timesProfile(const std::vector<double>& fwd) {
  Profile p;
  p.model = "literal";
  for (size_t i = 0; i < fwd.size(); ++i) {
    LayerCost c;
    c.name = "l" + std::to_string(i);
    c.forward = fwd[i];
    p.layers.push_back(c);
  }
  return p;
}

inline Cluster freeCluster(int n, std::int64_t capacity = -1) {
  return Cluster::uniform(n, 1.0, capacity, Link{}, Link{});
}

inline SolverOptions only(const std::string& family, std::int64_t batch = 1) {
  SolverOptions o;
  o.batch = batch;
  o.maxMicrobatches = static_cast<int>(batch);
  o.schedules = {parseScheduleFamily(family)};
  o.simulateTop = 0;
  return o;
}

inline std::vector<std::vector<int>> cuts(const Plan& p) {
  std::vector<std::vector<int>> out;
  for (const auto& s : p.stages) out.push_back({s.first, s.last});
  return out;
}

}  // namespace pipefb::planner::testing
