#include "pipefb/schedules/HeldOffloads.h"

#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/ScheduleKind.h"

namespace pipefb::schedules {

// Note [Held offloads]
std::vector<std::vector<int>> heldOffloadReleases(const Schedule& lowered, bool async,
                                                  bool stepsPerMicrobatch) {
  const int M = lowered.numMicrobatches;
  std::vector<std::vector<int>> out(lowered.devices.size());
  for (size_t d = 0; d < lowered.devices.size(); ++d) {
    const std::vector<Action>& list = lowered.devices[d];
    const int n = static_cast<int>(list.size());
    out[d].assign(n, -1);
    std::vector<int> offs;  // indices of the device's OFFs, stash or weight version
    for (int i = 0; i < n; ++i)
      if (list[i].type == ActionType::Offload) offs.push_back(i);
    const int numOffs = static_cast<int>(offs.size());
    for (int k = 0; k < numOffs; ++k) {
      const Action& a = list[offs[k]];
      if (a.stash != StashKind::Activation || !lowered.placement.split(a.stage)) continue;
      // The device's next OFF of the same stage (a stash), in this iteration or, for an
      // asynchronous kind, any.
      bool again = false;
      for (int j = k + 1; j < numOffs && !again; ++j) {
        const Action& b = list[offs[j]];
        if (b.stash != StashKind::Activation || b.stage != a.stage) continue;
        again =
            async || iterationOf(b, stepsPerMicrobatch, M) == iterationOf(a, stepsPerMicrobatch, M);
        break;
      }
      // Released by the OFF kOffloadsInFlight later (with one in flight: the one above).
      if (again && k + kOffloadsInFlight < numOffs) out[d][offs[k]] = offs[k + kOffloadsInFlight];
    }
  }
  return out;
}

std::vector<std::vector<int>> heldOffloadReleases(const Schedule& lowered) {
  ScheduleKind kind{};
  const bool known = findScheduleKind(lowered.kind, kind);
  return heldOffloadReleases(lowered, known && isAsync(kind), known && stepsPerMicrobatch(kind));
}

}  // namespace pipefb::schedules
