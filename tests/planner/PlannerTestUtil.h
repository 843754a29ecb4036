#pragma once
// Small builders for planner tests: literal profiles and clusters.
#include <random>
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

/// One layer of random costs for the exhaustive-search tables (OptimalityTest,
/// DagPartitionTest): every field the cost model reads, in a fixed order of draws.
inline LayerCost randomLayer(std::mt19937& rng) {
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  LayerCost c;
  c.forward = uni(0.1, 2);
  c.backward = uni(0.1, 4);
  c.recompute = c.forward * uni(0.8, 1.2);
  c.step = uni(0, 0.5);
  c.outputBytes = pick(1, 400);
  c.savedBytes = pick(0, 1000);
  c.workingBytes = pick(0, 300);
  c.paramBytes = pick(0, 500);
  c.gradBytes = c.paramBytes;
  c.optimizerBytes = c.paramBytes * pick(0, 2);
  c.stepWorkingBytes = pick(0, 2) == 0 ? pick(0, 2 * int(c.paramBytes)) : 0;
  // Note [Backward after a step], [Weight snapshots], [Forward device memory].
  c.backwardAfterStep = pick(0, 1) == 0 ? c.backward + uni(0, 1) : 0;
  c.snapshot = uni(0, 0.3);
  c.forwardWorkingBytes = pick(0, 1) == 0 ? pick(0, int(c.workingBytes)) : -1;
  return c;
}

}  // namespace pipefb::planner::testing
