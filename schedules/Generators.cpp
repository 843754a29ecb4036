#include "pipefb/schedules/Generators.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/schedules/ZeroBubble.h"

namespace pipefb::schedules {

namespace {

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

// PipeFB: Placement::checkFor's rule (at least one stage split; at most one forward range
// and one backward range per device, Note [Decoupled partitions]).
void checkSplit(const std::string& kind, const Placement& p) {
  p.checkFor(kind, p.numDevices(), kind);
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

void checkShape(const std::string& kind, int S, int M, int K, const Placement& p) {
  if (S < 1) throw UserError(kind + ": stages must be >= 1, got " + std::to_string(S));
  if (M < 1) throw UserError(kind + ": microbatches must be >= 1, got " + std::to_string(M));
  if (K < 1) throw UserError(kind + ": iterations must be >= 1, got " + std::to_string(K));
  if (p.numStages() != S)
    throw UserError(kind + ": the placement has " + std::to_string(p.numStages()) + " stages but " +
                    std::to_string(S) + " were asked for");
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
//
// Note [PipeFB device order]
// Per iteration, a device runs the forwards of its forward range and the backwards of its
// backward range (Note [Decoupled partitions]), then each backward stage's STEP and
// SyncWeights after that stage's last backward. It merges them by slot (PipefbSlots): F(s,j)
// has slot r(s) + j and B(s,j) slot R + q(s) + j, the step at which each would run in a
// perfectly pipelined chain of ranges F(range 0) .. F(range R-1), B(last range) .. B(range
// 0); ties: forwards first, forwards by ascending and backwards by descending stage. With
// one stage per range (the 2S form, folded()) the slots are s + j and 2S - 1 - s + j: a
// device with one pass runs its list in microbatch order; a folded device d (Note [Folded
// placements]) runs S forwards, then alternates B(S-1-d, j) and F(d, j + S), like 1F1B
// with a longer warm-up, so its copies (OFFs of one stage, PREs of the other) spread over
// the iteration. A forward range of several segments runs F(first..last, j) back to back,
// microbatch by microbatch, as one stage would. Every dependency (the previous stage's F,
// the stash, the next stage's B) has a smaller key, so no placement with at most one
// forward range and one backward range per device can deadlock within an iteration;
// across iterations each device finishes iteration k (and RW waits for SW of k-1 only). A
// stage that is not split (folded, odd S: the middle one) runs the same merge on one
// device; its STEP makes the version its next forwards use, so it needs no SW/RW and
// keeps one version.
//
// Note [Steps after the device's backwards]
// pipefb-sync steps a device's stages once the device has run its last backward of the
// iteration, in the order their last backwards ran: a device whose backward range has
// several stages no longer steps stage s+1 between B(s+1, M-1) and B(s, M-1). Under fp16 a
// stage may step only when every stage's gradients are known to be finite (Note [Loss
// scaling] in train/LossScaler.h), so a STEP waits for the verdict of the whole pipeline;
// placed before a backward of its own device it would wait for itself. The STEPs move
// nothing else: a sync forward of the next iteration waits for RW, which waits for SW, which
// follows its STEP either way. pipefb-async keeps each STEP after its stage's last backward
// (it has no fp16: Note [Loss scaling]).
SchedulePlan pipefb(const std::string& kind, int S, int M, const Placement& p, int K, int lag) {
  checkShape(kind, S, M, K, p);
  checkSplit(kind, p);
  if (lag < 0 || lag > M)
    throw UserError(kind + ": pipeline.async_lag must be in [0, microbatches = " +
                    std::to_string(M) + "], got " + std::to_string(lag));
  const int inFlight = K > 1 ? M + lag : M;
  const int versions = (lag > 0 && K > 1) ? 2 : 1;
  SchedulePlan plan{emptySchedule(kind, S, M, K, p), uniformContract(S, inFlight, versions)};
  for (int s = 0; s < S; ++s)
    if (!p.split(s)) {
      plan.contract.inFlight[s] = plan.contract.residentForward[s] =
          plan.contract.residentBackward[s] = unsplitPipefbInFlight(p, s, M);
      plan.contract.weightVersions[s] = plan.contract.residentWeightVersions[s] = 1;
    }
  const PipefbSlots slots(p);
  const int D = p.numDevices();
  for (int d = 0; d < D; ++d) {
    auto& out = plan.schedule.devices[d];
    // This device's forwards and backwards of one iteration, in slot order: (key, pass, s, j).
    std::vector<std::tuple<long long, bool, int, int>> order;
    std::vector<int> splitForwards;  // its split forward stages, ascending
    for (int s = 0; s < S; ++s) {
      for (int j = 0; j < M; ++j) {
        if (p.forward(s) == d) order.emplace_back(slots.key(false, s, j), false, s, j);
        if (p.backward(s) == d) order.emplace_back(slots.key(true, s, j), true, s, j);
      }
      if (p.forward(s) == d && p.split(s)) splitForwards.push_back(s);
    }
    std::sort(order.begin(), order.end());
    // The RWs of iteration k-1 go together: before the range's first forward with j == lag,
    // or (lag == M) after its last forward of iteration k. Per stage they could go before
    // each stage's own F(s, kM + lag), but the runtime feeds iteration k only once every
    // device ran its actions of iteration k-1 (RW s.(k-1) is one of them), so in sync an RW
    // of stage s+1 behind F(s, kM) of the same device would wait for itself.
    auto receiveWeights = [&](int k) {
      for (int s : splitForwards) out.push_back(recvWeights(s, k - 1, p.backward(s)));
    };
    size_t lastForward = 0, lastBackward = 0;
    for (size_t i = 0; i < order.size(); ++i)
      (std::get<1>(order[i]) ? lastBackward : lastForward) = i;
    for (int k = 0; k < K; ++k) {
      bool received = k == 0 || splitForwards.empty();
      std::vector<int> toStep;  // sync: Note [Steps after the device's backwards]
      auto stepStage = [&](int s) {
        out.push_back(step(s, k));
        if (p.split(s)) out.push_back(syncWeights(s, k, p.forward(s)));
      };
      for (size_t i = 0; i < order.size(); ++i) {
        const auto& [key, backward, s, j] = order[i];
        if (!backward) {
          if (!received && j == lag) {
            receiveWeights(k);
            received = true;
          }
          out.push_back(F(s, k * M + j));
          if (!received && i == lastForward) {  // lag == M
            receiveWeights(k);
            received = true;
          }
        } else {
          out.push_back(B(s, k * M + j));
          if (j + 1 == M) {
            if (lag > 0)
              stepStage(s);
            else
              toStep.push_back(s);
          }
          if (i == lastBackward)
            for (int t : toStep) stepStage(t);
        }
      }
    }
  }
  auto& dev = plan.schedule.devices;
  // The forward device ends with the newest weights.
  for (int s = 0; s < S; ++s)
    if (p.split(s)) dev[p.forward(s)].push_back(recvWeights(s, K - 1, p.backward(s)));
  return plan;
}

}  // namespace

PipefbSlots::PipefbSlots(const Placement& p)
    : forwardRange_(p.numStages()), backwardRange_(p.numStages()) {
  const auto forward = p.forwardRanges(), backward = p.backwardRanges();
  numForwardRanges_ = static_cast<int>(forward.size());
  for (size_t r = 0; r < forward.size(); ++r)
    for (int s = forward[r].first; s < forward[r].last; ++s) forwardRange_[s] = static_cast<int>(r);
  for (size_t r = 0; r < backward.size(); ++r)
    for (int s = backward[r].first; s < backward[r].last; ++s)
      backwardRange_[s] = static_cast<int>(backward.size() - 1 - r);
}

long long PipefbSlots::key(bool isBackward, int s, int j) const {
  const long long slot = isBackward ? backward(s, j) : forward(s, j);
  const long long n = static_cast<long long>(forwardRange_.size());
  return (slot * 2 + (isBackward ? 1 : 0)) * n + (isBackward ? n - 1 - s : s);
}

int unsplitPipefbInFlight(const Placement& p, int s, int M) {
  const PipefbSlots slots(p);
  return std::min(M, slots.backward(s, 0) - slots.forward(s, 0) + 1);
}

int unsplitPipefbInFlight(int S, int M) { return std::min(M, S + 1); }

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
    case ScheduleKind::InterleavedZb:
      return interleavedZb(S, M, p, K);
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
