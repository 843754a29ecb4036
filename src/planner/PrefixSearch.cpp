// The DP over prefixes: the plan of one shape whose stages each own their devices (Note
// [Solver search] in Solver.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "SolverDetail.h"
#include "pipefb/planner/Solver.h"
#include "pipefb/schedules/Lowering.h"

namespace pipefb::planner {

using detail::kInf;
using detail::placementsOf;
using detail::solveFoldedShape;
using detail::solveSharedShape;

namespace {

struct Entry {
  double score = kInf;  // max so far (time, or bytes for Objective::Memory)
  double tie = 0;       // secondary: summed work (Time) / pace (Memory); only breaks ties
  std::int64_t host = 0;
  int prevI = -1;    // start layer of the last stage
  int prevIdx = -1;  // entry index in the previous cell (Pareto mode)
  StashPolicy policy = StashPolicy::Keep;
  bool optimizerOnHost = false;  // Note [Optimizer placement search]
};

bool better(const Entry& a, const Entry& b) {
  return a.score < b.score || (a.score == b.score && a.tie < b.tie);
}

}  // namespace

std::optional<Plan> solveShape(const CostModel& modelIn, const PipelineShape& shape,
                               const std::vector<StashPolicy>& policiesIn,
                               const std::vector<std::int64_t>& limitsIn, std::int64_t hostLimit,
                               Objective objective, double bound) {
  // Note [Planned reserve]: the search fits estimates; a plan's peaks hold the reserve.
  const std::vector<std::int64_t> limits =
      roomForEstimates(limitsIn, modelIn.cluster().reservePerMille);
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shape.microbatchSize);
  const int L = model.numLayers(), S = shape.stages;
  if (S < 1 || S > L) return std::nullopt;
  if (shape.folded)
    return solveFoldedShape(model, shape, policiesIn, limits, hostLimit, objective, bound);
  if (shape.sharesDevices())
    return solveSharedShape(model, shape, policiesIn, limits, hostLimit, objective, bound);
  // Effective policies, deduplicated (a split stage cannot keep; Lowering.h).
  std::vector<StashPolicy> policies;
  for (StashPolicy p : policiesIn) {
    StashPolicy e = schedules::effectivePolicy(p, isSplit(shape.kind));
    if (std::find(policies.begin(), policies.end(), e) == policies.end()) policies.push_back(e);
  }
  const bool pareto = hostLimit >= 0;
  // Note [Optimizer placement search]: the placements a stage may take, and the shape
  // each is costed with.
  const std::vector<bool> opts = placementsOf(shape);
  const PipelineShape shapes[2] = {stageShape(shape, false), stageShape(shape, true)};
  // The memory relaxation takes the least: with the optimizer on the host if it may be.
  const PipelineShape& leanest = shapes[opts.back() ? 1 : 0];
  // Note [Devices and processes]: a stage split across processes stashes its input only.
  std::vector<char> crossProcess(S);
  for (int k = 0; k < S; ++k) crossProcess[k] = inputStashOnly(model.cluster(), shape, k);
  auto allowed = [&](int k, StashPolicy p) {
    return shape.policyAllowed(k, p) && (!crossProcess[k] || schedules::isCheckpoint(p));
  };
  auto fits = [&](const StageEstimate& e, int k) {
    const int fd = shape.forwardDevice(k), bd = shape.backwardDevice(k);
    if (e.same) return limits[fd] < 0 || total(e.backwardMemory) <= limits[fd];
    return (limits[fd] < 0 || total(e.forwardMemory) <= limits[fd]) &&
           (limits[bd] < 0 || total(e.backwardMemory) <= limits[bd]);
  };
  // Note [Solver relaxation]
  // A stage k = [a, b) can only be part of a plan under the cap if its relaxation holds:
  // its compute lower bound (CostModel::computeLowerBound, shaved by 1e-12 so rounding
  // never lifts it over the stage's time) is within the pace cap, and weights x versions
  // + grads + optimizer state + working set (which every policy keeps; the stash is left
  // out, but one graph's worth of saved bytes is not: every policy holds at least one
  // stash of the stage's graph, or recomputes that graph in its backward working set) fit
  // its devices' limits and the memory cap. Both only grow with the stage, so
  // covering the layers greedily (each stage as long as its relaxation allows) from the
  // front reaches at least as far after k stages as any plan that fits (exchange
  // argument), and from the back starts stage k at most as early. That gives each DP row
  // k a window of cells [low[k], reach[k]], and rejects a shape outright when the greedy
  // cannot cover all layers with S stages. Everything here only drops cells that no plan
  // under the cap can use, so the DP stays exact. The memory scan over a cell's starts
  // also charges the messages that can wait for the stage (below), which no policy avoids.
  const double f = model.scale(shape);
  const bool split = isSplit(shape.kind);
  const double stepShare = stepsPerMicrobatch(shape.kind, shape.microbatches);
  std::vector<double> invF(S), invB(S);
  std::vector<std::int64_t> copies(S), limF(S), limB(S);
  const bool offloadsWeights =
      shape.offloadWeights && std::any_of(policies.begin(), policies.end(), schedules::isOffloaded);
  for (int k = 0; k < S; ++k) {
    invF[k] = 1.0 / model.speed(shape, shape.forwardDevice(k));
    invB[k] = 1.0 / model.speed(shape, shape.backwardDevice(k));
    // pipefb-async keeps the old copy on the forward device for the graph kinds (Note
    // [Forward device memory]): the backward device's bound cannot count it.
    copies[k] = shape.kind == ScheduleKind::PipeFbAsync
                    ? 0
                    : weightCopies(shape.kind, S, k, shape.microbatches);
    // Note [Weight-version offload]: an offloaded stage keeps only the contract's count on
    // the device; the bound takes the least over the policies tried.
    if (offloadsWeights) copies[k] = schedules::residentStashedVersions(copies[k], shape.lookahead);
    limF[k] = limits[shape.forwardDevice(k)];
    limB[k] = limits[shape.backwardDevice(k)];
  }
  constexpr double kShave = 1 - 1e-12;
  auto timeLb = [&](int st, int i, int j) {
    const double fw = model.forwardTime(i, j, f), bw = model.backwardTime(i, j, f);
    const double step = model.stepSum(i, j) * stepShare;
    return kShave *
           (split ? std::max(fw * invF[st], (bw + step) * invB[st]) : (fw + bw + step) * invF[st]);
  };
  auto scaledAtF = [f](std::int64_t b) { return scaledBytes(b, f); };
  // Memory lower bound of stage k = [i, j) with the scaled working set `ws`: the larger of
  // its two devices' (one device unless split).
  auto memLb = [&](int k, int i, int j, std::int64_t ws) {
    // The copies are of the weights B runs on: the half copy at most (Note [Half-precision
    // weights on a device]).
    const std::int64_t W = model.forwardParamSum(i, j);
    // The backward device's: states, weight versions, and the larger of the working set
    // and one graph (keep and offload keep >= 1 resident stash of it, the checkpoint kinds
    // recompute it in B; a B charged layer by layer may free the graph's later layers
    // before its largest working set, Note [Backward layer by layer] in CostModel.h). Less
    // the first layer's saved input: a checkpointed stage's stash holds it, not its graph
    // (onStash in StageEstimate.cpp; the bound pruned optimal plans without it, Note
    // [Outputs kept between layers]'s random instances in OptimalityTest).
    // (memoryLowerBound with no working set: the states, without the optimizer's when it is
    // on the host, Note [Optimizer offload in the cost model].)
    return model.memoryLowerBound(leanest, k, i, j, 0) + copies[k] * W +
           std::max(ws, scaledAtF(model.savedLayersSum(i, j) -
                                  model.profile().layers[i].savedInputBytes));
  };
  auto memFits = [&](int k, int i, int j, std::int64_t ws, std::int64_t memCap) {
    const std::int64_t mb = memLb(k, i, j, ws);
    if (limB[k] >= 0 && mb > limB[k]) return false;
    if (memCap >= 0 && mb > memCap) return false;
    if (split) {  // the forward device holds the weights at least (Note [Forward device memory])
      const std::int64_t mf = model.forwardParamSum(i, j);
      if (limF[k] >= 0 && mf > limF[k]) return false;
    }
    return true;
  };
  std::vector<int> reach(S + 1), low(S + 1);
  auto cover = [&](double tauCap, std::int64_t memCap) {
    auto ok = [&](int k, int i, int j, std::int64_t ws) {
      return memFits(k, i, j, ws, memCap) && timeLb(k, i, j) <= tauCap;
    };
    int a = 0;
    reach[0] = 0;
    for (int k = 0; k < S; ++k) {
      int b = a;
      std::int64_t ws = 0;
      while (b < L) {
        const std::int64_t w2 = std::max(ws, model.workingBytes(b, f));
        if (!ok(k, a, b + 1, w2)) break;
        ws = w2;
        ++b;
      }
      reach[k + 1] = b;
      a = b;
    }
    if (a < L) return false;
    int e = L;
    low[S] = L;
    for (int k = S - 1; k >= 0; --k) {
      int st = e;
      std::int64_t ws = 0;
      while (st > 0) {
        const std::int64_t w2 = std::max(ws, model.workingBytes(st - 1, f));
        if (!ok(k, st - 1, e, w2)) break;
        ws = w2;
        --st;
      }
      low[k] = st;
      e = st;
    }
    return true;
  };
  auto capsOf = [&](double b, double* tauCap, std::int64_t* memCap) {
    *tauCap = objective == Objective::Time ? b : kInf;
    *memCap =
        objective == Objective::Memory && b < kInf ? static_cast<std::int64_t>(std::floor(b)) : -1;
  };
  {
    double tc;
    std::int64_t mc;
    capsOf(bound, &tc, &mc);
    if (!cover(tc, mc)) return std::nullopt;  // nothing fits under the cap (or at all)
  }
  // A greedy plan (cuts balancing the compute lower bound, the fastest feasible policy
  // per stage) gives a finite cap when none was passed in. The DP then looks only for
  // strictly better plans and falls back to the greedy one, so it stays exact.
  std::optional<Plan> greedy;
  if (bound == kInf) {
    double totalLb = 0;
    for (int k = 0; k < S; ++k) totalLb += model.computeLowerBound(shape, k, 0, L);
    Plan g;
    g.shape = shape;
    int first = 0;
    bool ok = true;
    double greedyScore = 0;
    for (int k = 0; k < S && ok; ++k) {
      int last = first + 1;
      const double target = model.computeLowerBound(shape, k, 0, L) * (double(L) / L) / S;
      (void)totalLb;
      while (last < L - (S - k - 1) &&
             (k == S - 1 || model.computeLowerBound(shape, k, first, last + 1) <= target))
        ++last;
      if (k == S - 1) last = L;
      StagePlan sp;
      sp.first = first;
      sp.last = last;
      double bestC = kInf;
      for (StashPolicy p : policies)
        for (bool oh : opts) {
          if (!allowed(k, p)) continue;
          StageEstimate e = model.stage(shapes[oh], k, first, last, p);
          if (!fits(e, k)) continue;
          const double c = objective == Objective::Time ? e.time : double(e.peakMemory());
          if (c < bestC) bestC = c, sp.policy = p, sp.optimizerOnHost = oh;
        }
      if (bestC == kInf) ok = false;
      greedyScore = std::max(greedyScore, bestC);
      g.stages.push_back(sp);
      first = last;
    }
    if (ok) {
      evaluatePlan(model, g);
      if (!pareto || g.hostBytes <= hostLimit) {
        greedy = g;
        bound = greedyScore;
      }
    }
  }
  {
    double tc;
    std::int64_t mc;
    capsOf(bound, &tc, &mc);
    if (!cover(tc, mc)) return greedy;
  }
  const size_t W = static_cast<size_t>(L) + 1;
  std::vector<std::vector<Entry>> cells(static_cast<size_t>(S + 1) * W);
  auto cell = [&](int k, int j) -> std::vector<Entry>& { return cells[k * W + j]; };
  Entry start;
  start.score = 0;
  cell(0, 0).push_back(start);

  // Range maximum of the working set (sparse table), for seeding a cell at any i.
  std::vector<std::vector<std::int64_t>> wsMax{std::vector<std::int64_t>(L)};
  for (int l = 0; l < L; ++l) wsMax[0][l] = model.workingBytes(l, f);
  for (int p = 1; (1 << p) <= L; ++p) {
    wsMax.emplace_back(L - (1 << p) + 1);
    for (int l = 0; l + (1 << p) <= L; ++l)
      wsMax[p][l] = std::max(wsMax[p - 1][l], wsMax[p - 1][l + (1 << (p - 1))]);
  }
  auto workingMax = [&](int a, int b) {
    int p = 0;
    while ((2 << p) <= b - a) ++p;
    return std::max(wsMax[p][a], wsMax[p][b - (1 << p)]);
  };

  std::vector<Entry> cand;
  Entry best;  // scalar mode; prevI < 0 while nothing was found
  // Stage [i, j) as the k-th, after every entry of cell (k - 1, i).
  auto consider = [&](int stage, int i, int j, std::int64_t maxWorking,
                      const std::vector<Entry>& prev) {
    for (StashPolicy p : policies)
      for (bool oh : opts) {
        if (!allowed(stage, p)) continue;
        const PipelineShape& sh = shapes[oh];
        // Scalar time search: a stage as slow as the best so far cannot beat it (nor tie
        // it below the cap, which is all a tie could change), so its memory is not costed.
        if (!pareto && objective == Objective::Time &&
            model.stage(sh, stage, i, j, p, maxWorking, /*timesOnly=*/true).time > best.score)
          continue;
        StageEstimate e = model.stage(sh, stage, i, j, p, maxWorking);
        if (!fits(e, stage)) continue;
        const double c = objective == Objective::Time ? e.time : double(e.peakMemory());
        const double t =
            objective == Objective::Time ? e.forwardCompute + e.backwardCompute : e.time;
        for (int idx = 0; idx < static_cast<int>(prev.size()); ++idx) {
          const Entry& pe = prev[idx];
          Entry n;
          n.score = std::max(pe.score, c);
          n.tie = objective == Objective::Time ? pe.tie + t : std::max(pe.tie, t);
          n.host = pe.host + e.hostBytes;
          n.prevI = i;
          n.prevIdx = idx;
          n.policy = p;
          n.optimizerOnHost = oh;
          if (pareto) {
            if (n.host > hostLimit || n.score >= bound) continue;
            cand.push_back(n);
          } else if (better(n, best)) {
            best = n;
          }
        }
      }
  };
  // minPrev[p][i] = the lowest score in cells (k - 1, i .. i + 2^p - 1) (front entries;
  // infinite when empty), rebuilt per row k.
  std::vector<std::vector<double>> minPrev(wsMax.size(), std::vector<double>(W, kInf));
  int minPrevRow = -1;
  // The largest i' in [lo, i] whose cell (row, i') has a score below cap, else lo - 1.
  auto lastBelow = [&](int row, int i, double cap) {
    const int lo = row;  // cell (row, i') is empty for i' < row
    while (i >= lo) {
      if (minPrev[0][i] < cap) return i;
      int p = 0;
      while (p + 1 < static_cast<int>(minPrev.size()) && i - (2 << p) + 1 >= lo &&
             minPrev[p + 1][i - (2 << p) + 1] >= cap)
        ++p;
      i -= 1 << p;
    }
    return lo - 1;
  };
  for (int k = 1; k <= S; ++k) {
    const int stage = k - 1;
    if (minPrevRow != k - 1) {
      for (int i = 0; i < static_cast<int>(W); ++i)
        minPrev[0][i] = cell(k - 1, i).empty() ? kInf : cell(k - 1, i).front().score;
      for (size_t p = 1; p < minPrev.size(); ++p)
        for (int i = 0; i + (1 << p) <= static_cast<int>(W); ++i)
          minPrev[p][i] = std::min(minPrev[p - 1][i], minPrev[p - 1][i + (1 << (p - 1))]);
      minPrevRow = k - 1;
    }
    int seed = -1;  // the last stage's start in the previous cell of this row
    for (int j = std::max(k, low[k]); j <= std::min(reach[k], L - (S - k)); ++j) {
      cand.clear();
      best = Entry{};
      best.score = bound;
      // Scalar mode: first try the start that was best for (k, j - 1) and the one after
      // it. Where the optimum lies is not needed for exactness (the scan below still
      // sees every i that could beat the cap); a good cap early makes the scan skip the
      // long stretch of prefixes that are already slower than it, and stop sooner.
      if (!pareto && seed >= 0) {
        for (int i = seed; i <= seed + 1 && i < j; ++i) {
          const auto& prev = cell(k - 1, i);
          if (!prev.empty() && prev.front().score < best.score)
            consider(stage, i, j, workingMax(i, j), prev);
        }
      }
      // Descend over the starts i whose prefix is below the cap, jumping over runs of
      // prefixes at or above it with the row's range minimum (sparse table minPrev).
      for (int i = j - 1; i >= k - 1; --i) {
        const double cap = pareto ? bound : best.score;
        i = lastBelow(k - 1, i, cap);
        if (i < k - 1) break;
        const std::int64_t maxWorking = workingMax(i, j);
        // Both bounds only grow as i decreases (the stage grows): they end the scan.
        if (!memFits(stage, i, j, maxWorking, -1)) break;
        if (objective == Objective::Time) {
          if (timeLb(stage, i, j) >= cap) break;
        } else {
          // Note [Waiting messages]: every policy is also charged the messages that can
          // wait for the stage, on its backward device the gradients (of layer j - 1, the
          // same for every i: the bound still only grows), and with them, on one device,
          // the activations (of layer i: this start only).
          const auto waiting = model.waitingBytes(shape, stage, i, j, /*outputTravels=*/false);
          const double lb = double(memLb(stage, i, j, maxWorking) + waiting.gradients);
          if (lb >= cap) break;
          if (!split && lb + double(waiting.activations) >= cap) continue;
        }
        consider(stage, i, j, maxWorking, cell(k - 1, i));
      }
      if (!pareto && best.prevI >= 0) seed = best.prevI;
      auto& out = cell(k, j);
      if (!pareto) {
        if (best.prevI >= 0) out.push_back(best);
        continue;
      }
      // Pareto front of (score, host): sort by score (then tie, host), keep strictly
      // decreasing host.
      std::sort(cand.begin(), cand.end(), [](const Entry& a, const Entry& b) {
        if (a.score != b.score) return a.score < b.score;
        if (a.host != b.host) return a.host < b.host;
        return a.tie < b.tie;
      });
      std::int64_t minHost = std::numeric_limits<std::int64_t>::max();
      for (const Entry& e : cand)
        if (e.host < minHost) {
          out.push_back(e);
          minHost = e.host;
        }
    }
  }
  const auto& last = cell(S, L);
  if (last.empty()) return greedy;
  // Pareto mode: every entry is within the host limit; the front's first has the lowest score.
  int idx = 0;
  Plan plan;
  plan.shape = shape;
  plan.stages.resize(S);
  int j = L;
  for (int k = S; k >= 1; --k) {
    const Entry& e = cell(k, j)[idx];
    StagePlan& sp = plan.stages[k - 1];
    sp.first = e.prevI;
    sp.last = j;
    sp.policy = e.policy;
    sp.optimizerOnHost = e.optimizerOnHost;
    idx = e.prevIdx < 0 ? 0 : e.prevIdx;
    j = e.prevI;
  }
  evaluatePlan(model, plan);
  return plan;
}

}  // namespace pipefb::planner
