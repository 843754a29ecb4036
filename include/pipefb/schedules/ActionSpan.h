#pragma once
// When one action of a device's list ran: predicted by the simulator (sim::simulate) or
// measured by the runtime (runtime::PipelineEngine::records()). One type, so reports and
// fidelity checks compare like with like. Span j of device d is action j of
// schedule.devices[d]. LibTorch-free.
#include "pipefb/common/MemoryCategory.h"

namespace pipefb::schedules {

/// Times are seconds from the start of the run (the simulation's 0, or the engine's
/// clock origin, PipelineEngine::clockOriginNs()). The runtime records the time its
/// device worker spent in the action. The simulator's:
///  * F/B/STEP/AR: the compute interval.
///  * sends: the transfer, from leaving the sender to arriving at the receiver.
///  * receives: from reaching the action to holding the data (the wait).
///  * OFF/PRE: the copy on the device's copy engine.
///  * DROP: a point.
struct ActionSpan {
  double start = 0;
  double end = 0;
  /// The device's live bytes per category when the action ended. Measured by the runtime;
  /// the simulator leaves it zero (its memory is SimResult::memory, sampled per change).
  CategoryBytes liveAfter{};

  double seconds() const { return end - start; }
};

}  // namespace pipefb::schedules
