// The solver on literal numbers (STYLE.md habit 6, like torchgpipe's blockpartition tests).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "PlannerTestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/planner/BruteForce.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/SharedDevices.h"
#include "pipefb/schedules/ZeroBubble.h"

using namespace pipefb::planner;
using namespace pipefb::planner::testing;
using pipefb::schedules::StashPolicy;

namespace {

PipelineShape shapeOf(ScheduleKind k, int S, int M, std::vector<int> chain, std::int64_t mb = 1) {
  PipelineShape sh;
  sh.kind = k;
  sh.stages = S;
  sh.microbatches = M;
  sh.microbatchSize = mb;
  sh.chain = std::move(chain);
  return sh;
}

std::vector<std::int64_t> unlimited(int n) { return std::vector<std::int64_t>(n, -1); }

}  // namespace

TEST(SolverLiteral, TorchgpipeBlockPartitionTwo) {
  // torchgpipe: solve([1,2,3,4,5,6], partitions=2) == [[1,2,3,4],[5,6]]
  CostModel m(timesProfile({1, 2, 3, 4, 5, 6}), freeCluster(2));
  auto p = solveShape(m, shapeOf(ScheduleKind::PipeDream, 2, 1, {0, 1}), {StashPolicy::Keep},
                      unlimited(2), -1, Objective::Time);
  ASSERT_TRUE(p);
  EXPECT_EQ(cuts(*p), (std::vector<std::vector<int>>{{0, 4}, {4, 6}}));
  EXPECT_DOUBLE_EQ(p->tau, 11);
}

TEST(SolverLiteral, TorchgpipeBlockPartitionThree) {
  // torchgpipe: solve([1,2,3,4,5,6], partitions=3) == [[1,2,3],[4,5],[6]]
  CostModel m(timesProfile({1, 2, 3, 4, 5, 6}), freeCluster(3));
  auto p = solveShape(m, shapeOf(ScheduleKind::PipeDream, 3, 1, {0, 1, 2}), {StashPolicy::Keep},
                      unlimited(3), -1, Objective::Time);
  ASSERT_TRUE(p);
  EXPECT_EQ(cuts(*p), (std::vector<std::vector<int>>{{0, 3}, {3, 5}, {5, 6}}));
  EXPECT_DOUBLE_EQ(p->tau, 9);
  // The whole search picks 3 stages (pace 9 < 11 < 21) for the asynchronous schedule.
  SolveResult r = solve(m, only("pipedream-keep"));
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.best.shape.stages, 3);
  EXPECT_DOUBLE_EQ(r.best.iterationTime, 9);
}

TEST(SolverLiteral, FlushBubbleDecidesStageCount) {
  // 1f1b with batch 4 = 4 microbatches of 1: S=1: 4 x 8 = 32; S=2: (4+1) x 4 = 20;
  // S=4: (4+3) x 2 = 14.
  CostModel m(timesProfile({2, 2, 2, 2}), freeCluster(4));
  SolverOptions o = only("1f1b-keep", 4);
  SolveResult r = solve(m, o);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.best.shape.stages, 4);
  EXPECT_EQ(r.best.shape.microbatches, 4);
  EXPECT_DOUBLE_EQ(r.best.iterationTime, 14);
  EXPECT_DOUBLE_EQ(r.best.throughput, 4.0 / 14);
}

TEST(SolverLiteral, HeterogeneousSpeedsGetProportionalWork) {
  // Device 1 is 3x faster: it takes three of the four unit layers; pace 1.
  Profile p = timesProfile({1, 1, 1, 1});
  Cluster c = freeCluster(2);
  c.devices[1].speed = 3;
  CostModel m(p, c);
  SolveResult r = solve(m, only("pipedream-keep"));
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.best.shape.stages, 2);
  EXPECT_DOUBLE_EQ(r.best.tau, 1);
  EXPECT_EQ(r.best.stages[0].forwardDevice, 0);
  EXPECT_EQ(cuts(r.best), (std::vector<std::vector<int>>{{0, 1}, {1, 4}}));
}

TEST(SolverLiteral, LinkMatrixChoosesTheFastPair) {
  // Three devices; 0<->1 is slow (0.5 B/s), every other link is fast. Two stages of 1 s
  // each, sending 1 byte: a chain over the slow link has pace 2 s (the link); the others
  // 1 s (the transfer, 1 ns, hides under compute).
  Profile p = timesProfile({1, 1});
  p.layers[0].outputBytes = 1;
  Cluster c = freeCluster(3);
  for (auto& row : c.links)
    for (auto& l : row) l = Link{1e9, 0};
  c.links[0][1] = c.links[1][0] = Link{0.5, 0};
  CostModel m(p, c);
  SolverOptions o = only("pipedream-keep");
  o.maxStages = 2;
  SolveResult r = solve(m, o);
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.best.shape.stages, 2);
  EXPECT_DOUBLE_EQ(r.best.tau, 1.0);
  const auto& ch = r.best.shape.chain;
  EXPECT_FALSE((ch[0] == 0 && ch[1] == 1) || (ch[0] == 1 && ch[1] == 0));
}

TEST(SolverLiteral, MemoryForcesAnUnbalancedCut) {
  // Equal times, but layer 0 has 60 bytes of weights; limit 100 per device.
  // Balanced [0,2)|[2,4) needs 60+50 = 110 on device 0: over. The DP gives [0,1)|[1,4).
  Profile p = timesProfile({1, 1, 1, 1});
  p.layers[0].paramBytes = 60;
  p.layers[1].paramBytes = 50;
  p.layers[2].paramBytes = 10;
  p.layers[3].paramBytes = 10;
  CostModel m(p, freeCluster(2, 100));
  SolverOptions o = only("1f1b-keep");
  o.maxStages = 2;
  SolveResult r = solve(m, o);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(cuts(r.best), (std::vector<std::vector<int>>{{0, 1}, {1, 4}}));
  EXPECT_EQ(r.best.deviceMemory[r.best.stages[0].forwardDevice], 60);
  EXPECT_EQ(r.best.deviceMemory[r.best.stages[1].forwardDevice], 70);
}

TEST(SolverLiteral, MemoryCategoriesOfOneStage) {
  // 1f1b, S=2, M=4, microbatch 2 from a profile at microbatch 1: stage 0 holds
  // min(S-0, M) = 2 stashes of 2 x 10 bytes; working set 2 x 7; W=100, G=100, O=200.
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) {
    l.savedBytes = 10;
    l.workingBytes = 7;
    l.paramBytes = l.gradBytes = 100;
    l.optimizerBytes = 200;
  }
  CostModel m(p, freeCluster(2));
  PipelineShape sh = shapeOf(ScheduleKind::OneFOneB, 2, 4, {0, 1}, 2);
  StageEstimate e = m.stage(sh, 0, 0, 1, StashPolicy::Keep);
  EXPECT_EQ(e.inFlight, 2);
  using pipefb::index;
  using pipefb::MemoryCategory;
  EXPECT_EQ(e.backwardMemory[index(MemoryCategory::Weights)], 100);
  EXPECT_EQ(e.backwardMemory[index(MemoryCategory::Grads)], 100);
  EXPECT_EQ(e.backwardMemory[index(MemoryCategory::OptimizerState)], 200);
  EXPECT_EQ(e.backwardMemory[index(MemoryCategory::Stash)], 2 * 20);
  // Working set: the layer's 2 x 7 beside its graph (20) while B runs; 1f1b's B adds the
  // weight gradients into .grad in place (Note [Gathered weight gradients]: gathered, the
  // whole G = 100 would be held at the end of B): 20 + 14, less the graph that Stash
  // already charges.
  EXPECT_EQ(e.backwardMemory[index(MemoryCategory::WorkingSet)], 14);
  EXPECT_EQ(e.peakMemory(), 454);
  // Checkpoint: the stash is the stage input (profile inputBytes = 0 here); B recomputes
  // the graph (20 bytes) and runs beside it: 20 + 14.
  StageEstimate c = m.stage(sh, 0, 0, 1, StashPolicy::Checkpoint);
  EXPECT_EQ(c.backwardMemory[index(MemoryCategory::Stash)], 0);
  EXPECT_EQ(c.backwardMemory[index(MemoryCategory::WorkingSet)], 20 + 14);
  // Stage 1, the last, is charged its whole graph beside B's largest working set: the loss
  // runs there first (its transient is not profiled), and B holds the loss and its seed
  // (Note [Loss scalars beside the backward]).
  StageEstimate last = m.stage(sh, 1, 1, 2, StashPolicy::Checkpoint);
  EXPECT_EQ(last.backwardMemory[index(MemoryCategory::WorkingSet)], 20 + 14 + 2 * kLossScalarBytes);
}

TEST(SolverLiteral, PipeDreamStepsInTheRoomOfTheCopyItsBackwardFreed) {
  // Note [Step working set]: one layer per stage, W = G = 100, O = 200, step transient 250,
  // no working set besides B's gathered gradient (G = 100). PipeDream S=2, stage 0 keeps
  // 2 weight copies; its STEP follows a B that let go of one: max(100, 250 - 100) = 150.
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) {
    l.paramBytes = l.gradBytes = 100;
    l.optimizerBytes = 200;
    l.stepWorkingBytes = 250;
  }
  CostModel m(p, freeCluster(2));
  using pipefb::index;
  using pipefb::MemoryCategory;
  PipelineShape pd = shapeOf(ScheduleKind::PipeDream, 2, 4, {0, 1});
  StageEstimate s0 = m.stage(pd, 0, 0, 1, StashPolicy::Keep);
  EXPECT_EQ(s0.backwardMemory[index(MemoryCategory::WeightVersions)], 200);
  EXPECT_EQ(s0.backwardMemory[index(MemoryCategory::WorkingSet)], 150);
  // The last stage keeps no copy: the whole transient, 250.
  StageEstimate s1 = m.stage(pd, 1, 1, 2, StashPolicy::Keep);
  EXPECT_EQ(s1.backwardMemory[index(MemoryCategory::WeightVersions)], 0);
  EXPECT_EQ(s1.backwardMemory[index(MemoryCategory::WorkingSet)], 250);
}

TEST(SolverLiteral, PipeDreamOffloadsItsWeightCopiesToTheHostPool) {
  // Note [Weight-version offload]: pipedream S=2, M=4, one layer per stage, W = 100, 10
  // saved bytes, host link 1000 B/s. Stage 0 stashes 2 weight versions. Keep: 2 x 100 on
  // the device. Offload with lookahead 0: min(2, 0 + 1) = 1 stays at compute starts, the
  // other goes to the host pool (2 - 1 - 0 / 2 = 1: 100, beside the 2 x 10 stash bytes),
  // and each microbatch copies one version out and back: 2 x 100 / 1000 = 0.2 s on the
  // copy engine beside the stash's 2 x 10 / 1000 = 0.02 s. The version an OFFW is still
  // copying out stays through the next B (Note [Copies held through the next compute]):
  // counted together (Note [Held at a same-device stage's starts]), B(0,m) runs beside 2
  // versions (its own and that one) and 1 stash, where the old per-category charge was
  // 2 stashes beside 100 + (100 - 10): the same 210.
  // pipeline.offload_weights none keeps both copies on the device.
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) {
    l.paramBytes = 100;
    l.savedBytes = 10;
  }
  CostModel m(p, Cluster::uniform(2, 1.0, -1, Link{}, Link{1000, 0}));
  using pipefb::index;
  using pipefb::MemoryCategory;
  const int wv = index(MemoryCategory::WeightVersions);
  PipelineShape pd = shapeOf(ScheduleKind::PipeDream, 2, 4, {0, 1});
  pd.lookahead = 0;
  StageEstimate keep = m.stage(pd, 0, 0, 1, StashPolicy::Keep);
  EXPECT_EQ(keep.backwardMemory[wv], 200);
  EXPECT_EQ(keep.hostBytes, 0);
  EXPECT_DOUBLE_EQ(keep.forwardCopy, 0);
  StageEstimate off = m.stage(pd, 0, 0, 1, StashPolicy::Offload);
  EXPECT_EQ(off.backwardMemory[wv], 200);
  EXPECT_EQ(off.backwardMemory[index(MemoryCategory::Stash)], 10);
  EXPECT_EQ(off.hostBytes, 2 * 10 + 100);
  EXPECT_NEAR(off.forwardCopy, 0.02 + 0.2, 1e-12);
  // Checkpoint-offload stashes the stage input (0 bytes here); the weights move the same,
  // and a version going out is all beyond the stash's slot: 100 + 100.
  StageEstimate ckoff = m.stage(pd, 0, 0, 1, StashPolicy::CheckpointOffload);
  EXPECT_EQ(ckoff.backwardMemory[wv], 200);
  EXPECT_EQ(ckoff.hostBytes, 100);
  // Lookahead 1: both versions may be back at once (min(2, 2)); they still move, since
  // B(0,m-1) runs between F(0,m)'s OFFW and the PREW one compute action before B(0,m), and
  // while it runs one version is in the host pool (2 - 1 - 1 / 2 = 1).
  pd.lookahead = 1;
  StageEstimate l1 = m.stage(pd, 0, 0, 1, StashPolicy::Offload);
  EXPECT_EQ(l1.backwardMemory[wv], 200);
  EXPECT_EQ(l1.hostBytes, 2 * 10 + 100);
  EXPECT_NEAR(l1.forwardCopy, 0.22, 1e-12);
  // Lookahead 2: the PREW would follow its OFFW directly; nothing moves.
  pd.lookahead = 2;
  StageEstimate l2 = m.stage(pd, 0, 0, 1, StashPolicy::Offload);
  EXPECT_EQ(l2.backwardMemory[wv], 200);
  EXPECT_EQ(l2.hostBytes, 2 * 10);
  EXPECT_NEAR(l2.forwardCopy, 0.02, 1e-12);
  // offload_weights none: the stash offloads, the versions stay.
  pd.lookahead = 0;
  pd.offloadWeights = false;
  StageEstimate none = m.stage(pd, 0, 0, 1, StashPolicy::Offload);
  EXPECT_EQ(none.backwardMemory[wv], 200);
  EXPECT_EQ(none.hostBytes, 2 * 10);
  EXPECT_NEAR(none.forwardCopy, 0.02, 1e-12);
  // S=3: stage 0 stashes 3 versions; lookahead 1 leaves 2 at compute starts and 3 held
  // while an OFFW's copy waits (measured: gpt2-tiny's embedding held 3 at the end of an F
  // whose earlier OFFW the copy engine had not reached; 2 charged, 3.0% above the plan).
  // Counted together, its most is in its drain: B0.m beside its version, the next one
  // prefetched and the one just taken out, and 2 stashes (its own and the next,
  // prefetched): 3 x 100 + 2 x 10, the old charge's 2 x 100 + (100 - 10) + 3 x 10.
  // Stage 1 (2 versions, 2 stashes in flight, all charged) holds both.
  PipelineShape pd3 = shapeOf(ScheduleKind::PipeDream, 3, 4, {0, 1, 2});
  pd3.lookahead = 1;
  Profile p3 = timesProfile({1, 1, 1});
  for (auto& l : p3.layers) {
    l.paramBytes = 100;
    l.savedBytes = 10;
  }
  CostModel m3(p3, Cluster::uniform(3, 1.0, -1, Link{}, Link{1000, 0}));
  EXPECT_EQ(m3.stage(pd3, 0, 0, 1, StashPolicy::Offload).backwardMemory[wv], 300);
  EXPECT_EQ(
      m3.stage(pd3, 0, 0, 1, StashPolicy::Offload).backwardMemory[index(MemoryCategory::Stash)],
      20);
  EXPECT_EQ(m3.stage(pd3, 0, 0, 1, StashPolicy::Keep).backwardMemory[wv], 300);
  EXPECT_EQ(m3.stage(pd3, 1, 1, 2, StashPolicy::Offload).backwardMemory[wv], 200);
  // The last stage stashes no version.
  pd.offloadWeights = true;
  StageEstimate s1 = m.stage(pd, 1, 1, 2, StashPolicy::Offload);
  EXPECT_EQ(s1.backwardMemory[wv], 0);
  EXPECT_EQ(s1.hostBytes, 10);
}

TEST(SolverLiteral, GatheredGradientsInTheBackwardWorkingSet) {
  // Note [Gathered weight gradients]: three layers with G = 10, 20, 30 and (profiled, at
  // microbatch 1) working sets 50, 5, 5; microbatch 2. A B that gathers holds the
  // gradients of layers 1 and 2 while it runs through layer 0: 2 x 50 + 20 + 30 = 150. At
  // the end: G = 60 plus the input gradient for a stage after the first (input 8 x 2 = 16).
  Profile p = timesProfile({1, 1, 1});
  const std::int64_t G[] = {10, 20, 30}, ws[] = {50, 5, 5};
  for (int l = 0; l < 3; ++l) {
    p.layers[l].paramBytes = p.layers[l].gradBytes = G[l];
    p.layers[l].workingBytes = ws[l];
    p.layers[l].outputBytes = 8;
  }
  CostModel m(p, freeCluster(2));
  PipelineShape sh = shapeOf(ScheduleKind::OneFOneB, 2, 4, {0, 1}, 2);
  EXPECT_EQ(m.backwardWorking(sh, 0, 0, 3, /*inPlace=*/false), 150);
  // Stage [1, 3) as the second stage: max(2 x 5 + 30, 2 x 5, 50 + 16) = 66.
  EXPECT_EQ(m.backwardWorking(sh, 1, 1, 3, /*inPlace=*/false), 66);
  // In place (Note [In-place weight gradients]): the largest layer working set, 2 x 50;
  // stage [1, 3): max(2 x 5, 16).
  EXPECT_EQ(m.backwardWorking(sh, 0, 0, 3, /*inPlace=*/true), 100);
  EXPECT_EQ(m.backwardWorking(sh, 1, 1, 3, /*inPlace=*/true), 16);
  // 1f1b's B runs on the master: in place. Its B also holds the gradient of the stage's
  // output (2 x 8), beside its working set (Note [Comm buffers in the cost model]).
  using pipefb::index;
  using pipefb::MemoryCategory;
  EXPECT_TRUE(CostModel::gradientsInPlace(sh, 0, StashPolicy::Keep));
  EXPECT_EQ(
      m.stage(sh, 0, 0, 3, StashPolicy::Keep).backwardMemory[index(MemoryCategory::WorkingSet)],
      100 + 16);
  // B on another copy gathers: PipeDream's stage 0 (weight copies), and a split stage of
  // pipefb-sync unless it recomputes on the master (checkpoint kinds); no B of
  // pipefb-async (versions) nor of replicated pipelines (gradient buckets).
  PipelineShape pd = shapeOf(ScheduleKind::PipeDream, 2, 4, {0, 1}, 2);
  EXPECT_FALSE(CostModel::gradientsInPlace(pd, 0, StashPolicy::Keep));
  EXPECT_TRUE(CostModel::gradientsInPlace(pd, 1, StashPolicy::Keep));
  EXPECT_EQ(
      m.stage(pd, 0, 0, 3, StashPolicy::Keep).backwardMemory[index(MemoryCategory::WorkingSet)],
      150 + 16);
  PipelineShape fb = shapeOf(ScheduleKind::PipeFbSync, 2, 4, {0, 1, 2, 3}, 2);
  EXPECT_FALSE(CostModel::gradientsInPlace(fb, 0, StashPolicy::Keep));
  EXPECT_FALSE(CostModel::gradientsInPlace(fb, 0, StashPolicy::Offload));
  EXPECT_TRUE(CostModel::gradientsInPlace(fb, 0, StashPolicy::Checkpoint));
  EXPECT_TRUE(CostModel::gradientsInPlace(fb, 0, StashPolicy::CheckpointOffload));
  PipelineShape fa = shapeOf(ScheduleKind::PipeFbAsync, 2, 4, {0, 1, 2, 3}, 2);
  EXPECT_FALSE(CostModel::gradientsInPlace(fa, 0, StashPolicy::Checkpoint));
  PipelineShape rep = sh;
  rep.replicas = 2;
  EXPECT_FALSE(CostModel::gradientsInPlace(rep, 0, StashPolicy::Keep));
}

TEST(SolverLiteral, ForwardDeviceHoldsNoReceivedWeights) {
  // Note [Forward device memory]: pipefb-sync, one stage of W = 100 with a forward working
  // set of 3 (F alone) and 40 (F or B); RecvWeights copies into place, so the forward
  // device holds W + 2 stashes (Note [Offloads in flight]) + 2 x 3 = 146 and no message
  // (it was 2 W = 200).
  Profile p = timesProfile({1});
  p.layers[0].paramBytes = p.layers[0].gradBytes = 100;
  p.layers[0].savedBytes = 10;
  p.layers[0].workingBytes = 40;
  p.layers[0].forwardWorkingBytes = 3;
  CostModel m(p, freeCluster(2));
  PipelineShape sh = shapeOf(ScheduleKind::PipeFbSync, 1, 4, {0, 1}, 2);
  StageEstimate e = m.stage(sh, 0, 0, 1, StashPolicy::Offload);
  using pipefb::index;
  using pipefb::MemoryCategory;
  EXPECT_EQ(e.forwardMemory[index(MemoryCategory::WorkingSet)], 6);
  EXPECT_EQ(e.forwardMemory[index(MemoryCategory::Stash)], 40);
  EXPECT_EQ(e.forwardMemory[index(MemoryCategory::CommBuffers)], 0);
  EXPECT_EQ(total(e.forwardMemory), 146);
  p.layers[0].forwardWorkingBytes = 60;
  CostModel m2(p, freeCluster(2));
  StageEstimate e2 = m2.stage(sh, 0, 0, 1, StashPolicy::Offload);
  EXPECT_EQ(total(e2.forwardMemory), 100 + 40 + 120);
}

TEST(SolverLiteral, ForwardDeviceHoldsTheStashesBeingCopiedOut) {
  // Note [Offloads in flight]: pipefb-sync, one stage, W = 100, saved 10 and input 4 per
  // sample, microbatch 2, forward working set 3 per sample. The forward device holds the
  // stash F builds plus kOffloadsInFlight (1) whose D2H copy is unfinished:
  // 100 + 2 x 20 + 6 = 146 (it was charged 100 + 20 + 6 = 126, one stash short, as
  // pipefb-sync's stage 0 measured on VGG16). With one microbatch there is no earlier
  // stash (126); checkpoint-offload stashes the input (100 + 2 x 8 + 6 = 122); with the
  // devices in two processes only the input is sent, never copied out (100 + 8 + 6).
  // Beside them wait the inputs of the microbatches whose F has not run (Note [Comm
  // buffers in the cost model]): 3 x 8 from F(0,1) on, or 4 x 8 beside F(0,0) when that is
  // more than the earlier stash; checked with no inputs (`p`) and with them (`q`).
  ASSERT_EQ(kOffloadsInFlight, 1);
  Profile p = timesProfile({1});
  p.layers[0].paramBytes = p.layers[0].gradBytes = 100;
  p.layers[0].savedBytes = 10;
  p.inputBytes = 4;
  p.layers[0].workingBytes = 40;
  p.layers[0].forwardWorkingBytes = 3;
  // F without autograd (checkpoint kinds): input 4 + temporaries 3 per sample, the input
  // being one of the inputs waiting (Note [Forward without autograd]).
  p.layers[0].noGradForwardBytes = 7;
  const Profile q = p;
  p.inputBytes = 0;  // the stashes alone; the checkpoint kinds' stash is set below
  CostModel m(p, freeCluster(2));
  using pipefb::index;
  using pipefb::MemoryCategory;
  PipelineShape sh = shapeOf(ScheduleKind::PipeFbSync, 1, 4, {0, 1}, 2);
  StageEstimate e = m.stage(sh, 0, 0, 1, StashPolicy::Offload);
  EXPECT_EQ(e.forwardMemory[index(MemoryCategory::Stash)], 40);
  EXPECT_EQ(total(e.forwardMemory), 146);
  PipelineShape one = shapeOf(ScheduleKind::PipeFbSync, 1, 1, {0, 1}, 2);
  EXPECT_EQ(total(m.stage(one, 0, 0, 1, StashPolicy::Offload).forwardMemory), 126);
  CostModel inputs(q, freeCluster(2));
  EXPECT_EQ(total(inputs.stage(sh, 0, 0, 1, StashPolicy::Offload).forwardMemory), 146 + 3 * 8);
  EXPECT_EQ(inputs.stage(sh, 0, 0, 1, StashPolicy::Offload)
                .forwardMemory[index(MemoryCategory::CommBuffers)],
            3 * 8);
  EXPECT_EQ(total(inputs.stage(one, 0, 0, 1, StashPolicy::Offload).forwardMemory), 126 + 8);
  EXPECT_EQ(total(inputs.stage(sh, 0, 0, 1, StashPolicy::CheckpointOffload).forwardMemory),
            122 + 3 * 8);
  Cluster two = freeCluster(2);
  two.processPerDevice();
  CostModel apart(q, two);
  // No earlier stash on the device: all 4 inputs beside F(0,0).
  EXPECT_EQ(total(apart.stage(sh, 0, 0, 1, StashPolicy::CheckpointOffload).forwardMemory),
            114 + 4 * 8);
}

TEST(SolverLiteral, BuffersSitBesideEveryCopyOfTheWeights) {
  // BatchNorm's running statistics (LayerCost::bufferBytes, 6) are on every device that
  // holds the layer, with no gradient and no optimizer state: pipefb-sync charges
  // W + buffers to both devices, G and O to the backward device only.
  Profile p = timesProfile({1});
  p.layers[0].paramBytes = p.layers[0].gradBytes = p.layers[0].optimizerBytes = 100;
  p.layers[0].bufferBytes = 6;
  CostModel m(p, freeCluster(2));
  using pipefb::index;
  using pipefb::MemoryCategory;
  StageEstimate e =
      m.stage(shapeOf(ScheduleKind::PipeFbSync, 1, 1, {0, 1}), 0, 0, 1, StashPolicy::Offload);
  EXPECT_EQ(e.forwardMemory[index(MemoryCategory::Weights)], 106);
  EXPECT_EQ(e.backwardMemory[index(MemoryCategory::Weights)], 106);
  EXPECT_EQ(e.backwardMemory[index(MemoryCategory::Grads)], 100);
  EXPECT_EQ(e.backwardMemory[index(MemoryCategory::OptimizerState)], 100);
}

TEST(SolverLiteral, InputsTargetsAndTheOutputGradientAreCommBuffers) {
  // Note [Comm buffers in the cost model]: 1f1b, S = 2, M = 4, microbatch 2; input 4 and
  // target 1 per sample. Stage 0 has 2 microbatches in flight when B peaks, so the inputs
  // of the other 2 still wait (2 x 8); the last stage holds all 4 targets (4 x 2). Each B
  // holds its output's gradient (output 3 per sample: 6) beside its working set. Note
  // [Message rendezvous]: 1f1b's and gpipe's gradients are sent at their receive, so none
  // waits on device 0 (one activation, 6, can wait on device 1).
  Profile p = timesProfile({1, 1});
  p.inputBytes = 4;
  p.targetBytes = 1;
  for (auto& l : p.layers) l.outputBytes = 3;
  CostModel m(p, freeCluster(2));
  using pipefb::index;
  using pipefb::MemoryCategory;
  PipelineShape sh = shapeOf(ScheduleKind::OneFOneB, 2, 4, {0, 1}, 2);
  StageEstimate first = m.stage(sh, 0, 0, 1, StashPolicy::Checkpoint);
  StageEstimate last = m.stage(sh, 1, 1, 2, StashPolicy::Checkpoint);
  EXPECT_EQ(first.backwardMemory[index(MemoryCategory::CommBuffers)], 2 * 8);
  EXPECT_EQ(last.backwardMemory[index(MemoryCategory::CommBuffers)], 4 * 2 + 6);
  // B's working set: the input gradient at its end (stage 1: 6) plus the output's (6); the
  // last stage's B lets go of its recomputed output once it took the loss (Note [Loss in
  // the recomputed graph]), and holds the loss and its seed (Note [Loss scalars beside the
  // backward]).
  EXPECT_EQ(last.backwardMemory[index(MemoryCategory::WorkingSet)], 6 + 6 + 2 * kLossScalarBytes);
  // gpipe runs every F before the first B: no input waits then, and no gradient waits
  // either; its forward phase holds the 4 inputs (Note [Two phases]).
  PipelineShape gp = shapeOf(ScheduleKind::GPipe, 2, 4, {0, 1}, 2);
  EXPECT_EQ(m.stage(gp, 0, 0, 1, StashPolicy::Checkpoint)
                .backwardMemory[index(MemoryCategory::CommBuffers)],
            4 * 8);
}

TEST(SolverLiteral, KeptGraphHoldsTheStageOutput) {
  // A kept stash is the saved bytes plus the graph root, the stage's output (the profile's
  // saved bytes leave it out); offloaded, the saved-tensor hooks catch the saved bytes
  // only. One layer, saved 10 and output 3 per sample, microbatch 2.
  Profile p = timesProfile({1});
  p.layers[0].savedBytes = 10;
  p.layers[0].outputBytes = 3;
  CostModel m(p, freeCluster(1));
  PipelineShape sh = shapeOf(ScheduleKind::GPipe, 1, 1, {0}, 2);
  EXPECT_EQ(m.stage(sh, 0, 0, 1, StashPolicy::Keep).stashBytes, 26);
  EXPECT_EQ(m.stage(sh, 0, 0, 1, StashPolicy::Offload).stashBytes, 20);
}

// The two layers of CheckpointedBackwardHoldsItsStashOnce: layer 0 saves 100, 40 of it its
// input (the stage's stash, input 40), and outputs 5; layer 1 saves 50, 5 of it its input,
// and outputs 3.
Profile checkpointedTwoLayers() {
  Profile p = timesProfile({1, 1});
  p.inputBytes = 40;
  const std::int64_t saved[] = {100, 50}, savedInput[] = {40, 5}, out[] = {5, 3};
  for (int l = 0; l < 2; ++l) {
    p.layers[l].savedBytes = saved[l];
    p.layers[l].savedInputBytes = savedInput[l];
    p.layers[l].outputBytes = out[l];
  }
  return p;
}

TEST(SolverLiteral, CheckpointedBackwardHoldsItsStashOnce) {
  // Note [Backward layer by layer]: 1f1b, S = 2, M = 1, microbatch 1, checkpoint. Layer 0
  // saves 100, 40 of it its input (the stage's stash, input 40), outputs 5 and has 6 bytes
  // of buffers; layer 1 saves 50, 5 of it its input, and outputs 3. Stage 0's B (layer by
  // layer) recomputes on its stash: the graph less the stash, 60, plus the recomputed
  // output and its gradient, 65 at most (F with autograd: 105 - 40 = 65), plus the
  // recomputed output held to B's end (5) and the buffers' copy (6): 76. The last stage
  // (whole): its input gradient 5 + the graph less the stash 45 + the output's gradient 3:
  // 53 (it lets go of its recomputed output once it took the loss, Note [Loss in the
  // recomputed graph]), and the loss and its seed (Note [Loss scalars beside the backward]).
  Profile p = checkpointedTwoLayers();
  p.layers[0].bufferBytes = 6;
  CostModel m(p, freeCluster(2));
  PipelineShape sh = shapeOf(ScheduleKind::OneFOneB, 2, 1, {0, 1});
  EXPECT_EQ(m.stage(sh, 0, 0, 1, StashPolicy::Checkpoint).backwardWorkingBytes, 76);
  EXPECT_EQ(m.stage(sh, 1, 1, 2, StashPolicy::Checkpoint).backwardWorkingBytes,
            53 + 2 * kLossScalarBytes);
  // Not measured (0): the recomputed graph is charged whole beside the stash.
  for (auto& l : p.layers) l.savedInputBytes = 0;
  CostModel whole(p, freeCluster(2));
  EXPECT_EQ(whole.stage(sh, 0, 0, 1, StashPolicy::Checkpoint).backwardWorkingBytes, 76 + 40);
  EXPECT_EQ(whole.stage(sh, 1, 1, 2, StashPolicy::Checkpoint).backwardWorkingBytes,
            53 + 5 + 2 * kLossScalarBytes);
}

TEST(SolverLiteral, RecomputingLastStageTakesTheLossInItsGraph) {
  // Note [Loss in the recomputed graph]: the profile of CheckpointedBackwardHoldsItsStashOnce
  // with the loss measured both ways: 18 above an output that is held (lossWorkingBytes),
  // 20 with the recomputed output (3) until B lets it go (recomputedLossBytes). The last
  // stage's B (1f1b, checkpoint) takes the loss in its graph: the graph less the stash 45
  // beside 20, 65 (more than the rest of B, 53). I (zb-h1) still reads a detached copy:
  // the graph 45 and the recomputed output 3 beside 18, 66. It also keeps the gradients
  // into its weight nodes for W (Note [What waits for W]): 20 beside the rest of I, 56: 76.
  Profile p = checkpointedTwoLayers();
  p.lossWorkingBytes = 18;
  p.recomputedLossBytes = 20;
  p.layers[1].keptGradBytes = 20;
  CostModel m(p, freeCluster(2));
  PipelineShape sh = shapeOf(ScheduleKind::OneFOneB, 2, 1, {0, 1});
  EXPECT_EQ(m.stage(sh, 1, 1, 2, StashPolicy::Checkpoint).backwardWorkingBytes, 65);
  PipelineShape zb = shapeOf(ScheduleKind::ZbH1, 2, 2, {0, 1});
  EXPECT_EQ(m.stage(zb, 1, 1, 2, StashPolicy::Checkpoint).backwardWorkingBytes, 76);
}

TEST(SolverLiteral, LastBackwardDeviceOfThe2SFormHoldsOnlyTheOutputItReads) {
  // pipefb-async, S = 2 on 4 devices, M = 1, keep (offload on the split stages). The last
  // stage's output goes from a forward-only device to a backward-only one, so it is sent
  // at its receive, right before B (Note [Message rendezvous]): the next iteration's output
  // (3), which could wait there after the loss (Note [Outputs at the loss]), no longer
  // does. B's charge is the larger of 3 + 20 (the output B read beside the loss) and the
  // rest of B (its output's gradient 3 and at its end its input's, 3) with nothing
  // waiting, 6; no output in the comm buffers.
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) {
    l.savedBytes = 4;
    l.outputBytes = 3;
    l.workingBytes = 2;
  }
  p.lossWorkingBytes = 20;
  CostModel m(p, freeCluster(4));
  PipelineShape sh = shapeOf(ScheduleKind::PipeFbAsync, 2, 1, {0, 1, 2, 3});
  const StageEstimate last = m.stage(sh, 1, 1, 2, StashPolicy::Keep);
  EXPECT_EQ(last.backwardMemory[index(pipefb::MemoryCategory::CommBuffers)], 0);
  EXPECT_EQ(last.backwardWorkingBytes, 3 + 20);
  EXPECT_EQ(m.waitingBytes(sh, 1, 1, 2, true).outputsAfterLoss, 0);
  // Folded, the last stage's backward device runs forwards too: the outputs wait beside
  // those as well, so they stay in the comm buffers.
  PipelineShape folded = shapeOf(ScheduleKind::PipeFbAsync, 2, 1, {0, 1});
  folded.folded = true;
  EXPECT_EQ(m.waitingBytes(folded, 1, 1, 2, true).outputsAfterLoss, 0);
  // With the loss no larger than the rest of B, the rest of B binds (it was 3 + 3 + 3 with
  // the next iteration's output waiting beside it).
  p.lossWorkingBytes = 1;
  CostModel small(p, freeCluster(4));
  EXPECT_EQ(small.stage(sh, 1, 1, 2, StashPolicy::Keep).backwardWorkingBytes, 3 + 3);
}

// Note [Output at its receive in the cost model]: pipefb-sync, S = 2, M = 4, offload. In
// the 2S form the head's output (5 bytes over a 10 B/s link: 0.5 s) is sent at its
// receive, so its transfer adds to the compute of F(1)'s device and of B(1)'s; folded, it
// is sent when made and hides beside them (the link is a resource of its own). A B(1)
// that recomputes is sent no output (Note [Recomputed last output]).
TEST(SolverLiteral, OutputSentAtItsReceiveAddsItsLinkToBothDevices) {
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) l.outputBytes = 5;
  CostModel fast(p, freeCluster(4));
  CostModel slow(p, Cluster::uniform(4, 1.0, -1, Link{10.0, 0.0}, Link{}));
  const PipelineShape twoS = shapeOf(ScheduleKind::PipeFbSync, 2, 4, {0, 1, 2, 3});
  const StageEstimate a = fast.stage(twoS, 1, 1, 2, StashPolicy::Offload);
  const StageEstimate b = slow.stage(twoS, 1, 1, 2, StashPolicy::Offload);
  EXPECT_DOUBLE_EQ(b.linkOut, 0.5);
  EXPECT_DOUBLE_EQ(b.forwardCompute - a.forwardCompute, 0.5);
  EXPECT_DOUBLE_EQ(b.backwardCompute - a.backwardCompute, 0.5);
  PipelineShape folded = shapeOf(ScheduleKind::PipeFbSync, 2, 4, {0, 1});
  folded.folded = true;
  const StageEstimate fa = fast.stage(folded, 1, 1, 2, StashPolicy::Offload);
  const StageEstimate fb = slow.stage(folded, 1, 1, 2, StashPolicy::Offload);
  EXPECT_DOUBLE_EQ(fb.linkOut, 0.5);
  EXPECT_DOUBLE_EQ(fb.backwardCompute, fa.backwardCompute);
  const StageEstimate ckpt = slow.stage(twoS, 1, 1, 2, StashPolicy::CheckpointOffload);
  EXPECT_DOUBLE_EQ(ckpt.linkOut, 0);
  EXPECT_DOUBLE_EQ(ckpt.backwardCompute,
                   fast.stage(twoS, 1, 1, 2, StashPolicy::CheckpointOffload).backwardCompute);
}

TEST(SolverLiteral, ForwardDevicePeaksLayerByLayer) {
  // Note [Forward peak]: pipefb-sync, M = 1, two layers with saved 50, 10, outputs 5, 5 and
  // forward working sets 40, 2 (microbatch 1). F peaks in layer 0 at 50 + 5 + 40 = 95 or in
  // layer 1 at 60 + 5 + 2 = 67: the forward device holds 95 (one stash of 60 plus 35 of
  // working set), not the stash plus the largest working set (100).
  Profile p = timesProfile({1, 1});
  const std::int64_t saved[] = {50, 10}, fws[] = {40, 2};
  for (int l = 0; l < 2; ++l) {
    p.layers[l].savedBytes = saved[l];
    p.layers[l].outputBytes = 5;
    p.layers[l].forwardWorkingBytes = fws[l];
    // Without autograd (Note [Forward without autograd]): input + output + temporaries.
    p.layers[l].noGradForwardBytes = l == 0 ? 30 : 12;
  }
  p.inputBytes = 4;
  CostModel m(p, freeCluster(2));
  using pipefb::index;
  using pipefb::MemoryCategory;
  PipelineShape sh = shapeOf(ScheduleKind::PipeFbSync, 1, 1, {0, 1});
  StageEstimate e = m.stage(sh, 0, 0, 2, StashPolicy::Offload);
  EXPECT_EQ(e.forwardMemory[index(MemoryCategory::Stash)], 60);
  EXPECT_EQ(e.forwardMemory[index(MemoryCategory::WorkingSet)], 35);
  // Checkpoint: layer 0 peaks at 30 (its input, stage 0's, is the waiting input, 4),
  // layer 1 at 12 beside the stage input: max(30, 12 + 4) - 4 = 26.
  StageEstimate c = m.stage(sh, 0, 0, 2, StashPolicy::Checkpoint);
  EXPECT_EQ(c.forwardMemory[index(MemoryCategory::WorkingSet)], 26);
  EXPECT_EQ(c.forwardMemory[index(MemoryCategory::CommBuffers)], 4);
}

TEST(SolverLiteral, OptimizerOnHostMovesStateToTheHostPool) {
  // Note [Optimizer offload in the cost model]: 1f1b, W = G = 100, O = 200 per layer; with
  // the optimizer on the host the backward device keeps W + G, the host pool gets
  // W + G + O, and the step pays G down and W up over the host link.
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) {
    l.savedBytes = 10;
    l.workingBytes = 7;
    l.paramBytes = l.gradBytes = 100;
    l.optimizerBytes = 200;
  }
  CostModel m(p, freeCluster(2));
  PipelineShape sh = shapeOf(ScheduleKind::OneFOneB, 2, 4, {0, 1}, 2);
  StageEstimate dev = m.stage(sh, 0, 0, 1, StashPolicy::Keep);
  sh.optimizerOnHost = true;
  StageEstimate host = m.stage(sh, 0, 0, 1, StashPolicy::Keep);
  using pipefb::index;
  using pipefb::MemoryCategory;
  EXPECT_EQ(host.backwardMemory[index(MemoryCategory::OptimizerState)], 0);
  EXPECT_EQ(host.backwardMemory[index(MemoryCategory::Weights)], 100);
  EXPECT_EQ(host.backwardMemory[index(MemoryCategory::Grads)], 100);
  EXPECT_EQ(host.peakMemory(), dev.peakMemory() - 200);
  EXPECT_EQ(host.hostBytes, dev.hostBytes + 100 + 100 + 200);
  const auto& link = m.cluster().devices[0].host;
  EXPECT_DOUBLE_EQ(host.stepTime, dev.stepTime + 2 * link.time(100));
  EXPECT_LE(m.memoryLowerBound(sh, 0, 0, 1, 7), host.peakMemory());
}

TEST(SolverLiteral, SnapshotAndBackwardAfterStepTimes) {
  // Note [Weight snapshots] and [Backward after a step]: per-layer F = 1, B = 2, step 3,
  // B after a step 2.5 (excess 0.5, parameter-sized: not scaled by the microbatch of 2),
  // snapshot 0.25. PipeDream S=2: stage 0 (two in flight) snapshots every F and pays step
  // and excess every microbatch; the last stage makes no snapshot. 1F1B pays step and
  // excess once per iteration (M = 4).
  Profile p = timesProfile({1});
  p.layers[0].forward = 1;
  p.layers[0].backward = 2;
  p.layers[0].step = 3;
  p.layers[0].backwardAfterStep = 2.5;
  p.layers[0].snapshot = 0.25;
  p.layers.push_back(p.layers[0]);
  CostModel m(p, freeCluster(2));
  PipelineShape pd = shapeOf(ScheduleKind::PipeDream, 2, 4, {0, 1}, 2);
  StageEstimate s0 = m.stage(pd, 0, 0, 1, StashPolicy::Keep);
  EXPECT_DOUBLE_EQ(s0.snapshotTime, 0.25);
  EXPECT_DOUBLE_EQ(s0.afterStepTime, 0.5);
  EXPECT_DOUBLE_EQ(s0.time, 2 * 1 + 2 * 2 + 0.25 + 3 + 0.5);
  StageEstimate s1 = m.stage(pd, 1, 1, 2, StashPolicy::Keep);
  EXPECT_DOUBLE_EQ(s1.snapshotTime, 0);
  EXPECT_DOUBLE_EQ(s1.time, 2 * 1 + 2 * 2 + 3 + 0.5);
  PipelineShape fb = shapeOf(ScheduleKind::OneFOneB, 2, 4, {0, 1}, 2);
  EXPECT_DOUBLE_EQ(m.stage(fb, 0, 0, 1, StashPolicy::Keep).time, 2 * 1 + 2 * 2 + (3 + 0.5) / 4);
}

TEST(SolverLiteral, ScaledBytesRoundLikeLlround) {
  // Note [Planner speed]: scaledBytes is std::llround(bytes x f), inline. Halves go away
  // from zero; above 2^53 every double is an integer.
  EXPECT_EQ(scaledBytes(1, 0.5), 1);
  EXPECT_EQ(scaledBytes(3, 0.5), 2);
  EXPECT_EQ(scaledBytes(-3, 0.5), -2);
  EXPECT_EQ(scaledBytes(5, 0.1), 1);   // 0.5000000000000001
  EXPECT_EQ(scaledBytes(7, 0.07), 0);  // 0.49000000000000005
  EXPECT_EQ(scaledBytes((std::int64_t(1) << 53) + 2, 1.0), (std::int64_t(1) << 53) + 2);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::int64_t> bytes(-(std::int64_t(1) << 40), std::int64_t(1)
                                                                                  << 40);
  std::uniform_real_distribution<double> f(0, 64);
  for (int i = 0; i < 200000; ++i) {
    const std::int64_t b = i % 4 == 0 ? bytes(rng) : bytes(rng) >> (i % 40);
    // Every fourth f a multiple of 1/2^k, so that products hit exact halves too.
    const double g = i % 4 == 1 ? std::ldexp(double(rng() % 4096), -int(rng() % 12)) : f(rng);
    ASSERT_EQ(scaledBytes(b, g), std::llround(static_cast<double>(b) * g)) << b << " x " << g;
  }
}

TEST(SolverLiteral, FixedTimeIsTheInterceptOfTheTwoSizes) {
  // Note [Microbatch scaling]: vgg16/8's fc6 B measured 2.534 ms at 1 and 9.324 ms at 16:
  // slope 0.4527 ms per sample, fixed 2.081 ms, whichever size is the profile's.
  EXPECT_NEAR(fitFixedTime(9.324, 16, 2.534, 1), 2.0813, 1e-4);
  EXPECT_NEAR(fitFixedTime(2.534, 1, 9.324, 16), 2.0813, 1e-4);
  EXPECT_DOUBLE_EQ(scaledTime(9.324, fitFixedTime(9.324, 16, 2.534, 1), 1.0 / 16), 2.534);
  // Pure linear: no fixed part; noise that implies a negative slope or intercept is clamped.
  EXPECT_DOUBLE_EQ(fitFixedTime(8, 4, 2, 1), 0);
  EXPECT_DOUBLE_EQ(fitFixedTime(8, 4, 1, 1), 0);  // intercept -4/3
  EXPECT_DOUBLE_EQ(fitFixedTime(8, 4, 9, 1), 8);  // slope < 0: none of it scales
}

TEST(SolverLiteral, FixedTimesFavourFewerLargerMicrobatches) {
  // Four layers of F = 1, B = 2 measured at microbatch 4, three quarters of it per pass
  // (forwardFixed 0.75, backwardFixed 1.5); 1f1b on 4 devices, batch 4. At 4 microbatches
  // of 1 a layer costs 0.8125 + 1.625 = 2.4375 per microbatch: 4 stages take
  // (4 + 3) x 2.4375 = 17.06. One microbatch of 4 takes 12 (one stage, or (1 + 3) x 3);
  // 2 of 2: 2.625 per layer, 5 x 2.625 = 13.1 on 4 stages, 3 x 5.25 on 2.
  Profile p = timesProfile({1, 1, 1, 1});
  p.microbatch = 4;
  for (auto& l : p.layers) l.backward = 2;
  CostModel linear(p, freeCluster(4));
  SolveResult r0 = solve(linear, only("1f1b-keep", 4));
  ASSERT_TRUE(r0.feasible);  // all of it scales: (4 + 3) x 0.75 = 5.25
  EXPECT_EQ(r0.best.shape.microbatches, 4);
  EXPECT_DOUBLE_EQ(r0.best.iterationTime, 5.25);
  for (auto& l : p.layers) {
    l.forwardFixed = l.recomputeFixed = 0.75;
    l.backwardFixed = 1.5;
  }
  CostModel fixed(p, freeCluster(4));
  EXPECT_DOUBLE_EQ(fixed.forwardTime(0, 4, 0.25), 4 * 0.8125);
  EXPECT_DOUBLE_EQ(fixed.backwardTime(0, 4, 0.25), 4 * 1.625);
  auto p4 = solveShape(fixed, shapeOf(ScheduleKind::OneFOneB, 4, 4, {0, 1, 2, 3}),
                       {StashPolicy::Keep}, unlimited(4), -1, Objective::Time);
  ASSERT_TRUE(p4);
  EXPECT_DOUBLE_EQ(p4->tau, 2.4375);
  EXPECT_DOUBLE_EQ(p4->iterationTime, 7 * 2.4375);
  SolveResult r = solve(fixed, only("1f1b-keep", 4));
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.best.shape.microbatches, 1);
  EXPECT_DOUBLE_EQ(r.best.iterationTime, 12);
}

TEST(SolverLiteral, SharedCoresBoundThePaceByTheWholeWork) {
  // Note [Shared cores]: 3 devices on 2 cores, layers F = 2, 2, 0.5 (no B, no step).
  Cluster c = freeCluster(3);
  c.cores = 2;
  CostModel m(timesProfile({2, 2, 0.5}), c);
  // 1f1b, 3 stages, 4 microbatches: the stages' paces are 2, 2, 0.5, but the cores need
  // (2 + 2 + 0.5) / 2 = 2.25 per microbatch: (4 + 3 - 1) x 2.25 = 13.5 (the old model,
  // every device at 2/3 speed, said 6 x 3 = 18).
  auto p3 = solveShape(m, shapeOf(ScheduleKind::OneFOneB, 3, 4, {0, 1, 2}), {StashPolicy::Keep},
                       unlimited(3), -1, Objective::Time);
  ASSERT_TRUE(p3);
  EXPECT_DOUBLE_EQ(p3->shape.corePace, 2.25);
  EXPECT_DOUBLE_EQ(p3->tau, 2);
  EXPECT_DOUBLE_EQ(p3->iterationTime, 13.5);
  // Two devices fit the two cores: no bound; [0,1) [1,3) at pace 2.5: 5 x 2.5 = 12.5 wins.
  EXPECT_DOUBLE_EQ(m.corePace(shapeOf(ScheduleKind::OneFOneB, 2, 4, {0, 1})), 0);
  SolveResult r = solve(m, only("1f1b-keep", 4));
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.best.shape.stages, 2);
  EXPECT_DOUBLE_EQ(r.best.iterationTime, 12.5);
  // A stage slower than the cores' bound sets the pace: F = 3, 0.5, 0.5 gives 4 / 2 = 2 < 3.
  CostModel heavy(timesProfile({3, 0.5, 0.5}), c);
  auto h = solveShape(heavy, shapeOf(ScheduleKind::OneFOneB, 3, 4, {0, 1, 2}), {StashPolicy::Keep},
                      unlimited(3), -1, Objective::Time);
  ASSERT_TRUE(h);
  EXPECT_DOUBLE_EQ(h->shape.corePace, 2);
  EXPECT_DOUBLE_EQ(h->iterationTime, 6 * 3);
  // PipeFB's 2 stages are 4 threads; cores = 0 (unknown) never bounds.
  Cluster c4 = freeCluster(4);
  c4.cores = 2;
  EXPECT_DOUBLE_EQ(CostModel(timesProfile({2, 2, 0.5}), c4)
                       .corePace(shapeOf(ScheduleKind::PipeFbSync, 2, 4, {0, 1, 2, 3})),
                   2.25);
  c.cores = 0;
  EXPECT_DOUBLE_EQ(CostModel(timesProfile({2, 2, 0.5}), c)
                       .corePace(shapeOf(ScheduleKind::OneFOneB, 3, 4, {0, 1, 2})),
                   0);
}

TEST(SolverLiteral, OffloadWinsWhenKeepDoesNotFitAndCopiesHide) {
  // One device, gpipe with 4 microbatches: keep holds 4 stashes of 100 bytes = 400 + 10
  // weights; the limit is 250. Offload with lookahead 0 keeps min(4, 0 + 2) = 2 -> 210 and
  // fits (with M = 2 or 1 the stashes are 200 or 400 bytes: over). Copies: 2 x 100 B at 1000 B/s =
  // 0.2 s per microbatch, under the 1 s of compute, so the pace stays 1 s.
  Profile p = timesProfile({1});
  p.layers[0].savedBytes = 100;
  p.layers[0].paramBytes = 10;
  p.layers[0].recompute = 1;
  Cluster c = Cluster::uniform(1, 1.0, 250, Link{}, Link{1000, 0});
  CostModel m(p, c);
  SolverOptions o;
  o.batch = 4;
  o.maxMicrobatches = 4;
  o.schedules = {parseScheduleFamily("gpipe-keep"), parseScheduleFamily("gpipe-offload")};
  o.lookahead = 0;
  o.simulateTop = 0;
  SolveResult r = solve(m, o);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.best.stages[0].policy, StashPolicy::Offload);
  // M = 4 of 1 sample: (4 + 1 - 1) x 1 s.
  EXPECT_EQ(r.best.shape.microbatches, 4);
  EXPECT_DOUBLE_EQ(r.best.iterationTime, 4);
  EXPECT_EQ(r.best.stages[0].estimate.binding, Resource::Compute);
  EXPECT_LE(r.best.peakMemory, 250);
}

TEST(SolverLiteral, SlowCopiesMakeCheckpointBetterThanOffload) {
  // gpipe on one device, batch 4; a layer with F = B = R = 1 s per sample, 100 saved
  // bytes and a 1-byte input; limit 350 B. At M = 4 (microbatch 1): keep needs 4 x 100
  // (over); offload keeps min(4, lookahead + 2) = 3 x 100 = 300 and fits; checkpoint keeps
  // 4 x 1 B + one recomputed graph of 100 B = 104. Smaller M only grows the stashes.
  Profile p = timesProfile({1});
  p.layers[0].backward = 1;
  p.layers[0].recompute = 1;
  p.layers[0].savedBytes = 100;
  p.inputBytes = 1;
  SolverOptions o;
  o.batch = 4;
  o.maxMicrobatches = 4;
  o.schedules = {parseScheduleFamily("gpipe")};
  o.simulateTop = 0;
  {
    // Fast copies (1 MB/s): offload hides under the 2 s of compute: (4 + 0) x 2 = 8 s.
    CostModel m(p, Cluster::uniform(1, 1.0, 350, Link{}, Link{1e6, 0}));
    SolveResult r = solve(m, o);
    ASSERT_TRUE(r.feasible);
    EXPECT_EQ(r.best.stages[0].policy, StashPolicy::Offload);
    EXPECT_DOUBLE_EQ(r.best.iterationTime, 4 * 2);
  }
  {
    // Slow copies (10 B/s): offload's 2 x 100 B take 20 s per microbatch; recomputing
    // costs 1 s: checkpoint, (4 + 0) x 3 = 12 s (M = 2 ties at 2 x 6 s).
    CostModel m(p, Cluster::uniform(1, 1.0, 350, Link{}, Link{10, 0}));
    SolveResult r = solve(m, o);
    ASSERT_TRUE(r.feasible);
    EXPECT_EQ(r.best.stages[0].policy, StashPolicy::Checkpoint);
    EXPECT_DOUBLE_EQ(r.best.iterationTime, 12);
    EXPECT_EQ(r.best.stages[0].estimate.binding, Resource::Compute);
  }
}

TEST(SolverLiteral, InfeasibleReportsTheSmallestBudget) {
  // Two layers of 100 B weights, 2 devices: any plan needs >= 100 B on some device;
  // the smallest budget is 100 (one layer per device).
  Profile p = timesProfile({1, 1});
  p.layers[0].paramBytes = p.layers[1].paramBytes = 100;
  CostModel m(p, freeCluster(2));
  SolverOptions o = only("1f1b-keep");
  o.budget = 99;
  SolveResult r = solve(m, o);
  EXPECT_FALSE(r.feasible);
  EXPECT_EQ(r.minimalBudget, 100);
  ASSERT_TRUE(r.minimalPlan);
  EXPECT_EQ(r.minimalPlan->shape.stages, 2);
  o.budget = 100;
  EXPECT_TRUE(solve(m, o).feasible);
}

TEST(SolverLiteral, HostPoolBudgetIsASumOverStages) {
  // Two stages on two devices that each fit only with offload (host bytes 1 x 100 each
  // with 1f1b at M=1); host pool 150 fits only one offloaded stage, the other must
  // checkpoint (its input is 1 byte).
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) {
    l.savedBytes = 100;
    l.outputBytes = 1;
    l.recompute = 0.5;
  }
  p.inputBytes = 1;
  Cluster c = Cluster::uniform(2, 1.0, -1, Link{}, Link{1e6, 0});
  c.hostPool = 150;
  CostModel m(p, c);
  SolverOptions o;
  o.batch = 1;
  o.maxMicrobatches = 1;
  o.maxStages = 2;
  o.schedules = {parseScheduleFamily("pipefb-sync")};
  o.simulateTop = 0;
  // PipeFB needs 4 devices for 2 stages: add two more.
  Cluster c4 = Cluster::uniform(4, 1.0, -1, Link{}, Link{1e6, 0});
  c4.hostPool = 150;
  CostModel m4(p, c4);
  SolveResult r = solve(m4, o);
  ASSERT_TRUE(r.feasible);
  EXPECT_LE(r.best.hostBytes, 150);
  BruteForceResult b = bruteForce(m4, o);
  ASSERT_TRUE(b.feasible);
  EXPECT_DOUBLE_EQ(r.best.iterationTime, b.objective);
}

TEST(SolverContract, ClosedFormsMatchTheGenerators) {
  using namespace pipefb::schedules;
  for (ScheduleKind k : allScheduleKinds())
    for (int S : {1, 2, 3, 4, 7})
      for (int M : {1, 2, 3, 8}) {
        if (!takesShape(toString(k), S, M)) continue;  // zbv, interleaved-1f1b: even S
        const int K = S + 2;                           // steady state
        // Note [Planned async lag]: pipefb-async at each lag, the others at none.
        std::vector<int> lags{-1};
        if (k == ScheduleKind::PipeFbAsync)
          for (int lag = 0; lag <= M; ++lag) lags.push_back(lag);
        for (int lag : lags) {
          auto plan =
              makeSchedule(toString(k), S, M, Placement::defaultFor(toString(k), S), K, lag);
          for (int s = 0; s < S; ++s) {
            EXPECT_EQ(inFlightStashes(k, S, s, M, lag), plan.contract.inFlight[s])
                << toString(k) << " S=" << S << " M=" << M << " s=" << s << " lag " << lag;
            EXPECT_EQ(weightVersions(k, S, s, M, lag), plan.contract.weightVersions[s])
                << toString(k) << " S=" << S << " M=" << M << " s=" << s << " lag " << lag;
          }
        }
      }
}

// Note [Planned async lag]: pipefb-async is planned at the lag it runs at, its in-flight
// stashes and weight versions those of the schedule lowered at that lag (M + L and 2, or M
// and 1 at L = 0), not a whole iteration's (2M) whatever the lag.
TEST(SolverContract, AsyncLagPlansTheLoweredSchedulesStashesAndVersions) {
  using namespace pipefb::schedules;
  Profile p = timesProfile({1, 1, 1, 1});
  for (auto& l : p.layers) l.savedBytes = l.paramBytes = l.gradBytes = 1000;
  CostModel m(p, freeCluster(8));
  const int S = 2, M = 4;
  std::map<int, std::pair<int, int>> planned;  // lag -> (in flight, versions) of stage 0
  for (int lag : {-1, 0, 1, 2, 4}) {
    PipelineShape sh = shapeOf(ScheduleKind::PipeFbAsync, S, M, {0, 1, 2, 3});
    sh.asyncLag = lag;
    const SchedulePlan lowered =
        lower(makeSchedule(ScheduleKind::PipeFbAsync, S, M,
                           Placement::defaultFor("pipefb-async", S), 3, lag),
              {StashPolicy::Keep, StashPolicy::Keep}, 1, true);
    for (int k = 0; k < S; ++k) {
      const StageEstimate e = m.stage(sh, k, 2 * k, 2 * k + 2, StashPolicy::Keep);
      EXPECT_EQ(e.inFlight, lowered.contract.inFlight[k]) << "lag " << lag << " stage " << k;
      EXPECT_EQ(e.versions, lowered.contract.weightVersions[k]) << "lag " << lag << " stage " << k;
      EXPECT_EQ(inFlightStashes(sh.kind, S, k, M, lag), lowered.contract.inFlight[k]);
      EXPECT_EQ(weightVersions(sh.kind, S, k, M, lag), lowered.contract.weightVersions[k]);
    }
    planned[lag] = {m.stage(sh, 0, 0, 2, StashPolicy::Keep).inFlight,
                    m.stage(sh, 0, 0, 2, StashPolicy::Keep).versions};
  }
  EXPECT_EQ(planned[-1], std::make_pair(2 * M, 2));  // -1 is M: a whole iteration
  EXPECT_EQ(planned[4], planned[-1]);
  EXPECT_EQ(planned[1], std::make_pair(M + 1, 2));  // pipeline.async_lag's default
  EXPECT_EQ(planned[2], std::make_pair(M + 2, 2));
  EXPECT_EQ(planned[0], std::make_pair(M, 1));
  // The host pool holds a split stage's in-flight stashes: M + 1 of them at lag 1, not 2M.
  PipelineShape one = shapeOf(ScheduleKind::PipeFbAsync, S, M, {0, 1, 2, 3}), whole = one;
  one.asyncLag = 1;
  const StageEstimate a = m.stage(one, 0, 0, 2, StashPolicy::Offload),
                      b = m.stage(whole, 0, 0, 2, StashPolicy::Offload);
  EXPECT_EQ(a.hostBytes, (M + 1) * a.stashBytes);
  EXPECT_EQ(b.hostBytes, 2 * M * b.stashBytes);
}

// Note [Simulated fill]: measured on the generated schedule in the profile's proportions,
// interleaved-1f1b's fill is Megatron's (D - 1) / v paces (v = 2), zbv's less, and 1f1b's
// stays the closed form's.
TEST(SolverFill, SimulatedFillOfTheSharedKinds) {
  Profile p = timesProfile(std::vector<double>(8, 1.0));
  for (auto& l : p.layers) l.backward = 2.0;
  CostModel m(p, freeCluster(4));
  const PipelineShape interleaved = shapeOf(ScheduleKind::Interleaved1F1B, 8, 8, {0, 1, 2, 3});
  const PipelineShape zbv = shapeOf(ScheduleKind::Zbv, 8, 8, {0, 1, 2, 3});
  EXPECT_NEAR(m.fill(interleaved), 0.5, 1e-9);
  EXPECT_LT(m.fill(zbv), 0.5);
  EXPECT_EQ(m.fill(shapeOf(ScheduleKind::OneFOneB, 4, 8, {0, 1, 2, 3})), 1.0);
  // The iteration of a balanced partition is the simulated makespan: 8 + 3 x 0.5 paces of
  // 2 stages x 3 units (experiments/README.md, zero_bubble: 28.5 ms at half the costs).
  EXPECT_NEAR((8 + 3 * m.fill(interleaved)) * 6.0, 57.0, 1e-9);
}

// Note [Planned async lag]: below a whole iteration's lag pipefb-async's forwards wait for
// the previous iteration's weights, so its 2S chain fills and drains: unit costs per stage
// (F = 1, B = 2), S = 4, M = 4, pipefb_sim --schedule pipefb-async --iterations 3 takes
// 9 units an iteration at lag -1 (M x the pace of 2, and a little), 16 at lag 1 and 18 at
// lag 0; the cost model said M x 2 = 8 at every lag.
TEST(SolverFill, PipefbAsyncBelowAWholeIterationFillsAndDrains) {
  Profile p = timesProfile(std::vector<double>(4, 1.0));
  for (auto& l : p.layers) l.backward = 2.0;
  CostModel m(p, freeCluster(8));
  std::map<int, double> predicted;
  for (int lag : {-1, 0, 1, 2, 4}) {
    PipelineShape sh = shapeOf(ScheduleKind::PipeFbAsync, 4, 4, {0, 1, 2, 3, 4, 5, 6, 7});
    sh.asyncLag = lag;
    sh.fill = m.fill(sh);
    predicted[lag] = sh.iterationTime(2.0);
  }
  EXPECT_DOUBLE_EQ(predicted[-1], 8);
  EXPECT_DOUBLE_EQ(predicted[4], 8);
  EXPECT_NEAR(predicted[1], 16, 1e-9);
  EXPECT_NEAR(predicted[0], 18, 1e-9);
  EXPECT_GT(predicted[2], predicted[4]);
  EXPECT_LT(predicted[2], predicted[1]);
}

// Note [Simulated fill]: pipefb-zb hands every stash over through the host pool and syncs
// the weights back to the forward devices; its fill counts both. Unit costs per stage
// (F = 1, B = 2, a stash copy 1, a weight sync 1): pipefb_sim --schedule pipefb-zb
// --stages 4 --microbatches 8 takes 23 units communication-free and 26 with a cost file of
// stash_bytes = weight_version_bytes = 1 MiB, link and host_link 1 MiB/s (the rest 0):
// fill = (26 / 2 - 8) / 7, against (23 / 2 - 8) / 7 = 0.5 on free links.
TEST(SolverFill, PipefbZbFillCountsTheHandOffAndTheWeightSync) {
  Profile p = timesProfile(std::vector<double>(4, 1.0));
  for (auto& l : p.layers) {
    l.backward = 2.0;
    l.savedBytes = l.paramBytes = l.gradBytes = 1 << 20;
  }
  const PipelineShape zb = shapeOf(ScheduleKind::PipeFbZb, 4, 8, {0, 1, 2, 3, 4, 5, 6, 7});
  const Link mib{double(1 << 20), 0.0};
  EXPECT_NEAR(CostModel(p, Cluster::uniform(8, 1.0, -1, mib, mib)).fill(zb), 5.0 / 7, 1e-9);
  EXPECT_NEAR(CostModel(p, freeCluster(8)).fill(zb), 0.5, 1e-9);
}

// Note [Stashes held together]: a zbv device holds at most 2D stashes of its two stages
// together (its hold), fewer than the sum of the two stages' own maxima, and the cost model
// charges the device that sum's bytes, not the maxima's.
TEST(SolverShared, ZbvDeviceHoldsItsStashesTogether) {
  using namespace pipefb::schedules;
  const int S = 8, M = 8, D = 4;
  const SchedulePlan plan = makeSchedule("zbv", S, M);
  const auto held = stashesHeldTogether(plan.schedule);
  int together = 0;
  for (const auto& v : held[0]) together = std::max(together, v.alive[0] + v.alive[S - 1]);
  EXPECT_EQ(together, 2 * D);
  EXPECT_GT(plan.contract.inFlight[0] + plan.contract.inFlight[S - 1], together);
  Profile p = timesProfile(std::vector<double>(8, 1.0));
  for (auto& l : p.layers) l.savedBytes = 100;
  CostModel m(p, freeCluster(4));
  PipelineShape sh = shapeOf(ScheduleKind::Zbv, S, M, {0, 1, 2, 3});
  const StageEstimate ka = m.stage(sh, 0, 0, 1, StashPolicy::Keep);
  const StageEstimate kb = m.stage(sh, S - 1, 7, 8, StashPolicy::Keep);
  const std::int64_t states = [&] {
    std::int64_t s = 0;
    for (const StageEstimate* e : {&ka, &kb}) {
      const auto& mm = e->backwardMemory;
      s += total(mm) - mm[index(pipefb::MemoryCategory::Stash)] -
           mm[index(pipefb::MemoryCategory::WorkingSet)];
    }
    return s;
  }();
  const std::int64_t ws = std::max(ka.backwardMemory[index(pipefb::MemoryCategory::WorkingSet)],
                                   kb.backwardMemory[index(pipefb::MemoryCategory::WorkingSet)]);
  // Keep: every stash on the device, 2D of them at most, of equal bytes here.
  EXPECT_EQ(sharedDeviceMemory(sh, 0, {{0, &ka}, {S - 1, &kb}}),
            states + 2 * D * ka.stashBytes + ws);
}

TEST(SolverFamilies, ParseAndErrors) {
  EXPECT_EQ(parseScheduleFamily("1f1b").policies.size(), 4u);
  auto f = parseScheduleFamily("pipefb-sync-checkpoint-offload");
  EXPECT_EQ(f.kind, ScheduleKind::PipeFbSync);
  ASSERT_EQ(f.policies.size(), 1u);
  EXPECT_EQ(f.policies[0], StashPolicy::CheckpointOffload);
  EXPECT_THROW(parseScheduleFamily("1f1b-kep"), pipefb::UserError);
  try {
    parseScheduleFamily("pipdream");
  } catch (const pipefb::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("pipedream"), std::string::npos);
  }
}

TEST(SolverChains, InterchangeableDevicesGiveOneChain) {
  Cluster c = freeCluster(8);
  bool heur = true;
  EXPECT_EQ(distinctChains(c, 8, 100, &heur).size(), 1u);
  EXPECT_FALSE(heur);
  c.devices[3].speed = 2;  // one distinct device: it can sit at any of 4 positions
  EXPECT_EQ(distinctChains(c, 4, 100, &heur).size(), 4u + 1u);
  // Too many distinct chains: greedy ones instead.
  Cluster d = freeCluster(6);
  for (int i = 0; i < 6; ++i) d.devices[i].speed = 1 + i;
  auto g = distinctChains(d, 6, 10, &heur);
  EXPECT_TRUE(heur);
  EXPECT_FALSE(g.empty());
}

// Note [Devices and processes] (Cluster.h): a stage whose forward and backward devices are
// in different processes can only stash its input.
TEST(SolverProcesses, SplitAcrossProcessesOnlyCheckpoints) {
  // One layer, F = B = R = 1 s, 100 saved bytes, free copies; pipefb-sync with one stage
  // (F on one device, B on the other). In one process the graph goes through the host
  // pool (offload): pace max(F, B) = 1 s. With a process per device only the stage input
  // can cross: checkpoint-offload recomputes in B, pace max(F, R + B) = 2 s.
  Profile p = timesProfile({1});
  p.layers[0].backward = 1;
  p.layers[0].recompute = 1;
  p.layers[0].savedBytes = 100;
  p.inputBytes = 1;
  SolverOptions o = only("pipefb-sync");
  Cluster one = freeCluster(2);
  {
    CostModel m(p, one);
    SolveResult r = solve(m, o);
    ASSERT_TRUE(r.feasible);
    EXPECT_EQ(r.best.stages[0].policy, StashPolicy::Offload);
    EXPECT_DOUBLE_EQ(r.best.tau, 1);
  }
  Cluster two = freeCluster(2);
  two.processPerDevice();
  EXPECT_FALSE(two.sameProcess(0, 1));
  {
    CostModel m(p, two);
    SolveResult r = solve(m, o);
    ASSERT_TRUE(r.feasible);
    EXPECT_EQ(r.best.stages[0].policy, StashPolicy::CheckpointOffload);
    EXPECT_DOUBLE_EQ(r.best.tau, 2);
    // Offload alone has no plan at all, and the brute force agrees.
    SolverOptions off = only("pipefb-sync-offload");
    EXPECT_FALSE(solve(m, off).feasible);
    EXPECT_FALSE(bruteForce(m, off).feasible);
    EXPECT_DOUBLE_EQ(bruteForce(m, o).objective, r.best.iterationTime);
  }
  // Non-split schedules run F and B on one device: nothing changes for them.
  {
    CostModel m(p, two);
    SolveResult r = solve(m, only("1f1b-keep"));
    ASSERT_TRUE(r.feasible);
    EXPECT_EQ(r.best.stages[0].policy, StashPolicy::Keep);
  }
}

TEST(SolverProcesses, ChainsPairEachStageWithinAProcess) {
  // Four identical devices in two processes {0, 1} and {2, 3}; pipefb-sync with 2 stages
  // of one layer. The identity chain would split both stages across processes (stage 0 on
  // 0 -> 3, stage 1 on 1 -> 2), so the solver must tell the devices apart by process and
  // choose a chain that keeps each stage's F and B in one process: offload, pace 1 s.
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) l.backward = 1, l.recompute = 1, l.savedBytes = 100;
  p.inputBytes = 1;
  Cluster c = freeCluster(4);
  c.devices[0].process = c.devices[1].process = 0;
  c.devices[2].process = c.devices[3].process = 1;
  CostModel m(p, c);
  SolverOptions o = only("pipefb-sync", 4);
  o.maxStages = 2;
  o.microbatches = 4;
  SolveResult r = solve(m, o);
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.best.stages.size(), 2u);
  for (const auto& st : r.best.stages) {
    EXPECT_TRUE(c.sameProcess(st.forwardDevice, st.backwardDevice))
        << st.forwardDevice << " -> " << st.backwardDevice;
    EXPECT_EQ(st.policy, StashPolicy::Offload);
  }
  EXPECT_DOUBLE_EQ(r.best.tau, 1);
  EXPECT_DOUBLE_EQ(bruteForce(m, o).objective, r.best.iterationTime);
  // With a process per device, no chain avoids it: checkpoint-offload everywhere, 2 s.
  c.processPerDevice();
  CostModel m2(p, c);
  SolveResult r2 = solve(m2, o);
  ASSERT_TRUE(r2.feasible);
  for (const auto& st : r2.best.stages) EXPECT_EQ(st.policy, StashPolicy::CheckpointOffload);
  EXPECT_DOUBLE_EQ(r2.best.tau, 2);
}

// Note [Devices and processes]: replicated pipelines run one process per device, so a
// replicated pipefb stage only stashes its input, even on a cluster spec of one process.
TEST(SolverReplicas, ReplicatedSplitStagesOnlyCheckpoint) {
  // One pipefb stage of two layers, F on device 0 and B on device 1, on a cluster spec of
  // one process. Offload (pace max(F, B) = 2 s) beats checkpoint-offload (B + recompute,
  // 4 s) for one pipeline; two replicas may only checkpoint.
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) l.backward = 1, l.recompute = 1, l.savedBytes = 100;
  p.inputBytes = 1;
  CostModel m(p, freeCluster(4));
  const std::vector<StashPolicy> both{StashPolicy::Offload, StashPolicy::CheckpointOffload};
  PipelineShape sh = shapeOf(ScheduleKind::PipeFbSync, 1, 2, {0, 1});
  auto one = solveShape(m, sh, both, unlimited(4), -1, Objective::Time);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->stages.at(0).policy, StashPolicy::Offload);
  EXPECT_DOUBLE_EQ(one->tau, 2);
  sh.replicas = 2;
  auto two = solveShape(m, sh, both, unlimited(4), -1, Objective::Time);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->stages.at(0).policy, StashPolicy::CheckpointOffload);
  EXPECT_DOUBLE_EQ(two->tau, 4);
  EXPECT_FALSE(solveShape(m, sh, {StashPolicy::Offload}, unlimited(4), -1, Objective::Time));
}

// Note [Replicated pipelines]: the solver chooses how many copies of the pipeline to run.
TEST(SolverReplicas, ReplicationAgainstPipeliningOnLiteralNumbers) {
  // Two layers, F = B = 1 s per sample, 100 gradient bytes each; batch 8 on 4 identical
  // devices; 1f1b. Without replicas the best is 2 stages x 8 microbatches of 1 sample:
  // pace 2 s, (8 + 1) x 2 = 18 s. Free links: 4 replicas of 1 stage (2 samples each; one
  // microbatch of 2, pace 8 s, or 2 of 1 at 4 s: 2 x 4 = 8 s) -> 8 s.
  Profile p = timesProfile({1, 1});
  for (auto& l : p.layers) l.backward = 1, l.paramBytes = l.gradBytes = 100;
  SolverOptions o = only("1f1b-keep", 8);
  {
    CostModel m(p, freeCluster(4));
    SolveResult one = solve(m, o);
    ASSERT_TRUE(one.feasible);
    EXPECT_EQ(one.best.shape.replicas, 1);
    EXPECT_DOUBLE_EQ(one.best.iterationTime, 18);
    o.maxReplicas = 4;
    SolveResult r = solve(m, o);
    ASSERT_TRUE(r.feasible);
    EXPECT_EQ(r.best.shape.replicas, 4);
    EXPECT_EQ(r.best.shape.stages, 1);
    EXPECT_DOUBLE_EQ(r.best.iterationTime, 8);
    EXPECT_DOUBLE_EQ(r.best.throughput, 1);  // 8 samples in 8 s
    EXPECT_DOUBLE_EQ(bruteForce(m, o).objective, 8);
  }
  // 50 B/s links, no latency: a ring all-reduce of G bytes over R takes 2(R-1)/R x G / 50
  // per iteration. 4 x 1 stage: G = 200 B, 6 s: pace (8 + 6) / M, M x pace = 14 s.
  // 2 x 2 stages (4 samples each, M = 4): G = 100 B, 2 s -> pace 2 + 2/4, (4 + 1) x 2.5 =
  // 12.5 s. The planner takes 2 replicas of 2 stages.
  {
    Cluster c = Cluster::uniform(4, 1.0, -1, Link{50, 0}, Link{});
    CostModel m(p, c);
    SolveResult r = solve(m, o);
    ASSERT_TRUE(r.feasible);
    EXPECT_EQ(r.best.shape.replicas, 2);
    EXPECT_EQ(r.best.shape.stages, 2);
    EXPECT_DOUBLE_EQ(r.best.iterationTime, 12.5);
    EXPECT_DOUBLE_EQ(r.best.stages[0].estimate.allReduceTime, 2);
    EXPECT_DOUBLE_EQ(bruteForce(m, o).objective, 12.5);
  }
  // Devices that differ: no replicas (the replicas would not see the same costs).
  {
    Cluster c = freeCluster(4);
    c.devices[3].speed = 2;
    EXPECT_EQ(replicaCounts(c, o), std::vector<int>{1});
  }
}

TEST(SolverLiteral, ZeroBubbleFillAndStashes) {
  // Note [Zero-bubble fill]: 4 layers, F = 1 and B = 2 each; 4 devices, M = 8. 1f1b's
  // iteration is (8 + 3) x 3 = 33; zb-h1's (8 + 3 x F/(F+B)) x 3 = 27 (the simulator's
  // uniform-cost makespan, ZeroBubbleSim); zb-h2's 8 x 3 = 24 (steady state). zb-h1 holds
  // S = 4 stashes on every device (1f1b: S - s), zb-h2 2S - 1 = 7.
  Profile p = timesProfile({1, 1, 1, 1});
  for (auto& l : p.layers) l.backward = 2, l.savedBytes = 10;
  CostModel m(p, freeCluster(4));
  auto best = [&](const std::string& family) {
    SolverOptions o = only(family, 8);
    o.microbatches = 8;
    o.maxStages = 4;
    o.maxReplicas = 1;
    return solve(m, o).best;
  };
  const Plan f = best("1f1b-keep"), h1 = best("zb-h1-keep"), h2 = best("zb-h2-keep");
  EXPECT_NEAR(f.iterationTime, 33, 1e-9);
  EXPECT_NEAR(h1.iterationTime, 27, 1e-9);
  EXPECT_NEAR(h2.iterationTime, 24, 1e-9);
  ASSERT_EQ(h1.stages.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(f.stages[k].estimate.inFlight, 4 - k);
    EXPECT_EQ(h1.stages[k].estimate.inFlight, 4);
    EXPECT_EQ(h2.stages[k].estimate.inFlight, 7);
  }
}

// Note [Folded pace]: device 0 runs F0 and B1, device 1 runs F1 and B0, so the best cut
// balances F(stage 0) + B(stage 1) against F(stage 1) + B(stage 0), which 1F1B's per-stage
// F + B cannot: forwards {1, 1, 3, 3}, backwards 1 each. Folded [0,3) [3,4): 5 + 1 = 6 on
// device 0, 3 + 3 = 6 on device 1. 1F1B's best on two devices is 8 ([0,2) [2,4): 4, 8 or
// [0,3) [3,4): 8, 4), and PipeFB's 2S form fits only one stage on them (F 8, B 4).
TEST(SolverLiteral, FoldedPipeFbPairsOneStagesForwardWithAnothersBackward) {
  Profile prof = timesProfile({1, 1, 3, 3});
  for (auto& l : prof.layers) l.backward = 1;
  CostModel m(prof, freeCluster(2));
  PipelineShape folded = shapeOf(ScheduleKind::PipeFbSync, 2, 1, {0, 1});
  folded.folded = true;
  auto p = solveShape(m, folded, {StashPolicy::Offload}, unlimited(2), -1, Objective::Time);
  ASSERT_TRUE(p);
  EXPECT_EQ(cuts(*p), (std::vector<std::vector<int>>{{0, 3}, {3, 4}}));
  EXPECT_DOUBLE_EQ(p->tau, 6);
  EXPECT_EQ(p->stages[0].backwardDevice, 1);
  EXPECT_EQ(p->stages[1].backwardDevice, 0);
  auto one = solveShape(m, shapeOf(ScheduleKind::OneFOneB, 2, 1, {0, 1}), {StashPolicy::Keep},
                        unlimited(2), -1, Objective::Time);
  ASSERT_TRUE(one);
  EXPECT_DOUBLE_EQ(one->tau, 8);
  // The whole search finds the folded plan and prefers it: (1 + 2 - 1) x 6 = 12 against the
  // 2S form's (1 + 2 - 1) x 8 = 16 and 1F1B's 16.
  SolveResult r = solve(m, only("pipefb-sync"));
  ASSERT_TRUE(r.feasible);
  EXPECT_TRUE(r.best.shape.folded);
  EXPECT_DOUBLE_EQ(r.best.iterationTime, 12);
  SolverOptions twoS = only("pipefb-sync");
  twoS.foldedPlacements = false;
  SolveResult r2 = solve(m, twoS);
  ASSERT_TRUE(r2.feasible);
  EXPECT_FALSE(r2.best.shape.folded);
  EXPECT_DOUBLE_EQ(r2.best.iterationTime, 16);
}

// Note [Folded pace]: a folded device holds both parts' states and stashes, and the larger
// of what F and B hold while they run. Device 0 runs F0 and B1 (offload, M = 4, lookahead
// 1): F0's stashes: the one F builds + kOffloadsInFlight = 1 being copied out, 2 x 100;
// B1's resident ones: lookahead + 1 = 2, 2 x 100. While F runs: 200 + its working set 10;
// while B runs: the one copy still going out, 100, + B's working set 1000. So 200 + 1100.
// (Both working sets less the smaller, as before, charged 1400: F's stash in the making
// beside B's working set.)
TEST(SolverLiteral, FoldedDeviceHoldsTheLargerOfWhatFAndBHoldWhileTheyRun) {
  Profile prof = timesProfile({1, 1});
  for (auto& l : prof.layers) {
    l.backward = 1;
    l.savedBytes = 100;
    l.workingBytes = 1000;
    l.forwardWorkingBytes = 10;
  }
  CostModel m(prof, freeCluster(2));
  PipelineShape folded = shapeOf(ScheduleKind::PipeFbSync, 2, 4, {0, 1});
  folded.folded = true;
  auto p = solveShape(m, folded, {StashPolicy::Offload}, unlimited(2), -1, Objective::Time);
  ASSERT_TRUE(p);
  ASSERT_EQ(kOffloadsInFlight, 1);
  EXPECT_EQ(p->stages[0].estimate.forwardMemory[index(pipefb::MemoryCategory::Stash)], 200);
  EXPECT_EQ(p->stages[1].estimate.backwardMemory[index(pipefb::MemoryCategory::Stash)], 200);
  EXPECT_EQ(p->deviceMemory, (std::vector<std::int64_t>{1300, 1300}));
  // A forward working set larger than B's binds while F runs: 200 + 2000 + 200.
  for (auto& l : prof.layers) l.forwardWorkingBytes = 2000;
  CostModel m2(prof, freeCluster(2));
  auto q = solveShape(m2, folded, {StashPolicy::Offload}, unlimited(2), -1, Objective::Time);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->deviceMemory, (std::vector<std::int64_t>{2400, 2400}));
}

// Note [Messages held together] (schedules/Messages.h): pipefb-sync folded, S = 3, M = 4,
// every layer's output 100 bytes. Device 2 runs F2 and B0: 3 activations can wait for F2
// and 3 gradients for B0, but never more than 3 together. With F's working set binding
// (2000 against B's 10) the device is charged 300 bytes of messages; the two counts
// summed charged 600.
TEST(SolverLiteral, FoldedDeviceIsChargedTheMessagesThatWaitTogether) {
  Profile prof = timesProfile({1, 1, 1});
  for (auto& l : prof.layers) {
    l.backward = 1;
    l.outputBytes = 100;
    l.savedBytes = 100;
    l.workingBytes = 10;
    l.forwardWorkingBytes = 2000;
  }
  CostModel m(prof, freeCluster(3));
  PipelineShape folded = shapeOf(ScheduleKind::PipeFbSync, 3, 4, {0, 1, 2});
  folded.folded = true;
  auto p = solveShape(m, folded, {StashPolicy::Offload}, unlimited(3), -1, Objective::Time);
  ASSERT_TRUE(p);
  const StageEstimate& f2 = p->stages[2].estimate;
  const StageEstimate& b0 = p->stages[0].estimate;
  EXPECT_EQ(f2.messages.forward, 300);
  EXPECT_EQ(b0.messages.backward, 300);
  EXPECT_EQ(p->deviceMemory[2], foldedDeviceMemory(f2, b0));
  StageEstimate f2Apart = f2, b0Apart = b0;  // as the two counts summed
  f2Apart.messages.together = b0Apart.messages.together = nullptr;
  EXPECT_EQ(foldedDeviceMemory(f2Apart, b0Apart) - foldedDeviceMemory(f2, b0), 300);
}

// Note [Optimizer placement search]: two stages of 1 s each (F 1, B 0, step 0); stage 1's
// layer has 100 bytes of weights and 200 of optimizer state, and the host link moves 100
// bytes/s. Under a 300-byte budget only the host fits stage 1 (W + G + O = 400 on the
// device, 200 with O on the host; its step then waits 1 s for G down and 1 s for W up;
// B adds its gradient into .grad in place, Note [Gathered weight gradients]); stage 0 (60
// bytes of weights, no optimizer state: 120) stays on its device, where its step is free.
// One stage does not fit either way (320 with O on the host).
TEST(SolverLiteral, OptimizerOnTheHostForTheStageThatNeedsIt) {
  Profile prof = timesProfile({1, 1});
  prof.layers[1].paramBytes = prof.layers[1].gradBytes = 100;
  prof.layers[1].optimizerBytes = 200;
  prof.layers[0].paramBytes = prof.layers[0].gradBytes = 60;
  Cluster c = Cluster::uniform(2, 1.0, -1, Link{}, Link{100, 0});
  CostModel m(prof, c);
  SolverOptions o = only("1f1b-keep");
  o.budget = 300;
  o.maxStages = 2;
  EXPECT_FALSE(solve(m, o).feasible);
  o.optimizerOffload = OptimizerOffload::PerStage;
  SolveResult r = solve(m, o);
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.best.stages.size(), 2u);
  EXPECT_FALSE(r.best.stages[0].optimizerOnHost);
  EXPECT_TRUE(r.best.stages[1].optimizerOnHost);
  EXPECT_EQ(r.best.deviceMemory, (std::vector<std::int64_t>{120, 200}));
  EXPECT_EQ(r.best.hostBytes, 400);
  EXPECT_DOUBLE_EQ(r.best.stages[1].estimate.stepTime, 2);
  EXPECT_DOUBLE_EQ(r.best.stages[0].estimate.stepTime, 0);
}

// Odd S: the middle stage runs F and B on its own device (not split) and may keep its graph.
TEST(SolverLiteral, FoldedMiddleStageIsNotSplit) {
  Profile prof = timesProfile({1, 1, 1});
  for (auto& l : prof.layers) {
    l.backward = 2;
    l.savedBytes = 10;
  }
  CostModel m(prof, freeCluster(3));
  PipelineShape folded = shapeOf(ScheduleKind::PipeFbSync, 3, 2, {0, 1, 2});
  folded.folded = true;
  auto p = solveShape(m, folded, {StashPolicy::Keep}, unlimited(3), -1, Objective::Time);
  ASSERT_TRUE(p);
  EXPECT_DOUBLE_EQ(p->tau, 3);  // F + B on every device
  EXPECT_EQ(p->stages[1].forwardDevice, 1);
  EXPECT_EQ(p->stages[1].backwardDevice, 1);
  EXPECT_EQ(p->stages[1].estimate.effective, StashPolicy::Keep);
  EXPECT_EQ(p->stages[0].estimate.effective, StashPolicy::Offload);
  // Keep on the middle stage: its M = 2 stashes stay on device 1.
  EXPECT_EQ(p->stages[1].estimate.inFlight, 2);
  EXPECT_EQ(p->stages[1].estimate.backwardMemory[index(pipefb::MemoryCategory::Stash)], 20);
}

namespace pipefb::planner {
namespace {

// Three equal layers (W = G = 10, saved 100, input and output 5, B 2, recompute 1), and
// the decoupled plan of one forward device feeding one backward device, every layer a
// segment under checkpoint-offload, M = 4, at `lookahead`.
Profile threeSegmentProfile() {
  Profile p = testing::timesProfile({1, 1, 1});
  p.inputBytes = 5;
  for (auto& l : p.layers) {
    l.backward = 2;
    l.recompute = 1;
    l.paramBytes = l.gradBytes = 10;
    l.savedBytes = 100;
    l.outputBytes = 5;
    l.noGradForwardBytes = 10;
  }
  return p;
}
Plan threeSegmentPlan(const CostModel& m, int lookahead) {
  Plan plan;
  plan.shape = shapeOf(ScheduleKind::PipeFbSync, 3, 4, {0, 1});
  plan.shape.lookahead = lookahead;
  plan.shape.forwardDevices = plan.shape.backwardDevices = 1;
  plan.shape.forwardRange = plan.shape.backwardRange = {0, 0, 0};
  for (int l = 0; l < 3; ++l) {
    StagePlan st;
    st.first = l;
    st.last = l + 1;
    st.policy = StashPolicy::CheckpointOffload;
    plan.stages.push_back(st);
  }
  evaluatePlan(m, plan);
  return plan;
}

// Note [Decoupled devices]: a decoupled plan (every layer a segment, here one forward device
// feeding one backward device) holds on its backward device the states of its range, the
// prefetched stashes (lookahead + 1 of the largest) and ONE segment's recomputed graph, not
// the range's: 3 layers of W = G = 10, saved 100, input and output 5 per sample, one sample
// per microbatch, M = 4, checkpoint-offload. The last segment's B, charged whole (Note
// [Backward layer by layer]), holds its graph 100, its output's gradient 5 and its input's
// gradient 5, not its recomputed output (Note [Loss in the recomputed graph]): 110, as the
// others, layer by layer (each adds its weight gradients into .grad in place, Note
// [Gathered weight gradients]); the range's states 3 x 20 = 60; 2 input stashes of 5:
// 60 + 10 + 110 = 180. No model output waits there: the
// last segment's B recomputes it (Note [Recomputed last output]); under offload it is sent at
// its receive (Note [Message rendezvous]; 3 of 5 could wait at M = 4 before). The same layers
// as one split stage recompute all three layers' graphs at once (300 of them).
TEST(SolverLiteral, DecoupledBackwardDeviceHoldsOneSegmentsGraph) {
  CostModel m(threeSegmentProfile(), testing::freeCluster(2));
  const Plan plan = threeSegmentPlan(m, 1);
  EXPECT_EQ(plan.stages[2].forwardDevice, 0);
  EXPECT_EQ(plan.stages[0].backwardDevice, 1);
  // (and the last segment's loss and its seed, Note [Loss scalars beside the backward])
  EXPECT_EQ(plan.deviceMemory[1], 180 + 2 * kLossScalarBytes);
  std::vector<StageEstimate> est;
  for (const StagePlan& st : plan.stages) est.push_back(st.estimate);
  EXPECT_EQ(decoupledRanges(m, plan.shape, est, {0, 1, 2, 3}).back().boundary.bytes, 0);
  for (StageEstimate& e : est) e.policy = StashPolicy::Offload;
  EXPECT_EQ(decoupledRanges(m, plan.shape, est, {0, 1, 2, 3}).back().boundary.bytes, 0);
  PipelineShape whole = shapeOf(ScheduleKind::PipeFbSync, 1, 4, {0, 1});
  const StageEstimate one = m.stage(whole, 0, 0, 3, StashPolicy::CheckpointOffload);
  EXPECT_GE(total(one.backwardMemory), 300);
  // Compute adds up over the range's segments: B with its recompute, 3 x (2 + 1).
  EXPECT_DOUBLE_EQ(plan.tau, 9);
}

// Note [Prefetch distance zero]: the same three segments with a host link of 1 byte/s. At
// lookahead 1 the backward device holds two input stashes of 5 (180, as above) and each
// PRE (5 s) hides beside the device's B; at lookahead 0 it holds one (175) and every B
// waits for its copy: 3 x (2 + 1 + 5) = 24 against the forward device's 15 s of copies
// out. The smallest budget takes lookahead 0, the fastest plan without a budget keeps 1.
TEST(SolverLiteral, DecoupledLookaheadZeroHoldsOneStashAndWaitsForItsCopy) {
  CostModel m(threeSegmentProfile(), Cluster::uniform(2, 1.0, -1, Link{}, Link{1.0, 0.0}));
  const Plan one = threeSegmentPlan(m, 1), zero = threeSegmentPlan(m, 0);
  EXPECT_EQ(one.deviceMemory[1], 180 + 2 * kLossScalarBytes);
  EXPECT_EQ(zero.deviceMemory[1], 175 + 2 * kLossScalarBytes);
  EXPECT_DOUBLE_EQ(one.tau, 15);
  EXPECT_DOUBLE_EQ(zero.tau, 24);
  SolverOptions o = testing::only("pipefb-sync-checkpoint-offload", 4);
  o.microbatches = 4;
  o.foldedPlacements = false;
  o.maxStages = 3;
  o.objective = Objective::Memory;
  SolveResult small = solve(m, o);
  ASSERT_TRUE(small.feasible);
  ASSERT_TRUE(small.best.shape.decoupled());
  EXPECT_EQ(small.best.shape.lookahead, 0);
  EXPECT_EQ(small.best.peakMemory, zero.peakMemory);
  o.objective = Objective::Time;
  SolveResult fast = solve(m, o);
  ASSERT_TRUE(fast.feasible);
  if (fast.best.shape.decoupled()) EXPECT_EQ(fast.best.shape.lookahead, 1);
}

// Note [Decoupled search]: given the devices, the solver puts the light forward passes of
// all layers on one device and splits the backward passes over the others; "0/1 0/2 0/3"
// for equal layers whose B is three times F.
TEST(SolverLiteral, OneForwardDeviceFeedsThreeBackwardDevices) {
  Profile p = testing::timesProfile({1, 1, 1});
  for (auto& l : p.layers) l.backward = 3;
  CostModel m(p, testing::freeCluster(4));
  SolverOptions o = testing::only("pipefb-sync-offload", 8);
  o.microbatches = 8;
  o.foldedPlacements = false;
  SolveResult r = solve(m, o);
  ASSERT_TRUE(r.feasible);
  ASSERT_TRUE(r.best.shape.decoupled());
  std::vector<schedules::StagePlacement> got;
  for (const StagePlan& s : r.best.stages) got.push_back({s.forwardDevice, s.backwardDevice});
  EXPECT_EQ(schedules::Placement(got).toString(), "0/3 0/2 0/1");
  EXPECT_DOUBLE_EQ(r.best.tau, 3);
}

}  // namespace
}  // namespace pipefb::planner

// Note [Decoupled devices]: a backward device holds, at each segment's B, that segment's
// stash and the next lookahead B's (the range's first segment is followed by its last one
// of the next microbatch) beside that segment's working set; the most over segments.
TEST(DecoupledDevice, ChargesEachSegmentsBWithTheStashesResidentThen) {
  // Segments 0..3 of one backward range: stashes 384, 64, 32, 256 and working sets 100,
  // 2000, 50, 10; B runs 3, 2, 1, 0, then 3 of the next microbatch.
  const std::int64_t stash[] = {384, 64, 32, 256}, work[] = {100, 2000, 50, 10};
  auto device = [&](int microbatches, int lookahead) {
    PipelineShape shape;
    shape.microbatches = microbatches;
    shape.lookahead = lookahead;
    DecoupledDevice d;
    for (int k = 3; k >= 0; --k) {
      StageEstimate e;
      e.stashBytes = stash[k];
      e.backwardMemory[index(pipefb::MemoryCategory::WorkingSet)] = work[k];
      e.backwardMemory[index(pipefb::MemoryCategory::Grads)] = 1000;
      d.addBackward(e, shape);
    }
    return d;
  };
  // Lookahead 1: B of segment 1 holds stashes 1 and 0 beside its working set, 448 + 2000
  // (the largest stashes twice beside the largest working set would be 768 + 2000).
  const DecoupledDevice one = device(4, 1);
  EXPECT_EQ(one.peak().stashes, 448);
  EXPECT_EQ(one.peak().working, 2000);
  EXPECT_EQ(one.memory(), 4000 + 448 + 2000);
  EXPECT_LE(one.memoryFloor(), one.memory());
  // Lookahead 2: segment 1's B holds 1, 0 and the next microbatch's 3.
  EXPECT_EQ(device(4, 2).peak().stashes, 64 + 384 + 256);
  // Segment 0's B wraps to the next microbatch's segment 3, 384 + 256 + its 100, unless
  // there is no next microbatch (M = 1); with lookahead 3 it is the most there.
  EXPECT_EQ(device(4, 3).peak().total(), 64 + 384 + 256 + 32 + 2000);
  EXPECT_EQ(device(1, 3).peak().total(), 64 + 384 + 2000);
}

// Note [Planned async lag]: at lag 1 a decoupled backward device holds a segment's kept
// version only near its first B after the STEP (prefetched `lookahead` B's ahead, dropped
// after it), the last segment's beside the next microbatch's first B (its OFFW's copy held
// through that compute), and beside each STEP the one made for it and the previous one.
TEST(DecoupledDevice, ChargesKeptVersionsWhereTheLoweredScheduleHasThem) {
  // Segments 0..3 of one backward range, B order 3, 2, 1, 0 (q = 0..3): versions 1, 10,
  // 100, 1000 (segment 3 .. 0 = q 0 .. 3), working sets 5000 at q = 1, 100 elsewhere,
  // stashes 0, step transients 0, resident grads 10000.
  const std::int64_t version[] = {1, 10, 100, 1000}, work[] = {100, 5000, 100, 100};
  auto device = [&](int microbatches, int lookahead, bool windowed) {
    PipelineShape shape;
    shape.microbatches = microbatches;
    shape.lookahead = lookahead;
    DecoupledDevice d;
    for (int q = 0; q < 4; ++q) {
      StageEstimate e;
      e.backwardMemory[index(pipefb::MemoryCategory::WorkingSet)] = work[q];
      e.backwardMemory[index(pipefb::MemoryCategory::Grads)] = 10000;
      if (windowed)
        e.windowedVersionBytes = version[q];
      else
        e.backwardMemory[index(pipefb::MemoryCategory::WeightVersions)] = version[q];
      d.addBackward(e, shape);
    }
    return d;
  };
  // Every version all the time (lag >= 2, or not offloaded): 40000 + 1111 + 5000.
  EXPECT_EQ(device(4, 0, false).memory(), 40000 + 1111 + 5000);
  // Lookahead 0: q = 1's B(., 0) holds its own version only; q = 0's the last segment's
  // too (1 + 1000 beside 100); STEP(q = 3) holds 1000 + 100. The most: 5000 + 10.
  const DecoupledDevice zero = device(4, 0, true);
  EXPECT_EQ(zero.peak().versions, 10);
  EXPECT_EQ(zero.memory(), 40000 + 5000 + 10);
  EXPECT_LE(zero.memoryFloor(), zero.memory());
  // Lookahead 1: q = 1's B(., 0) also holds q = 2's prefetched version, 10 + 100 (its
  // B(., M-1) holds only q = 0's, stepped just before it).
  EXPECT_EQ(device(4, 1, true).memory(), 40000 + 5000 + 110);
  // Lookahead 3 (n - 1: no OFFW is emitted), every later segment's version is there.
  EXPECT_EQ(device(4, 3, true).memory(), 40000 + 5000 + 1110);
  // M = 1: B(q, 0) is also B(q, M-1), beside the versions stepped before it.
  EXPECT_EQ(device(1, 1, true).memory(), 40000 + 5000 + 111);
}

// Note [Decoupled devices]: a forward device holds, at each segment's F, the stash F
// builds and its working set beside the stash of the device's OFF before it: the previous
// segment's, or for the range's first segment the last one's of the microbatch before.
TEST(DecoupledDevice, ChargesEachSegmentsFWithTheCopyOfTheOffBeforeIt) {
  // Segments 0..2 of one forward range: stashes 480, 260, 40 and F's working sets 160, 1,
  // 0 (resnet50/8's layer3.0, layer3.1 and head, in KiB, roughly); every stash leaves
  // through the copy engine and two are in flight (M >= 2).
  const std::int64_t stash[] = {480, 260, 40}, work[] = {160, 1, 0};
  DecoupledDevice d;
  for (int k = 2; k >= 0; --k) {
    StageEstimate e;
    e.same = false;  // split: forward and backward on two devices
    e.stashBytes = e.copyingOutBytes = stash[k];
    e.forwardMemory[index(pipefb::MemoryCategory::Stash)] = 2 * stash[k];
    e.forwardMemory[index(pipefb::MemoryCategory::WorkingSet)] = work[k];
    e.forwardMemory[index(pipefb::MemoryCategory::Weights)] = 100;
    d.addForward(e);
    EXPECT_LE(d.memoryFloor(), d.memory());
  }
  // F of segment 1 beside segment 0's copy: 260 + 1 + 480 = 741; F of segment 0 beside
  // segment 2's (the head's) of the microbatch before: 480 + 160 + 40 = 680. The largest F
  // beside the largest copy would be 640 + 480 = 1120.
  EXPECT_EQ(d.peak().stashes, 260 + 480);
  EXPECT_EQ(d.peak().working, 1);
  EXPECT_EQ(d.memory(), 300 + 741);
  // One microbatch (one stash in flight per segment): nothing of the last segment waits
  // for the first one's F, but segment 0's copy may still go out beside segment 1's F.
  DecoupledDevice one;
  for (int k = 2; k >= 0; --k) {
    StageEstimate e;
    e.same = false;
    e.stashBytes = e.copyingOutBytes = stash[k];
    e.forwardMemory[index(pipefb::MemoryCategory::Stash)] = stash[k];
    e.forwardMemory[index(pipefb::MemoryCategory::WorkingSet)] = work[k];
    one.addForward(e);
  }
  EXPECT_EQ(one.memory(), 741);
}

// Note [Planned reserve]: roomUnder is the exact inverse of bytes + plannedReserve(bytes):
// the most that fits a limit with its reserve, for small and huge limits alike.
TEST(PlannedReserve, RoomUnderIsTheMostThatFitsWithItsReserve) {
  EXPECT_EQ(plannedReserve(0, 5), 0);
  EXPECT_EQ(plannedReserve(1, 5), 1);
  EXPECT_EQ(plannedReserve(200, 5), 1);
  EXPECT_EQ(plannedReserve(201, 5), 2);
  EXPECT_EQ(plannedReserve(1000000, 0), 0);
  EXPECT_EQ(roomUnder(-1, 5), -1);
  const std::int64_t limits[] = {
      0, 1, 2, 199, 200, 201, 1000, 8664564, 1LL << 40, 9000000000000000000LL, (1LL << 62) + 12345};
  for (const std::int64_t limit : limits)
    for (const int perMille : {0, 5, 10}) {
      const std::int64_t r = roomUnder(limit, perMille);
      SCOPED_TRACE(std::to_string(limit) + " at " + std::to_string(perMille) + " per mille");
      ASSERT_GE(r, 0);
      EXPECT_LE(r + plannedReserve(r, perMille), limit);
      if (r < limit) {
        EXPECT_GT(r + 1 + plannedReserve(r + 1, perMille), limit);
      }
    }
}
