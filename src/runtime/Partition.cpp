#include "pipefb/runtime/Partition.h"

#include <algorithm>
#include <limits>

#include "pipefb/common/Error.h"

namespace pipefb::runtime {

std::vector<StageRange> balancedPartition(const std::vector<int64_t>& costs, int S) {
  const int64_t L = static_cast<int64_t>(costs.size());
  if (S < 1 || S > L)
    throw UserError("pipeline.stages: " + std::to_string(S) + " stages for a model of " +
                    std::to_string(L) + " layers; allowed: 1.." + std::to_string(L) +
                    " (every stage needs at least one layer)");
  // best[k][i]: smallest max-stage cost splitting layers [0,i) into k stages.
  std::vector<int64_t> prefix(L + 1, 0);
  for (int64_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(S + 1, std::vector<int64_t>(L + 1, inf));
  std::vector<std::vector<int64_t>> cut(S + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= S; ++k)
    for (int64_t i = k; i <= L; ++i)
      for (int64_t j = k - 1; j < i; ++j) {  // last stage is [j, i)
        if (best[k - 1][j] == inf) continue;
        int64_t v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  std::vector<StageRange> out(S);
  int64_t i = L;
  for (int k = S; k >= 1; --k) {
    out[k - 1] = {cut[k][i], i};
    i = cut[k][i];
  }
  return out;
}

std::vector<StageRange> partitionFromCuts(const std::vector<int64_t>& cuts, int64_t L) {
  std::vector<StageRange> out;
  int64_t first = 0;
  for (int64_t c : cuts) {
    if (c <= first || c >= L)
      throw UserError("pipeline.partition: cut point " + std::to_string(c) +
                      " is out of order or out of range; allowed: strictly increasing layer "
                      "indices in 1.." +
                      std::to_string(L - 1) + " (the model has " + std::to_string(L) + " layers)");
    out.push_back({first, c});
    first = c;
  }
  out.push_back({first, L});
  return out;
}

// One rule, one place: the config's (Note [Stages per device] in schedules/Placement.h).
int stagesFor(const config::Config& c) { return config::pipelineStages(c); }

void checkProcesses(const std::string& source, int64_t D, int64_t R, int64_t worldSize) {
  const std::string launch =
      std::to_string(D * R) + " ranks (pipefb_launch -n " + std::to_string(D * R) + ")";
  if (R > 1 && worldSize == 0)
    throw UserError(source + ": pipeline.replicas: " + std::to_string(R) +
                    " replicas need one process per device; launch devices.count x replicas = " +
                    launch + ", or set pipeline.replicas: 1");
  if (worldSize > 0 && D * R != worldSize)
    throw UserError(source + ": devices.count: the schedule runs on " + std::to_string(D) +
                    " devices" + (R > 1 ? " x " + std::to_string(R) + " replicas" : std::string()) +
                    " but WORLD_SIZE=" + std::to_string(worldSize) +
                    "; one process per device: launch " + launch);
}

std::string toString(const std::vector<StageRange>& partition) {
  std::string s;
  for (const auto& r : partition) {
    if (!s.empty()) s += ' ';
    s += "[" + std::to_string(r.first) + "," + std::to_string(r.last) + ")";
  }
  return s;
}

}  // namespace pipefb::runtime
