#pragma once
// The schedule kinds: one enum and one table of names and traits (issue 15, "one rule,
// one place"). The config's pipeline.schedule, the generators, the planner's families,
// the runtime and the trainer all read this table; none keeps a list of its own.
//
// Note [Adding a schedule kind]
// Add an enumerator to ScheduleKind and one row to scheduleKinds() (ScheduleKind.cpp),
// then a generator case in makeSchedule (Generators.cpp). The compiler's -Werror=switch
// points at every switch over ScheduleKind that must learn the new kind (the planner's
// closed forms, the generators); names, parsing, "did you mean" and the traits below
// come from the row.
#include <string>
#include <vector>

namespace pipefb::schedules {

enum class ScheduleKind {
  GPipe,
  OneFOneB,
  PipeDream,
  PipeFbSync,
  PipeFbAsync,
  // Split backward (I/W) and interleaved kinds (ZeroBubble.h).
  ZbH1,
  ZbH2,
  Zbv,
  Interleaved1F1B,
  PipeFbZb,
  InterleavedZb,
};

/// A kind's default placement (Placement::defaultFor).
enum class DefaultPlacement {
  SameDevice,  // stage s on device s for F and B (Placement::sameDevice)
  PipeFb,      // F(s) on s, B(s) on 2S-1-s (Placement::pipefb)
  Looped,      // two stages per device, stage s on s mod S/2 (Placement::looped)
  VShape,      // stage s on min(s, S-1-s) (Placement::vShape)
};

/// One row of the table.
struct ScheduleKindInfo {
  ScheduleKind kind;
  const char* name;  // the pipeline.schedule / plan-file / --schedules spelling
  /// Its default placement. PipeFb runs F and B of a stage on two devices; whether one
  /// stage IS split is Placement::split(stage), never a name.
  DefaultPlacement placement;
  /// Forwards may run on weights older than the backward's (weight stashing): the
  /// pipeline is not flushed per iteration and step() returns before the iteration ends.
  bool async;
  /// One optimizer step per microbatch (STEP s.m), not one per iteration (STEP s.k).
  bool stepPerMicrobatch;
  /// Its backward is split into I and W (Note [Split backward], Action.h).
  bool splitBackward;
};

namespace detail {
/// The table's rows (ScheduleKind.cpp), in enum order. Constant-initialised, so info()
/// reads it inline, without a function-local static's guard: the planner's cost model
/// asks for a kind's traits millions of times per solve.
extern const ScheduleKindInfo kScheduleKindRows[];
}  // namespace detail

/// Every kind, in enum order.
const std::vector<ScheduleKindInfo>& scheduleKinds();
inline const ScheduleKindInfo& info(ScheduleKind k) {
  return detail::kScheduleKindRows[static_cast<int>(k)];
}
const char* toString(ScheduleKind k);
/// The names, in enum order: "gpipe", "1f1b", "pipedream", "pipefb-sync", "pipefb-async".
std::vector<std::string> scheduleKindNames();
/// By name; anything else is a UserError with "did you mean" and the allowed names.
ScheduleKind parseScheduleKind(const std::string& name);
/// By name; false (and `out` untouched) for anything else.
bool findScheduleKind(const std::string& name, ScheduleKind& out);

inline bool usesSplitPlacement(ScheduleKind k) {
  return info(k).placement == DefaultPlacement::PipeFb;
}
inline bool isAsync(ScheduleKind k) { return info(k).async; }
/// Flushes every iteration (its iteration time has a fill/drain bubble): not async.
inline bool isFlushing(ScheduleKind k) { return !info(k).async; }
inline bool stepsPerMicrobatch(ScheduleKind k) { return info(k).stepPerMicrobatch; }
inline bool splitsBackward(ScheduleKind k) { return info(k).splitBackward; }

}  // namespace pipefb::schedules
