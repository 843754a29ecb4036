// The planner's search over shapes (Note [Solver search] in Solver.h).
#include "pipefb/planner/Solver.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "SolverDetail.h"
#include "pipefb/schedules/ZeroBubble.h"

namespace pipefb::planner {

using detail::kInf;
using detail::prefetchFurther;

// ---------------------------------------------------------------------------------------
// Plan evaluation

int Plan::bindingStage() const {
  int best = 0;
  for (int s = 1; s < static_cast<int>(stages.size()); ++s)
    if (stages[s].estimate.time > stages[best].estimate.time) best = s;
  return best;
}

int Plan::bindingDevice(const CostModel& m, std::int64_t budget) const {
  int best = -1;
  double bestUse = -1;
  for (int d = 0; d < static_cast<int>(deviceMemory.size()); ++d) {
    if (deviceMemory[d] == 0) continue;
    std::int64_t lim = m.limit(d, budget);
    double use = lim > 0 ? double(deviceMemory[d]) / double(lim) : double(deviceMemory[d]) * 1e-30;
    if (use > bestUse) bestUse = use, best = d;
  }
  return best;
}

void evaluatePlan(const CostModel& modelIn, Plan& plan) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  plan.shape.corePace = model.corePace(plan.shape);  // Note [Shared cores]
  plan.shape.fill = model.fill(plan.shape);          // Note [Zero-bubble fill]
  const PipelineShape& sh = plan.shape;
  // Note [Optimizer placement search]: each stage is costed with its own placement.
  const PipelineShape onDevice = stageShape(sh, false), onHost = stageShape(sh, true);
  std::vector<StageEstimate> est;
  std::vector<int> cuts{0};
  for (int k = 0; k < static_cast<int>(plan.stages.size()); ++k) {
    StagePlan& sp = plan.stages[k];
    sp.forwardDevice = sh.forwardDevice(k);
    sp.backwardDevice = sh.backwardDevice(k);
    sp.estimate =
        model.stage(sp.optimizerOnHost ? onHost : onDevice, k, sp.first, sp.last, sp.policy);
    est.push_back(sp.estimate);
    cuts.push_back(sp.last);
  }
  PlanLoad load = planLoad(model, sh, est, cuts);
  plan.tau = load.tau;
  plan.hostBytes = load.hostBytes;
  plan.deviceMemory = std::move(load.deviceMemory);
  plan.deviceReserve = std::move(load.deviceReserve);
  plan.iterationTime = sh.iterationTime(plan.tau);
  plan.throughput =
      plan.iterationTime > 0
          ? double(sh.replicas * sh.microbatches * sh.microbatchSize) / plan.iterationTime
          : 0;
  plan.peakMemory = 0;
  for (auto m : plan.deviceMemory) plan.peakMemory = std::max(plan.peakMemory, m);
}

// ---------------------------------------------------------------------------------------
// The search over shapes

namespace {

// The least a layer leaves on the backward devices: weights, gradients and optimizer state,
// or with the optimizer allowed on the host the copy B runs on and its gradients (Note
// [Half-precision weights on a device]). A lower bound of the decoupled searches.
std::int64_t leastStaticBytes(const LayerCost& l, OptimizerOffload offload) {
  return offload == OptimizerOffload::None ? l.paramBytes + l.gradBytes + l.optimizerBytes
                                           : forwardParamBytes(l) + hostedGradBytes(l);
}

struct Job {
  const ScheduleFamily* family;
  PipelineShape shape;
  double bound;
};

double objectiveOf(const Plan& p, Objective o) {
  return o == Objective::Time ? p.iterationTime : double(p.peakMemory);
}

// Note [Decoupled search]: PipeFB families also as (M, Df, Db, chain) shapes, each
// with a lower bound of its objective: the pace of both passes spread over their devices,
// or the states spread over the chain.
template <typename Chains>
void addDecoupledJobs(const CostModel& model, const SolverOptions& options,
                      const std::vector<ScheduleFamily>& families, Chains& chains,
                      std::vector<Job>& jobs, SolveResult& res) {
  const int D = model.cluster().numDevices(), L = model.numLayers();
  if (!options.decoupledPlacements || (options.maxStages > 0 && options.maxStages < L)) return;
  const Profile& prof = model.profile();
  double sumStep = 0;
  std::int64_t sumStatic = 0, sumW = 0;
  for (const auto& l : prof.layers) {
    sumW += forwardParamBytes(l);  // what forward devices hold at least
    sumStep += l.step;
    sumStatic += leastStaticBytes(l, options.optimizerOffload);
  }
  for (const ScheduleFamily& fam : families) {
    if (!foldsAndDecouples(fam.kind)) continue;
    if (L > kDecoupledExactLayers) {
      res.decoupledSkipped = true;
      continue;
    }
    std::vector<int> Ms = microbatchCounts(options.batch, options.maxMicrobatches);
    if (options.microbatches > 0)
      Ms = options.batch % options.microbatches == 0 ? std::vector<int>{options.microbatches}
                                                     : std::vector<int>{};
    for (int M : Ms)
      for (int n = 2; n <= D; ++n)
        for (const auto& ch : chains(n))
          for (int Df = 1; Df < n; ++Df) {
            PipelineShape sh = PipelineShape::of(fam.kind, L, M, options.batch, options.lookahead);
            sh.asyncLag = options.asyncLag;  // Note [Planned async lag]
            sh.optimizerOnHost = options.optimizerOffload == OptimizerOffload::Host;
            sh.optimizerPerStage = options.optimizerOffload == OptimizerOffload::PerStage;
            sh.forwardDevices = Df;
            sh.backwardDevices = n - Df;
            sh.chain = ch;
            sh.corePace = model.corePace(sh);  // Note [Shared cores]
            sh.fill = model.fill(sh);          // Note [Zero-bubble fill]
            double bound;
            if (options.objective == Objective::Time) {
              const double f = model.scale(sh);
              double sf = 0, sb = 0;
              for (int a = 0; a < Df; ++a) sf += model.speed(sh, sh.forwardRangeDevice(a));
              for (int r = 0; r < n - Df; ++r) sb += model.speed(sh, sh.backwardRangeDevice(r));
              const double step = sumStep * stepsPerMicrobatch(fam.kind, M);
              bound = sh.iterationTime(std::max(model.forwardTime(0, L, f) / sf,
                                                (model.backwardTime(0, L, f) + step) / sb));
            } else {
              // The backward devices hold every W + G (+ O), the forward ones every W.
              bound = std::max(double(sumStatic) / (n - Df), double(sumW) / Df);
            }
            jobs.push_back({&fam, sh, bound});
          }
  }
}

SolveResult search(const CostModel& model, const SolverOptions& options,
                   const std::vector<std::int64_t>& limits, std::int64_t hostLimit) {
  const auto t0 = std::chrono::steady_clock::now();
  SolveResult res;
  std::vector<ScheduleFamily> families = options.schedules;
  if (families.empty())
    for (ScheduleKind k : defaultScheduleKinds())
      families.push_back({toString(k), k, allStashPolicies()});
  const Cluster& cl = model.cluster();
  const int D = cl.numDevices(), L = model.numLayers();
  const Profile& prof = model.profile();
  double sumStep = 0;
  std::int64_t sumStatic = 0;
  for (const auto& l : prof.layers) {
    sumStep += l.step;
    // (The optimizer state may live in the host pool: then it bounds nothing.)
    sumStatic += leastStaticBytes(l, options.optimizerOffload);
  }
  std::map<int, std::vector<std::vector<int>>> chainCache;
  auto chains = [&](int len) -> const std::vector<std::vector<int>>& {
    auto it = chainCache.find(len);
    if (it != chainCache.end()) return it->second;
    bool heur = false;
    auto v = distinctChains(cl, len, options.maxChains, &heur);
    res.heuristicChains = res.heuristicChains || heur;
    return chainCache.emplace(len, std::move(v)).first->second;
  };

  std::vector<Job> jobs;
  for (const ScheduleFamily& fam : families)
    for (int R : replicaCounts(cl, options)) {
      const bool split = isSplit(fam.kind);
      const std::int64_t sub = options.batch / R;  // Note [Replicated pipelines]
      std::vector<int> Ms = microbatchCounts(sub, options.maxMicrobatches);
      if (options.microbatches > 0)
        Ms = sub % options.microbatches == 0 ? std::vector<int>{options.microbatches}
                                             : std::vector<int>{};
      // Note [Folded search]: PipeFB also folded onto S devices (S >= 2).
      const bool shared = PipelineShape::of(fam.kind, 1, 1, 1, 1).sharesDevices();
      if (shared && L > kSharedExactLayers) {  // Note [Shared search]
        res.sharedSkipped = true;
        continue;
      }
      for (bool folded : {false, true}) {
        if (folded && (!foldsAndDecouples(fam.kind) || !options.foldedPlacements)) continue;
        if (folded && L > kFoldedExactLayers) {
          res.foldedSkipped = true;
          continue;
        }
        // Note [Shared devices]: two stages on every device.
        int maxS = (split && !folded ? D / 2 : shared ? 2 * D : D) / R;
        maxS = std::min(maxS, L);
        if (options.maxStages > 0) maxS = std::min(maxS, options.maxStages);
        for (int M : Ms) {
          for (int S = folded ? 2 : 1; S <= maxS; ++S) {
            if (!schedules::takesShape(toString(fam.kind), S, M)) continue;
            PipelineShape sh = PipelineShape::of(fam.kind, S, M, sub, options.lookahead);
            sh.asyncLag = options.asyncLag;  // Note [Planned async lag]
            sh.replicas = R;
            sh.folded = folded;
            // Note [Optimizer placement search]
            sh.optimizerOnHost = options.optimizerOffload == OptimizerOffload::Host;
            sh.optimizerPerStage = options.optimizerOffload == OptimizerOffload::PerStage;
            // Note [Microbatch scaling]: the whole model's F and B at this microbatch.
            const double sumF = model.forwardTime(0, L, model.scale(sh));
            const double sumB = model.backwardTime(0, L, model.scale(sh));
            for (const auto& ch : chains(sh.chainLength())) {
              sh.chain = ch;
              sh.corePace = model.corePace(sh);  // Note [Shared cores]
              sh.fill = model.fill(sh);          // Note [Zero-bubble fill]
              double bound;
              if (options.objective == Objective::Time) {
                double sf = 0, sb = 0;
                for (int k = 0; k < S; ++k) {
                  sf += model.speed(sh, sh.forwardDevice(k));
                  sb += model.speed(sh, sh.backwardDevice(k));
                }
                if (shared) {  // each device once
                  sf = 0;
                  for (int d : sh.chain) sf += model.speed(sh, d);
                }
                const double step = sumStep * stepsPerMicrobatch(fam.kind, M);
                double tau = split && !folded ? std::max(sumF / sf, (sumB + step) / sb)
                                              : (sumF + sumB + step) / sf;
                bound = sh.iterationTime(tau);
              } else {
                // (every device holds its stages' states: the fullest at least the mean)
                bound = double(sumStatic) / sh.chainLength();
              }
              jobs.push_back({&fam, sh, bound});
            }
          }
        }
      }
    }
  addDecoupledJobs(model, options, families, chains, jobs, res);
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const Job& a, const Job& b) { return a.bound < b.bound; });
  res.shapesTotal = static_cast<long>(jobs.size());
  const size_t keep = static_cast<size_t>(std::max(1, options.keepTop));
  std::vector<Plan>& top = res.candidates;
  for (const Job& job : jobs) {
    // Shapes that cannot beat the best found are skipped; the kept candidates are the
    // best plans met on the way (at most keepTop), re-scored by the simulator later.
    if (!top.empty() && job.bound >= objectiveOf(top.front(), options.objective)) break;
    ++res.shapesSolved;
    // Cap the DP at the pace (or peak) that would tie the worst kept candidate.
    double bound = kInf;
    if (!top.empty()) {
      const double worst = objectiveOf(top.front(), options.objective);
      bound = options.objective == Objective::Time ? worst / job.shape.slots() : worst;
      bound *= 1 + 1e-12;
    }
    auto plan = job.shape.decoupled()
                    ? solveDecoupledShape(model, job.shape, job.family->policies, limits, hostLimit,
                                          options.objective, bound)
                    : solveShape(model, job.shape, job.family->policies, limits, hostLimit,
                                 options.objective, bound);
    if (!plan) continue;
    plan->family = job.family->name;
    const double v = objectiveOf(*plan, options.objective);
    if (top.size() >= keep && v >= objectiveOf(top.back(), options.objective)) continue;
    auto pos = std::upper_bound(top.begin(), top.end(), v, [&](double x, const Plan& p) {
      return x < objectiveOf(p, options.objective);
    });
    top.insert(pos, std::move(*plan));
    if (top.size() > keep) top.pop_back();
  }
  res.feasible = !top.empty();
  if (res.feasible) res.best = top.front();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::vector<std::int64_t> limitsFor(const CostModel& model, std::int64_t budget) {
  std::vector<std::int64_t> out;
  for (int d = 0; d < model.cluster().numDevices(); ++d) out.push_back(model.limit(d, budget));
  return out;
}

std::int64_t hostLimitFor(const CostModel& model, std::int64_t hostBudget) {
  std::int64_t c = model.cluster().hostPool;
  if (hostBudget < 0) return c;
  if (c < 0) return hostBudget;
  return std::min(c, hostBudget);
}

}  // namespace

SolveResult minimalBudget(const CostModel& model, const SolverOptions& optionsIn) {
  SolverOptions o = optionsIn;
  o.objective = Objective::Memory;
  o.budget = -1;
  o.validate();
  const std::int64_t host = hostLimitFor(model, o.hostBudget);
  SolveResult r = search(model, o, limitsFor(model, -1), host);
  if (r.feasible) {
    r.minimalBudget = r.best.peakMemory;
    r.minimalPlan = r.best;
    return r;
  }
  // Not even the full capacities: report what it would take without them.
  SolveResult u =
      search(model, o, std::vector<std::int64_t>(model.cluster().numDevices(), -1), host);
  r.minimalBudget = -1;
  if (u.feasible) r.minimalPlan = u.best;
  return r;
}

SolveResult solve(const CostModel& model, const SolverOptions& options) {
  options.validate();
  const auto t0 = std::chrono::steady_clock::now();
  const auto limits = limitsFor(model, options.budget);
  const std::int64_t host = hostLimitFor(model, options.hostBudget);
  SolveResult r = search(model, options, limits, host);
  if (options.objective == Objective::Time && r.feasible && options.simulateTop > 0) {
    const int n = std::min<int>(options.simulateTop, static_cast<int>(r.candidates.size()));
    for (int i = 0; i < n; ++i) {
      simulatePlan(model, r.candidates[i], limits, host);
      prefetchFurther(model, r.candidates[i], limits, host, options.lookahead);
    }
    // Among the simulated, those that fit first, then by simulated iteration time.
    std::stable_sort(
        r.candidates.begin(), r.candidates.begin() + n, [](const Plan& a, const Plan& b) {
          if (a.simFits != b.simFits) return a.simFits;
          // (A plan the simulator cannot run keeps its predicted time.)
          auto t = [](const Plan& p) { return p.simulated ? p.simIterationTime : p.iterationTime; };
          return t(a) < t(b);
        });
    r.best = r.candidates.front();
  }
  if (options.objective == Objective::Time && !r.feasible) {
    SolveResult m = minimalBudget(model, options);
    r.minimalBudget = m.minimalBudget;
    r.minimalPlan = m.minimalPlan;
    r.heuristicChains = r.heuristicChains || m.heuristicChains;
  }
  if (options.objective == Objective::Memory && r.feasible) {
    r.minimalBudget = r.best.peakMemory;
    r.minimalPlan = r.best;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace pipefb::planner
