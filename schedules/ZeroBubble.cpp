#include "pipefb/schedules/ZeroBubble.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/schedules/SharedDevices.h"

namespace pipefb::schedules {

namespace {

constexpr int kNotYet = INT_MAX;  // end time of an action that has not started

void checkPlacement(const std::string& kind, const Placement& p, const Placement& want,
                    const std::string& what) {
  if (!(p == want))
    throw UserError(kind + " runs " + what + " (placement " + want.toString() + "), got " +
                    p.toString());
}

// Note [Greedy zero-bubble order]: one iteration's compute order per device.
// `hold`: stashes of the device's same-device stages between the start of F and the end of
// W; an F that starts a microbatch on the device needs fewer than hold - 1 alive, any other
// F fewer than hold, so the later stages of a V always find room (0: unlimited).
// `deferCap`: at most that many deferred W's per device before a W goes first (0: no cap).
std::vector<std::vector<Action>> greedyOrder(int S, int M, const Placement& p, int hold,
                                             int deferCap) {
  const int D = p.numDevices();
  std::vector<std::vector<int>> fEnd(S, std::vector<int>(M, kNotYet)), iEnd = fEnd;
  std::vector<int> nextF(S, 0), nextI(S, 0), busyUntil(D, 0), live(D, 0);
  std::vector<int> entry(D, S);  // lowest stage whose F runs on the device
  for (int s = 0; s < S; ++s) entry[p.forward(s)] = std::min(entry[p.forward(s)], s);
  // Deferred W per device, oldest first: (end time of its I, microbatch, stage).
  std::vector<std::set<std::tuple<int, int, int>>> pendingW(D);
  // Ends of W on the device, to release `live` when they finish.
  std::vector<std::multiset<int>> liveEnds(D);
  std::vector<std::vector<Action>> out(D);
  const long long total = 3LL * S * M;
  long long done = 0;
  for (int t = 0; done < total; ++t) {
    PIPEFB_ASSERT(t < 64 * (3 * S * M + 8), "greedy order made no progress");
    for (int d = 0; d < D; ++d) {
      auto& ends = liveEnds[d];
      while (!ends.empty() && *ends.begin() <= t) {
        ends.erase(ends.begin());
        --live[d];
      }
    }
    for (int d = 0; d < D; ++d) {
      if (busyUntil[d] > t) continue;
      auto& pw = pendingW[d];
      auto runW = [&] {
        auto [iDone, m, s] = *pw.begin();
        pw.erase(pw.begin());
        out[d].push_back(W(s, m));
        if (!p.split(s)) liveEnds[d].insert(t + 1);
        busyUntil[d] = t + 1;
        ++done;
      };
      // 0. Past the cap, the oldest deferred W.
      if (deferCap > 0 && static_cast<int>(pw.size()) >= deferCap &&
          std::get<0>(*pw.begin()) <= t) {
        runW();
        continue;
      }
      // 1. The oldest ready I (then the highest stage).
      int bestI = -1;
      for (int s = 0; s < S; ++s) {
        if (p.backward(s) != d || nextI[s] >= M) continue;
        const int m = nextI[s];
        const bool ready = fEnd[s][m] <= t && (s + 1 == S || iEnd[s + 1][m] <= t);
        if (ready && (bestI < 0 || m < nextI[bestI] || (m == nextI[bestI] && s > bestI))) bestI = s;
      }
      if (bestI >= 0) {
        const int m = nextI[bestI]++;
        out[d].push_back(I(bestI, m));
        iEnd[bestI][m] = t + 1;
        pendingW[d].insert({t + 1, m, bestI});
        busyUntil[d] = t + 1;
        ++done;
        continue;
      }
      // 2. A ready F, the highest stage first; a new microbatch only under the limit.
      int bestF = -1;
      for (int s = S - 1; s >= 0 && bestF < 0; --s) {
        if (p.forward(s) != d || nextF[s] >= M) continue;
        const int m = nextF[s];
        if (s > 0 && fEnd[s - 1][m] > t) continue;
        if (hold > 0 && live[d] >= (s == entry[d] ? hold - 1 : hold)) continue;
        bestF = s;
      }
      if (bestF >= 0) {
        const int m = nextF[bestF]++;
        out[d].push_back(F(bestF, m));
        fEnd[bestF][m] = t + 1;
        if (!p.split(bestF)) ++live[d];
        busyUntil[d] = t + 1;
        ++done;
        continue;
      }
      // 3. The oldest deferred W.
      if (!pw.empty() && std::get<0>(*pw.begin()) <= t) runW();
    }
  }
  return out;
}

// Note [Lagged W]: ZB-H1 and ZB-H2 as 1F1B with B split into I and W. Device d (stage d)
// warms up with `warmup` forwards, then alternates F and I (then the remaining I's), and
// after I(m) runs W(m - lag); the last `lag` W's close the iteration.
std::vector<Action> laggedOrder(int d, int M, int warmup, int lag) {
  warmup = std::min(warmup, M);
  std::vector<Action> out;
  int nextW = 0;
  auto afterI = [&](int m) {
    if (m - lag >= 0) out.push_back(W(d, nextW++));
  };
  for (int m = 0; m < warmup; ++m) out.push_back(F(d, m));
  for (int k = 0; k < M - warmup; ++k) {
    out.push_back(F(d, warmup + k));
    out.push_back(I(d, k));
    afterI(k);
  }
  for (int k = M - warmup; k < M; ++k) {
    out.push_back(I(d, k));
    afterI(k);
  }
  while (nextW < M) out.push_back(W(d, nextW++));
  return out;
}

// Iteration k of `order` on microbatches kM.., then STEP (and PipeFB's SW/RW) per stage.
Schedule repeatIterations(const std::string& kind, int S, int M, int K, const Placement& p,
                          const std::vector<std::vector<Action>>& order) {
  Schedule out = emptySchedule(kind, S, M, K, p);
  for (int k = 0; k < K; ++k)
    for (int d = 0; d < p.numDevices(); ++d) {
      auto& list = out.devices[d];
      bool firstF = true;
      for (Action a : order[d]) {
        if (a.type == ActionType::Forward && firstF && k > 0) {
          // pipefb-sync's flush: the forward device waits for the weights of step k-1.
          for (int s = 0; s < S; ++s)
            if (p.split(s) && p.forward(s) == d)
              list.push_back(recvWeights(s, k - 1, p.backward(s)));
          firstF = false;
        }
        a.index += k * M;
        list.push_back(a);
      }
      for (int s = 0; s < S; ++s)
        if (p.backward(s) == d) {
          list.push_back(step(s, k));
          if (p.split(s)) list.push_back(syncWeights(s, k, p.forward(s)));
        }
    }
  for (int s = 0; s < S; ++s)  // the forward device ends with the newest weights
    if (p.split(s)) out.devices[p.forward(s)].push_back(recvWeights(s, K - 1, p.backward(s)));
  return out;
}

SchedulePlan plan(const std::string& kind, int S, int M, int K, const Placement& p,
                  const std::vector<std::vector<Action>>& order) {
  SchedulePlan out;
  out.schedule = repeatIterations(kind, S, M, K, p, order);
  out.contract = contractFromOrder(out.schedule);
  return out;
}

void checkOneStagePerDevice(const std::string& kind, const Placement& p) {
  const Placement same = Placement::sameDevice(p.numStages());
  checkPlacement(kind, p, same, "stage s on device s");
}

}  // namespace

bool takesShape(const std::string& kind, int S, int M) {
  if (S < 1 || M < 1) return false;
  if (kind == "zbv") return S % 2 == 0;
  ScheduleKind k{};  // the interleaved kinds: their table row's looped placement, v = 2
  if (findScheduleKind(kind, k) && info(k).placement == DefaultPlacement::Looped)
    return S % 2 == 0 && M % (S / 2) == 0;
  return true;
}

MemoryContract contractFromOrder(const Schedule& s) {
  const int S = s.numStages;
  MemoryContract c;
  c.inFlight.assign(S, 0);
  c.residentForward.assign(S, 0);
  c.residentBackward.assign(S, 0);
  c.weightVersions.assign(S, 1);
  c.residentWeightVersions.assign(S, 1);
  c.deferredW.assign(S, 0);
  c.deferredAtI.assign(S, 0);
  for (int d = 0; d < s.numDevices(); ++d) {
    std::vector<int> alive(S, 0), deferred(S, 0);
    for (const Action& a : s.devices[d]) {
      if (!a.isCompute()) continue;
      // Note [Counting resident stashes]: at compute starts; B and W count their own.
      for (int st = 0; st < S; ++st) {
        if (s.placement.backward(st) != d) continue;
        c.deferredW[st] = std::max(c.deferredW[st], deferred[st]);
        if (!s.placement.split(st))
          c.residentForward[st] = std::max(c.residentForward[st], alive[st]);
      }
      const int st = a.stage;
      if (a.type == ActionType::InputGrad)
        c.deferredAtI[st] = std::max(c.deferredAtI[st], deferred[st]);
      if (a.type == ActionType::Forward) ++alive[st];
      if (a.type == ActionType::InputGrad) ++deferred[st];
      if (a.type == ActionType::WeightGrad) --deferred[st];
      if (a.endsStash()) --alive[st];
    }
  }
  const int M = s.numMicrobatches;
  for (int st = 0; st < S; ++st) {
    if (s.placement.split(st)) c.residentForward[st] = M;  // before the offload lowering
    c.inFlight[st] = c.residentBackward[st] = c.residentForward[st];
  }
  return c;
}

std::vector<std::vector<HeldAtStart>> stashesHeldTogether(const Schedule& s) {
  const int S = s.numStages;
  std::vector<std::vector<HeldAtStart>> out(s.numDevices());
  for (int d = 0; d < s.numDevices(); ++d) {
    std::vector<int> alive(S, 0), deferred(S, 0);
    std::vector<HeldAtStart>& seen = out[d];
    // x bounds y: the same starting stage and at least y's count in every stage.
    auto bounds = [&](const HeldAtStart& x, const HeldAtStart& y) {
      if (x.starting != y.starting || x.forward != y.forward || x.weight != y.weight) return false;
      for (int k = 0; k < S; ++k)
        if (x.alive[k] < y.alive[k] || x.deferred[k] < y.deferred[k]) return false;
      return true;
    };
    for (const Action& a : s.devices[d]) {
      if (!a.isCompute()) continue;
      const int st = a.stage;
      // Note [Counting resident stashes]: F's stash is not alive yet at its start.
      const HeldAtStart now{st, a.type == ActionType::Forward, a.type == ActionType::WeightGrad,
                            alive, deferred};
      if (std::none_of(seen.begin(), seen.end(),
                       [&](const HeldAtStart& h) { return bounds(h, now); })) {
        seen.erase(std::remove_if(seen.begin(), seen.end(),
                                  [&](const HeldAtStart& h) { return bounds(now, h); }),
                   seen.end());
        seen.push_back(now);
      }
      if (a.type == ActionType::Forward) ++alive[st];
      if (a.type == ActionType::InputGrad) ++deferred[st];
      if (a.type == ActionType::WeightGrad) --deferred[st];
      if (a.endsStash()) --alive[st];
    }
  }
  return out;
}

SchedulePlan zbH1(int S, int M, const Placement& p, int K) {
  checkShape("zb-h1", S, M, K, p);
  checkOneStagePerDevice("zb-h1", p);
  std::vector<std::vector<Action>> order(S);
  for (int d = 0; d < S; ++d) order[d] = laggedOrder(d, M, S - 1 - d, d);
  return plan("zb-h1", S, M, K, p, order);
}

SchedulePlan zbH2(int S, int M, const Placement& p, int K) {
  checkShape("zb-h2", S, M, K, p);
  checkOneStagePerDevice("zb-h2", p);
  std::vector<std::vector<Action>> order(S);
  for (int d = 0; d < S; ++d) order[d] = laggedOrder(d, M, 2 * (S - 1 - d), 2 * d);
  return plan("zb-h2", S, M, K, p, order);
}

SchedulePlan zbv(int S, int M, const Placement& p, int K) {
  checkShape("zbv", S, M, K, p);
  checkPlacement("zbv", p, Placement::vShape(S), "two stages per device in a V");
  const int D = S / 2;
  return plan("zbv", S, M, K, p, greedyOrder(S, M, p, 2 * D, 0));
}

SchedulePlan pipefbZb(int S, int M, const Placement& p, int K) {
  checkShape("pipefb-zb", S, M, K, p);
  std::set<int> used;
  for (int s = 0; s < S; ++s)
    if (!p.split(s) || !used.insert(p.forward(s)).second || !used.insert(p.backward(s)).second)
      throw UserError("pipefb-zb needs a forward and a backward device per stage, all distinct " +
                      std::string("(e.g. ") + Placement::pipefb(S).toString() + "), got " +
                      p.toString());
  // Note [PipeFB with a split backward]: W right after the I that sent the gradient.
  return plan("pipefb-zb", S, M, K, p, greedyOrder(S, M, p, 0, 1));
}

namespace {

// Megatron-LM's interleaved order over v = S / D chunks, for interleaved-1f1b and (with B
// split into I and W) interleaved-zb. `kind` names the schedule in errors.
//
// Note [Interleaved zero bubble]: interleaved-zb is the zero-bubble paper's ZB1P over v
// chunks, in the order torch.distributed.pipelining's ScheduleInterleavedZeroBubble gives
// its ranks, so that the two can be compared like for like (experiments/README.md,
// peer_pipelining). From interleaved-1f1b's order it differs in three ways:
//  * each B is an I (input gradient) and a W (weight gradient);
//  * device d warms up with (D-d-1) + (v-1)D forwards, one per hop to the last device
//    rather than two: an I is shorter than a B, so the gradient comes back sooner;
//  * after its k-th I (k >= d) the device runs the W of its (k-d)-th, as zb-h1's Note
//    [Lagged W]; the last d W's close the iteration, where 1F1B's cool-down bubble was.
// With v = 1 the order is zb-h1's. tests/schedules/torch_zb_order.py checks it against
// torch's generator action by action.
std::vector<std::vector<Action>> interleavedOrder(const std::string& kind, int S, int M,
                                                  const Placement& p, bool zeroBubble) {
  const int D = p.numDevices();
  if (D < 1 || S % D != 0 || S / D < 2)
    throw UserError(kind + ": " + std::to_string(S) + " stages on " + std::to_string(D) +
                    " devices; pipeline.virtual_stages must be >= 2 and divide the stages " +
                    "(use " + (zeroBubble ? "zb-h1" : "1f1b") + " for one stage per device)");
  const int v = S / D;
  checkPlacement(kind, p, Placement::looped(S, v), "stage s on device s mod " + std::to_string(D));
  if (M % D != 0)
    throw UserError(kind + ": microbatches (" + std::to_string(M) +
                    ") must be a multiple of the devices (" + std::to_string(D) +
                    "), as Megatron's interleaving walks the chunks in groups of " +
                    std::to_string(D));
  const int N = v * M;  // (chunk, microbatch) pairs per device and iteration
  // The k-th forward (or backward) of a device: chunk and microbatch (Megatron's order).
  auto stageOf = [&](int d, int k, bool forward) {
    const int chunk = (k % (D * v)) / D;
    return (forward ? chunk : v - 1 - chunk) * D + d;
  };
  auto mbOf = [&](int k) { return (k / (D * v)) * D + k % D; };
  std::vector<std::vector<Action>> order(D);
  for (int d = 0; d < D; ++d) {
    // Note [Interleaved zero bubble]
    const int warmup = zeroBubble ? std::min(N, (D - d - 1) + (v - 1) * D)
                       : M == D   ? N
                                  : std::min(N, 2 * (D - d - 1) + (v - 1) * D);
    auto& out = order[d];
    int nextW = 0;
    auto backward = [&](int k) {
      if (!zeroBubble) {
        out.push_back(B(stageOf(d, k, false), mbOf(k)));
        return;
      }
      out.push_back(I(stageOf(d, k, false), mbOf(k)));
      if (k >= d) {
        out.push_back(W(stageOf(d, nextW, false), mbOf(nextW)));
        ++nextW;
      }
    };
    for (int k = 0; k < warmup; ++k) out.push_back(F(stageOf(d, k, true), mbOf(k)));
    for (int k = 0; k < N - warmup; ++k) {
      out.push_back(F(stageOf(d, warmup + k, true), mbOf(warmup + k)));
      backward(k);
    }
    for (int k = N - warmup; k < N; ++k) backward(k);
    for (; zeroBubble && nextW < N; ++nextW)
      out.push_back(W(stageOf(d, nextW, false), mbOf(nextW)));
  }
  return order;
}

}  // namespace

SchedulePlan interleaved1F1B(int S, int M, const Placement& p, int K) {
  checkShape("interleaved-1f1b", S, M, K, p);
  return plan("interleaved-1f1b", S, M, K, p, interleavedOrder("interleaved-1f1b", S, M, p, false));
}

SchedulePlan interleavedZb(int S, int M, const Placement& p, int K) {
  checkShape("interleaved-zb", S, M, K, p);
  return plan("interleaved-zb", S, M, K, p, interleavedOrder("interleaved-zb", S, M, p, true));
}

}  // namespace pipefb::schedules
