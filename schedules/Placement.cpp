#include "pipefb/schedules/Placement.h"

#include <algorithm>

#include "pipefb/common/Error.h"

namespace pipefb::schedules {

Placement::Placement(std::vector<StagePlacement> stages) : stages_(std::move(stages)) {
  for (size_t s = 0; s < stages_.size(); ++s) {
    const StagePlacement& p = stages_[s];
    if (p.forward < 0 || p.backward < 0)
      throw UserError("placement of stage " + std::to_string(s) + " uses a negative device (" +
                      std::to_string(p.forward) + "/" + std::to_string(p.backward) +
                      "); devices are numbered from 0");
    // The same bound as the schedule text's "device <n>:" lines. Without it a placement
    // such as 0/2147483647 overflowed `+ 1`, and 0/2000000000 made parseSchedule allocate
    // two billion action lists (both seen under fuzz/ScheduleFuzzer's ASan/UBSan).
    if (p.forward >= kMaxDevices || p.backward >= kMaxDevices)
      throw UserError("placement of stage " + std::to_string(s) + " uses device " +
                      std::to_string(std::max(p.forward, p.backward)) + "; devices are numbered " +
                      "0.." + std::to_string(kMaxDevices - 1));
    numDevices_ = std::max({numDevices_, p.forward + 1, p.backward + 1});
  }
}

Placement Placement::sameDevice(int numStages) {
  std::vector<StagePlacement> v;
  for (int s = 0; s < numStages; ++s) v.push_back({s, s});
  return Placement(std::move(v));
}

Placement Placement::pipefb(int numStages) {
  std::vector<StagePlacement> v;
  for (int s = 0; s < numStages; ++s) v.push_back({s, 2 * numStages - 1 - s});
  return Placement(std::move(v));
}

Placement Placement::defaultFor(const std::string& kind, int numStages) {
  if (kind.rfind("pipefb", 0) == 0) return pipefb(numStages);
  return sameDevice(numStages);
}

std::string Placement::toString() const {
  std::string out;
  for (const StagePlacement& p : stages_) {
    if (!out.empty()) out += " ";
    out += std::to_string(p.forward) + "/" + std::to_string(p.backward);
  }
  return out;
}

}  // namespace pipefb::schedules
