#include "pipefb/schedules/WeightVersions.h"

#include <algorithm>
#include <map>

namespace pipefb::schedules {

std::vector<StashedVersion> stashedVersions(const Schedule& s) {
  const int S = s.numStages;
  // (stage, mb) -> version at F / at B, by walking each device's list in order: only that
  // device's own STEP and RW change what it holds. Flat tables over [stage][mb - lo]
  // (Note [Lowering speed] in Lowering.h); hasB: whether B (or I) of (stage, mb) runs.
  const IndexSpan span = indexSpan(s);
  const int lo = span.lo;
  const size_t width = span.width();
  auto at = [&](int st, int m) { return static_cast<size_t>(st) * width + (m - lo); };
  std::vector<int> fVer(S * width, 0), bVer(S * width, 0);
  std::vector<char> hasB(S * width, 0), recompute(S * width, 0);
  std::vector<std::vector<int>> fOrder(S);
  for (int d = 0; d < s.numDevices(); ++d) {
    std::vector<int> cur(S, 0);
    for (const Action& a : s.devices[d]) {
      if (a.stage < 0 || a.stage >= S) continue;
      if (a.type == ActionType::Step || a.type == ActionType::RecvWeights)
        cur[a.stage] = a.index + 1;
      else if (a.type == ActionType::Forward && s.placement.forward(a.stage) == d) {
        fVer[at(a.stage, a.index)] = cur[a.stage];
        fOrder[a.stage].push_back(a.index);
      } else if (a.isInputBackward() && s.placement.backward(a.stage) == d) {
        // I and its W run on the version the device holds at I: a STEP waits for every W.
        bVer[at(a.stage, a.index)] = cur[a.stage];
        hasB[at(a.stage, a.index)] = 1;
        recompute[at(a.stage, a.index)] = a.recompute;
      }
    }
  }
  std::vector<StashedVersion> out;
  for (int st = 0; st < S; ++st) {
    const bool split = s.placement.split(st);
    std::map<int, StashedVersion> byVersion;
    for (int m : fOrder[st]) {
      const int f = fVer[at(st, m)];
      if (!hasB[at(st, m)] || bVer[at(st, m)] == f) continue;
      if (split && !recompute[at(st, m)]) continue;  // kept by the graph on the forward device
      StashedVersion& v = byVersion[f];
      v.stage = st;
      v.version = f;
      v.device = s.placement.backward(st);
      v.madeByStep = split;
      v.microbatches.push_back(m);
    }
    for (auto& [ver, v] : byVersion) out.push_back(std::move(v));
  }
  return out;
}

}  // namespace pipefb::schedules
