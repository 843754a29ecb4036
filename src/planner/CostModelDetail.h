// What the cost model's files share beyond CostModel.h (private to src/planner).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pipefb/planner/CostModel.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/Messages.h"
#include "pipefb/schedules/SharedDevices.h"

namespace pipefb::planner::detail {

inline std::int64_t scaled(std::int64_t bytes, double f) { return scaledBytes(bytes, f); }

// Note [What waits for W]: n resident stashes of which `deferred` (at most) wait for their
// W, counted at their size first.
inline std::int64_t residentStashBytes(const StageEstimate& e, int n, int deferred) {
  const int d = std::max(0, std::min(n, deferred));
  return d * e.deferredStashBytes + (n - d) * e.stashBytes;
}

// Note [Forward beside backward]: a stage alone on its device, F and fused B there.
inline bool forwardBesideBackward(const PipelineShape& shape) {
  return !shape.sharesDevices() && !shape.decoupled() && !isSplit(shape.kind) &&
         !splitsBackward(shape.kind);
}

// The schedule-contract lookups (ScheduleContract.cpp, where each one's Note is): tables
// read off a generated schedule, computed once per key.
const schedules::MemoryContract& generatedContract(ScheduleKind k, int S, int M);
const std::vector<bool>& phasedStages(ScheduleKind k, int S, int M, int lag);
const std::vector<std::vector<schedules::HeldAtStart>>& heldTogether(ScheduleKind k, int S, int M,
                                                                     int lag);
const std::vector<int>& foldedStashesAtStep(ScheduleKind k, int S, int M, int lookahead, int lag);
const std::vector<int>& foldedStashesAtBackward(ScheduleKind k, int S, int M, int lookahead,
                                                int lag);
const std::vector<int>& asyncStashesAtBackward(ScheduleKind k, int S, int M, int lookahead,
                                               bool folded, int lag);
bool outputAtReceive(ScheduleKind k, int S, int M, bool folded, int lag);
const std::vector<schedules::SameDeviceHeld>& pipedreamHeld(int S, int k, int M, int lookahead);
const schedules::WaitingMessages& waitingFor(ScheduleKind k, int S, int M, bool folded, int lag);

}  // namespace pipefb::planner::detail
