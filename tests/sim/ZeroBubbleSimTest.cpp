// Issue 18's simulator goals for the split-backward schedules (Note [Lagged W], Note [Greedy
// zero-bubble order] in schedules/ZeroBubble.h). Uniform costs: F = I = W = 1 ms, B = I + W
// (CostTable::uniform leaves I and W unset, so each is half of B, Note [I and W costs]).
// Simulator outputs, deterministic: no timing.
#include <gtest/gtest.h>

#include <algorithm>

#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Validator.h"
#include "pipefb/schedules/ZeroBubble.h"
#include "pipefb/sim/Simulator.h"

using namespace pipefb::schedules;
using namespace pipefb::sim;

namespace {

struct SimRun {
  SimResult r;
  double idle = 0;  // device-seconds without compute over the makespan
  std::int64_t peakStashBytes = 0;
  int peakStashes = 0;
};

SimRun run(const std::string& kind, int S, int M, int K = 1, const CostTable* costs = nullptr) {
  SchedulePlan plan = lower(makeSchedule(kind, S, M, K), {StashPolicy::Keep}, 1);
  validate(plan.schedule, &plan.contract);
  SimRun out;
  out.r = simulate(plan.schedule, costs ? *costs : CostTable::uniform(S));
  for (int d = 0; d < plan.schedule.numDevices(); ++d) {
    out.idle += out.r.makespan - out.r.busy[d];
    out.peakStashBytes = std::max(out.peakStashBytes, out.r.peakStashBytes[d]);
    out.peakStashes = std::max(out.peakStashes, out.r.peakStashCount[d]);
  }
  return out;
}

// Half of a uniform stage per stage: zbv and interleaved cut the same model into twice the
// stages, so each costs and stashes half.
CostTable halfStages(int S) {
  CostTable c = CostTable::uniform(S);
  for (StageCosts& sc : c.stages) {
    sc.forward /= 2;
    sc.backward /= 2;
    sc.stashBytes /= 2;
  }
  return c;
}

}  // namespace

TEST(ZeroBubbleSim, UniformCostsSplitBOntoIAndW) {
  const StageCosts sc = CostTable::uniform(1).stages[0];
  EXPECT_DOUBLE_EQ(sc.inputGradTime(), sc.forward);
  EXPECT_DOUBLE_EQ(sc.weightGradTime(), sc.forward);
  EXPECT_DOUBLE_EQ(sc.inputGradTime() + sc.weightGradTime(), sc.backward);
}

// Goal: ZB-H1's idle time is at most 1/3 of 1F1B's, its bubble <= 0.112 (1F1B's is 0.273),
// at 1F1B's peak activation memory (S = 4, M = 8, one iteration).
TEST(ZeroBubbleSim, ZbH1HasAThirdOf1F1BsIdleAtItsPeakActivationMemory) {
  const SimRun f = run("1f1b", 4, 8), z = run("zb-h1", 4, 8);
  EXPECT_NEAR(f.r.bubbleFraction, 9.0 / 33.0, 1e-9);  // 0.273
  EXPECT_LE(z.idle, f.idle / 3 + 1e-12);
  EXPECT_LE(z.r.bubbleFraction, 0.112);
  EXPECT_NEAR(z.r.bubbleFraction, 3.0 / 27.0, 1e-9);  // (S-1) / (3M + S - 1)
  EXPECT_LE(z.peakStashBytes, f.peakStashBytes);
  EXPECT_LE(z.peakStashes, f.peakStashes);
}

// Goal: ZB-H2 over 4 iterations has an idle fraction <= 0.05 in steady state, with each
// stage stepping after its own last W (no flush); one flushed iteration is bounded by the
// fill (S-1) F's: (S-1) / (3M + S - 1) = 0.111.
TEST(ZeroBubbleSim, ZbH2HasNoSteadyStateBubble) {
  const SimRun steady = run("zb-h2", 4, 8, 4), one = run("zb-h2", 4, 8, 1);
  const SimRun f = run("1f1b", 4, 8);
  EXPECT_LE(steady.r.bubbleFraction, 0.05);
  EXPECT_NEAR(one.r.bubbleFraction, 3.0 / 27.0, 1e-9);
  // At most twice 1F1B's activation memory (the paper's 2x).
  EXPECT_LE(steady.peakStashBytes, 2 * f.peakStashBytes);
  EXPECT_GT(steady.peakStashBytes, f.peakStashBytes);
}

TEST(ZeroBubbleSim, ZbvBeats1F1BAtItsActivationMemory) {
  const CostTable half = halfStages(8);
  const SimRun f = run("1f1b", 4, 8), v = run("zbv", 8, 8, 1, &half), h1 = run("zb-h1", 4, 8);
  EXPECT_LT(v.r.makespan, h1.r.makespan);
  EXPECT_LE(v.r.bubbleFraction, 0.06);
  EXPECT_LE(v.peakStashBytes, f.peakStashBytes);
}

TEST(ZeroBubbleSim, Interleaved1F1BShrinksTheBubble) {
  const CostTable half = halfStages(8);
  const SimRun f = run("1f1b", 4, 8), i = run("interleaved-1f1b", 8, 8, 1, &half);
  // Megatron: the bubble falls by the number of virtual stages, (S-1)/(vM + S-1) here.
  EXPECT_NEAR(i.r.bubbleFraction, 3.0 / (2 * 8 + 3), 1e-9);
  EXPECT_LT(i.r.makespan, f.r.makespan);
}

// Note [PipeFB with a split backward]: the backward chain fills in (S-1) I's instead of
// (S-1) B's: one iteration is (S-1) W shorter, holding one stash more (the W after its I).
TEST(ZeroBubbleSim, PipeFbZbSavesAWPerStageOfTheBackwardFill) {
  const SimRun sync = run("pipefb-sync", 4, 8), zb = run("pipefb-zb", 4, 8);
  EXPECT_NEAR(sync.r.makespan - zb.r.makespan, 3 * 1e-3, 1e-9);
  EXPECT_LE(zb.peakStashes, sync.peakStashes + 1);
  const SimRun sync3 = run("pipefb-sync", 4, 8, 3), zb3 = run("pipefb-zb", 4, 8, 3);
  EXPECT_LT(zb3.r.iterationTime, sync3.r.iterationTime);
}
