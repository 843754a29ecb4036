#include "pipefb/schedules/Lowering.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <tuple>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/WeightVersions.h"

namespace pipefb::schedules {

namespace {
using Key = std::tuple<ActionType, int, int, StashKind>;
Key keyOf(const Action& a) { return {a.type, a.stage, a.index, a.stash}; }
}  // namespace

std::vector<StashPolicy> policiesPerStage(const std::vector<StashPolicy>& policies, int S) {
  if (policies.empty()) return std::vector<StashPolicy>(S, StashPolicy::Keep);
  if (policies.size() == 1) return std::vector<StashPolicy>(S, policies[0]);
  if (static_cast<int>(policies.size()) != S)
    throw UserError("got " + std::to_string(policies.size()) + " stash policies for " +
                    std::to_string(S) + " stages; give one policy, or one per stage");
  return policies;
}

std::vector<int> lookaheadPerStage(const std::vector<int>& lookahead, int S) {
  for (int v : lookahead)
    if (v < 0) throw UserError("pipeline.lookahead: must be >= 0, got " + std::to_string(v));
  if (lookahead.empty()) return std::vector<int>(S, 1);
  if (lookahead.size() == 1) return std::vector<int>(S, lookahead[0]);
  if (static_cast<int>(lookahead.size()) != S)
    throw UserError("pipeline.lookahead: got " + std::to_string(lookahead.size()) + " values for " +
                    std::to_string(S) + " stages; give one, or one per stage");
  return lookahead;
}

Schedule markRecompute(const Schedule& in, const std::vector<StashPolicy>& policiesIn) {
  const int S = in.numStages;
  std::vector<StashPolicy> policy = policiesPerStage(policiesIn, S);
  Schedule out = in;
  for (auto& list : out.devices)
    for (Action& a : list)
      if (a.isInputBackward())
        a.recompute = isCheckpoint(effectivePolicy(policy[a.stage], in.placement.split(a.stage)));
  return out;
}

Schedule addCommunication(const Schedule& in) {
  const Placement& p = in.placement;
  const int S = in.numStages;
  // Note [Recomputed last output]: the microbatches whose last-stage B (or I) recomputes.
  std::set<int> recomputesOutput;
  for (const auto& list : in.devices)
    for (const Action& a : list)
      if (a.isInputBackward() && a.stage == S - 1 && a.recompute) recomputesOutput.insert(a.index);
  auto outputTravels = [&](int m) {
    return lastOutputTravels(p.split(S - 1), recomputesOutput.count(m) > 0);
  };
  // The activation and gradient messages already on the device, the only keys asked for,
  // as a flat table over (type, stage, index) (Note [Lowering speed]), reset per device.
  const IndexSpan span = indexSpan(in);
  const int lo = span.lo;
  const size_t width = span.width();
  auto slot = [&](const Action& a) -> long {
    int t = a.type == ActionType::SendAct    ? 0
            : a.type == ActionType::RecvAct  ? 1
            : a.type == ActionType::SendGrad ? 2
            : a.type == ActionType::RecvGrad ? 3
                                             : -1;
    if (t < 0 || a.stash != StashKind::Activation || a.stage < 0 || a.stage >= S) return -1;
    return static_cast<long>((static_cast<size_t>(t) * S + a.stage) * width + (a.index - lo));
  };
  std::vector<char> present(4 * S * width, 0);
  std::vector<long> marked;
  Schedule out = in;
  for (int d = 0; d < in.numDevices(); ++d) {
    for (long i : marked) present[i] = 0;
    marked.clear();
    auto mark = [&](const Action& a) {
      const long i = slot(a);
      if (i < 0 || present[i]) return false;
      present[i] = 1;
      marked.push_back(i);
      return true;
    };
    for (const Action& a : in.devices[d])
      if (a.isSend() || a.isRecv()) mark(a);
    auto addIfMissing = [&](std::vector<Action>& list, const Action& a) {
      PIPEFB_ASSERT(slot(a) >= 0, "a message outside the schedule's stages or indices");
      if (mark(a)) list.push_back(a);
    };
    std::vector<Action> list;
    list.reserve(in.devices[d].size() * 2);
    for (const Action& a : in.devices[d]) {
      const int s = a.stage, m = a.index;
      if (a.type == ActionType::Forward) {
        if (s > 0 && p.forward(s - 1) != d) addIfMissing(list, recvAct(s - 1, m, p.forward(s - 1)));
        list.push_back(a);
        if (s + 1 < S) {
          if (p.forward(s + 1) != d) addIfMissing(list, sendAct(s, m, p.forward(s + 1)));
        } else if (outputTravels(m)) {
          addIfMissing(list, sendAct(s, m, p.backward(s)));
        }
      } else if (a.isInputBackward()) {  // W needs nothing from another device
        if (s + 1 < S) {
          if (p.backward(s + 1) != d) addIfMissing(list, recvGrad(s + 1, m, p.backward(s + 1)));
        } else if (outputTravels(m)) {
          addIfMissing(list, recvAct(s, m, p.forward(s)));
        }
        list.push_back(a);
        if (s > 0 && p.backward(s - 1) != d) addIfMissing(list, sendGrad(s, m, p.backward(s - 1)));
      } else {
        list.push_back(a);
      }
    }
    out.devices[d] = std::move(list);
  }
  return out;
}

Schedule addOffload(const Schedule& in, const std::vector<StashPolicy>& policiesIn, int lookahead) {
  return addOffload(in, policiesIn, std::vector<int>{lookahead});
}

Schedule addOffload(const Schedule& in, const std::vector<StashPolicy>& policiesIn,
                    const std::vector<int>& lookaheadIn) {
  const int S = in.numStages;
  const std::vector<int> lookahead = lookaheadPerStage(lookaheadIn, S);
  std::vector<StashPolicy> policy = policiesPerStage(policiesIn, S);
  for (int s = 0; s < S; ++s) policy[s] = effectivePolicy(policy[s], in.placement.split(s));

  const PipefbSlots slots(in.placement);
  const int M = in.numMicrobatches;
  const std::vector<bool> phased = forwardPhaseFirst(in);
  const Schedule marked = markRecompute(in, policy);  // BR for checkpoint kinds
  Schedule out = in;
  for (int d = 0; d < in.numDevices(); ++d) {
    // The OFFs and PREs already on the device (only those are ever looked up: Note
    // [Lowering speed]).
    std::set<Key> present;
    for (const Action& a : in.devices[d])
      if (a.type == ActionType::Offload || a.type == ActionType::Prefetch) present.insert(keyOf(a));

    // Pass 1: OFF right after the producing F.
    std::vector<Action> list;
    list.reserve(in.devices[d].size() * 2);
    for (const Action& a : marked.devices[d]) {
      list.push_back(a);
      if (a.type == ActionType::Forward && isOffloaded(policy[a.stage])) {
        Action off = offload(a.stage, a.index);
        if (present.insert(keyOf(off)).second) list.push_back(off);
      }
    }

    // Pass 2: PRE `lookahead` compute actions before each B of an offloaded stage.
    // inserts[i] = prefetches to place in front of list[i], in consumption order.
    std::vector<std::vector<Action>> inserts(list.size() + 1);
    std::vector<int> computeIdx;  // positions of F/B in `list`
    std::vector<int> backIdx;     // positions of B in `list`
    std::set<int> forwardsOther;  // stages whose F runs here and B elsewhere
    std::set<std::pair<int, int>> offloadedHere;
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      if (a.type == ActionType::Offload && a.stash == StashKind::Activation)
        offloadedHere.insert({a.stage, a.index});
      if (a.isCompute()) computeIdx.push_back(i);
      if (a.type == ActionType::Backward) backIdx.push_back(i);
      if (a.type == ActionType::Forward && in.placement.backward(a.stage) != d)
        forwardsOther.insert(a.stage);
    }
    bool foldedHere = false;  // this device runs B of a stage and F of another
    for (int i : backIdx)
      for (int f : forwardsOther) foldedHere = foldedHere || f != list[i].stage;
    for (size_t c = 0; c < computeIdx.size(); ++c) {
      int i = computeIdx[c];
      const Action& b = list[i];
      if (!b.isInputBackward() || !isOffloaded(policy[b.stage])) continue;
      Action pre = prefetch(b.stage, b.index);
      if (!present.insert(keyOf(pre)).second) continue;
      const size_t ahead = static_cast<size_t>(lookahead[b.stage]);
      int anchor = c >= ahead ? computeIdx[c - ahead] : 0;
      // Note [Folded lookahead]: a device that runs another stage's forwards between its
      // backwards (folded) counts the lookahead in its backwards, so PRE s.m goes out as
      // many whole F + B cycles ahead (the cost model hides a copy under a microbatch's
      // compute) and still holds at most lookahead + 1 stashes of stage s.
      if (foldedHere) {
        const size_t nb = static_cast<size_t>(std::lower_bound(backIdx.begin(), backIdx.end(), i) -
                                              backIdx.begin());
        anchor = nb >= ahead ? backIdx[nb - ahead] : 0;
      }
      // Issue the copy before the device blocks on the receives feeding the anchor.
      while (anchor > 0 && list[anchor - 1].isRecv()) --anchor;
      // Note [Prefetch behind other stages' offloads]
      // The copy engine is FIFO. A folded device (Note [Folded placements]) offloads one
      // stage and prefetches another; PRE s.m waits for OFF s.m on another device, which
      // waits (through F(s,m)'s inputs, OFF backpressure, or RW from an earlier iteration)
      // for this device's OFFs of forwards with a smaller key (Note [PipeFB device order],
      // PipefbSlots) or of an earlier iteration. A PRE
      // queued ahead of one of those would wait for a copy that waits for it, so it goes
      // behind the last of them; later OFFs may queue behind it (the lookahead holds in
      // the steady state).
      const int iteration = b.index / M;
      for (int j = i - 1; foldedHere && j >= anchor; --j) {
        const Action& u = list[j];
        if (u.type == ActionType::Offload && u.stash == StashKind::Activation &&
            u.stage != b.stage &&
            (u.index / M < iteration ||
             slots.key(false, u.stage, u.index % M) <= slots.key(false, b.stage, b.index % M))) {
          anchor = j + 1;
          break;
        }
      }
      // Note [Prefetches after the forward phase]: not before the last F of the phase.
      if (phased[b.stage]) {
        for (int j = i - 1; j >= 0; --j)
          if (list[j].type == ActionType::Forward && list[j].stage == b.stage) {
            const bool off = j + 1 < i && list[j + 1].type == ActionType::Offload;
            anchor = std::max(anchor, j + (off ? 2 : 1));
            break;
          }
      }
      // Never before this device's own OFF of the same stash.
      if (offloadedHere.count({b.stage, b.index})) {
        for (int j = i - 1; j >= 0; --j)
          if (list[j].type == ActionType::Offload && list[j].stage == b.stage &&
              list[j].index == b.index && list[j].stash == StashKind::Activation) {
            anchor = std::max(anchor, j + 1);
            break;
          }
      }
      inserts[anchor].push_back(pre);
    }
    std::vector<Action> merged;
    merged.reserve(list.size() * 2);
    for (size_t i = 0; i <= list.size(); ++i) {
      for (const Action& a : inserts[i]) merged.push_back(a);
      if (i < list.size()) merged.push_back(list[i]);
    }
    out.devices[d] = std::move(merged);
  }
  return out;
}

Schedule addWeightOffload(const Schedule& in, const std::vector<StashPolicy>& policiesIn,
                          const std::vector<int>& lookaheadIn) {
  const int S = in.numStages;
  const std::vector<int> lookahead = lookaheadPerStage(lookaheadIn, S);
  std::vector<StashPolicy> policy = policiesPerStage(policiesIn, S);
  for (int s = 0; s < S; ++s) policy[s] = effectivePolicy(policy[s], in.placement.split(s));
  const std::vector<StashedVersion> versions = stashedVersions(in);

  // pos[slot(t, stage, index)]: the position on the device of its action (t: F, B or I,
  // the B or W that ends the stash, STEP), -1 = none; a flat table (Note [Lowering speed]),
  // reset after each device.
  const IndexSpan span = indexSpan(in);
  const int lo = span.lo, hi = span.hi;
  const int width = static_cast<int>(span.width());
  enum Slot { kF, kB, kEnd, kStep, kSlots };
  std::vector<int> pos(static_cast<size_t>(kSlots) * S * width, -1);
  auto slot = [&](int t, int st, int i) {
    return (static_cast<size_t>(t) * S + st) * width + (i - lo);
  };
  auto slotOf = [](ActionType t) {
    return t == ActionType::Forward ? kF : t == ActionType::Step ? kStep : kB;  // B or I
  };
  Schedule out = in;
  for (int d = 0; d < in.numDevices(); ++d) {
    const std::vector<Action>& list = in.devices[d];
    const int n = static_cast<int>(list.size());
    std::vector<int> computeIdx, ordinal(n + 1, 0);  // ordinal: compute actions before i
    for (int i = 0; i < n; ++i) {
      const Action& a = list[i];
      // I stands where B would for the version's first use, W for its last.
      if ((a.isCompute() || a.type == ActionType::Step) && a.stage >= 0 && a.stage < S) {
        if (a.type != ActionType::WeightGrad) pos[slot(slotOf(a.type), a.stage, a.index)] = i;
        if (a.endsStash()) pos[slot(kEnd, a.stage, a.index)] = i;
      }
      ordinal[i + 1] = ordinal[i] + (a.isCompute() ? 1 : 0);
      if (a.isCompute()) computeIdx.push_back(i);
    }
    auto find = [&](ActionType t, int st, int i) {
      if (i < lo || i > hi) return -1;
      return pos[slot(t == ActionType::WeightGrad ? kEnd : slotOf(t), st, i)];
    };
    // In front of list[i]: drops, then offloads, then prefetches.
    std::vector<std::vector<Action>> drops(n + 1), offs(n + 1), pres(n + 1);
    for (const StashedVersion& v : versions) {
      if (v.device != d || !isOffloaded(policy[v.stage])) continue;
      int madeAt = -1, firstB = n, lastB = -1;
      bool complete = true;
      if (v.madeByStep) madeAt = find(ActionType::Step, v.stage, v.version);
      for (int m : v.microbatches) {
        if (!v.madeByStep) madeAt = std::max(madeAt, find(ActionType::Forward, v.stage, m));
        const int b = find(ActionType::Backward, v.stage, m);    // B or I
        const int e = find(ActionType::WeightGrad, v.stage, m);  // B or W
        if (b < 0 || e < 0) complete = false;
        firstB = std::min(firstB, b);
        lastB = std::max(lastB, e);
      }
      if (!complete || madeAt < 0 || madeAt > firstB) continue;  // not a shape we lower
      int offAt = madeAt + 1;                                    // after the F's own OFF
      if (offAt < n && list[madeAt].type == ActionType::Forward &&
          list[offAt].type == ActionType::Offload && list[offAt].stash == StashKind::Activation &&
          list[offAt].stage == v.stage && list[offAt].index == list[madeAt].index)
        ++offAt;
      const int c = ordinal[firstB];
      const int ahead = lookahead[v.stage];
      int preAt = c >= ahead ? computeIdx[c - ahead] : 0;
      while (preAt > 0 && list[preAt - 1].isRecv()) --preAt;
      preAt = std::max(preAt, offAt);
      if (ordinal[preAt] > ordinal[offAt]) {  // some compute runs while it is away
        offs[offAt].push_back(offload(v.stage, v.version, StashKind::Weights));
        pres[preAt].push_back(prefetch(v.stage, v.version, StashKind::Weights));
      }
      drops[lastB + 1].push_back(drop(v.stage, v.version, StashKind::Weights));
    }
    std::vector<Action> merged;
    merged.reserve(list.size() + 8);
    for (int i = 0; i <= n; ++i) {
      for (const auto* bucket : {&drops[i], &offs[i], &pres[i]})
        merged.insert(merged.end(), bucket->begin(), bucket->end());
      if (i < n) merged.push_back(list[i]);
    }
    out.devices[d] = std::move(merged);
    for (const Action& a : list)
      if ((a.isCompute() || a.type == ActionType::Step) && a.stage >= 0 && a.stage < S)
        for (int t = 0; t < kSlots; ++t) pos[slot(t, a.stage, a.index)] = -1;
  }
  return out;
}

namespace {
// Per stage, the most activation stashes of the stage resident on a device at the start of
// an action `at` accepts (the stage's own actions), over the devices of a lowered schedule:
// F on that device makes one until its OFF, PRE brings one until B or W ends it.
template <class At>
std::vector<int> stashesAt(const Schedule& lowered, At at) {
  const int S = lowered.numStages;
  std::vector<int> out(S, 0);
  for (int d = 0; d < lowered.numDevices(); ++d) {
    std::vector<int> resident(S, 0);
    for (const Action& a : lowered.devices[d]) {
      if (at(a)) out[a.stage] = std::max(out[a.stage], resident[a.stage]);
      const bool activation = a.stash == StashKind::Activation;
      if (a.type == ActionType::Forward || (a.type == ActionType::Prefetch && activation))
        ++resident[a.stage];
      else if (a.endsStash() || (a.type == ActionType::Offload && activation))
        --resident[a.stage];
    }
  }
  return out;
}
}  // namespace

// Note [Stashes at a step]
std::vector<int> stashesAtStep(const Schedule& lowered) {
  return stashesAt(lowered, [](const Action& a) { return a.type == ActionType::Step; });
}

// Note [Stashes at a backward]
std::vector<int> stashesAtBackward(const Schedule& lowered) {
  // At a B or I start the stash it takes is resident (its PRE, or its F, came before it).
  return stashesAt(lowered, [](const Action& a) { return a.isInputBackward(); });
}

std::vector<std::vector<SameDeviceHeld>> heldAtSameDeviceStarts(const Schedule& lowered,
                                                                bool stepsPerMicrobatch) {
  // Note [Held at a same-device stage's starts]
  static_assert(kOffloadsInFlight == 1, "one offload's device copy may still be there");
  const int S = lowered.numStages, M = lowered.numMicrobatches;
  const int N = lowered.totalMicrobatches();
  const Placement& p = lowered.placement;
  std::vector<std::vector<SameDeviceHeld>> out(S);
  for (int s = 0; s < S; ++s) {
    const int d = p.forward(s);
    bool alone = p.backward(s) == d;
    for (int t = 0; t < S && alone; ++t)
      alone = t == s || (p.forward(t) != d && p.backward(t) != d);
    if (!alone) continue;
    const std::vector<Action>& list = lowered.devices[d];
    // The weight version F(s,m) and B(s,m) run on: the STEPs before them on the device.
    std::vector<int> fVersion(N, 0), bVersion(N, 0);
    int steps = 0, versionsMade = 0;
    for (const Action& a : list) {
      if (a.stage != s) continue;
      if (a.type == ActionType::Step) ++steps;
      if (a.type == ActionType::Forward) fVersion[a.index] = steps;
      if (a.isInputBackward()) bVersion[a.index] = steps;
    }
    versionsMade = steps + 1;
    std::vector<int> lastUse(versionsMade, -1);  // version -> last microbatch that stashes it
    std::vector<bool> dropped(versionsMade, false);
    for (int m = 0; m < N; ++m)
      if (fVersion[m] != bVersion[m]) lastUse[fVersion[m]] = m;
    for (const Action& a : list)
      if (a.stage == s && a.type == ActionType::Drop && a.stash == StashKind::Weights &&
          a.index < versionsMade)
        dropped[a.index] = true;
    // Iteration inputs: fed at the device's first action of their iteration (stage 0).
    std::vector<int> feedAt;
    if (s == 0) {
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        const int k = iterationOf(list[i], stepsPerMicrobatch, M);
        if (k >= static_cast<int>(feedAt.size())) feedAt.resize(k + 1, -1);
        if (k >= 0 && feedAt[k] < 0) feedAt[k] = i;
      }
    }
    std::vector<bool> stash(N, false), version(versionsMade, false);
    int stashes = 0, versions = 0, inputs = 0;
    // The last offload issued: (weights?, index), counted until the next one.
    bool pending = false, pendingWeights = false;
    int pendingIndex = 0;
    auto setStash = [&](int m, bool on) {
      if (stash[m] != on) stashes += on ? 1 : -1;
      stash[m] = on;
    };
    auto setVersion = [&](int v, bool on) {
      if (version[v] != on) versions += on ? 1 : -1;
      version[v] = on;
    };
    std::set<SameDeviceHeld> seen;
    auto record = [&](SameDeviceHeld::At at, int ownStash) {
      SameDeviceHeld h;
      h.at = at;
      const bool pendingStash = pending && !pendingWeights && !stash[pendingIndex];
      const bool pendingVersion = pending && pendingWeights && !version[pendingIndex];
      h.stashes = stashes + pendingStash - ownStash;
      h.versions = versions + pendingVersion;
      h.inputs = inputs;
      seen.insert(h);
    };
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      for (int k = 0; k < static_cast<int>(feedAt.size()); ++k)
        if (feedAt[k] == i) inputs += M;
      if (a.stage != s) continue;
      const bool weights = a.stash == StashKind::Weights;
      switch (a.type) {
        case ActionType::Forward: {
          const int v = fVersion[a.index];
          if (fVersion[a.index] != bVersion[a.index]) setVersion(v, true);  // its snapshot
          if (s == 0) --inputs;  // its own: in F's peak (its first layer saves it)
          record(SameDeviceHeld::At::Forward, 0);
          setStash(a.index, true);
          break;
        }
        case ActionType::Backward:
        case ActionType::InputGrad:
          setStash(a.index, true);  // a PRE brought it, or it stayed
          if (fVersion[a.index] != bVersion[a.index]) setVersion(fVersion[a.index], true);
          record(SameDeviceHeld::At::Backward, 0);
          if (a.type == ActionType::Backward) setStash(a.index, false);
          if (fVersion[a.index] != bVersion[a.index] && !dropped[fVersion[a.index]] &&
              lastUse[fVersion[a.index]] == a.index)
            setVersion(fVersion[a.index], false);
          break;
        case ActionType::WeightGrad:
          setStash(a.index, false);
          break;
        case ActionType::Step:
          record(SameDeviceHeld::At::Step, 0);
          break;
        case ActionType::Offload:
          if (weights)
            setVersion(a.index, false);
          else
            setStash(a.index, false);
          pending = true;
          pendingWeights = weights;
          pendingIndex = a.index;
          break;
        case ActionType::Prefetch:
          if (weights)
            setVersion(a.index, true);
          else
            setStash(a.index, true);
          break;
        case ActionType::Drop:
          if (weights)
            setVersion(a.index, false);
          else
            setStash(a.index, false);
          break;
        case ActionType::SendAct:
        case ActionType::RecvAct:
        case ActionType::SendGrad:
        case ActionType::RecvGrad:
        case ActionType::SyncWeights:
        case ActionType::RecvWeights:
        case ActionType::AllReduce:
          break;
      }
    }
    out[s].assign(seen.begin(), seen.end());
  }
  return out;
}

std::vector<SameDeviceHeld> pipedreamHeld(int S, int k, int M, int lookahead) {
  const int n = S - k;
  const int K = std::max(3, (2 * n + 2 + M - 1) / M);
  SchedulePlan plan = makeSchedule(ScheduleKind::PipeDream, n, M,
                                   Placement::defaultFor(ScheduleKind::PipeDream, n), K);
  for (int d = 1; d < plan.schedule.numDevices(); ++d) plan.schedule.devices[d].clear();
  const SchedulePlan lowered = lower(plan, {StashPolicy::Offload}, lookahead, true);
  std::vector<SameDeviceHeld> out =
      heldAtSameDeviceStarts(lowered.schedule, stepsPerMicrobatch(ScheduleKind::PipeDream))[0];
  if (k > 0) {
    std::set<SameDeviceHeld> noInputs;
    for (SameDeviceHeld h : out) {
      h.inputs = 0;
      noInputs.insert(h);
    }
    out.assign(noInputs.begin(), noInputs.end());
  }
  return out;
}

std::vector<bool> forwardPhaseFirst(const Schedule& schedule) {
  const int S = schedule.numStages, M = schedule.numMicrobatches;
  const Placement& p = schedule.placement;
  std::vector<bool> out(S, false);
  for (int s = 0; s < S; ++s) {
    if (p.forward(s) != p.backward(s)) continue;
    // Per iteration: the positions of its first and last F and B (or I) on the device.
    std::map<int, std::array<int, 4>> at;  // iteration -> firstF, lastF, firstB, lastB
    const std::vector<Action>& list = schedule.devices[p.forward(s)];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      const bool f = a.type == ActionType::Forward;
      if (a.stage != s || !(f || a.isInputBackward())) continue;
      auto it = at.try_emplace(a.index / M, std::array<int, 4>{-1, -1, -1, -1}).first;
      std::array<int, 4>& v = it->second;
      const int first = f ? 0 : 2;
      if (v[first] < 0) v[first] = i;
      v[first + 1] = i;
    }
    bool phases = !at.empty();
    for (auto it = at.begin(); phases && it != at.end(); ++it) {
      const std::array<int, 4>& v = it->second;
      phases = v[0] >= 0 && v[2] >= 0 && v[1] < v[2];
      auto next = std::next(it);
      if (phases && next != at.end()) phases = v[3] < next->second[0];
    }
    out[s] = phases;
  }
  return out;
}

int residentOffloadedStashes(int inFlight, int lookahead, bool forwardPhaseFirst, int deferred) {
  const int near =
      forwardPhaseFirst ? std::max(lookahead + 1, 1 + kOffloadsInFlight) : lookahead + 2;
  return std::min(inFlight, near + deferred);
}

int residentStashedVersions(int versions, int lookahead) {
  return std::min(versions, lookahead + 1);
}

int heldStashedVersions(int versions, int lookahead) {
  // Note [Versions being copied out]
  return std::min(versions, lookahead + 2);
}

MemoryContract offloadContract(const MemoryContract& in, const Placement& p,
                               const std::vector<StashPolicy>& policiesIn, int lookahead,
                               bool offloadWeights) {
  return offloadContract(in, p, policiesIn, std::vector<int>{lookahead}, offloadWeights);
}

MemoryContract offloadContract(const MemoryContract& in, const Placement& p,
                               const std::vector<StashPolicy>& policiesIn,
                               const std::vector<int>& lookaheadIn, bool offloadWeights) {
  const int S = p.numStages();
  const std::vector<int> lookahead = lookaheadPerStage(lookaheadIn, S);
  std::vector<StashPolicy> policy = policiesPerStage(policiesIn, S);
  MemoryContract c = in;
  for (int s = 0; s < S; ++s) {
    if (!isOffloaded(effectivePolicy(policy[s], p.split(s)))) continue;
    // Note [Split backward]: the stashes waiting for their W stay on the backward device.
    const int deferred = static_cast<int>(c.deferredW.size()) == S ? c.deferredW[s] : 0;
    int nearB = std::min(c.inFlight[s], lookahead[s] + 1 + deferred);
    c.residentBackward[s] = nearB;
    c.residentForward[s] = p.split(s) ? 0 : nearB;
    if (offloadWeights && static_cast<int>(c.residentWeightVersions.size()) == S)
      c.residentWeightVersions[s] = residentStashedVersions(c.weightVersions[s], lookahead[s]);
  }
  return c;
}

SchedulePlan lower(const SchedulePlan& plan, const std::vector<StashPolicy>& policies,
                   int lookahead, bool offloadWeights) {
  return lower(plan, policies, std::vector<int>{lookahead}, offloadWeights);
}

SchedulePlan lower(const SchedulePlan& plan, const std::vector<StashPolicy>& policies,
                   const std::vector<int>& lookahead, bool offloadWeights) {
  SchedulePlan out;
  out.schedule =
      addOffload(addCommunication(markRecompute(plan.schedule, policies)), policies, lookahead);
  if (offloadWeights) out.schedule = addWeightOffload(out.schedule, policies, lookahead);
  out.contract =
      offloadContract(plan.contract, plan.schedule.placement, policies, lookahead, offloadWeights);
  return out;
}

}  // namespace pipefb::schedules
