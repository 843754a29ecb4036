// The paired searches: folded shapes and shared devices, two stages a step (Note [Folded
// search], Note [Shared search]).
#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "SolverDetail.h"
#include "pipefb/planner/Solver.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/SharedDevices.h"

namespace pipefb::planner {

using detail::kInf;

namespace {

// Note [Folded search]
// A folded shape (Note [Folded pace], CostModel.h) couples stage d with stage S-1-d: device
// chain[d] runs F(d) and B(S-1-d), device chain[S-1-d] runs F(S-1-d) and B(d). The prefix
// DP cannot see that, so folded shapes get a DP of their own, from both ends inwards: a
// state (p, i, j) has placed the pairs 0..p-1, covering layers [0, i) and [j, L); a step
// places stage p = [i, i2) and stage S-1-p = [j2, j) with a policy each, and charges both
// devices of the pair, the stages' own times, and (p >= 1) the two links that carry the
// boundaries at i and j (a -> a+1 for a = p-1 and a = S-1-p). Odd S ends with the middle
// stage [i, j), not split, on chain[(S-1)/2]. Every term of planLoad() is charged exactly
// once, so with a Pareto front of (score, host bytes) per state the DP is exact (the
// optimality test compares it with the brute force). It is O(S L^4) in the worst case;
// the time cap prunes i2 and j2 (compute lower bounds only grow with a stage), and shapes
// of more than kFoldedExactLayers layers are not searched folded (SolveResult says so).
struct FoldEntry {
  double score = kInf;
  std::int64_t host = 0;
  int prevI = -1, prevJ = -1, prevIdx = -1;
  int polL = -1, polR = -1;  // indices into the pair's policy list (polL: middle stage)
};

// One DP step of the paired searches (folded and shared devices): every entry of the
// previous cell `prev` (left at (i, j)) extended by a pair of stages with policies (a, b)
// whose device term is `term` and whose host bytes are `host`; each extension within the
// host limit (pareto) and below `cap` goes to `keep`.
template <class Keep>
void extendPair(const std::vector<FoldEntry>& prev, double term, std::int64_t host, int i, int j,
                int a, int b, double cap, bool pareto, std::int64_t hostLimit, Keep&& keep) {
  for (int idx = 0; idx < static_cast<int>(prev.size()); ++idx) {
    FoldEntry n{std::max(prev[idx].score, term), prev[idx].host + host, i, j, idx, a, b};
    if (pareto && n.host > hostLimit) continue;
    if (n.score >= cap) continue;
    keep(n);
  }
}

}  // namespace

namespace detail {

std::optional<Plan> solveFoldedShape(const CostModel& modelIn, const PipelineShape& shape,
                                     const std::vector<StashPolicy>& policiesIn,
                                     const std::vector<std::int64_t>& limits,
                                     std::int64_t hostLimit, Objective objective, double bound) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shape.microbatchSize);
  const int L = model.numLayers(), S = shape.stages, P = S / 2;
  if (S < 2 || S > L) return std::nullopt;
  const bool odd = S % 2 == 1, pareto = hostLimit >= 0, time = objective == Objective::Time;
  std::vector<StashPolicy> splitPols, allPols;
  for (StashPolicy p : policiesIn)
    for (auto [list, e] :
         {std::pair{&splitPols, schedules::effectivePolicy(p, true)}, std::pair{&allPols, p}})
      if (std::find(list->begin(), list->end(), e) == list->end()) list->push_back(e);
  auto polsOf = [&](int k) -> const std::vector<StashPolicy>& {
    return shape.splits(k) ? splitPols : allPols;
  };
  auto allowed = [&](int k, StashPolicy p) {
    return shape.policyAllowed(k, p) &&
           (!inputStashOnly(model.cluster(), shape, k) || schedules::isCheckpoint(p));
  };
  // Note [Optimizer placement search]: choice c of stage k is the policy polsOf(k)[c / nO]
  // with the optimizer placement opts[c % nO].
  const std::vector<bool> opts = placementsOf(shape);
  const int nO = static_cast<int>(opts.size());
  const PipelineShape shapes[2] = {stageShape(shape, false), stageShape(shape, true)};
  auto choices = [&](int k) { return static_cast<int>(polsOf(k).size()) * nO; };
  auto policyOf = [&](int k, int c) { return polsOf(k)[c / nO]; };
  auto hostOf = [&](int c) { return static_cast<bool>(opts[c % nO]); };
  const size_t W = static_cast<size_t>(L) + 1;
  // Stage estimates, computed on first use: (k, a, b, choice).
  std::map<std::tuple<int, int, int, int>, StageEstimate> cache;
  auto est = [&](int k, int a, int b, int pi) -> const StageEstimate& {
    auto key = std::make_tuple(k, a, b, pi);
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache.emplace(key, model.stage(shapes[hostOf(pi)], k, a, b, policyOf(k, pi))).first;
    return it->second;
  };
  auto over = [&](int device, std::int64_t bytes) {
    return limits[device] >= 0 && bytes > limits[device];
  };
  auto links = [&](int p, int i, int j) {
    return p == 0 ? 0.0
                  : std::max(model.foldedLinkTime(shape, p - 1, i, j),
                             model.foldedLinkTime(shape, S - 1 - p, j, i));
  };
  std::vector<std::vector<FoldEntry>> cur(W * W), next(W * W);
  cur[0 * W + L].push_back(FoldEntry{0.0, 0, -1, -1, -1, -1, -1});
  std::vector<std::vector<std::vector<FoldEntry>>> rows;  // rows[p] = states after p pairs
  std::vector<FoldEntry> cand;
  auto settle = [&](std::vector<FoldEntry>& out, std::vector<FoldEntry>& in) {
    if (in.empty()) return;
    std::sort(in.begin(), in.end(), [](const FoldEntry& a, const FoldEntry& b) {
      return a.score != b.score ? a.score < b.score : a.host < b.host;
    });
    if (!pareto) {
      out.push_back(in.front());
      return;
    }
    std::int64_t minHost = std::numeric_limits<std::int64_t>::max();
    for (const FoldEntry& e : in)
      if (e.host < minHost) out.push_back(e), minHost = e.host;
  };
  for (int p = 0; p < P; ++p) {
    const int q = S - 1 - p;
    const int dp = shape.chain[p], dq = shape.chain[q];
    const bool lastPair = p + 1 == P;
    for (auto& v : next) v.clear();
    for (int i = 0; i <= L; ++i)
      for (int j = i; j <= L; ++j) {
        const auto& prev = cur[i * W + j];
        if (prev.empty()) continue;
        const double link = time ? links(p, i, j) : 0.0;
        const double cap = bound;
        if (link >= cap) continue;
        const int rest = S - 2 * (p + 1);  // stages still to place inside
        for (int i2 = i + 1; i2 <= j - 1 - rest; ++i2) {
          if (time && model.computeLowerBound(shape, p, i, i2) >= cap) break;
          for (int j2 = j - 1; j2 >= i2; --j2) {
            if (j2 - i2 < rest) break;
            if (!odd && lastPair && j2 != i2) continue;
            if (time && model.computeLowerBound(shape, q, j2, j) >= cap) break;
            for (int a = 0; a < choices(p); ++a) {
              if (!allowed(p, policyOf(p, a))) continue;
              const StageEstimate& eL = est(p, i, i2, a);
              for (int b = 0; b < choices(q); ++b) {
                if (!allowed(q, policyOf(q, b))) continue;
                const StageEstimate& eR = est(q, j2, j, b);
                const std::int64_t memP = foldedDeviceMemory(eL, eR);
                const std::int64_t memQ = foldedDeviceMemory(eR, eL);
                if (over(dp, memP) || over(dq, memQ)) continue;
                const double term =
                    time ? std::max({link, eL.time, eR.time, foldedDeviceTime(eL, eR),
                                     foldedDeviceTime(eR, eL)})
                         : double(std::max(memP, memQ));
                if (term >= cap) continue;
                extendPair(prev, term, eL.hostBytes + eR.hostBytes, i, j, a, b, cap, pareto,
                           hostLimit, [&](const FoldEntry& n) { next[i2 * W + j2].push_back(n); });
              }
            }
          }
        }
      }
    rows.push_back(std::move(cur));
    cur.assign(W * W, {});
    for (size_t c = 0; c < W * W; ++c) {
      cand = std::move(next[c]);
      next[c].clear();
      settle(cur[c], cand);
    }
  }
  rows.push_back(std::move(cur));
  // The end: the innermost link (even S) or the middle stage (odd S).
  FoldEntry best;
  int bestI = -1, bestJ = -1;
  const auto& last = rows[P];
  for (int i = 0; i <= L; ++i)
    for (int j = i; j <= L; ++j)
      for (int idx = 0; idx < static_cast<int>(last[i * W + j].size()); ++idx) {
        const FoldEntry& e = last[i * W + j][idx];
        if (!odd) {
          if (i != j) continue;
          FoldEntry n = e;
          n.score = std::max(e.score, time ? links(P, i, j) : 0.0);
          n.prevIdx = idx;
          n.polL = -1;
          if (n.score < bound &&
              (n.score < best.score || (n.score == best.score && n.host < best.host)))
            best = n, bestI = i, bestJ = j;
          continue;
        }
        if (j - i < 1) continue;
        const int m = P;
        for (int c = 0; c < choices(m); ++c) {
          if (!allowed(m, policyOf(m, c))) continue;
          const StageEstimate& e2 = est(m, i, j, c);
          const std::int64_t mem = total(e2.backwardMemory);
          if (over(shape.chain[m], mem)) continue;
          if (pareto && e.host + e2.hostBytes > hostLimit) continue;
          FoldEntry n = e;
          n.score = std::max(e.score, time ? std::max(links(P, i, j), e2.time) : double(mem));
          n.host = e.host + e2.hostBytes;
          n.prevIdx = idx;
          n.polL = c;
          if (n.score < bound &&
              (n.score < best.score || (n.score == best.score && n.host < best.host)))
            best = n, bestI = i, bestJ = j;
        }
      }
  if (bestI < 0) return std::nullopt;
  Plan plan;
  plan.shape = shape;
  plan.stages.resize(S);
  if (odd) {
    plan.stages[P].first = bestI;
    plan.stages[P].last = bestJ;
    plan.stages[P].policy = policyOf(P, best.polL);
    plan.stages[P].optimizerOnHost = hostOf(best.polL);
  }
  int i = bestI, j = bestJ, idx = best.prevIdx;
  for (int p = P - 1; p >= 0; --p) {
    const FoldEntry& e = rows[p + 1][i * W + j][idx];
    const int q = S - 1 - p;
    plan.stages[p].first = e.prevI;
    plan.stages[p].last = i;
    plan.stages[p].policy = policyOf(p, e.polL);
    plan.stages[p].optimizerOnHost = hostOf(e.polL);
    plan.stages[q].first = j;
    plan.stages[q].last = e.prevJ;
    plan.stages[q].policy = policyOf(q, e.polR);
    plan.stages[q].optimizerOnHost = hostOf(e.polR);
    i = e.prevI;
    j = e.prevJ;
    idx = e.prevIdx;
  }
  evaluatePlan(model, plan);
  return plan;
}

// Note [Shared search]
// A shared shape (Note [Shared devices], CostModel.h) puts two stages on each device of its
// chain: position d holds stage d and stage q(d) = S-1-d (V) or D+d (looped, v = 2). The DP
// places the devices in chain order, both of a device's stages in one step, so that each
// device's sum of times and its stashes held together are charged exactly once. The state
// after positions 0..d-1 is the pair (i, j): the first chain covers [0, i); the second
// covers [j, L) (V, from both ends inwards, as Note [Folded search]) or [X, j) (looped,
// where X, the start of stage D, is enumerated, the DP run once per X). A step places
// stage d = [i, i2) and stage q(d) = [j2, j) (V) or [j, j2) (looped) with a policy and an
// optimizer placement each, and charges the device's time and memory (CostModel's
// sharedDeviceTime / sharedDeviceMemory), the stages' own times and the links between
// positions d-1 and d (the boundaries at i and j, and for looped D = 2 the wrap at X too;
// for D >= 3 the wrap link D-1 -> 0 is charged once per X). The V ends with i2 = j2 (its
// turn is local), looped with i2 = X and j2 = L. Every term of planLoad() is charged
// once, and with a Pareto front of (score, host bytes) per state the DP is exact (the
// optimality test compares it with the brute force). It is O(D L^4) per X in the worst
// case; the cap prunes i2 and j2 (compute lower bounds and memory lower bounds only grow
// with a stage), and shapes of more than kSharedExactLayers layers are not searched.
std::optional<Plan> solveSharedShape(const CostModel& modelIn, const PipelineShape& shape,
                                     const std::vector<StashPolicy>& policiesIn,
                                     const std::vector<std::int64_t>& limits,
                                     std::int64_t hostLimit, Objective objective, double bound) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shape.microbatchSize);
  const int L = model.numLayers(), S = shape.stages, D = shape.chainLength();
  if (S < 2 || S > L || S != 2 * D) return std::nullopt;
  const bool looped = schedules::info(shape.kind).placement == schedules::DefaultPlacement::Looped;
  const bool pareto = hostLimit >= 0, time = objective == Objective::Time;
  std::vector<StashPolicy> pols;
  for (StashPolicy p : policiesIn)
    if (std::find(pols.begin(), pols.end(), p) == pols.end()) pols.push_back(p);
  const std::vector<bool> opts = placementsOf(shape);
  const int nO = static_cast<int>(opts.size());
  const PipelineShape shapes[2] = {stageShape(shape, false), stageShape(shape, true)};
  const PipelineShape& leanest = shapes[opts.back() ? 1 : 0];
  const double leanF = model.scale(leanest);
  const int nC = static_cast<int>(pols.size()) * nO;
  auto policyOf = [&](int c) { return pols[c / nO]; };
  auto hostOf = [&](int c) { return static_cast<bool>(opts[c % nO]); };
  const size_t W = static_cast<size_t>(L) + 1;
  std::unordered_map<std::int64_t, StageEstimate> cache;
  auto est = [&](int k, int a, int b, int c) -> const StageEstimate& {
    const std::int64_t key =
        ((std::int64_t(k) * std::int64_t(W) + a) * std::int64_t(W) + b) * nC + c;
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache.emplace(key, model.stage(shapes[hostOf(c)], k, a, b, policyOf(c))).first;
    return it->second;
  };
  auto maxWorking = [&](int a, int b) {
    std::int64_t ws = 0;
    for (int l = a; l < b; ++l) ws = std::max(ws, model.workingBytes(l, leanF));
    return ws;
  };
  // A stage's relaxation (Note [Solver relaxation]): beyond the cap once it is.
  constexpr double kShave = 1 - 1e-12;
  auto hopeless = [&](int k, int a, int b, double cap) {
    const int dev = shape.forwardDevice(k);
    if (time && model.computeLowerBound(shape, k, a, b) * kShave >= cap) return true;
    const std::int64_t mem = model.memoryLowerBound(leanest, k, a, b, maxWorking(a, b));
    if (limits[dev] >= 0 && mem > limits[dev]) return true;
    return !time && double(mem) >= cap;
  };
  FoldEntry best;
  int bestI = -1, bestJ = -1;
  std::vector<std::vector<std::vector<FoldEntry>>> bestRows;
  double cap = bound;
  std::vector<int> Xs;
  if (looped)
    for (int X = D; X + D <= L; ++X) Xs.push_back(X);
  else
    Xs.push_back(-1);
  for (int X : Xs) {
    // The wrap link D-1 -> 0 (looped, D >= 3) carries the boundary at X alone.
    const double wrap = looped && D >= 3 && time ? model.linksTime(shape, {{D, X}}) : 0.0;
    if (wrap >= cap) continue;
    std::vector<std::vector<FoldEntry>> cur(W * W), next(W * W);
    std::vector<std::vector<std::vector<FoldEntry>>> rows;
    // (A cell's entries are sorted by score; the reconstruction indexes them.)
    cur[0 * W + (looped ? X : L)].push_back(FoldEntry{wrap, 0, -1, -1, -1, -1, -1});
    for (int d = 0; d < D; ++d) {
      const int q = looped ? D + d : S - 1 - d;
      const int rest = D - 1 - d;  // stages of each chain still to place after this step
      const bool lastDevice = rest == 0;
      const int dev = shape.chain[d];
      const std::vector<schedules::HeldAtStart>& held = stashesHeldTogether(shape, d);
      std::vector<const StageEstimate*> eLs(nC), eRs(nC);
      for (auto& v : next) v.clear();
      for (int i = 0; i <= L; ++i)
        for (int j = 0; j <= L; ++j) {
          const auto& prev = cur[i * W + j];
          if (prev.empty()) continue;
          double link = 0;
          if (time && d > 0) {
            std::vector<std::pair<int, int>> bs{{d, i}, {looped ? q : S - d, j}};
            if (looped && D == 2) bs.push_back({D, X});
            link = model.linksTime(shape, bs);
          }
          if (link >= cap) continue;
          // Stage d = [i, i2): up to X (looped) or leaving 2 rest + 1 layers for the rest.
          const int i2max = looped ? X - rest : j - 1 - 2 * rest;
          for (int i2 = looped && lastDevice ? X : i + 1; i2 <= i2max; ++i2) {
            if (hopeless(d, i, i2, cap)) break;
            for (int a = 0; a < nC; ++a)
              eLs[a] = shape.policyAllowed(d, policyOf(a)) ? &est(d, i, i2, a) : nullptr;
            // Stage q: [j2, j) (V) or [j, j2) (looped).
            int lo, hi, step;
            if (looped) {
              lo = lastDevice ? L : j + 1;
              hi = L - rest;
              step = 1;
            } else {
              lo = lastDevice ? i2 : j - 1;
              hi = lastDevice ? i2 : i2 + 2 * rest;
              step = -1;
            }
            for (int j2 = lo; step > 0 ? j2 <= hi : j2 >= hi; j2 += step) {
              const int qa = looped ? j : j2, qb = looped ? j2 : j;
              if (qa >= qb) break;
              if (hopeless(q, qa, qb, cap)) break;
              for (int b = 0; b < nC; ++b)
                eRs[b] = shape.policyAllowed(q, policyOf(b)) ? &est(q, qa, qb, b) : nullptr;
              for (int a = 0; a < nC; ++a) {
                if (!eLs[a] || (time && eLs[a]->time >= cap)) continue;
                const StageEstimate& eL = *eLs[a];
                for (int b = 0; b < nC; ++b) {
                  if (!eRs[b]) continue;
                  const StageEstimate& eR = *eRs[b];
                  const HostedStage hosted[2] = {{d, &eL}, {q, &eR}};
                  const double t =
                      time
                          ? std::max({link, eL.time, eR.time, sharedDeviceTime(hosted, hosted + 2)})
                          : 0.0;
                  if (t >= cap) continue;
                  const std::int64_t mem = sharedDeviceMemory(held, hosted, hosted + 2);
                  if (limits[dev] >= 0 && mem > limits[dev]) continue;
                  const double term = time ? t : double(mem);
                  if (term >= cap) continue;
                  // The cell's Pareto front of (score, host bytes), kept as it grows
                  // (without a host budget: its best entry; the first wins ties).
                  std::vector<FoldEntry>& cell = next[i2 * W + j2];
                  auto covers = [&](const FoldEntry& x, const FoldEntry& y) {
                    return x.score <= y.score && (!pareto || x.host <= y.host);
                  };
                  extendPair(prev, term, eL.hostBytes + eR.hostBytes, i, j, a, b, cap, pareto,
                             hostLimit, [&](const FoldEntry& n) {
                               if (std::any_of(cell.begin(), cell.end(),
                                               [&](const FoldEntry& e) { return covers(e, n); }))
                                 return;
                               cell.erase(
                                   std::remove_if(cell.begin(), cell.end(),
                                                  [&](const FoldEntry& e) { return covers(n, e); }),
                                   cell.end());
                               cell.push_back(n);
                             });
                }
              }
            }
          }
        }
      rows.push_back(std::move(cur));
      cur.assign(W * W, {});
      for (size_t c = 0; c < W * W; ++c) {
        cur[c] = std::move(next[c]);
        next[c].clear();
        std::sort(cur[c].begin(), cur[c].end(), [](const FoldEntry& a, const FoldEntry& b) {
          return a.score != b.score ? a.score < b.score : a.host < b.host;
        });
      }
    }
    rows.push_back(std::move(cur));
    // The end: the V's middle (i = j), or looped's (X, L).
    // A cell's front has the lowest score (its Pareto entries trade score for host bytes).
    const auto& last = rows[D];
    FoldEntry here;
    int hereI = -1, hereJ = -1;
    for (int i = 0; i <= L; ++i)
      for (int j = 0; j <= L; ++j) {
        if (looped ? (i != X || j != L) : i != j) continue;
        const auto& cell = last[i * W + j];
        if (cell.empty() || cell.front().score >= cap) continue;
        if (hereI < 0 || cell.front().score < here.score)
          here = cell.front(), here.prevIdx = 0, hereI = i, hereJ = j;
      }
    if (hereI >= 0) {
      best = here, bestI = hereI, bestJ = hereJ;
      bestRows = std::move(rows);
      cap = here.score;
    }
  }
  if (bestI < 0) return std::nullopt;
  Plan plan;
  plan.shape = shape;
  plan.stages.resize(S);
  int i = bestI, j = bestJ, idx = best.prevIdx;
  for (int d = D - 1; d >= 0; --d) {
    const FoldEntry& e = bestRows[d + 1][i * W + j][idx];
    const int q = looped ? D + d : S - 1 - d;
    plan.stages[d].first = e.prevI;
    plan.stages[d].last = i;
    plan.stages[d].policy = policyOf(e.polL);
    plan.stages[d].optimizerOnHost = hostOf(e.polL);
    plan.stages[q].first = looped ? e.prevJ : j;
    plan.stages[q].last = looped ? j : e.prevJ;
    plan.stages[q].policy = policyOf(e.polR);
    plan.stages[q].optimizerOnHost = hostOf(e.polR);
    i = e.prevI;
    j = e.prevJ;
    idx = e.prevIdx;
  }
  evaluatePlan(model, plan);
  return plan;
}

}  // namespace detail

}  // namespace pipefb::planner
