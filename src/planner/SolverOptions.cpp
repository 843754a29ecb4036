// The solver's options: schedule families, optimizer placements and their checks.
#include <algorithm>
#include <string>
#include <vector>

#include "SolverDetail.h"
#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/planner/Solver.h"
#include "pipefb/schedules/Lowering.h"

namespace pipefb::planner {

ScheduleFamily parseScheduleFamily(const std::string& name) {
  std::vector<ScheduleKind> kinds = allScheduleKinds();
  // Longest kind name first, so "pipefb-sync-keep" is not read as "pipefb" + "sync-keep".
  std::sort(kinds.begin(), kinds.end(), [](ScheduleKind a, ScheduleKind b) {
    return std::string(toString(a)).size() > std::string(toString(b)).size();
  });
  for (ScheduleKind k : kinds) {
    const std::string kn = toString(k);
    if (name == kn) return {name, k, allStashPolicies()};
    if (name.size() > kn.size() + 1 && name.compare(0, kn.size() + 1, kn + "-") == 0) {
      const std::string rest = name.substr(kn.size() + 1);
      for (StashPolicy p : allStashPolicies())
        if (rest == schedules::toString(p)) return {name, k, {p}};
    }
  }
  std::vector<std::string> forms;
  for (ScheduleKind k : allScheduleKinds()) {
    forms.push_back(toString(k));
    for (StashPolicy p : allStashPolicies())
      forms.push_back(std::string(toString(k)) + "-" + schedules::toString(p));
  }
  throw UserError("unknown schedule family '" + name + "'" + didYouMean(name, forms) +
                  "; allowed: a schedule (" + joinAllowed([] {
                    std::vector<std::string> n;
                    for (ScheduleKind k : allScheduleKinds()) n.push_back(toString(k));
                    return n;
                  }()) +
                  "), optionally with -keep, -offload, -checkpoint or -checkpoint-offload");
}

std::vector<ScheduleFamily> parseScheduleFamilies(const std::vector<std::string>& names) {
  std::vector<ScheduleFamily> out;
  for (const auto& n : names) out.push_back(parseScheduleFamily(n));
  return out;
}

OptimizerOffload parseOptimizerOffload(const std::string& text, const std::string& flag) {
  for (OptimizerOffload o :
       {OptimizerOffload::None, OptimizerOffload::Host, OptimizerOffload::PerStage})
    if (text == toString(o)) return o;
  throw UserError(flag + ": unknown value '" + text + "'; allowed: none | host | per-stage");
}

const char* toString(OptimizerOffload o) {
  switch (o) {
    case OptimizerOffload::None:
      return "none";
    case OptimizerOffload::Host:
      return "host";
    case OptimizerOffload::PerStage:
      return "per-stage";
  }
  return "?";
}

std::vector<bool> optimizerPlacements(OptimizerOffload o) {
  switch (o) {
    case OptimizerOffload::None:
      return {false};
    case OptimizerOffload::Host:
      return {true};
    case OptimizerOffload::PerStage:
      return {false, true};
  }
  return {false};
}

namespace detail {
// Note [Optimizer placement search]: the placements the DP tries for each stage of `shape`.
std::vector<bool> placementsOf(const PipelineShape& shape) {
  return shape.optimizerPerStage ? optimizerPlacements(OptimizerOffload::PerStage)
                                 : std::vector<bool>{shape.optimizerOnHost};
}
}  // namespace detail

PipelineShape stageShape(const PipelineShape& shape, bool optimizerOnHost) {
  PipelineShape s = shape;
  s.optimizerOnHost = optimizerOnHost;
  s.optimizerPerStage = false;
  return s;
}

void SolverOptions::validate() const {
  if (batch < 1) throw UserError("planner: batch must be >= 1, got " + std::to_string(batch));
  if (maxMicrobatches < 1)
    throw UserError("planner: max microbatches must be >= 1, got " +
                    std::to_string(maxMicrobatches));
  if (lookahead < 0)
    throw UserError("planner: lookahead must be >= 0, got " + std::to_string(lookahead));
  if (budget == 0) throw UserError("planner: a budget of 0 bytes leaves nothing to plan");
  if (maxStages < 0) throw UserError("planner: max stages must be >= 0");
  if (microbatches < 0 || (microbatches > 0 && batch % microbatches != 0))
    throw UserError("planner: microbatches must divide the batch " + std::to_string(batch) +
                    ", got " + std::to_string(microbatches) +
                    "; please choose a divisor or adjust training.batch");
}

std::vector<int> microbatchCounts(std::int64_t batch, int maxMicrobatches) {
  std::vector<int> out;
  for (std::int64_t m = 1; m <= std::min<std::int64_t>(batch, maxMicrobatches); ++m)
    if (batch % m == 0) out.push_back(static_cast<int>(m));
  return out;
}

}  // namespace pipefb::planner
