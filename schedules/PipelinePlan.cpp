// Note [The plan is the program] (PipelinePlan.h).
#include "pipefb/schedules/PipelinePlan.h"

#include <algorithm>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/DataParallel.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Validator.h"

namespace pipefb::schedules {

const char* toString(OptimizerPlacement p) {
  switch (p) {
    case OptimizerPlacement::BackwardDevice:
      return "none";
    case OptimizerPlacement::Host:
      return "host";
  }
  return "?";
}

bool PipelineStage::operator==(const PipelineStage& o) const {
  return first == o.first && last == o.last && forwardDevice == o.forwardDevice &&
         backwardDevice == o.backwardDevice && stash == o.stash && lookahead == o.lookahead &&
         optimizer == o.optimizer;
}

int PipelinePlan::numDevices() const {
  int d = 0;
  for (const auto& s : stages) d = std::max({d, s.forwardDevice + 1, s.backwardDevice + 1});
  return d;
}

Placement PipelinePlan::placement() const {
  std::vector<StagePlacement> v;
  for (const auto& s : stages) v.push_back({s.forwardDevice, s.backwardDevice});
  return Placement(std::move(v));
}

std::vector<StashPolicy> PipelinePlan::stashPolicies() const {
  std::vector<StashPolicy> out;
  for (const auto& s : stages) out.push_back(s.stash);
  return out;
}

std::vector<int> PipelinePlan::lookaheads() const {
  std::vector<int> out;
  for (const auto& s : stages) out.push_back(s.lookahead);
  return out;
}

std::string PipelinePlan::rangesText() const {
  std::string out;
  for (const auto& s : stages)
    out +=
        (out.empty() ? "[" : " [") + std::to_string(s.first) + "," + std::to_string(s.last) + ")";
  return out;
}

std::string PipelinePlan::stashText() const {
  const bool uniform = std::all_of(stages.begin(), stages.end(), [&](const PipelineStage& s) {
    return s.stash == stages[0].stash;
  });
  std::string out;
  for (const auto& s : stages) {
    out += (out.empty() ? "" : ",") + std::string(toString(s.stash));
    if (uniform) break;
  }
  return out;
}

void lowerPlan(PipelinePlan& plan, const std::string& where) {
  const int S = plan.numStages();
  if (S < 1) throw UserError(where + ": a pipeline needs at least one stage");
  for (int s = 0; s < S; ++s) {
    const PipelineStage& st = plan.stages[s];
    const std::int64_t expectFirst = s == 0 ? 0 : plan.stages[s - 1].last;
    if (st.first != expectFirst || st.last <= st.first)
      throw UserError(where + ": stage " + std::to_string(s) + " covers layers [" +
                      std::to_string(st.first) + "," + std::to_string(st.last) +
                      "); stages must be non-empty and contiguous from layer 0 (expected it to "
                      "start at " +
                      std::to_string(expectFirst) + ")");
    if (st.lookahead < 0)
      throw UserError(where + ": stage " + std::to_string(s) + " has lookahead " +
                      std::to_string(st.lookahead) + "; allowed: >= 0");
  }
  if (plan.microbatches < 1 || plan.iterations < 1 || plan.replicas < 1)
    throw UserError(where + ": microbatches (" + std::to_string(plan.microbatches) +
                    "), iterations (" + std::to_string(plan.iterations) + ") and replicas (" +
                    std::to_string(plan.replicas) + ") must be >= 1");
  const int D = plan.numDevices();
  if (static_cast<int>(plan.deviceCapacity.size()) != D)
    throw UserError(where + ": " + std::to_string(plan.deviceCapacity.size()) +
                    " device capacities for " + std::to_string(D) +
                    " devices; give one, or one per device");
  const Placement placement = plan.placement();
  placement.checkFor(toString(plan.kind), D, where + ": placement");
  SchedulePlan raw =
      makeSchedule(plan.kind, S, plan.microbatches, placement, plan.iterations, plan.asyncLag);
  SchedulePlan lowered = lower(raw, plan.stashPolicies(), plan.lookaheads(), plan.offloadWeights);
  if (plan.replicas > 1) lowered.schedule = addAllReduce(lowered.schedule);
  validate(lowered.schedule, &lowered.contract);
  plan.lowered = std::move(lowered);
}

}  // namespace pipefb::schedules
