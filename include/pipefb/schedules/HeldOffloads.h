#pragma once
// What the transfer manager holds on a device, read off a lowered schedule: which offloaded
// stashes a device keeps after their copy to the host is done and which of its actions lets
// each go, and which prefetches get their destinations only at a later acquire. One table
// each for the runtime (src/runtime/Stash.cpp, through offload/TransferManager.h) and the
// simulator (src/sim/Simulator.cpp).
//
// Note [Held offloads]
// A split stage's forward device keeps the device copy of its stash (s,m) after the copy
// to the host is done when the device offloads stage s again before the flush (for an
// asynchronous schedule, at all): until the device's OFF kOffloadsInFlight OFFs later (by
// then the copy is done: that OFF waited for it, Note [Offloads in flight] in
// planner/CostModel.h), whether or not B(s,m) on its backward device took the stash
// meanwhile (Note [Held offload copies], offload/TransferManager.h). Every OFF counts
// towards that, of any stage, stash or weight version: each is one copy out through the
// device's copy engine. So the next F of stage s runs beside it, every time, as the memory
// contract charges (min(n, 1 + kOffloadsInFlight) stashes on the forward device). The last
// OFF before a flush is not held: with one microbatch in flight (n = 1) the device is
// charged the stash F builds and nothing else. Any other OFF releases its device copy as
// copied (Note [Release as copied]).
// The rule lived in the runtime alone, and the simulator released every stash as copied:
// vgg16/8 pipefb-async 2S at its plan, device 0 simulated 16.41 MiB against 25.66 MiB
// costed (22.77 MiB measured).
#include <vector>

#include "pipefb/schedules/Schedule.h"
#include "pipefb/schedules/ScheduleKind.h"

namespace pipefb::schedules {

/// Per device of a lowered schedule, per action: for an activation OFF whose device copy is
/// held (Note [Held offloads]), the index in the device's list of the OFF that releases it;
/// -1 for every other action. `async`: the kind does not flush (isAsync);
/// `stepsPerMicrobatch`: the kind's (ScheduleKind.h), for iterationOf.
std::vector<std::vector<int>> heldOffloadReleases(const Schedule& lowered, bool async,
                                                  bool stepsPerMicrobatch);
/// The same with the traits of `lowered.kind` (a name that is no kind: flushing, one step
/// per iteration).
std::vector<std::vector<int>> heldOffloadReleases(const Schedule& lowered);

/// Note [Prefetches across a flush]
/// A prefetch's device tensors are allocated when the plan issues it (Note [Planned
/// prefetch destinations], offload/TransferManager.h). A flushing schedule may issue the
/// first PREs of iteration k + 1 before the last Bs of iteration k (lookahead counts
/// compute actions, the flush included), while the memory contract counts the stashes in
/// flight within an iteration (min(n, lookahead + 1) near B). Those PREs get their tensors
/// at the device's first acquire of iteration k + 1, not when issued (bound at once,
/// vgg16/8 pipefb-sync-keep M=1 held the next iteration's stash beside B, 13% above the
/// plan). A prefetch's epoch is its microbatch's iteration (prefetchEpoch); asynchronous
/// schedules have no flush: their epoch is always 0.
/// Per device, per action: true for an activation PRE whose next compute action on the
/// device belongs to an earlier iteration (bound at an acquire, not when issued).
std::vector<std::vector<bool>> prefetchesBoundLater(const Schedule& lowered, bool async,
                                                    bool stepsPerMicrobatch);
std::vector<std::vector<bool>> prefetchesBoundLater(const Schedule& lowered);
inline int prefetchEpoch(int microbatch, int M, bool async) { return async ? 0 : microbatch / M; }

}  // namespace pipefb::schedules
