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
/// the counts together, and which stage's action starts then (its working set is the one
/// beside them): per device, at each compute start, the stage that starts, whether it is
/// an F (which builds a stash; an I, W or B works on one), and the
/// per-stage counts of stashes alive (as contractFromOrder counts them, a B or W counting
/// its own), indexed by stage (0 for the stages of other devices), without duplicates and
/// without an entry that another one of the same starting action bounds in every stage.
/// (Measured, zbv VGG16/8 on 2 devices, device 0 with stage 0 (conv) and stage 3 (fc7..fc8):
/// charging the largest stash sum beside the largest working set of either stage put the
/// plan 10.5% above the measured peak: the schedule's most stashes beside stage 3 are at
/// its F, whose working set is far below its B's.)
struct HeldAtStart {
  int starting = 0;        // the stage whose compute action starts
  bool forward = false;    // that action is an F
  bool weight = false;     // that action is a W (Note [What waits for W])
  std::vector<int> alive;  // stashes alive per stage
  /// Of those, the ones whose I ran and whose W has not (Note [What waits for W] in
  /// planner/CostModel.h: they are larger).
  std::vector<int> deferred;
};
std::vector<std::vector<HeldAtStart>> stashesHeldTogether(const Schedule& schedule);

}  // namespace pipefb::schedules
