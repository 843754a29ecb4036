#include "pipefb/schedules/Generators.h"

#include <algorithm>
#include <set>

#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/schedules/ZeroBubble.h"

namespace pipefb::schedules {

namespace {

void checkShape(const std::string& kind, int S, int M, int K, const Placement& p) {
  if (S < 1) throw UserError(kind + ": stages must be >= 1, got " + std::to_string(S));
  if (M < 1) throw UserError(kind + ": microbatches must be >= 1, got " + std::to_string(M));
  if (K < 1) throw UserError(kind + ": iterations must be >= 1, got " + std::to_string(K));
  if (p.numStages() != S)
    throw UserError(kind + ": the placement has " + std::to_string(p.numStages()) + " stages but " +
                    std::to_string(S) + " were asked for");
}

// GPipe, 1F1B and PipeDream: F(s) == B(s) and one stage per device.
void checkSameDevice(const std::string& kind, const Placement& p) {
  std::set<int> used;
  for (int s = 0; s < p.numStages(); ++s) {
    if (p.split(s))
      throw UserError(kind + " runs forward and backward of a stage on one device, but stage " +
                      std::to_string(s) + " is placed " + std::to_string(p.forward(s)) + "/" +
                      std::to_string(p.backward(s)) + "; use pipefb-sync or pipefb-async");
    if (!used.insert(p.forward(s)).second)
      throw UserError(kind + ": device " + std::to_string(p.forward(s)) +
                      " holds more than one stage; one stage per device is supported");
  }
}

// PipeFB: F(s) != B(s) and all 2S devices distinct.
void checkSplit(const std::string& kind, const Placement& p) {
  std::set<int> used;
  for (int s = 0; s < p.numStages(); ++s) {
    if (!p.split(s))
      throw UserError(kind +
                      " needs a different forward and backward device for every stage, "
                      "but stage " +
                      std::to_string(s) + " is placed " + std::to_string(p.forward(s)) + "/" +
                      std::to_string(p.backward(s)));
    if (!used.insert(p.forward(s)).second || !used.insert(p.backward(s)).second)
      throw UserError(kind +
                      ": a device holds more than one pass; every forward and backward "
                      "device must be distinct (placement " +
                      p.toString() + ")");
  }
}

Schedule emptySchedule(const std::string& kind, int S, int M, int K, const Placement& p) {
  Schedule s;
  s.kind = kind;
  s.numStages = S;
  s.numMicrobatches = M;
  s.numIterations = K;
  s.placement = p;
  s.devices.resize(p.numDevices());
  return s;
}

MemoryContract uniformContract(int S, int inFlight, int versions) {
  MemoryContract c;
  c.inFlight.assign(S, inFlight);
  c.residentForward.assign(S, inFlight);
  c.residentBackward.assign(S, inFlight);
  c.weightVersions.assign(S, versions);
  c.residentWeightVersions.assign(S, versions);
  return c;
}

// 1F1B order of one stage over microbatches [first, first + n): warm-up of `warmup`
// forwards, then (F, B) pairs, then the remaining backwards. `afterB` runs after each B.
template <typename AfterB>
void oneFOneBStage(std::vector<Action>& out, int s, int first, int n, int warmup, AfterB afterB) {
  warmup = std::min(warmup, n);
  for (int i = 0; i < warmup; ++i) out.push_back(F(s, first + i));
  for (int i = 0; i < n - warmup; ++i) {
    out.push_back(F(s, first + warmup + i));
    out.push_back(B(s, first + i));
    afterB(first + i);
  }
  for (int i = n - warmup; i < n; ++i) {
    out.push_back(B(s, first + i));
    afterB(first + i);
  }
}

}  // namespace

SchedulePlan gpipe(int S, int M, const Placement& p, int K) {
  checkShape("gpipe", S, M, K, p);
  checkSameDevice("gpipe", p);
  SchedulePlan plan{emptySchedule("gpipe", S, M, K, p), uniformContract(S, M, 1)};
  for (int s = 0; s < S; ++s) {
    auto& out = plan.schedule.devices[p.forward(s)];
    for (int k = 0; k < K; ++k) {
      for (int j = 0; j < M; ++j) out.push_back(F(s, k * M + j));
      for (int j = 0; j < M; ++j) out.push_back(B(s, k * M + j));
      out.push_back(step(s, k));
    }
  }
  return plan;
}

SchedulePlan oneFOneB(int S, int M, const Placement& p, int K) {
  checkShape("1f1b", S, M, K, p);
  checkSameDevice("1f1b", p);
  SchedulePlan plan{emptySchedule("1f1b", S, M, K, p), uniformContract(S, 0, 1)};
  for (int s = 0; s < S; ++s) {
    auto& out = plan.schedule.devices[p.forward(s)];
    for (int k = 0; k < K; ++k) {
      oneFOneBStage(out, s, k * M, M, S - s - 1, [](int) {});
      out.push_back(step(s, k));
    }
    int inFlight = std::min(S - s, M);
    plan.contract.inFlight[s] = plan.contract.residentForward[s] =
        plan.contract.residentBackward[s] = inFlight;
  }
  return plan;
}

SchedulePlan pipedream(int S, int M, const Placement& p, int K) {
  checkShape("pipedream", S, M, K, p);
  checkSameDevice("pipedream", p);
  SchedulePlan plan{emptySchedule("pipedream", S, M, K, p), uniformContract(S, 0, 1)};
  int N = K * M;
  for (int s = 0; s < S; ++s) {
    auto& out = plan.schedule.devices[p.forward(s)];
    // One update per microbatch: STEP s.m follows B(s,m), so F(s,m) uses the newest
    // version and B(s,m) the stashed one (Note [Weight versions]).
    oneFOneBStage(out, s, 0, N, S - s - 1, [&](int m) { out.push_back(step(s, m)); });
    int inFlight = std::min(S - s, N);
    plan.contract.inFlight[s] = plan.contract.residentForward[s] =
        plan.contract.residentBackward[s] = inFlight;
    plan.contract.weightVersions[s] = plan.contract.residentWeightVersions[s] = inFlight;
  }
  return plan;
}

namespace {

// Shared by both PipeFB variants; `lag` is how many forwards of iteration k the forward
// device runs before it receives RW s.(k-1): 0 = sync (a flush per iteration), M = async
// (forwards never wait for the previous iteration's backward; one version stale).
SchedulePlan pipefb(const std::string& kind, int S, int M, const Placement& p, int K, int lag) {
  checkShape(kind, S, M, K, p);
  checkSplit(kind, p);
  if (lag < 0 || lag > M)
    throw UserError(kind + ": pipeline.async_lag must be in [0, microbatches = " +
                    std::to_string(M) + "], got " + std::to_string(lag));
  const int inFlight = K > 1 ? M + lag : M;
  const int versions = (lag > 0 && K > 1) ? 2 : 1;
  SchedulePlan plan{emptySchedule(kind, S, M, K, p), uniformContract(S, inFlight, versions)};
  for (int s = 0; s < S; ++s) {
    int fd = p.forward(s), bd = p.backward(s);
    auto& fwd = plan.schedule.devices[fd];
    auto& bwd = plan.schedule.devices[bd];
    for (int k = 0; k < K; ++k) {
      for (int j = 0; j < M; ++j) {
        if (k > 0 && j == lag) fwd.push_back(recvWeights(s, k - 1, bd));
        fwd.push_back(F(s, k * M + j));
      }
      if (k > 0 && lag == M) fwd.push_back(recvWeights(s, k - 1, bd));
      for (int j = 0; j < M; ++j) bwd.push_back(B(s, k * M + j));
      bwd.push_back(step(s, k));
      bwd.push_back(syncWeights(s, k, fd));
    }
    // The forward device ends with the newest weights.
    fwd.push_back(recvWeights(s, K - 1, bd));
  }
  return plan;
}

}  // namespace

SchedulePlan pipefbSync(int S, int M, const Placement& p, int K) {
  return pipefb("pipefb-sync", S, M, p, K, 0);
}

SchedulePlan pipefbAsync(int S, int M, const Placement& p, int K, int lag) {
  return pipefb("pipefb-async", S, M, p, K, lag < 0 ? M : lag);
}

SchedulePlan makeSchedule(ScheduleKind kind, int S, int M, const Placement& p, int K,
                          int asyncLag) {
  switch (kind) {  // Note [Adding a schedule kind]
    case ScheduleKind::GPipe:
      return gpipe(S, M, p, K);
    case ScheduleKind::OneFOneB:
      return oneFOneB(S, M, p, K);
    case ScheduleKind::PipeDream:
      return pipedream(S, M, p, K);
    case ScheduleKind::PipeFbSync:
      return pipefbSync(S, M, p, K);
    case ScheduleKind::PipeFbAsync:
      return pipefbAsync(S, M, p, K, asyncLag);
    case ScheduleKind::ZbH1:
      return zbH1(S, M, p, K);
    case ScheduleKind::ZbH2:
      return zbH2(S, M, p, K);
    case ScheduleKind::Zbv:
      return zbv(S, M, p, K);
    case ScheduleKind::Interleaved1F1B:
      return interleaved1F1B(S, M, p, K);
    case ScheduleKind::PipeFbZb:
      return pipefbZb(S, M, p, K);
  }
  PIPEFB_ASSERT(false, "a schedule kind without a generator");
  return {};
}

SchedulePlan makeSchedule(const std::string& kind, int S, int M, const Placement& p, int K,
                          int asyncLag) {
  return makeSchedule(parseScheduleKind(kind), S, M, p, K, asyncLag);
}

SchedulePlan makeSchedule(const std::string& kind, int S, int M, int K) {
  if (S < 1) throw UserError(kind + ": stages must be >= 1, got " + std::to_string(S));
  return makeSchedule(kind, S, M, Placement::defaultFor(kind, S), K);
}

}  // namespace pipefb::schedules
