#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/DataParallel.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Validator.h"
#include "pipefb/schedules/ZeroBubble.h"

using namespace pipefb::schedules;

namespace {
const std::vector<std::pair<int, int>> kShapes = {{1, 1}, {1, 4}, {2, 1},  {3, 2}, {4, 10},
                                                  {7, 3}, {5, 5}, {8, 64}, {6, 1}};
const std::vector<StashPolicy> kPolicies = {StashPolicy::Keep, StashPolicy::Offload,
                                            StashPolicy::Checkpoint,
                                            StashPolicy::CheckpointOffload};
}  // namespace

TEST(GeneratorsTest, ValidatorAcceptsEveryKindShapeAndPolicy) {
  int checked = 0, expected = 0;
  for (const std::string& kind : scheduleKindNames())
    for (auto [S, M] : kShapes) {
      if (!takesShape(kind, S, M)) continue;
      expected += 2 * 4 * 3;
      for (int K : {1, 3})
        for (StashPolicy policy : kPolicies)
          for (int lookahead : {0, 1, 3}) {
            SchedulePlan plan = lower(makeSchedule(kind, S, M, K), {policy}, lookahead);
            SCOPED_TRACE(kind + " S=" + std::to_string(S) + " M=" + std::to_string(M) +
                         " K=" + std::to_string(K) + " " + toString(policy) +
                         " lookahead=" + std::to_string(lookahead));
            EXPECT_NO_THROW(validate(plan.schedule, &plan.contract));
            ++checked;
          }
    }
  EXPECT_EQ(checked, expected);
  EXPECT_GT(checked, 5 * 9 * 2 * 4 * 3);  // the split-backward kinds are in the table
}

TEST(GeneratorsTest, MixedPoliciesPerStageValidate) {
  for (const std::string& kind : scheduleKindNames()) {
    if (!takesShape(kind, 4, 6)) continue;
    std::vector<StashPolicy> mix = {StashPolicy::Keep, StashPolicy::Offload,
                                    StashPolicy::Checkpoint, StashPolicy::CheckpointOffload};
    SchedulePlan plan = lower(makeSchedule(kind, 4, 6, 2), mix, 2);
    EXPECT_NO_THROW(validate(plan.schedule, &plan.contract)) << kind;
  }
}

TEST(GeneratorsTest, EveryMicrobatchHasOneForwardAndOneBackwardOnItsDevices) {
  for (const std::string& kind : scheduleKindNames())
    for (auto [S, M] : kShapes) {
      if (!takesShape(kind, S, M)) continue;
      const int K = 2;
      SchedulePlan plan = makeSchedule(kind, S, M, K);
      const Schedule& s = plan.schedule;
      std::map<std::tuple<int, int, int>, int> count;  // (type, stage, mb) -> n
      for (int d = 0; d < s.numDevices(); ++d)
        for (const Action& a : s.devices[d]) {
          if (a.type == ActionType::Forward) {
            EXPECT_EQ(d, s.placement.forward(a.stage));
          }
          if (a.type == ActionType::Backward || a.type == ActionType::InputGrad ||
              a.type == ActionType::WeightGrad) {
            EXPECT_EQ(d, s.placement.backward(a.stage));
          }
          if (a.isCompute()) ++count[{static_cast<int>(a.type), a.stage, a.index}];
        }
      // F and B, or F, I and W (Note [Split backward]) of every (stage, microbatch).
      const bool split = count.count({static_cast<int>(ActionType::InputGrad), 0, 0}) > 0;
      EXPECT_EQ(static_cast<int>(count.size()), (split ? 3 : 2) * S * M * K) << kind;
      for (auto& [key, n] : count) EXPECT_EQ(n, 1);
    }
}

TEST(GeneratorsTest, ContractsMatchTheAbstractRun) {
  for (auto [S, M] : kShapes) {
    SCOPED_TRACE(std::to_string(S) + "x" + std::to_string(M));
    ValidationStats g = validate(lower(makeSchedule("gpipe", S, M), {}, 0).schedule);
    ValidationStats f = validate(lower(makeSchedule("1f1b", S, M), {}, 0).schedule);
    for (int s = 0; s < S; ++s) {
      EXPECT_EQ(g.peakInFlight[s], M);
      EXPECT_EQ(g.peakResident[s][s], M);
      EXPECT_EQ(f.peakInFlight[s], std::min(S - s, M));
      EXPECT_EQ(f.peakResident[s][s], std::min(S - s, M));
    }
    // PipeDream: stage s holds S-s weight versions once enough microbatches flow.
    const int K = (2 * S + M - 1) / M + 1;
    ValidationStats p = validate(lower(makeSchedule("pipedream", S, M, K), {}, 0).schedule);
    for (int s = 0; s < S; ++s) {
      EXPECT_EQ(p.peakWeightVersions[s], S - s);
      EXPECT_EQ(p.peakInFlight[s], S - s);
    }
  }
}

TEST(GeneratorsTest, PipefbForwardDevicesHoldNoStashWhenOffloading) {
  for (auto [S, M] : kShapes)
    for (std::string kind : {"pipefb-sync", "pipefb-async"})
      for (int lookahead : {0, 1, 2}) {
        SchedulePlan plan = lower(makeSchedule(kind, S, M, 3), {StashPolicy::Offload}, lookahead);
        ValidationStats st = validate(plan.schedule, &plan.contract);
        const Placement& p = plan.schedule.placement;
        for (int s = 0; s < S; ++s) {
          EXPECT_EQ(st.peakResident[p.forward(s)][s], 0);
          EXPECT_EQ(plan.contract.residentForward[s], 0);
          EXPECT_LE(st.peakResident[p.backward(s)][s], lookahead + 1);
          EXPECT_GE(st.peakResident[p.backward(s)][s], 1);
        }
      }
}

TEST(GeneratorsTest, OneFOneBWarmsUpWithSMinusSMinusOneForwards) {
  const int S = 5, M = 8;
  SchedulePlan plan = makeSchedule("1f1b", S, M);
  for (int s = 0; s < S; ++s) {
    const auto& list = plan.schedule.devices[s];
    auto firstB = std::find_if(list.begin(), list.end(),
                               [](const Action& a) { return a.type == ActionType::Backward; });
    EXPECT_EQ(firstB - list.begin(), S - s) << "stage " << s;  // S-s-1 warm-up + one steady F
    // After the warm-up, F and B alternate.
    for (auto it = firstB; it + 2 < list.end() && (it + 1)->type == ActionType::Forward; it += 2)
      EXPECT_EQ(it->type, ActionType::Backward);
  }
}

TEST(GeneratorsTest, PipefbAsyncForwardRunsOneVersionStale) {
  const int S = 3, M = 4, K = 4;
  SchedulePlan sync = makeSchedule("pipefb-sync", S, M, K);
  SchedulePlan async = makeSchedule("pipefb-async", S, M, K);
  for (int s = 0; s < S; ++s) {
    int fd = sync.schedule.placement.forward(s);
    // The weights version each forward runs with: (last RW index before it) + 1.
    auto versions = [&](const Schedule& sch) {
      std::vector<int> v;
      int cur = 0;
      for (const Action& a : sch.devices[fd]) {
        if (a.type == ActionType::RecvWeights) cur = a.index + 1;
        if (a.type == ActionType::Forward) v.push_back(cur);
      }
      return v;
    };
    std::vector<int> vs = versions(sync.schedule), va = versions(async.schedule);
    ASSERT_EQ(vs.size(), static_cast<size_t>(M * K));
    for (int m = 0; m < M * K; ++m) {
      int k = m / M;
      EXPECT_EQ(vs[m], k);                   // sync: the newest weights
      EXPECT_EQ(va[m], std::max(0, k - 1));  // async: at most one version stale
    }
    // pipeline.async_lag: only the first `lag` forwards of an iteration are stale.
    for (int lag : {0, 1, 3, M}) {
      SchedulePlan p = makeSchedule("pipefb-async", S, M, sync.schedule.placement, K, lag);
      SchedulePlan low = lower(p, {StashPolicy::Keep}, 1);
      validate(low.schedule, &low.contract);
      std::vector<int> vl = versions(p.schedule);
      for (int m = 0; m < M * K; ++m)
        EXPECT_EQ(vl[m], m % M < lag ? std::max(0, m / M - 1) : m / M) << "lag " << lag;
      EXPECT_EQ(p.contract.inFlight[s], M + lag);
      EXPECT_EQ(p.contract.weightVersions[s], lag > 0 ? 2 : 1);
      if (lag == M) EXPECT_EQ(p.schedule, async.schedule);
      if (lag == 0) EXPECT_EQ(vl, vs);
    }
  }
  EXPECT_EQ(async.contract.weightVersions, std::vector<int>(S, 2));
  EXPECT_EQ(sync.contract.weightVersions, std::vector<int>(S, 1));
  EXPECT_THROW(makeSchedule("pipefb-async", S, M, Placement::pipefb(S), K, M + 1),
               pipefb::UserError);
}

TEST(GeneratorsTest, UnknownKindListsAllowedNames) {
  try {
    makeSchedule("1f1f", 2, 2);
    FAIL();
  } catch (const pipefb::UserError& e) {
    std::string msg = e.what();
    for (const std::string& k : scheduleKindNames()) EXPECT_NE(msg.find(k), std::string::npos);
    EXPECT_NE(msg.find("1f1f"), std::string::npos);
  }
}

TEST(GeneratorsTest, RejectsBadShapesAndPlacements) {
  EXPECT_THROW(makeSchedule("gpipe", 0, 2), pipefb::UserError);
  EXPECT_THROW(makeSchedule("gpipe", 2, 0), pipefb::UserError);
  EXPECT_THROW(makeSchedule("gpipe", 2, 2, 0), pipefb::UserError);
  EXPECT_THROW(makeSchedule("1f1b", 2, 2, Placement::pipefb(2)), pipefb::UserError);
  EXPECT_THROW(makeSchedule("pipefb-sync", 2, 2, Placement::sameDevice(2)), pipefb::UserError);
  EXPECT_THROW(makeSchedule("1f1b", 2, 2, Placement({{0, 0}, {0, 0}})), pipefb::UserError);
  // Device 1 would run the backwards of stages 0 and 2 but not of stage 1 (Note [Decoupled
  // partitions]: one backward range per device).
  EXPECT_THROW(makeSchedule("pipefb-async", 3, 2, Placement({{0, 1}, {2, 3}, {4, 1}})),
               pipefb::UserError);
  // No stage split: that is 1F1B's or GPipe's job.
  EXPECT_THROW(makeSchedule("pipefb-sync", 2, 2, Placement::sameDevice(2)), pipefb::UserError);
  EXPECT_THROW(makeSchedule("pipefb-sync", 1, 2, Placement::folded(1)), pipefb::UserError);
  EXPECT_THROW(makeSchedule("gpipe", 3, 2, Placement::sameDevice(2)), pipefb::UserError);
}

TEST(GeneratorsTest, CustomPipefbPlacementValidates) {
  // Backward devices in the same order as forward ones: traffic no longer flows one way, but
  // the schedule is still correct.
  Placement p({{0, 3}, {1, 4}, {2, 5}});
  SchedulePlan plan = lower(makeSchedule("pipefb-sync", 3, 4, p, 2), {StashPolicy::Keep}, 1);
  EXPECT_NO_THROW(validate(plan.schedule, &plan.contract));
}

// Note [Split backward]: kinds with several stages per device, over odd shapes (v = 2, 3).
TEST(GeneratorsTest, SeveralStagesPerDeviceValidateOverOddShapes) {
  int checked = 0;
  for (int S : {2, 4, 6, 10})
    for (int M : {1, 2, 3, 7, 12}) {
      SCOPED_TRACE("zbv S=" + std::to_string(S) + " M=" + std::to_string(M));
      for (StashPolicy policy : kPolicies) {
        SchedulePlan plan = lower(zbv(S, M, Placement::vShape(S), 2), {policy}, 1);
        EXPECT_NO_THROW(validate(plan.schedule, &plan.contract));
        ++checked;
      }
    }
  for (auto [S, v, M] : {std::tuple{6, 2, 3}, {6, 3, 2}, {9, 3, 6}, {8, 4, 2}, {12, 2, 12}})
    for (StashPolicy policy : kPolicies) {
      SCOPED_TRACE("interleaved S=" + std::to_string(S) + " v=" + std::to_string(v) +
                   " M=" + std::to_string(M));
      SchedulePlan plan = lower(interleaved1F1B(S, M, Placement::looped(S, v), 3), {policy}, 2);
      EXPECT_NO_THROW(validate(plan.schedule, &plan.contract));
      SchedulePlan zb = lower(interleavedZb(S, M, Placement::looped(S, v), 3), {policy}, 2);
      EXPECT_NO_THROW(validate(zb.schedule, &zb.contract));
      checked += 2;
    }
  EXPECT_EQ(checked, 4 * 5 * 4 + 2 * 5 * 4);
}

TEST(GeneratorsTest, ShapesTheSplitKindsRefuseAreUserErrors) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const pipefb::UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { makeSchedule("zbv", 3, 4); }).find("even number of stages"),
            std::string::npos);
  EXPECT_NE(message([] { makeSchedule("interleaved-1f1b", 6, 4); }).find("multiple of the devices"),
            std::string::npos);
  EXPECT_NE(message([] { Placement::looped(6, 4); }).find("pipeline.virtual_stages"),
            std::string::npos);
  EXPECT_NE(message([] { zbH1(3, 4, Placement::pipefb(3)); }).find("stage s on device s"),
            std::string::npos);
  EXPECT_NE(message([] { pipefbZb(2, 4, Placement::sameDevice(2)); }).find("pipefb-zb needs"),
            std::string::npos);
  EXPECT_FALSE(takesShape("zbv", 3, 4));
  EXPECT_TRUE(takesShape("zbv", 4, 3));
  EXPECT_FALSE(takesShape("interleaved-1f1b", 6, 4));
  EXPECT_TRUE(takesShape("interleaved-1f1b", 6, 6));
  EXPECT_NE(message([] { makeSchedule("interleaved-zb", 6, 4); }).find("multiple of the devices"),
            std::string::npos);
  EXPECT_NE(message([] { interleavedZb(4, 4, Placement::sameDevice(4)); }).find("use zb-h1"),
            std::string::npos);
  EXPECT_FALSE(takesShape("interleaved-zb", 6, 4));
  EXPECT_TRUE(takesShape("interleaved-zb", 6, 6));
}

// Note [Lagged W]: ZB-H1 holds 1F1B's device-0 stash count on every device; ZB-H2 up to
// 2S - 1; both defer W's, and the contract says how many wait.
TEST(GeneratorsTest, SplitKindsStateWhatTheirWsHold) {
  for (auto [S, M] : kShapes) {
    if (M < S) continue;
    SchedulePlan h1 = lower(makeSchedule("zb-h1", S, M), {StashPolicy::Keep}, 1);
    SchedulePlan h2 = lower(makeSchedule("zb-h2", S, M), {StashPolicy::Keep}, 1);
    ValidationStats a = validate(h1.schedule, &h1.contract);
    ValidationStats b = validate(h2.schedule, &h2.contract);
    for (int s = 0; s < S; ++s) {
      EXPECT_LE(a.peakInFlight[s], S);
      EXPECT_LE(b.peakInFlight[s], 2 * S - 1);
      EXPECT_EQ(a.peakDeferredW[s], h1.contract.deferredW[s]);
      EXPECT_EQ(b.peakDeferredW[s], h2.contract.deferredW[s]);
    }
    if (S > 1) EXPECT_GT(h1.contract.deferredW[S - 1], 1);  // the last stage defers most
  }
}
// Note [Folded placements]: device d runs F(d) and B(S-1-d); with odd S the middle stage is
// not split. Every shape, policy, lookahead and async lag validates against its contract.
TEST(GeneratorsTest, FoldedPipefbValidatesOnEveryShapeAndPolicy) {
  int checked = 0;
  for (int S = 2; S <= 6; ++S)
    for (int M : {1, 2, 3, 8})
      for (int K : {1, 3})
        for (std::string kind : {"pipefb-sync", "pipefb-async"})
          for (int lag : kind == "pipefb-sync" ? std::vector<int>{0} : std::vector<int>{-1, 1})
            for (StashPolicy policy : kPolicies)
              for (int lookahead : {0, 1, 3}) {
                SCOPED_TRACE(kind + " S=" + std::to_string(S) + " M=" + std::to_string(M) +
                             " K=" + std::to_string(K) + " lag=" + std::to_string(lag) + " " +
                             toString(policy) + " lookahead=" + std::to_string(lookahead));
                SchedulePlan raw = makeSchedule(kind, S, M, Placement::folded(S), K, lag);
                EXPECT_EQ(raw.schedule.numDevices(), S);
                SchedulePlan plan = lower(raw, {policy}, lookahead);
                ValidationStats st;
                EXPECT_NO_THROW(st = validate(plan.schedule, &plan.contract));
                if (S % 2 == 1 && !(M == 1 && K == 1)) {
                  // The middle stage runs on one device, B(s,i) before F(s,j) once j > S + i.
                  EXPECT_EQ(st.peakInFlight[S / 2], std::min(M, S + 1));
                  EXPECT_EQ(st.peakWeightVersions[S / 2], 1);
                }
                ++checked;
              }
  EXPECT_EQ(checked, 5 * 4 * 2 * 3 * 4 * 3);
}

TEST(GeneratorsTest, FoldedDevicesRunOneForwardAndOneBackwardStage) {
  const int S = 5, M = 3, K = 2;
  SchedulePlan plan = makeSchedule("pipefb-sync", S, M, Placement::folded(S), K);
  EXPECT_EQ(plan.schedule.placement.toString(), "0/4 1/3 2/2 3/1 4/0");
  EXPECT_TRUE(plan.schedule.placement.sharesDevices());
  EXPECT_FALSE(Placement::pipefb(S).sharesDevices());
  for (int d = 0; d < S; ++d) {
    std::set<std::pair<ActionType, int>> passes;
    bool sawB = false;
    for (const Action& a : plan.schedule.devices[d]) {
      if (a.isCompute()) passes.insert({a.type, a.stage});
      // Note [PipeFB device order]: per iteration, F's before B's; the middle stage needs
      // no weight messages.
      if (a.type == ActionType::Backward) sawB = true;
      if (a.type == ActionType::Forward && a.index % M == 0 && a.index > 0) sawB = false;
      if (a.type == ActionType::Forward) {
        EXPECT_FALSE(sawB) << toString(a) << " on " << d;
      }
      if (a.type == ActionType::RecvWeights || a.type == ActionType::SyncWeights) {
        EXPECT_NE(a.stage, S / 2);
      }
    }
    EXPECT_EQ(passes, (std::set<std::pair<ActionType, int>>{{ActionType::Forward, d},
                                                            {ActionType::Backward, S - 1 - d}}));
  }
}

TEST(GeneratorsTest, VShapeSharesTheMirrorFold) {
  EXPECT_EQ(Placement::vShape(6).toString(), "0/0 1/1 2/2 2/2 1/1 0/0");
  for (int n = 1; n <= 7; ++n)
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(Placement::foldedDevice(i, n), Placement::foldedDevice(n - 1 - i, n));
      EXPECT_EQ(Placement::folded(n).forward(i), Placement::folded(n).backward(n - 1 - i));
    }
}

// Note [Decoupled partitions]: the segments of two cut lists, and their ranges.
TEST(DecoupledPartitions, SegmentsAreTheUnionOfBothPassesCuts) {
  // Forward: [0,4) on 0, [4,10) on 1. Backward: [0,2) on 1, [2,7) on 2, [7,10) on 3.
  DecoupledStages d = decouple(10, {{4}, {0, 1}}, {{2, 7}, {1, 2, 3}});
  EXPECT_EQ(d.cuts, (std::vector<std::int64_t>{2, 4, 7}));
  EXPECT_EQ(d.placement.toString(), "0/1 0/2 1/2 1/3");
  // The backward range [2,7) on device 2 spans two forward ranges; forward device 0's layers
  // go to two backward devices.
  EXPECT_EQ(d.placement.forwardRanges(), (std::vector<Placement::StageRun>{{0, 2, 0}, {2, 4, 1}}));
  EXPECT_EQ(d.placement.backwardRanges(),
            (std::vector<Placement::StageRun>{{0, 1, 1}, {1, 3, 2}, {3, 4, 3}}));
  d.placement.checkFor("pipefb-sync", 4, "<t>");
  // One forward device feeding three backward devices.
  DecoupledStages one = decouple(9, {{}, {0}}, {{3, 6}, {1, 2, 3}});
  EXPECT_EQ(one.placement, Placement::decoupled({0, 0, 0}, {1, 2, 3}));
  EXPECT_EQ(one.placement.toString(), "0/1 0/2 0/3");
  // A shared cut makes no empty segment.
  EXPECT_EQ(decouple(6, {{3}, {0, 1}}, {{3}, {2, 3}}).cuts, (std::vector<std::int64_t>{3}));
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const pipefb::UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] {
              decouple(6, {{3}, {0}}, {{}, {1}});
            }).find("the forward partition has 1 cuts and 1 devices"),
            std::string::npos);
  EXPECT_NE(message([] {
              decouple(6, {{}, {0}}, {{4, 2}, {1, 2, 3}});
            }).find("the backward partition cuts at layer 2"),
            std::string::npos);
  EXPECT_NE(message([] {
              decouple(6, {{6}, {0, 1}}, {{}, {2}});
            }).find("lie in (0, 6)"),
            std::string::npos);
  EXPECT_NE(message([] {
              Placement::decoupled({0, 0}, {1});
            }).find("one forward and one backward"),
            std::string::npos);
}

// Note [Decoupled partitions], Note [PipeFB device order]: every placement the rule accepts
// (all of them for 3 stages on 3 devices and 4 on 3) generates, lowers and validates against
// its contract, and an unsplit stage holds exactly what unsplitPipefbInFlight says.
TEST(DecoupledPartitions, EveryAcceptedPlacementValidatesUnderEveryPolicy) {
  int checked = 0, placements = 0;
  for (auto [S, D] : {std::pair{3, 3}, std::pair{4, 3}}) {
    const std::vector<Placement> all = Placement::everyPipefb(S, D);
    placements += static_cast<int>(all.size());
    for (const Placement& p : all)
      for (std::string kind : {"pipefb-sync", "pipefb-async"})
        for (int M : {1, 3, 6})
          for (StashPolicy policy : kPolicies) {
            SCOPED_TRACE(kind + " " + p.toString() + " M=" + std::to_string(M) + " " +
                         toString(policy));
            SchedulePlan plan = lower(makeSchedule(kind, S, M, p, 2), {policy}, 1);
            ValidationStats st;
            ASSERT_NO_THROW(st = validate(plan.schedule, &plan.contract));
            for (int s = 0; s < S; ++s)
              if (!p.split(s)) {
                EXPECT_EQ(st.peakInFlight[s], unsplitPipefbInFlight(p, s, M));
              }
            // The runtime feeds iteration k once every device ran its actions of k-1 (an
            // RW, STEP or SW names its iteration, the rest their microbatch's): in sync no
            // device may wait in an action of k before one of k-1 (copies never wait: a PRE
            // of k may be issued ahead).
            if (kind == "pipefb-sync")
              for (int d = 0; d < plan.schedule.numDevices(); ++d) {
                int previous = 0;
                for (const Action& a : plan.schedule.devices[d]) {
                  if (a.type == ActionType::Offload || a.type == ActionType::Prefetch ||
                      a.type == ActionType::Drop)
                    continue;
                  const bool named = a.type == ActionType::Step ||
                                     a.type == ActionType::SyncWeights ||
                                     a.type == ActionType::RecvWeights;
                  const int k = named ? a.index : a.index / M;
                  EXPECT_GE(k, previous) << toString(a) << " on device " << d;
                  previous = k;
                }
              }
            ++checked;
          }
  }
  // 3 on 3: 9^3 = 729 candidates; the rule keeps the ones with a split stage and one range
  // per device and pass.
  EXPECT_GT(placements, 200);
  EXPECT_EQ(checked, placements * 2 * 3 * 4);
}

TEST(DecoupledPartitions, OneForwardDeviceRunsItsRangeMicrobatchByMicrobatch) {
  const int M = 3;
  SchedulePlan plan = makeSchedule("pipefb-sync", 3, M, Placement::parse("0/1 0/2 0/3", "<t>"));
  std::vector<std::string> dev0;
  for (const Action& a : plan.schedule.devices[0]) dev0.push_back(toString(a));
  EXPECT_EQ(dev0, (std::vector<std::string>{"F0.0", "F1.0", "F2.0", "F0.1", "F1.1", "F2.1", "F0.2",
                                            "F1.2", "F2.2", "RW0.0<1", "RW1.0<2", "RW2.0<3"}));
  // Its messages to the next segment stay on the device.
  const Schedule lowered = addCommunication(plan.schedule);
  for (const Action& a : lowered.devices[0])
    if (a.isSend()) EXPECT_EQ(a.stage, 2) << toString(a);  // only the last segment's output
}

// The slots of ranges reproduce the orders of one stage per range (the golden files hold
// them too): folded's middle stage holds S + 1.
TEST(DecoupledPartitions, FoldedInFlightIsThePlacementForm) {
  for (int S = 1; S <= 9; S += 2)
    for (int M : {1, 4, 20})
      EXPECT_EQ(unsplitPipefbInFlight(Placement::folded(S), S / 2, M), unsplitPipefbInFlight(S, M));
}

// Note [All-reduces before the steps]: a device's STEPs that follow one another get their
// ARs before the first of them; a STEP alone keeps its AR right before it.
TEST(GeneratorsTest, AllReducesGoBeforeTheDevicesSteps) {
  auto tail = [](const std::vector<Action>& list, size_t n) {
    std::string out;
    for (size_t i = list.size() - n; i < list.size(); ++i)
      out += (out.empty() ? "" : " ") + toString(list[i]);
    return out;
  };
  const Schedule two = addAllReduce(makeSchedule("interleaved-1f1b", 4, 2).schedule);
  EXPECT_EQ(tail(two.devices[0], 4), "AR0.0 AR2.0 STEP0.0 STEP2.0");
  EXPECT_EQ(tail(two.devices[1], 4), "AR1.0 AR3.0 STEP1.0 STEP3.0");
  const Schedule one = addAllReduce(makeSchedule("1f1b", 2, 2).schedule);
  EXPECT_EQ(tail(one.devices[1], 3), "B1.1 AR1.0 STEP1.0");
  // pipedream steps after every B: each AR right before its STEP.
  const Schedule async = addAllReduce(makeSchedule("pipedream", 2, 2, 2).schedule);
  for (const auto& list : async.devices)
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].type == ActionType::Step) {
        ASSERT_GE(i, 1u);
        EXPECT_EQ(list[i - 1].type, ActionType::AllReduce) << toString(list[i]);
        EXPECT_EQ(list[i - 1].stage, list[i].stage);
      }
}
