// The planner's dynamic program (Note [Solver search] in Solver.h).
#include "pipefb/planner/Solver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/ZeroBubble.h"
#include "pipefb/sim/Simulator.h"

namespace pipefb::planner {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

// ---------------------------------------------------------------------------------------
// Families and options

ScheduleFamily parseScheduleFamily(const std::string& name) {
  std::vector<ScheduleKind> kinds = allScheduleKinds();
  // Longest kind name first, so "pipefb-sync-keep" is not read as "pipefb" + "sync-keep".
  std::sort(kinds.begin(), kinds.end(), [](ScheduleKind a, ScheduleKind b) {
    return std::string(toString(a)).size() > std::string(toString(b)).size();
  });
  for (ScheduleKind k : kinds) {
    const std::string kn = toString(k);
    if (name == kn) return {name, k, allStashPolicies()};
    if (name.size() > kn.size() + 1 && name.compare(0, kn.size() + 1, kn + "-") == 0) {
      const std::string rest = name.substr(kn.size() + 1);
      for (StashPolicy p : allStashPolicies())
        if (rest == schedules::toString(p)) return {name, k, {p}};
    }
  }
  std::vector<std::string> forms;
  for (ScheduleKind k : allScheduleKinds()) {
    forms.push_back(toString(k));
    for (StashPolicy p : allStashPolicies())
      forms.push_back(std::string(toString(k)) + "-" + schedules::toString(p));
  }
  throw UserError("unknown schedule family '" + name + "'" + didYouMean(name, forms) +
                  "; allowed: a schedule (" + joinAllowed([] {
                    std::vector<std::string> n;
                    for (ScheduleKind k : allScheduleKinds()) n.push_back(toString(k));
                    return n;
                  }()) +
                  "), optionally with -keep, -offload, -checkpoint or -checkpoint-offload");
}

std::vector<ScheduleFamily> parseScheduleFamilies(const std::vector<std::string>& names) {
  std::vector<ScheduleFamily> out;
  for (const auto& n : names) out.push_back(parseScheduleFamily(n));
  return out;
}

OptimizerOffload parseOptimizerOffload(const std::string& text, const std::string& flag) {
  for (OptimizerOffload o :
       {OptimizerOffload::None, OptimizerOffload::Host, OptimizerOffload::PerStage})
    if (text == toString(o)) return o;
  throw UserError(flag + ": unknown value '" + text + "'; allowed: none | host | per-stage");
}

const char* toString(OptimizerOffload o) {
  switch (o) {
    case OptimizerOffload::None:
      return "none";
    case OptimizerOffload::Host:
      return "host";
    case OptimizerOffload::PerStage:
      return "per-stage";
  }
  return "?";
}

std::vector<bool> optimizerPlacements(OptimizerOffload o) {
  switch (o) {
    case OptimizerOffload::None:
      return {false};
    case OptimizerOffload::Host:
      return {true};
    case OptimizerOffload::PerStage:
      return {false, true};
  }
  return {false};
}

namespace {
// Note [Optimizer placement search]: the placements the DP tries for each stage of `shape`.
std::vector<bool> placementsOf(const PipelineShape& shape) {
  return shape.optimizerPerStage ? optimizerPlacements(OptimizerOffload::PerStage)
                                 : std::vector<bool>{shape.optimizerOnHost};
}
}  // namespace

PipelineShape stageShape(const PipelineShape& shape, bool optimizerOnHost) {
  PipelineShape s = shape;
  s.optimizerOnHost = optimizerOnHost;
  s.optimizerPerStage = false;
  return s;
}

void SolverOptions::validate() const {
  if (batch < 1) throw UserError("planner: batch must be >= 1, got " + std::to_string(batch));
  if (maxMicrobatches < 1)
    throw UserError("planner: max microbatches must be >= 1, got " +
                    std::to_string(maxMicrobatches));
  if (lookahead < 0)
    throw UserError("planner: lookahead must be >= 0, got " + std::to_string(lookahead));
  if (budget == 0) throw UserError("planner: a budget of 0 bytes leaves nothing to plan");
  if (maxStages < 0) throw UserError("planner: max stages must be >= 0");
  if (microbatches < 0 || (microbatches > 0 && batch % microbatches != 0))
    throw UserError("planner: microbatches must divide the batch " + std::to_string(batch) +
                    ", got " + std::to_string(microbatches) +
                    "; please choose a divisor or adjust training.batch");
}

std::vector<int> microbatchCounts(std::int64_t batch, int maxMicrobatches) {
  std::vector<int> out;
  for (std::int64_t m = 1; m <= std::min<std::int64_t>(batch, maxMicrobatches); ++m)
    if (batch % m == 0) out.push_back(static_cast<int>(m));
  return out;
}

// ---------------------------------------------------------------------------------------
// Chains

namespace {

bool interchangeable(const Cluster& c, int a, int b) {
  const auto &da = c.devices[a], &db = c.devices[b];
  if (da.speed != db.speed || da.capacity != db.capacity || !(da.host == db.host)) return false;
  if (!(c.links[a][b] == c.links[b][a])) return false;
  for (int x = 0; x < c.numDevices(); ++x) {
    if (x == a || x == b) continue;
    if (!(c.links[a][x] == c.links[b][x]) || !(c.links[x][a] == c.links[x][b])) return false;
    // Note [Devices and processes]: which pairs share a process is part of the cost.
    if (c.sameProcess(a, x) != c.sameProcess(b, x)) return false;
  }
  return true;
}

}  // namespace

std::vector<std::vector<int>> distinctChains(const Cluster& c, int length, int maxChains,
                                             bool* heuristic) {
  if (heuristic) *heuristic = false;
  const int D = c.numDevices();
  if (length > D || length < 1) return {};
  // Classes of interchangeable devices (transpositions that are automorphisms of the
  // cost structure; their closure is a group, so comparing with a representative works).
  std::vector<std::vector<int>> classes;
  for (int d = 0; d < D; ++d) {
    bool placed = false;
    for (auto& cl : classes)
      if (interchangeable(c, cl.front(), d)) {
        cl.push_back(d);
        placed = true;
        break;
      }
    if (!placed) classes.push_back({d});
  }
  std::vector<std::vector<int>> out;
  std::vector<int> used(classes.size(), 0), chain;
  bool overflow = false;
  // Depth-first over class sequences; the concrete device is the class's next free one.
  std::function<void()> dfs = [&]() {
    if (overflow) return;
    if (static_cast<int>(chain.size()) == length) {
      out.push_back(chain);
      if (static_cast<int>(out.size()) > maxChains) overflow = true;
      return;
    }
    for (size_t k = 0; k < classes.size(); ++k) {
      if (used[k] == static_cast<int>(classes[k].size())) continue;
      chain.push_back(classes[k][used[k]++]);
      dfs();
      --used[k];
      chain.pop_back();
    }
  };
  dfs();
  if (overflow) {
    if (heuristic) *heuristic = true;
    return greedyChains(c, length);
  }
  return out;
}

std::vector<std::vector<int>> greedyChains(const Cluster& c, int length) {
  const int D = c.numDevices();
  std::set<std::vector<int>> seen;
  std::vector<std::vector<int>> out;
  auto add = [&](std::vector<int> ch) {
    ch.resize(length);
    if (seen.insert(ch).second) out.push_back(ch);
  };
  auto bw = [&](int a, int b) {
    double x = c.link(a, b).bandwidth;
    return x <= 0 ? kInf : x;
  };
  for (int start = 0; start < D; ++start) {
    std::vector<int> ch{start};
    std::vector<bool> used(D, false);
    used[start] = true;
    while (static_cast<int>(ch.size()) < D) {
      int best = -1;
      for (int x = 0; x < D; ++x) {
        if (used[x]) continue;
        if (best < 0 || bw(ch.back(), x) > bw(ch.back(), best) ||
            (bw(ch.back(), x) == bw(ch.back(), best) && c.devices[x].speed > c.devices[best].speed))
          best = x;
      }
      used[best] = true;
      ch.push_back(best);
    }
    add(ch);
  }
  std::vector<int> ident(D);
  for (int i = 0; i < D; ++i) ident[i] = i;
  add(ident);
  std::stable_sort(ident.begin(), ident.end(),
                   [&](int a, int b) { return c.devices[a].speed > c.devices[b].speed; });
  add(ident);
  return out;
}

std::vector<int> replicaCounts(const Cluster& c, const SolverOptions& o) {
  std::vector<int> out{1};
  bool uniform = c.cores == 0;
  for (int d = 1; d < c.numDevices() && uniform; ++d) uniform = interchangeable(c, 0, d);
  if (!uniform) return out;
  for (int R = 2; R <= std::min(o.maxReplicas, c.numDevices()); ++R)
    if (o.batch % R == 0) out.push_back(R);
  return out;
}

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
  plan.iterationTime = sh.iterationTime(plan.tau);
  plan.throughput =
      plan.iterationTime > 0
          ? double(sh.replicas * sh.microbatches * sh.microbatchSize) / plan.iterationTime
          : 0;
  plan.peakMemory = 0;
  for (auto m : plan.deviceMemory) plan.peakMemory = std::max(plan.peakMemory, m);
}

// ---------------------------------------------------------------------------------------
// The DP for one shape

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

}  // namespace

std::optional<Plan> solveShape(const CostModel& modelIn, const PipelineShape& shape,
                               const std::vector<StashPolicy>& policiesIn,
                               const std::vector<std::int64_t>& limits, std::int64_t hostLimit,
                               Objective objective, double bound) {
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
    const std::int64_t W = model.paramSum(i, j);
    // The backward device's: states, weight versions, and the larger of the working set
    // and one graph (keep and offload keep >= 1 resident stash of it, the checkpoint kinds
    // recompute it in B; a B charged layer by layer may free the graph's later layers
    // before its largest working set, Note [Backward layer by layer] in CostModel.h).
    // (memoryLowerBound with no working set: the states, without the optimizer's when it is
    // on the host, Note [Optimizer offload in the cost model].)
    return model.memoryLowerBound(leanest, k, i, j, 0) + copies[k] * W +
           std::max(ws, scaledAtF(model.savedSum(i, j)));
  };
  auto memFits = [&](int k, int i, int j, std::int64_t ws, std::int64_t memCap) {
    const std::int64_t mb = memLb(k, i, j, ws);
    if (limB[k] >= 0 && mb > limB[k]) return false;
    if (memCap >= 0 && mb > memCap) return false;
    if (split) {  // the forward device holds the weights at least (Note [Forward device memory])
      const std::int64_t mf = model.paramSum(i, j);
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

// ---------------------------------------------------------------------------------------
// Decoupled partitions (Note [Decoupled search] in Solver.h)

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
                                        const std::vector<std::int64_t>& limits,
                                        std::int64_t hostLimit, Objective objective, double bound) {
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

// ---------------------------------------------------------------------------------------
// The search over shapes

namespace {

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
    sumW += l.paramBytes;
    sumStep += l.step;
    sumStatic += l.paramBytes + l.gradBytes +
                 (options.optimizerOffload == OptimizerOffload::None ? l.optimizerBytes : 0);
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
    sumStatic += l.paramBytes + l.gradBytes +
                 (options.optimizerOffload == OptimizerOffload::None ? l.optimizerBytes : 0);
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

namespace {

// Note [Prefetch distance in re-scoring]
// The cost model counts a stage's copies as a resource of their own that hides under
// compute when it is shorter. The schedule hides a PRE only under the `lookahead` compute
// actions in front of its B: with lookahead 1 on a folded device, a 5.9 ms PRE (VGG16's
// stage 0 at 224 px, 12 GB/s) has 3.2 ms of F to hide under, and pipefb-sync simulated at
// 748 ms per iteration against 615 ms predicted. So the re-scoring also simulates each
// candidate that offloads with up to two more actions of lookahead, and keeps the faster
// when its memory (one more resident stash per offloaded stage for each) still fits.
bool fitsLimits(const Plan& p, const std::vector<std::int64_t>& limits, std::int64_t hostLimit) {
  for (size_t d = 0; d < p.deviceMemory.size() && d < limits.size(); ++d)
    if (limits[d] >= 0 && p.deviceMemory[d] > limits[d]) return false;
  return hostLimit < 0 || p.hostBytes <= hostLimit;
}

void prefetchFurther(const CostModel& modelIn, Plan& plan, const std::vector<std::int64_t>& limits,
                     std::int64_t hostLimit, int lookahead) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  const bool offloads = std::any_of(plan.stages.begin(), plan.stages.end(), [](const StagePlan& s) {
    return schedules::isOffloaded(s.estimate.effective);
  });
  if (!offloads || !plan.simulated) return;
  for (int extra = 1; extra <= 2; ++extra) {
    Plan q = plan;
    q.shape.lookahead = lookahead + extra;
    evaluatePlan(model, q);
    if (!fitsLimits(q, limits, hostLimit)) return;
    simulatePlan(model, q, limits, hostLimit);
    if (q.simFits && q.simIterationTime < plan.simIterationTime * (1 - 1e-3)) plan = q;
  }
}

}  // namespace

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

// ---------------------------------------------------------------------------------------
// Simulator re-scoring

// Note [One memory model]
// The simulator holds what the runtime holds, action by action and in simulated time: the
// stashes a device keeps after their copy out (Note [Held offloads] in
// schedules/HeldOffloads.h), the weight versions B keeps (Note [Versions in simulated
// time] in src/sim/Simulator.cpp). What an action holds beyond the stashes while it runs
// is the cost model's own number, not a second estimate from the profile: F's whole peak,
// the stash it builds included (StageEstimate::forwardPeakBytes, Note [Forward peak]),
// B's working set (backwardWorkingBytes, Note [Backward layer by layer]) and the step's
// transient (stepWorkingBytes). Before, the simulator was given the profile's largest
// forward working set without the stash F builds (vgg16/8 pipefb-async 2S at its plan:
// device 0 simulated 16.41 MiB against 25.66 MiB costed) and B's working set as a fused B
// holds it whole, its graph beside it, where the runtime frees the graph layer by layer
// (device 3: 33.61 MiB simulated, 27.35 MiB costed, 25.27 MiB measured a round before).
// Where they still differ, the cost model takes the worst over timing and waiting
// messages that the simulator does not model (SimAgreementTest lists them).

void simulatePlan(const CostModel& modelIn, Plan& plan, const std::vector<std::int64_t>& limits,
                  std::int64_t hostLimit) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  const PipelineShape& sh = plan.shape;
  // Note [Decoupled search]: the generators do not run several segments per device yet.
  if (sh.decoupled()) return;
  const int S = sh.stages;
  std::vector<schedules::StagePlacement> sp;
  std::vector<StashPolicy> policies;
  sim::CostTable ct;
  const Cluster& cl = model.cluster();
  const double f = model.scale(sh);
  // The simulator's devices: the cluster's, or for a shared shape the chain positions (its
  // generators take only their default placement, Note [Shared devices]).
  auto clusterDevice = [&](int simDevice) {
    return sh.sharesDevices() ? sh.chain.at(simDevice) : simDevice;
  };
  for (int k = 0; k < S; ++k) {
    const StagePlan& st = plan.stages[k];
    if (sh.sharesDevices())
      sp.push_back({sh.position(k), sh.position(k)});
    else
      sp.push_back({st.forwardDevice, st.backwardDevice});
    policies.push_back(st.policy);
    const StageEstimate& e = st.estimate;
    sim::StageCosts c;
    c.forward = e.forwardTime + e.snapshotTime;  // Note [Weight snapshots]
    const double sb = model.speed(sh, st.backwardDevice);
    c.backward = model.backwardTime(st.first, st.last, f) / sb;
    c.recompute = model.recomputeTime(st.first, st.last, f) / sb;
    // Note [Backward after a step]: the first B after a STEP pays the excess; charged to
    // the STEP, on the same device and once per step.
    c.step = e.stepTime + e.afterStepTime + e.allReduceTime;  // Note [Replicated pipelines]
    c.activationBytes = scaledBytes(model.profile().layers[st.last - 1].outputBytes, f);
    c.gradientBytes = scaledBytes(model.inputBytes(st.first), f);
    std::int64_t saved = 0, W = 0, G = 0, O = 0;
    for (int l = st.first; l < st.last; ++l) {
      const auto& lc = model.profile().layers[l];
      saved += lc.savedBytes;
      W += lc.paramBytes;
      G += lc.gradBytes;
      O += lc.optimizerBytes;
    }
    c.stashBytes = scaledBytes(saved, f);
    c.checkpointBytes = c.gradientBytes;
    c.deferredBytes = e.deferredStashBytes;  // Note [What waits for W] (CostModel.h)
    c.weightVersionBytes = W;
    c.weightsBytes = W;
    c.gradsBytes = G;
    c.optimizerStateBytes = st.optimizerOnHost ? 0 : O;  // Note [Optimizer placement search]
    // Note [One memory model]: what F, B and STEP hold beyond the stashes, as the cost model
    // charges them. F: its whole peak, the stash it builds included (Note [Forward peak]);
    // the simulator charges the stash from F's end. B: its working set (Note [Backward
    // layer by layer]), of which a recomputing B's recomputed graph is charged by the
    // simulator as one stash (it adds stashBytes while BR runs).
    c.forwardWorkingSetBytes = e.forwardPeakBytes;
    const bool recomputes = schedules::isCheckpoint(e.effective);
    c.workingSetBytes =
        std::max<std::int64_t>(0, e.backwardWorkingBytes - (recomputes ? c.stashBytes : 0));
    c.stepWorkingBytes = e.stepWorkingBytes;  // Note [Step working set]
    if (e.weightWorkingBytes > 0)             // (W's own stash is the simulator's until W ends)
      c.weightWorkingSetBytes =
          std::max<std::int64_t>(0, e.weightWorkingBytes - e.deferredStashBytes);
    ct.stages.push_back(c);
  }
  std::set<int> used;
  for (auto& p : sp) used.insert(p.forward), used.insert(p.backward);
  for (int a : used) {
    const ClusterDevice& ca = cl.devices[clusterDevice(a)];
    ct.hostLinks[a] = {ca.host.bandwidth, ca.host.latency};
    for (int b : used)
      if (a != b) {
        const Link l = cl.link(clusterDevice(a), clusterDevice(b));
        ct.links[{a, b}] = {l.bandwidth, l.latency};
      }
  }
  // Enough iterations to reach the steady state the cost model assumes: PipeDream keeps
  // min(S-s, K*M) stashes, so K*M must reach S.
  int K = 3;
  if (sh.kind == ScheduleKind::PipeDream)
    K = std::max(K, (2 * S + sh.microbatches - 1) / sh.microbatches + 1);
  auto plan3 = schedules::makeSchedule(toString(sh.kind), S, sh.microbatches,
                                       schedules::Placement(sp), K, sh.lag());
  auto lowered = schedules::lower(plan3, policies, sh.lookahead, sh.offloadWeights);
  sim::SimOptions so;
  so.recordMemoryTimeline = false;
  sim::SimResult r = sim::simulate(lowered.schedule, ct, so);
  plan.simulated = true;
  plan.simIterationTime = r.iterationTime;
  plan.simPeak.assign(cl.numDevices(), 0);
  plan.simFits = true;
  for (int d = 0; d < static_cast<int>(r.memory.size()) && d < cl.numDevices(); ++d) {
    const int c = clusterDevice(d);
    if (sh.sharesDevices() && d >= sh.chainLength()) break;
    plan.simPeak[c] = r.memory[d].peakBytes;
    if (limits[c] >= 0 && plan.simPeak[c] > limits[c]) plan.simFits = false;
  }
  plan.simHostPeak = r.host.peakBytes;
  if (hostLimit >= 0 && plan.simHostPeak > hostLimit) plan.simFits = false;
}

}  // namespace pipefb::planner
