#pragma once
// What a schedule promises about memory (STYLE.md habit 4, like DeepSpeed's
// num_pipe_buffers()). The planner charges memory from it; the validator and the
// simulator check it.
#include <vector>

namespace pipefb::schedules {

/// All vectors are indexed by stage. Counts are upper bounds.
///
/// Note [Counting resident stashes]
/// A stash of (s,m) is *in flight* from the end of F(s,m) until B(s,m) consumed it
/// (or a Drop), wherever it lives. It is *resident* on a device while its bytes are
/// there: from F until Offload, and from Prefetch until B. Residency is counted at
/// the instants a compute action (F/B) starts, i.e. B(s,m) counts its own stash and
/// a stash offloaded right after its F is never resident (the simulator, which has
/// time, samples after all events of one instant).
struct MemoryContract {
  std::vector<int> inFlight;          // stashes of stage s alive anywhere (device or host)
  std::vector<int> residentForward;   // stashes of stage s resident on its forward device
  std::vector<int> residentBackward;  // ... on its backward device (== forward if same device)
  std::vector<int> weightVersions;    // distinct weight versions of stage s held at once
  /// Stashed weight versions of stage s (Note [Stashed weight versions]) resident on the
  /// device that keeps them, counted as stashes are (at compute starts). Empty: unchecked.
  std::vector<int> residentWeightVersions;
  /// Note [Split backward] (Action.h): stashes of stage s whose I ran and whose W has not,
  /// on its backward device, counted at compute starts (a W counts its own). They are part
  /// of residentBackward too; the offload lowering keeps them on the device (they cannot
  /// be prefetched lookahead actions ahead of I, they are already there). Empty: the
  /// schedule runs fused B only.
  std::vector<int> deferredW;
  /// Of those, the most at an I start of stage s (its own not counted: it is I's working
  /// set until I ends, Note [What waits for W] in planner/CostModel.h). Empty as deferredW.
  std::vector<int> deferredAtI;
};

/// Note [Offloads in flight] (planner/CostModel.h): the D2H copies a device may have
/// unfinished before its next OFF waits (the runtime's copy-engine backpressure,
/// TransferOptions::maxOffloadsInFlight). The runtime, the simulator and the planner's
/// cost model all take it from here.
inline constexpr int kOffloadsInFlight = 1;

}  // namespace pipefb::schedules
