#pragma once
// Checks a lowered schedule by running it abstractly.
//
// Note [Abstract run]
// Each device has a program counter. A device advances while its next action can run:
//  * a receive blocks until the matching send (same type/stage/index, peers agreeing) ran;
//  * OFF and PRE go to the device's copy engine, which runs them in issue order (as the
//    runtime's does, offload/TransferManager.h): an OFF finishes when it reaches the
//    head, a PRE once the OFF of the same stash finished (possibly on another device), and
//    a copy behind a waiting PRE waits too. PRE is issued without blocking; OFF waits while
//    kOffloadsInFlight of the device's OFFs have not finished. (Without the queue, 648 of
//    243,456 PipeFB placements the placement rule accepts were validated and deadlocked in
//    the simulator, which runs the queue: "1/1 1/1 0/1", pipefb-sync M=1 offload, lookahead
//    2, device 1's PRE2.0 waits ahead of its OFF0.0 for an OFF that waits on device 1. The
//    runtime would have run until its stall watchdog; they are refused now);
//  * B(s,m) blocks until its stash is on the device (local F not offloaded, or PRE done);
//  * F needs its input on the device (local F(s-1,m) or RA(s-1).m), B needs its gradient
//    (local B(s+1,m) or RG(s+1).m; for the last stage the output of F(S-1,m)); a missing
//    one is an error at once ("missing receive"), not a deadlock;
//  * a send needs the data it sends to have been produced on its device, and a send
//    between two devices of one PipeFB pass waits until its receiver is at the receive
//    (Note [Message rendezvous] in Messages.h);
//  * pipefb-async's STEP(s, k) waits until RW(s, k - 1) ran (Note [Weights by reference] in
//    src/runtime/WeightVersions.cpp: SW sends the weights themselves);
//  * I(s,m) is checked as B is and leaves the stash for W(s,m), which must follow it on the
//    same device (Note [Split backward]); the stash is in flight and resident until W.
// When no device can advance and some are not done, that is a deadlock. Afterwards every
// send must have been received. Counts of Note [Counting resident stashes] are checked
// against the contract at every F/B, and so are the stashed weight versions resident on
// each device: a version is made by its first F (or STEP, split stages), leaves with OFFW,
// comes back with PREW, and goes with DROPW or, without one, with its last B; a B whose
// version is in the host pool, a DROPW before the last B, or an OFFW never dropped is an
// error.
#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/schedules/ScheduleError.h"

namespace pipefb::schedules {

struct ValidationStats {
  std::vector<int> peakInFlight;               // per stage
  std::vector<std::vector<int>> peakResident;  // [device][stage] at F/B starts
  std::vector<int> peakWeightVersions;         // per stage
  /// [device][stage]: stashed weight versions resident at F/B starts (Note [Stashed weight
  /// versions]); checked against MemoryContract::residentWeightVersions.
  std::vector<std::vector<int>> peakResidentWeightVersions;
  /// Per stage: stashes whose I ran and W did not, at compute starts (Note [Split backward]);
  /// checked against MemoryContract::deferredW.
  std::vector<int> peakDeferredW;
};

/// Throws ScheduleError (with the step x device grid) on the first violation.
/// `contract` may be null (then only the structural checks run).
ValidationStats validate(const Schedule& s, const MemoryContract* contract = nullptr);

}  // namespace pipefb::schedules
