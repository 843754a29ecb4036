// The decoupled search: forward and backward partitions of their own (Note [Decoupled
// search] in Solver.h).
#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "SolverDetail.h"
#include "pipefb/planner/Solver.h"
#include "pipefb/schedules/Lowering.h"

namespace pipefb::planner {

using detail::kInf;
using detail::placementsOf;

std::vector<DecoupledChoice> decoupledChoices(const CostModel& modelIn, const PipelineShape& shape,
                                              const std::vector<StashPolicy>& policies) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shape.microbatchSize);
  std::vector<DecoupledChoice> out;
  if (shape.replicas != 1) return out;
  for (int d : shape.chain)  // Note [Devices and processes]: one process
    if (!model.cluster().sameProcess(d, shape.chain.front())) return out;
  for (StashPolicy p : policies) {
    const StashPolicy e = schedules::effectivePolicy(p, true);
    std::vector<int> lookaheads{shape.lookahead};
    if (shape.lookahead > 0 && schedules::isOffloaded(e)) lookaheads.push_back(0);
    for (bool host : placementsOf(shape))
      for (int la : lookaheads) {
        const DecoupledChoice c{e, host, la};
        if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
      }
  }
  return out;
}

namespace {

// One pass's partition of the L segments into `n` ranges on their devices: best[a][j] is
// the least score (pace, or bytes) of ranges 0..a-1 covering layers [0, j); a range's
// score is its device's (Note [Decoupled devices]) with its boundary's message, infinite
// over the device's limit. Returns the cuts (n + 1 of them) and the score, or nothing.
struct PassCuts {
  double score = kInf;
  std::vector<int> cuts;
};

// cost(a, i, j, d): the score of range a = [i, j) on its device, whose segments' load is d
// (infinite over the device's limit); floor(a, d): a part of it that only grows with the
// range, so the scan over i (j - 1 down to a - 1, one segment added each step) stops once
// it reaches the cap.
template <typename Cost, typename Floor>
PassCuts partitionPass(int L, int n, double cap,
                       const std::vector<const std::vector<StageEstimate>*>& est,
                       const PipelineShape& shape, bool forward, Cost cost, Floor floor) {
  std::vector<std::vector<double>> best(n + 1, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int>> arg(n + 1, std::vector<int>(L + 1, -1));
  best[0][0] = 0;
  for (int a = 1; a <= n; ++a)
    for (int j = a; j <= L - (n - a); ++j) {
      DecoupledDevice d;
      for (int i = j - 1; i >= a - 1; --i) {
        forward ? d.addForward((*est[a - 1])[i]) : d.addBackward((*est[a - 1])[i], shape);
        if (floor(a - 1, d) >= cap) break;
        if (best[a - 1][i] >= cap) continue;
        const double c = std::max(best[a - 1][i], cost(a - 1, i, j, d));
        if (c < best[a][j]) best[a][j] = c, arg[a][j] = i;
      }
    }
  PassCuts out;
  if (!(best[n][L] < cap)) return out;
  out.score = best[n][L];
  out.cuts.assign(n + 1, L);
  for (int a = n, j = L; a >= 1; --a) out.cuts[a - 1] = j = arg[a][j];
  return out;
}

}  // namespace

std::optional<Plan> solveDecoupledShape(const CostModel& modelIn, const PipelineShape& shapeIn,
                                        const std::vector<StashPolicy>& policies,
                                        const std::vector<std::int64_t>& limitsIn,
                                        std::int64_t hostLimit, Objective objective, double bound) {
  // Note [Planned reserve]: the search fits estimates; a plan's peaks hold the reserve.
  const std::vector<std::int64_t> limits =
      roomForEstimates(limitsIn, modelIn.cluster().reservePerMille);
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shapeIn.microbatchSize);
  const int L = model.numLayers(), Df = shapeIn.forwardDevices, Db = shapeIn.backwardDevices;
  if (Df < 1 || Db < 1 || Df > L || Db > L || !isSplit(shapeIn.kind)) return std::nullopt;
  const bool time = objective == Objective::Time;
  std::optional<Plan> best;
  for (const auto& choice : decoupledChoices(model, shapeIn, policies)) {
    const StashPolicy policy = choice.policy;
    const bool host = choice.optimizerOnHost;
    PipelineShape sh = stageShape(shapeIn, host);
    sh.stages = L;
    sh.lookahead = choice.lookahead;
    // Segment estimates per (range, layer): a segment's forward part depends only on its
    // forward device, its backward part only on its backward device, and of that device
    // only on its speed and host link (one process: Note [Devices and processes] does not
    // enter), so devices alike share them.
    std::map<std::tuple<double, double, double>, std::vector<StageEstimate>> cache[2];
    auto estimates = [&](int ranges, bool backward) {
      std::vector<const std::vector<StageEstimate>*> out;
      for (int a = 0; a < ranges; ++a) {
        const ClusterDevice& dev =
            model.cluster()
                .devices[backward ? sh.backwardRangeDevice(a) : sh.forwardRangeDevice(a)];
        auto key = std::make_tuple(dev.speed, dev.host.bandwidth, dev.host.latency);
        auto it = cache[backward].find(key);
        if (it == cache[backward].end()) {
          PipelineShape probe = sh;
          probe.forwardRange.assign(L, backward ? 0 : a);
          probe.backwardRange.assign(L, backward ? a : 0);
          std::vector<StageEstimate> v;
          for (int l = 0; l < L; ++l) v.push_back(model.stage(probe, l, l, l + 1, policy));
          it = cache[backward].emplace(key, std::move(v)).first;
        }
        out.push_back(&it->second);
      }
      return out;
    };
    const auto fwd = estimates(Df, false);
    const auto bwd = estimates(Db, true);
    std::int64_t hostBytes = 0;
    for (const StageEstimate& e : *fwd[0]) hostBytes += e.hostBytes;
    if (hostLimit >= 0 && hostBytes > hostLimit) continue;
    const double cap = best ? std::min(bound, time ? best->tau : double(best->peakMemory)) : bound;
    auto over = [&](int device, std::int64_t bytes) {
      return limits[device] >= 0 && bytes > limits[device];
    };
    auto score = [&](int device, const DecoupledDevice& d, const RangeBoundary& b) {
      const std::int64_t mem = d.memory() + b.bytes;
      if (over(device, mem)) return kInf;
      return time ? b.busy(d.time()) : double(mem);
    };
    // What only grows with a range: its device's time or bytes (infinite once over).
    auto floorAt = [&](int device, const DecoupledDevice& d) {
      if (over(device, d.memoryFloor())) return kInf;
      return time ? d.time() : double(d.memoryFloor());
    };
    const PassCuts fp = partitionPass(
        L, Df, cap, fwd, sh, true,
        [&](int a, int i, int j, const DecoupledDevice& d) {
          return score(sh.forwardRangeDevice(a), d, model.forwardRangeInput(sh, a, i));
        },
        [&](int a, const DecoupledDevice& d) { return floorAt(sh.forwardRangeDevice(a), d); });
    if (fp.cuts.empty()) continue;
    const PassCuts bp = partitionPass(
        L, Db, cap, bwd, sh, false,
        [&](int a, int i, int j, const DecoupledDevice& d) {
          if (a + 1 == Db && j != L) return kInf;  // the last range ends at the model's end
          return score(sh.backwardRangeDevice(a), d, model.backwardRangeOutput(sh, a, j, policy));
        },
        [&](int a, const DecoupledDevice& d) { return floorAt(sh.backwardRangeDevice(a), d); });
    if (bp.cuts.empty()) continue;
    Plan plan;
    plan.shape = sh;
    plan.shape.forwardRange.assign(L, 0);
    plan.shape.backwardRange.assign(L, 0);
    for (int a = 0; a < Df; ++a)
      for (int l = fp.cuts[a]; l < fp.cuts[a + 1]; ++l) plan.shape.forwardRange[l] = a;
    for (int r = 0; r < Db; ++r)
      for (int l = bp.cuts[r]; l < bp.cuts[r + 1]; ++l) plan.shape.backwardRange[l] = r;
    for (int l = 0; l < L; ++l) {
      StagePlan st;
      st.first = l;
      st.last = l + 1;
      st.policy = policy;
      st.optimizerOnHost = host;
      plan.stages.push_back(st);
    }
    evaluatePlan(model, plan);
    if (!best || (time ? plan.tau < best->tau : plan.peakMemory < best->peakMemory))
      best = std::move(plan);
  }
  return best;
}

}  // namespace pipefb::planner
