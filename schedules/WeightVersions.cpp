#include "pipefb/schedules/WeightVersions.h"

#include <map>

namespace pipefb::schedules {

std::vector<StashedVersion> stashedVersions(const Schedule& s) {
  const int S = s.numStages;
  // (stage, mb) -> version at F / at B, by walking each device's list in order: only that
  // device's own STEP and RW change what it holds.
  std::vector<std::map<int, int>> fVer(S), bVer(S);
  std::vector<std::map<int, bool>> recompute(S);
  std::vector<std::vector<int>> fOrder(S);
  for (int d = 0; d < s.numDevices(); ++d) {
    std::vector<int> cur(S, 0);
    for (const Action& a : s.devices[d]) {
      if (a.stage < 0 || a.stage >= S) continue;
      if (a.type == ActionType::Step || a.type == ActionType::RecvWeights)
        cur[a.stage] = a.index + 1;
      else if (a.type == ActionType::Forward && s.placement.forward(a.stage) == d) {
        fVer[a.stage][a.index] = cur[a.stage];
        fOrder[a.stage].push_back(a.index);
      } else if (a.isInputBackward() && s.placement.backward(a.stage) == d) {
        // I and its W run on the version the device holds at I: a STEP waits for every W.
        bVer[a.stage][a.index] = cur[a.stage];
        recompute[a.stage][a.index] = a.recompute;
      }
    }
  }
  std::vector<StashedVersion> out;
  for (int st = 0; st < S; ++st) {
    const bool split = s.placement.split(st);
    std::map<int, StashedVersion> byVersion;
    for (int m : fOrder[st]) {
      auto b = bVer[st].find(m);
      if (b == bVer[st].end() || b->second == fVer[st][m]) continue;
      if (split && !recompute[st][m]) continue;  // kept by the graph on the forward device
      StashedVersion& v = byVersion[fVer[st][m]];
      v.stage = st;
      v.version = fVer[st][m];
      v.device = s.placement.backward(st);
      v.madeByStep = split;
      v.microbatches.push_back(m);
    }
    for (auto& [ver, v] : byVersion) out.push_back(std::move(v));
  }
  return out;
}

}  // namespace pipefb::schedules
