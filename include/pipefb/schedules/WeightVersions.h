#pragma once
// Which weight versions a schedule stashes, where, and for which backwards.
//
// Note [Stashed weight versions]
// Note [Weight versions] (Generators.h) numbers the versions: STEP s.n makes version n+1
// on the device that runs it, RW s.n gives version n+1 to a forward device. F(s,m) runs on
// the version its device holds (fVersion) and B(s,m) on the one the backward device holds
// (bVersion). When they differ, B must differentiate at fVersion, so that version is
// *stashed*: the runtime keeps a copy of it apart from the live weights, category
// weight_versions (Note [Weights, versions and replicas] in PipelineEngine.cpp):
//  * a stage whose F and B share a device (pipedream): F(s,m) runs on a snapshot of the
//    live weights, made by the first such F of the version (the copy exists from the end
//    of that F) and used by every later F of the same version;
//  * a split stage whose B recomputes (BR: pipefb-async with a checkpoint kind): the
//    backward device copies the version at STEP s.v, the step that supersedes it (the copy
//    exists from the end of that STEP).
// A split stage whose B is not BR keeps its version in the forward copy its autograd
// graph holds, on the forward device; that is not a stashed version here (not tracked).
// A stashed version is needed until the last B of its microbatches. Offloading it
// (OFFW/PREW/DROPW, addWeightOffload in Lowering.h) is about these copies only.
#include <vector>

#include "pipefb/schedules/Schedule.h"

namespace pipefb::schedules {

struct StashedVersion {
  int stage = 0;
  int version = 0;
  int device = 0;                 // where the copy lives (the backward device)
  bool madeByStep = false;        // split stage: made by STEP s.version; else by the first F
  std::vector<int> microbatches;  // F ran on `version` and B runs on a later one, F order
};

/// The stashed versions of every stage, ordered by (stage, version). Pure; no checks (an
/// F without a B, or the reverse, is simply not a use).
std::vector<StashedVersion> stashedVersions(const Schedule& s);

}  // namespace pipefb::schedules
