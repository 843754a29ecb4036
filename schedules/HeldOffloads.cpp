#include "pipefb/schedules/HeldOffloads.h"

#include <utility>

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

namespace {
// The traits of `lowered.kind`: (async, stepsPerMicrobatch); a name that is no kind: neither.
std::pair<bool, bool> traits(const Schedule& lowered) {
  ScheduleKind kind{};
  const bool known = findScheduleKind(lowered.kind, kind);
  return {known && isAsync(kind), known && stepsPerMicrobatch(kind)};
}
}  // namespace

std::vector<std::vector<int>> heldOffloadReleases(const Schedule& lowered) {
  const auto [async, perMicrobatch] = traits(lowered);
  return heldOffloadReleases(lowered, async, perMicrobatch);
}

// Note [Prefetches across a flush]
std::vector<std::vector<bool>> prefetchesBoundLater(const Schedule& lowered, bool async,
                                                    bool stepsPerMicrobatch) {
  const int M = lowered.numMicrobatches;
  std::vector<std::vector<bool>> out(lowered.devices.size());
  for (size_t d = 0; d < lowered.devices.size(); ++d) {
    const std::vector<Action>& list = lowered.devices[d];
    out[d].assign(list.size(), false);
    if (async) continue;
    int next = -1;  // the iteration of the next compute action after i; -1: none
    for (size_t i = list.size(); i-- > 0;) {
      const Action& a = list[i];
      if (a.type == ActionType::Prefetch && a.stash == StashKind::Activation && next >= 0)
        out[d][i] = next < iterationOf(a, stepsPerMicrobatch, M);
      if (a.isCompute()) next = iterationOf(a, stepsPerMicrobatch, M);
    }
  }
  return out;
}

std::vector<std::vector<bool>> prefetchesBoundLater(const Schedule& lowered) {
  const auto [async, perMicrobatch] = traits(lowered);
  return prefetchesBoundLater(lowered, async, perMicrobatch);
}

}  // namespace pipefb::schedules
