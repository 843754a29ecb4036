#pragma once
// Rules of the schedules that run several stages on one device (Placement::looped,
// Placement::vShape), for the planner's cost model (planner/CostModel.h, Note [Shared
// devices]). Kept out of Placement.h and ZeroBubble.h, which most of the runtime includes.
#include <vector>

#include "pipefb/schedules/Schedule.h"

namespace pipefb::schedules {

/// The device of stage s of Placement::looped(numStages, v): s mod (numStages / v).
inline int loopedDevice(int s, int numStages, int v) { return s % (numStages / v); }

/// Note [Stashes held together]
/// A device that hosts several stages (looped, V) holds their stashes at once, but each
/// stage's count in the contract is its own maximum, reached at different times (zbv's
/// first chunk peaks during the warm-up, its second chunk after the turn). The planner
/// charges a device the most of sum_s n_s x stash(s) over its compute starts, so it needs
/// the counts together: per device, the per-stage counts of stashes alive (as
/// contractFromOrder counts them, a B or W counting its own) at each compute start,
/// indexed by stage (0 for the stages of other devices), without duplicates and without a
/// vector that another one bounds from above in every stage.
std::vector<std::vector<std::vector<int>>> stashesHeldTogether(const Schedule& schedule);

}  // namespace pipefb::schedules
