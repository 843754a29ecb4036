// Exhaustive search for tests (BruteForce.h). Deliberately simple: it enumerates every
// combination explicitly and keeps the best, with no bounds and no dominance.
#include "pipefb/planner/BruteForce.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "pipefb/schedules/ZeroBubble.h"

namespace pipefb::planner {

namespace {

// Every ordered selection of `length` distinct devices out of D.
void chainsOf(int D, int length, std::vector<int>& cur, std::vector<bool>& used,
              std::vector<std::vector<int>>& out) {
  if (static_cast<int>(cur.size()) == length) {
    out.push_back(cur);
    return;
  }
  for (int d = 0; d < D; ++d) {
    if (used[d]) continue;
    used[d] = true;
    cur.push_back(d);
    chainsOf(D, length, cur, used, out);
    cur.pop_back();
    used[d] = false;
  }
}

// Every composition of L layers into S non-empty stages, as cut vectors [0, c1, ..., L].
void partitionsOf(int L, int S, std::vector<int>& cuts, std::vector<std::vector<int>>& out) {
  const int k = static_cast<int>(cuts.size()) - 1;  // stages placed so far
  if (k == S - 1) {
    cuts.push_back(L);
    out.push_back(cuts);
    cuts.pop_back();
    return;
  }
  for (int c = cuts.back() + 1; c <= L - (S - 1 - k); ++c) {
    cuts.push_back(c);
    partitionsOf(L, S, cuts, out);
    cuts.pop_back();
  }
}

}  // namespace

BruteForceResult bruteForce(const CostModel& model, const SolverOptions& options) {
  BruteForceResult res;
  res.objective = std::numeric_limits<double>::infinity();
  std::vector<ScheduleFamily> families = options.schedules;
  if (families.empty())
    for (ScheduleKind k : defaultScheduleKinds())
      families.push_back({toString(k), k, allStashPolicies()});
  const Cluster& cl = model.cluster();
  const int D = cl.numDevices(), L = model.numLayers();
  std::vector<std::int64_t> limits;
  for (int d = 0; d < D; ++d)
    limits.push_back(options.objective == Objective::Memory ? model.limit(d, -1)
                                                            : model.limit(d, options.budget));
  const std::vector<bool> opts = optimizerPlacements(options.optimizerOffload);
  const int nO = static_cast<int>(opts.size());
  std::int64_t hostLimit = cl.hostPool;
  if (options.hostBudget >= 0)
    hostLimit = hostLimit < 0 ? options.hostBudget : std::min(hostLimit, options.hostBudget);

  // Keeps `plan` when it fits and beats the best so far.
  auto consider = [&](const PipelineShape& sh, const std::vector<StageEstimate>& chosen,
                      const std::vector<int>& cut, bool allowed, auto makePlan) {
    ++res.visited;
    const PlanLoad load = planLoad(model, sh, chosen, cut);
    bool ok = allowed && (hostLimit < 0 || load.hostBytes <= hostLimit);
    std::int64_t peak = 0;
    for (int d = 0; d < D && ok; ++d) {
      if (limits[d] >= 0 && load.deviceMemory[d] > limits[d]) ok = false;
      peak = std::max(peak, load.deviceMemory[d]);
    }
    if (!ok) return;
    const double obj =
        options.objective == Objective::Time ? sh.iterationTime(load.tau) : double(peak);
    if (obj >= res.objective) return;
    res.objective = obj;
    res.feasible = true;
    res.plan = makePlan();
    evaluatePlan(model, res.plan);
  };

  // Note [Decoupled search]: Df forward and Db backward devices, every chain, every
  // forward and every backward partition of the layers (each layer a segment), one policy
  // and optimizer placement for all segments.
  const bool decoupled = options.decoupledPlacements &&
                         (options.maxStages == 0 || options.maxStages >= L) &&
                         L <= kDecoupledExactLayers;
  for (const ScheduleFamily& fam : families) {
    if (!decoupled || !foldsAndDecouples(fam.kind)) continue;
    std::vector<int> Ms = microbatchCounts(options.batch, options.maxMicrobatches);
    if (options.microbatches > 0)
      Ms = options.batch % options.microbatches == 0 ? std::vector<int>{options.microbatches}
                                                     : std::vector<int>{};
    std::vector<int> layerCuts;
    for (int l = 0; l <= L; ++l) layerCuts.push_back(l);
    for (int M : Ms)
      for (int n = 2; n <= D; ++n) {
        std::vector<std::vector<int>> chains;
        std::vector<int> cur;
        std::vector<bool> used(D, false);
        chainsOf(D, n, cur, used, chains);
        for (int Df = 1; Df < n && Df <= L && n - Df <= L; ++Df) {
          std::vector<std::vector<int>> fparts, bparts;
          std::vector<int> c0{0};
          partitionsOf(L, Df, c0, fparts);
          c0 = {0};
          partitionsOf(L, n - Df, c0, bparts);
          for (const auto& chain : chains) {
            PipelineShape sh = PipelineShape::of(fam.kind, L, M, options.batch, options.lookahead);
            sh.asyncLag = options.asyncLag;
            sh.optimizerPerStage = options.optimizerOffload == OptimizerOffload::PerStage;
            sh.optimizerOnHost = options.optimizerOffload == OptimizerOffload::Host;
            sh.forwardDevices = Df;
            sh.backwardDevices = n - Df;
            sh.chain = chain;
            sh.corePace = model.corePace(sh);
            sh.fill = model.fill(sh);
            for (const auto& choice : decoupledChoices(model, sh, fam.policies)) {
              const auto policy = choice.policy;
              const bool host = choice.optimizerOnHost;
              for (const auto& fc : fparts)
                for (const auto& bc : bparts) {
                  PipelineShape s2 = stageShape(sh, host);
                  s2.lookahead = choice.lookahead;
                  s2.forwardRange.assign(L, 0);
                  s2.backwardRange.assign(L, 0);
                  for (int a = 0; a < Df; ++a)
                    for (int l = fc[a]; l < fc[a + 1]; ++l) s2.forwardRange[l] = a;
                  for (int r = 0; r < n - Df; ++r)
                    for (int l = bc[r]; l < bc[r + 1]; ++l) s2.backwardRange[l] = r;
                  std::vector<StageEstimate> chosen;
                  for (int l = 0; l < L; ++l)
                    chosen.push_back(model.at(s2.microbatchSize).stage(s2, l, l, l + 1, policy));
                  consider(s2, chosen, layerCuts, true, [&] {
                    Plan p;
                    p.family = fam.name;
                    p.shape = s2;
                    for (int l = 0; l < L; ++l) {
                      StagePlan st;
                      st.first = l;
                      st.last = l + 1;
                      st.policy = policy;
                      st.optimizerOnHost = host;
                      p.stages.push_back(st);
                    }
                    return p;
                  });
                }
            }
          }
        }
      }
  }

  for (const ScheduleFamily& fam : families) {
    // Policies that behave identically under this placement are tried once.
    // A folded shape's middle stage (odd S) is not split: there every policy differs.
    std::vector<StashPolicy> splitPols, allPols;
    for (StashPolicy p : fam.policies)
      for (auto [list, e] :
           {std::pair{&splitPols, schedules::effectivePolicy(p, isSplit(fam.kind))},
            std::pair{&allPols, p}})
        if (std::find(list->begin(), list->end(), e) == list->end()) list->push_back(e);
    for (int R : replicaCounts(cl, options)) {  // Note [Replicated pipelines]
      const std::int64_t sub = options.batch / R;
      std::vector<int> Ms = microbatchCounts(sub, options.maxMicrobatches);
      if (options.microbatches > 0)
        Ms = sub % options.microbatches == 0 ? std::vector<int>{options.microbatches}
                                             : std::vector<int>{};
      for (int M : Ms) {
        for (int S = 1; S <= L; ++S)
          for (bool folded : {false, true}) {  // Note [Folded placements]: PipeFB on S devices
            if (options.maxStages > 0 && S > options.maxStages) break;
            if (folded && (!foldsAndDecouples(fam.kind) || S < 2 || !options.foldedPlacements))
              continue;
            if (!schedules::takesShape(toString(fam.kind), S, M)) continue;
            PipelineShape sh = PipelineShape::of(fam.kind, S, M, sub, options.lookahead);
            sh.asyncLag = options.asyncLag;
            sh.replicas = R;
            sh.folded = folded;
            sh.optimizerOnHost = options.optimizerOffload == OptimizerOffload::Host;
            sh.optimizerPerStage = options.optimizerOffload == OptimizerOffload::PerStage;
            const int len = sh.chainLength();
            if (R * len > D) continue;
            const std::vector<StashPolicy>& pols = folded && S % 2 == 1 ? allPols : splitPols;
            std::vector<std::vector<int>> chains, parts;
            std::vector<int> cur;
            std::vector<bool> used(D, false);
            chainsOf(D, len, cur, used, chains);
            std::vector<int> cuts{0};
            partitionsOf(L, S, cuts, parts);
            for (const auto& chain : chains) {
              sh.chain = chain;
              sh.corePace = model.corePace(sh);  // Note [Shared cores]
              sh.fill = model.fill(sh);          // Note [Zero-bubble fill]
              for (const auto& cut : parts) {
                // Stage costs per (stage, policy, optimizer placement), then every
                // combination (Note [Optimizer placement search]: choice c is the policy
                // pols[c / nO] with the placement opts[c % nO]).
                std::vector<std::vector<StageEstimate>> est(S);
                for (int k = 0; k < S; ++k)
                  for (StashPolicy p : pols)
                    for (bool oh : opts)
                      est[k].push_back(model.at(sh.microbatchSize)
                                           .stage(stageShape(sh, oh), k, cut[k], cut[k + 1], p));
                std::vector<int> choice(S, 0);
                while (true) {
                  // Note [Devices and processes]: a stage split across processes can only
                  // take a checkpoint kind.
                  bool allowed = true;
                  for (int k = 0; k < S; ++k)
                    if (inputStashOnly(cl, sh, k) && !schedules::isCheckpoint(pols[choice[k] / nO]))
                      allowed = false;
                  std::vector<StageEstimate> chosen;
                  for (int k = 0; k < S; ++k) chosen.push_back(est[k][choice[k]]);
                  consider(sh, chosen, cut, allowed, [&] {
                    Plan p;
                    p.family = fam.name;
                    p.shape = sh;
                    for (int k = 0; k < S; ++k) {
                      StagePlan st;
                      st.first = cut[k];
                      st.last = cut[k + 1];
                      st.policy = pols[choice[k] / nO];
                      st.optimizerOnHost = opts[choice[k] % nO];
                      p.stages.push_back(st);
                    }
                    return p;
                  });
                  int k = 0;
                  while (k < S && ++choice[k] == static_cast<int>(pols.size()) * nO)
                    choice[k++] = 0;
                  if (k == S) break;
                }
              }
            }
          }
      }
    }
  }
  return res;
}

}  // namespace pipefb::planner
