#include <gtest/gtest.h>

#include <set>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/HeldOffloads.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/ScheduleError.h"
#include "pipefb/schedules/Validator.h"
#include "pipefb/schedules/ZeroBubble.h"

using namespace pipefb::schedules;

namespace {
std::vector<std::string> tokens(const std::vector<Action>& list) {
  std::vector<std::string> out;
  for (const Action& a : list) out.push_back(toString(a));
  return out;
}
int indexOf(const std::vector<Action>& list, const std::string& token) {
  for (size_t i = 0; i < list.size(); ++i)
    if (toString(list[i]) == token) return static_cast<int>(i);
  return -1;
}
}  // namespace

TEST(LoweringTest, CommunicationFor1F1BTwoStages) {
  Schedule s = addCommunication(makeSchedule("1f1b", 2, 2).schedule);
  using V = std::vector<std::string>;
  EXPECT_EQ(tokens(s.devices[0]), (V{"F0.0", "SA0.0>1", "F0.1", "SA0.1>1", "RG1.0<1", "B0.0",
                                     "RG1.1<1", "B0.1", "STEP0.0"}));
  EXPECT_EQ(tokens(s.devices[1]), (V{"RA0.0<0", "F1.0", "B1.0", "SG1.0>0", "RA0.1<0", "F1.1",
                                     "B1.1", "SG1.1>0", "STEP1.0"}));
}

TEST(LoweringTest, PipefbHandsTheLastOutputToItsBackwardDevice) {
  const int S = 3;
  Schedule s = addCommunication(makeSchedule("pipefb-sync", S, 2).schedule);
  const Placement& p = s.placement;
  // F(S-1) on device 2 sends its output to B(S-1) on device 3, which receives it before B.
  int send = indexOf(s.devices[p.forward(S - 1)], "SA2.0>3");
  int recv = indexOf(s.devices[p.backward(S - 1)], "RA2.0<2");
  int bwd = indexOf(s.devices[p.backward(S - 1)], "B2.0");
  EXPECT_GE(send, 0);
  EXPECT_GE(recv, 0);
  EXPECT_EQ(recv + 1, bwd);
  // Gradients flow B2 (dev 3) -> B1 (dev 4) -> B0 (dev 5); no activations go backwards.
  EXPECT_GE(indexOf(s.devices[3], "SG2.0>4"), 0);
  EXPECT_GE(indexOf(s.devices[4], "RG2.0<3"), 0);
  EXPECT_GE(indexOf(s.devices[4], "SG1.0>5"), 0);
  for (int d = 0; d < s.numDevices(); ++d)
    for (const Action& a : s.devices[d])
      if (a.isSend() && a.type != ActionType::SyncWeights) {
        EXPECT_GT(a.peer, d) << toString(a);
      }
}

// Note [Recomputed last output]: under a checkpoint kind B(S-1) recomputes the output from
// its stashed input, so no SA/RA of the last stage's output is lowered; under keep and
// offload the output still goes from F(S-1) to B(S-1). Default (2S), folded and decoupled
// ("0/1 0/2 0/3": one forward device, three backward devices) placements.
TEST(LoweringTest, RecomputingLastBackwardIsSentNoOutput) {
  const int S = 3, M = 3;
  const std::vector<Placement> placements = {Placement::pipefb(S), Placement::folded(S),
                                             Placement::parse("0/1 0/2 0/3", "test")};
  for (const std::string kind : {"pipefb-sync", "pipefb-async"})
    for (const Placement& placement : placements)
      for (StashPolicy policy : {StashPolicy::Keep, StashPolicy::Offload, StashPolicy::Checkpoint,
                                 StashPolicy::CheckpointOffload}) {
        SCOPED_TRACE(std::string(kind) + " " + placement.toString() + " " + toString(policy));
        const SchedulePlan plan = lower(makeSchedule(kind, S, M, placement, 2), {policy}, 1);
        const Schedule& s = plan.schedule;
        const bool recomputes = isCheckpoint(policy);
        const int fd = placement.forward(S - 1), bd = placement.backward(S - 1);
        int sends = 0, recvs = 0, backwards = 0;
        for (const Action& a : s.devices[fd])
          sends += a.type == ActionType::SendAct && a.stage == S - 1;
        for (const Action& a : s.devices[bd]) {
          recvs += a.type == ActionType::RecvAct && a.stage == S - 1;
          if (a.type == ActionType::Backward && a.stage == S - 1) {
            ++backwards;
            EXPECT_EQ(a.recompute, recomputes) << toString(a);
          }
        }
        EXPECT_EQ(backwards, 2 * M);
        EXPECT_EQ(sends, recomputes ? 0 : 2 * M);
        EXPECT_EQ(recvs, recomputes ? 0 : 2 * M);
        EXPECT_NO_THROW(validate(s, &plan.contract));
      }
}

TEST(LoweringTest, ValidatorWantsTheLastOutputUnlessBRecomputes) {
  // Without the output's receive, a plain B(S-1) on another device is refused, a BR is not.
  Schedule s = addCommunication(makeSchedule("pipefb-sync", 2, 1).schedule);
  const Placement& p = s.placement;
  auto& b = s.devices[p.backward(1)];
  b.erase(b.begin() + indexOf(b, "RA1.0<1"));
  auto& f = s.devices[p.forward(1)];
  f.erase(f.begin() + indexOf(f, "SA1.0>2"));
  s = addOffload(s, {StashPolicy::Keep}, 1);  // keep acts as offload on a split stage
  try {
    validate(s);
    FAIL() << "expected the missing output to be named";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("the output of the last stage"), std::string::npos)
        << e.what();
  }
  for (auto& list : s.devices)
    for (Action& a : list)
      if (a.type == ActionType::Backward) a.recompute = true;
  EXPECT_NO_THROW(validate(s));
}

TEST(LoweringTest, CommunicationIsIdempotent) {
  for (const std::string& kind : scheduleKindNames()) {
    const int M = takesShape(kind, 4, 3) ? 3 : 4;
    Schedule once = addCommunication(makeSchedule(kind, 4, M, 2).schedule);
    EXPECT_EQ(addCommunication(once), once) << kind;
  }
}

TEST(LoweringTest, OffloadRightAfterFAndPrefetchLookaheadBeforeB) {
  for (int lookahead : {0, 1, 2}) {
    Schedule s = addOffload(addCommunication(makeSchedule("1f1b", 3, 6).schedule),
                            {StashPolicy::Offload}, lookahead);
    for (int d = 0; d < s.numDevices(); ++d) {
      const auto& list = s.devices[d];
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        if (a.type == ActionType::Forward) {
          ASSERT_LT(i + 1, list.size());
          EXPECT_EQ(list[i + 1], offload(a.stage, a.index));
        }
        if (a.type == ActionType::Backward) {
          EXPECT_FALSE(a.recompute);
          int pre = indexOf(list, toString(prefetch(a.stage, a.index)));
          int off = indexOf(list, toString(offload(a.stage, a.index)));
          ASSERT_GE(pre, 0);
          EXPECT_GT(pre, off);  // never before its own offload
          int computeBetween = 0;
          for (size_t j = pre; j < i; ++j) computeBetween += list[j].isCompute();
          // lookahead compute actions, fewer when clamped behind the OFF or at the start.
          EXPECT_LE(computeBetween, lookahead);
          if (computeBetween < lookahead) {
            bool clamped = pre == off + 1;
            bool atStart = true;
            for (int j = 0; j < pre; ++j) atStart &= !list[j].isCompute();
            EXPECT_TRUE(clamped || atStart) << toString(a) << " lookahead " << lookahead;
          }
        }
      }
    }
  }
}

// Note [Prefetches after the forward phase]
TEST(LoweringTest, ForwardPhaseFirstStagesPrefetchAfterTheirLastForward) {
  using B = std::vector<bool>;
  EXPECT_EQ(forwardPhaseFirst(makeSchedule("gpipe", 3, 4).schedule), (B{true, true, true}));
  // 1f1b: stage s runs min(S - s, M) Fs before its first B.
  EXPECT_EQ(forwardPhaseFirst(makeSchedule("1f1b", 3, 2).schedule), (B{true, true, false}));
  EXPECT_EQ(forwardPhaseFirst(makeSchedule("1f1b", 3, 6).schedule), (B{false, false, false}));
  // No flush: the next iteration's Fs come before this one's last B.
  EXPECT_EQ(forwardPhaseFirst(makeSchedule(ScheduleKind::PipeDream, 2, 2,
                                           Placement::defaultFor(ScheduleKind::PipeDream, 2), 3)
                                  .schedule),
            (B{false, false}));
  // Split stages: F and B on two devices.
  EXPECT_EQ(forwardPhaseFirst(makeSchedule("pipefb-sync", 2, 4).schedule), (B{false, false}));

  for (int lookahead : {1, 2, 3}) {
    const Schedule g =
        makeSchedule(ScheduleKind::GPipe, 3, 4, Placement::defaultFor(ScheduleKind::GPipe, 3), 2)
            .schedule;
    Schedule s = addOffload(addCommunication(g), {StashPolicy::Offload}, lookahead);
    EXPECT_NO_THROW(validate(s));
    for (int d = 0; d < s.numDevices(); ++d) {
      const auto& list = s.devices[d];
      std::set<int> seen;  // iterations whose first PRE was looked at
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].type != ActionType::Prefetch) continue;
        const int it = list[i].index / 4;
        // Every F of the iteration and its OFF come before the PRE; the first PRE comes
        // right after the last OFF (it was lookahead compute actions before B: among the Fs).
        int lastOff = -1;
        for (size_t j = 0; j < list.size(); ++j)
          if (list[j].type == ActionType::Offload && list[j].index / 4 == it)
            lastOff = static_cast<int>(j);
        EXPECT_GT(static_cast<int>(i), lastOff) << toString(list[i]) << " L=" << lookahead;
        if (seen.insert(it).second)
          EXPECT_EQ(static_cast<int>(i), lastOff + 1) << toString(list[i]);
      }
    }
  }
}

TEST(LoweringTest, PrefetchIsIssuedBeforeTheReceivesOfItsAnchor) {
  // lookahead 0 on a pipefb backward device: PRE goes in front of RG, so the copy overlaps
  // with waiting for the gradient.
  Schedule s = addOffload(addCommunication(makeSchedule("pipefb-sync", 2, 2).schedule),
                          {StashPolicy::Offload}, 0);
  int pre = indexOf(s.devices[3], "PRE0.0");
  int rg = indexOf(s.devices[3], "RG1.0<2");
  EXPECT_GE(pre, 0);
  EXPECT_EQ(pre + 1, rg);
}

TEST(LoweringTest, CheckpointMarksRecomputeAndKeepAddsNothing) {
  Schedule base = addCommunication(makeSchedule("gpipe", 3, 4).schedule);
  Schedule keep = addOffload(base, {StashPolicy::Keep}, 1);
  EXPECT_EQ(keep, base);
  Schedule ck = addOffload(base, {StashPolicy::Checkpoint}, 1);
  EXPECT_EQ(ck.numActions(), base.numActions());
  for (const auto& list : ck.devices)
    for (const Action& a : list)
      if (a.type == ActionType::Backward) {
        EXPECT_TRUE(a.recompute);
      }
  Schedule cko = addOffload(base, {StashPolicy::CheckpointOffload}, 1);
  EXPECT_EQ(cko.numActions(), base.numActions() + 2 * 3 * 4);
}

TEST(LoweringTest, SplitStagesAlwaysGoThroughTheHostPool) {
  SchedulePlan plan = makeSchedule("pipefb-sync", 2, 3);
  SchedulePlan keep = lower(plan, {StashPolicy::Keep}, 1);
  SchedulePlan ck = lower(plan, {StashPolicy::Checkpoint}, 1);
  for (const SchedulePlan* p : {&keep, &ck}) {
    int offs = 0, pres = 0;
    for (const auto& list : p->schedule.devices)
      for (const Action& a : list) {
        offs += a.type == ActionType::Offload;
        pres += a.type == ActionType::Prefetch;
      }
    EXPECT_EQ(offs, 2 * 3);
    EXPECT_EQ(pres, 2 * 3);
    EXPECT_EQ(p->contract.residentForward, (std::vector<int>{0, 0}));
    EXPECT_EQ(p->contract.residentBackward, (std::vector<int>{2, 2}));
  }
}

TEST(LoweringTest, PolicyCountsAreChecked) {
  EXPECT_THROW(policiesPerStage({StashPolicy::Keep, StashPolicy::Keep}, 3), pipefb::UserError);
  EXPECT_EQ(policiesPerStage({}, 2).size(), 2u);
  EXPECT_THROW(addOffload(makeSchedule("1f1b", 2, 2).schedule, {}, -1), pipefb::UserError);
  EXPECT_THROW(parseStashPolicy("ofload"), pipefb::UserError);
  EXPECT_EQ(parseStashPolicy("checkpoint-offload"), StashPolicy::CheckpointOffload);
}

// Note [Weight-version offload], worked by hand for pipedream 2 stages x 4 microbatches,
// offload, lookahead 1. Stage 0 (warm-up 1): F0.1 runs on version 0 and B0.1 on version 1
// (after STEP0.0), F0.2 on 1 / B0.2 on 2, F0.3 on 2 / B0.3 on 3; F0.0 and B0.0 share version
// 0 (no snapshot). Version v goes right after the last F on it (after that F's OFF), comes
// back one compute action before its B (after that action's PRE), and is dropped after its
// B. Version 2 would come straight back (B0.2 is the only compute action between, and it is
// the lookahead's anchor): not offloaded, only dropped. Stage 1 runs F and B on one version.
TEST(LoweringTest, WeightVersionsOfPipedreamGoToTheHostPool) {
  SchedulePlan plan = lower(makeSchedule("pipedream", 2, 2, 2), {StashPolicy::Offload}, 1);
  using V = std::vector<std::string>;
  EXPECT_EQ(tokens(plan.schedule.devices[0]),
            (V{"F0.0",    "OFF0.0",   "SA0.0>1", "PRE0.0",  "F0.1",    "OFF0.1",   "OFFW0.0",
               "SA0.1>1", "RG1.0<1",  "B0.0",    "STEP0.0", "PRE0.1",  "PREW0.0",  "F0.2",
               "OFF0.2",  "OFFW0.1",  "SA0.2>1", "RG1.1<1", "B0.1",    "DROPW0.0", "STEP0.1",
               "PRE0.2",  "PREW0.1",  "F0.3",    "OFF0.3",  "SA0.3>1", "PRE0.3",   "RG1.2<1",
               "B0.2",    "DROPW0.1", "STEP0.2", "RG1.3<1", "B0.3",    "DROPW0.2", "STEP0.3"}));
  for (const Action& a : plan.schedule.devices[1])
    EXPECT_NE(a.stash, StashKind::Weights) << toString(a);
  EXPECT_EQ(plan.contract.residentWeightVersions, (std::vector<int>{2, 1}));  // min(S-s, L+1)
  EXPECT_EQ(plan.contract.weightVersions, (std::vector<int>{2, 1}));

  // pipeline.offload_weights: none, or a policy that keeps: no weight actions.
  for (const SchedulePlan& p :
       {lower(makeSchedule("pipedream", 2, 2, 2), {StashPolicy::Offload}, 1,
              /*offloadWeights=*/false),
        lower(makeSchedule("pipedream", 2, 2, 2), {StashPolicy::Keep}, 1),
        lower(makeSchedule("pipedream", 2, 2, 2), {StashPolicy::Checkpoint}, 1)})
    for (const auto& list : p.schedule.devices)
      for (const Action& a : list) EXPECT_NE(a.stash, StashKind::Weights) << toString(a);
}

// pipefb-async keeps the stale version on the backward device only for checkpoint kinds
// (BR), made by STEP s.k; the first B after that STEP needs it, so it is never offloaded,
// only dropped after the last B of iteration k+1 that ran forward on it.
TEST(LoweringTest, PipefbAsyncCheckpointOffloadDropsItsVersionsOnly) {
  SchedulePlan plan =
      lower(makeSchedule("pipefb-async", 2, 2, 3), {StashPolicy::CheckpointOffload}, 1);
  const Schedule& s = plan.schedule;
  const int b0 = s.placement.backward(0);
  int step0 = indexOf(s.devices[b0], "STEP0.0"), b02 = indexOf(s.devices[b0], "BR0.2"),
      b03 = indexOf(s.devices[b0], "BR0.3"), drop = indexOf(s.devices[b0], "DROPW0.0");
  ASSERT_GE(step0, 0);
  EXPECT_LT(step0, b02);
  EXPECT_EQ(drop, b03 + 1);  // async_lag M: both microbatches of iteration 1 ran on version 0
  EXPECT_EQ(indexOf(s.devices[b0], "OFFW0.0"), -1);
  EXPECT_EQ(indexOf(s.devices[b0], "PREW0.0"), -1);
  // The graph kinds keep the version in the forward copy: nothing to lower.
  SchedulePlan graph = lower(makeSchedule("pipefb-async", 2, 2, 3), {StashPolicy::Offload}, 1);
  for (const auto& list : graph.schedule.devices)
    for (const Action& a : list) EXPECT_NE(a.stash, StashKind::Weights) << toString(a);
}

// Note [Stashes at a step]: a folded device of the second half prefetches the next
// iteration's first stashes before its STEP (Note [Folded lookahead]: lookahead backwards
// ahead, behind the previous iteration's offloads); the first half's next prefetches go
// behind the next forwards' offloads; a flush on its own devices steps with none.
TEST(LoweringTest, StashesAtAStepAreCountedOnTheLoweredSchedule) {
  auto atStep = [](const std::string& kind, int S, int M, const Placement& p, int lookahead) {
    const SchedulePlan plan = makeSchedule(kind, S, M, p, /*iterations=*/2);
    return stashesAtStep(lower(plan, {StashPolicy::Offload}, lookahead, false).schedule);
  };
  using V = std::vector<int>;
  // S=2 M=1: device 1 runs F1 and B0, device 0 F0 and B1.
  EXPECT_EQ(atStep("pipefb-async", 2, 1, Placement::folded(2), 1), (V{1, 0}));
  EXPECT_EQ(atStep("pipefb-async", 3, 4, Placement::folded(3), 1), (V{1, 0, 0}));
  EXPECT_EQ(atStep("pipefb-async", 2, 2, Placement::folded(2), 2), (V{2, 0}));
  EXPECT_EQ(atStep("1f1b", 3, 4, Placement::defaultFor("1f1b", 3), 1), (V{0, 0, 0}));
}

// Note [Stashes at a backward]: lookahead + 1 at a B, but on a folded device whose PREs go
// behind its forwards' offloads, fewer: with M = 1 the device of F0 and B(S-1) prefetches
// B(S-1)'s next stash only after the next F0, when the last B(S-1) has ended.
TEST(LoweringTest, StashesAtABackwardAreCountedOnTheLoweredSchedule) {
  auto atB = [](const std::string& kind, int S, int M, const Placement& p, int lookahead) {
    const SchedulePlan plan = makeSchedule(kind, S, M, p, /*iterations=*/3);
    return stashesAtBackward(lower(plan, {StashPolicy::Offload}, lookahead, false).schedule);
  };
  using V = std::vector<int>;
  // device 0: F0.m OFF0.m PRE2.m ... BR2.m; device 2: ... PRE0.(m+1) ... B0.m.
  EXPECT_EQ(atB("pipefb-async", 3, 1, Placement::folded(3), 1), (V{2, 1, 1}));
  EXPECT_EQ(atB("pipefb-async", 2, 1, Placement::folded(2), 1), (V{2, 1}));
  EXPECT_EQ(atB("pipefb-async", 3, 4, Placement::folded(3), 1), (V{2, 2, 2}));
  // Not folded: every B beside lookahead + 1 (2S devices), or n in flight if fewer.
  EXPECT_EQ(atB("pipefb-async", 2, 1, Placement::defaultFor("pipefb-async", 2), 1), (V{2, 2}));
  EXPECT_EQ(atB("pipefb-sync", 2, 4, Placement::defaultFor("pipefb-sync", 2), 2), (V{3, 3}));
  // Counted as issued: across a flush that is the next iterations' PREs too, which the
  // runtime binds only at their iteration's first acquire (Note [Prefetches across a flush]).
  EXPECT_EQ(atB("pipefb-sync", 2, 1, Placement::defaultFor("pipefb-sync", 2), 2), (V{3, 3}));
}

// Note [Held at a same-device stage's starts]: pipedream S=3 M=2, lookahead 1, stage 0's
// device (worked by hand over its list: F0.0 OFF0.0 SA F0.1 OFF0.1 SA PRE0.0 F0.2 OFF0.2
// OFFW0.0 SA RG B0.0 STEP0.0 ...; iteration inputs fed at F0.0, F0.2 and F0.4).
TEST(LoweringTest, HeldAtSameDeviceStartsCountsStashesVersionsAndInputsTogether) {
  const auto k = parseScheduleKind("pipedream");
  const SchedulePlan plan = makeSchedule(k, 3, 2, Placement::defaultFor(k, 3), /*iterations=*/3);
  const auto held =
      heldAtSameDeviceStarts(lower(plan, {StashPolicy::Offload}, 1, true).schedule, true);
  ASSERT_EQ(held.size(), 3u);
  using At = SameDeviceHeld::At;
  auto counts = [](At at, int stashes, int versions, int inputs) {
    SameDeviceHeld h;
    h.at = at;
    h.stashes = stashes;
    h.versions = versions;
    h.inputs = inputs;
    return h;
  };
  const std::vector<SameDeviceHeld> stage0 = {
      counts(At::Forward, 0, 0, 1),   // F0.0: the other input
      counts(At::Forward, 1, 1, 0),   // F0.1: OFF0.0 copying, its snapshot v0
      counts(At::Forward, 1, 2, 0),   // F0.3: PRE0.1, PREW0.0, its v1
      counts(At::Forward, 1, 3, 0),   // F0.5: PRE0.3, PREW0.1, OFFW0.2 copying, its v3
      counts(At::Forward, 1, 3, 1),   // F0.4: PRE0.2, v0, OFFW0.1 copying, its v2
      counts(At::Forward, 2, 1, 1),   // F0.2: PRE0.0 and OFF0.1 copying
      counts(At::Backward, 1, 1, 0),  // B0.5
      counts(At::Backward, 1, 1, 1),  // B0.0: on the live weights, OFFW0.0 copying
      counts(At::Backward, 1, 2, 0),  // B0.1: v0, OFFW0.1 copying
      counts(At::Backward, 1, 2, 1),  // B0.2
      counts(At::Backward, 2, 2, 0),  // B0.4: PRE0.5, PREW0.3
      counts(At::Backward, 2, 3, 0),  // B0.3: PRE0.4, PREW0.2 and OFFW0.3 copying
      counts(At::Step, 0, 1, 0),      // STEP0.5: OFFW0.3 counted until another offload
      counts(At::Step, 0, 1, 1),      // STEP0.0
      counts(At::Step, 0, 2, 0),      // STEP0.1
      counts(At::Step, 1, 1, 0),      // STEP0.4
      counts(At::Step, 1, 2, 0)};     // STEP0.3
  EXPECT_EQ(held[0], stage0);
  // Never lookahead + 2 stashes (the per-category bound) at a B, nor 3 versions beside an
  // input: the categories peak apart.
  for (const SameDeviceHeld& h : held[0]) {
    if (h.at == At::Backward) EXPECT_LE(h.stashes, 2);
    if (h.at == At::Backward && h.versions == 3) EXPECT_EQ(h.inputs, 0);
  }
  // The last stage keeps no versions and waits no inputs.
  for (const SameDeviceHeld& h : held[2]) EXPECT_EQ(h.versions + h.inputs, 0);
  // Split stages are not counted.
  const auto fb = parseScheduleKind("pipefb-sync");
  const auto split =
      heldAtSameDeviceStarts(lower(makeSchedule(fb, 2, 2, Placement::defaultFor(fb, 2), 1),
                                   {StashPolicy::Offload}, 1, true)
                                 .schedule,
                             false);
  for (const auto& s : split) EXPECT_TRUE(s.empty());
}

// pipedreamHeld counts stage k as stage 0 of pipedream (S - k, M) on that device's list
// alone: the same counts as the whole lowering's, over a table of shapes.
TEST(LoweringTest, PipedreamHeldIsTheWholeLoweringsCount) {
  const auto k = parseScheduleKind("pipedream");
  for (int lookahead : {0, 1, 2})
    for (int S : {2, 3, 4, 6})
      for (int M : {1, 2, 3, 4, 8}) {
        const int K = std::max(3, (2 * S + 2 + M - 1) / M);
        const auto whole =
            heldAtSameDeviceStarts(lower(makeSchedule(k, S, M, Placement::defaultFor(k, S), K),
                                         {StashPolicy::Offload}, lookahead, true)
                                       .schedule,
                                   true);
        for (int s = 0; s < S; ++s)
          EXPECT_EQ(pipedreamHeld(S, s, M, lookahead), whole[s])
              << "S=" << S << " M=" << M << " lookahead " << lookahead << " stage " << s;
      }
}

// Note [Held offloads] (HeldOffloads.h): a split stage's forward device holds OFF s.m until
// its next OFF when stage s offloads again before the flush; pipefb-async never flushes.
// Same-device stages (1f1b) hold none.
TEST(LoweringTest, HeldOffloadsLastUntilTheDevicesNextOffload) {
  const std::vector<StashPolicy> off = {StashPolicy::Offload};
  auto held = [&](const std::string& kind, int S, int M, int K) {
    const SchedulePlan p = lower(makeSchedule(kind, S, M, K), off, 1);
    const auto releases = heldOffloadReleases(p.schedule);
    // "OFF0.0<OFF0.1": OFF0.0 released by OFF0.1, for every device.
    std::vector<std::string> out;
    for (size_t d = 0; d < releases.size(); ++d) {
      const auto& list = p.schedule.devices[d];
      EXPECT_EQ(releases[d].size(), list.size());
      for (size_t i = 0; i < list.size(); ++i)
        if (releases[d][i] >= 0) {
          EXPECT_EQ(list[i].type, ActionType::Offload);
          out.push_back(toString(list[i]) + "<" + toString(list[releases[d][i]]));
        }
    }
    return out;
  };
  using V = std::vector<std::string>;
  // pipefb-sync, M = 2: the first OFF of each iteration, released by the second.
  EXPECT_EQ(held("pipefb-sync", 2, 2, 2),
            (V{"OFF0.0<OFF0.1", "OFF0.2<OFF0.3", "OFF1.0<OFF1.1", "OFF1.2<OFF1.3"}));
  EXPECT_EQ(held("pipefb-sync", 2, 1, 3), V{});  // one microbatch in flight: none
  EXPECT_EQ(held("pipefb-async", 2, 1, 3),
            (V{"OFF0.0<OFF0.1", "OFF0.1<OFF0.2", "OFF1.0<OFF1.1", "OFF1.1<OFF1.2"}));
  EXPECT_EQ(held("1f1b", 3, 4, 2), V{});
}

// Note [Prefetches across a flush] (HeldOffloads.h): a flushing schedule's PREs of the next
// iteration, issued before the device's last compute of this one, bind at that iteration's
// first acquire; an asynchronous schedule has none.
TEST(LoweringTest, PrefetchesOfTheNextIterationAreBoundLater) {
  auto later = [](const std::string& kind, int M, int lookahead) {
    const SchedulePlan p = lower(makeSchedule(kind, 2, M, 2), {StashPolicy::Offload}, lookahead);
    const auto bound = prefetchesBoundLater(p.schedule);
    std::vector<std::string> out;
    for (size_t d = 0; d < bound.size(); ++d)
      for (size_t i = 0; i < bound[d].size(); ++i)
        if (bound[d][i]) out.push_back(toString(p.schedule.devices[d][i]));
    return out;
  };
  using V = std::vector<std::string>;
  // Device 2: PRE1.0 PRE1.1 RA1.0<1 B1.0 ...: PRE1.1 is iteration 1's, before B1.0.
  EXPECT_EQ(later("pipefb-sync", 1, 1), (V{"PRE1.1", "PRE0.1"}));
  // Device 2: PRE1.0 PRE1.1 PRE1.2 RA1.0<1 B1.0 SG1.0>3 PRE1.3 RA1.1<1 B1.1 ...
  EXPECT_EQ(later("pipefb-sync", 2, 2), (V{"PRE1.2", "PRE1.3", "PRE0.2", "PRE0.3"}));
  EXPECT_EQ(later("pipefb-async", 1, 1), V{});
  EXPECT_EQ(prefetchEpoch(5, 2, false), 2);
  EXPECT_EQ(prefetchEpoch(5, 2, true), 0);
}
