#pragma once
// A schedule: one ordered action list per device, plus the shape it was made for.
//
// Note [Schedule text form]
//   # comments and blank lines are ignored
//   kind 1f1b
//   stages 4
//   microbatches 8          (per iteration)
//   iterations 1
//   placement 0/0 1/1 2/2 3/3   (forward/backward device of each stage)
//   device 0: F0.0 SA0.0>1 F0.1 ...
//   device 1: ...
// A device line may repeat ("device 0:" again appends). Every device 0..D-1 of the
// placement gets a list (possibly empty). Parse errors are pipefb::UserError naming the
// source, the line and the token.
#include <cstddef>
#include <string>
#include <vector>

#include "pipefb/schedules/Action.h"
#include "pipefb/schedules/Placement.h"

namespace pipefb::schedules {

struct Schedule {
  std::string kind;         // generator name, informational ("custom" for hand-written)
  int numStages = 0;        // S
  int numMicrobatches = 0;  // M, per iteration
  int numIterations = 1;    // K; microbatch indices run over [0, K*M)
  Placement placement;
  std::vector<std::vector<Action>> devices;  // devices[d] = ordered actions of device d

  int numDevices() const { return static_cast<int>(devices.size()); }
  int totalMicrobatches() const { return numMicrobatches * numIterations; }
  std::size_t numActions() const;
  bool operator==(const Schedule& o) const;
};

/// The iteration an action of a schedule with M microbatches per iteration belongs to: its
/// microbatch's, or for STEP, SW, RW and AR its step's (one per microbatch when the kind
/// steps per microbatch, ScheduleKind.h); -1 for OFFW, PREW and DROPW, which belong to the
/// action before them on their device. The runtime feeds an iteration's inputs to a
/// same-device stage 0 once that device ran every action before its first one of it
/// (Note [Overlapping iterations] in src/runtime/PipelineEngine.cpp), and the planner's
/// cost model counts them so (Note [Held at a same-device stage's starts] in Lowering.h).
int iterationOf(const Action& a, bool stepsPerMicrobatch, int M);

/// The microbatch indices of a schedule's actions, [lo, hi] with lo <= 0 (hi < lo: no
/// action): the span of the flat tables over (stage, index) that lowering keeps (Note
/// [Lowering speed] in Lowering.h).
struct IndexSpan {
  int lo = 0, hi = -1;
  size_t width() const { return static_cast<size_t>(hi - lo + 1); }
};
IndexSpan indexSpan(const Schedule& s);

/// The whole schedule in the text form (Note [Schedule text form]).
std::string toText(const Schedule& s);
/// Parses the text form. `source` names the file in error messages.
Schedule parseSchedule(const std::string& text, const std::string& source = "<schedule>");
/// Reads/writes a file; a missing file is a UserError.
Schedule loadSchedule(const std::string& path);
void saveSchedule(const Schedule& s, const std::string& path);

}  // namespace pipefb::schedules
