// The pipeline runtime against single-device training (DESIGN.md, "Correctness"), its
// memory contract, its errors and its trace.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "../PipelineConfig.h"
#include "../TestUtil.h"
#include "Equivalence.h"
#include "pipefb/common/Error.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/Placement.h"
#include "pipefb/sim/Simulator.h"
#include "pipefb/train/Optimizer.h"

using namespace pipefb;
namespace fs = std::filesystem;

namespace {
using namespace test::equivalence;
}  // namespace

class RuntimeEnv : public ::testing::Environment {
 public:
  void SetUp() override { memory::installTrackingAllocator(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new RuntimeEnv);

TEST(Partition, BalancedByCostAndCuts) {
  using runtime::StageRange;
  auto p = runtime::balancedPartition({1, 2, 3, 4, 5, 6}, 2);
  EXPECT_EQ(p, (std::vector<StageRange>{{0, 4}, {4, 6}}));
  p = runtime::balancedPartition({10, 1, 1, 1, 10}, 3);
  EXPECT_EQ(p, (std::vector<StageRange>{{0, 1}, {1, 4}, {4, 5}}));
  p = runtime::balancedPartition({0, 0, 0}, 3);
  EXPECT_EQ(p, (std::vector<StageRange>{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_THROW(runtime::balancedPartition({1, 2}, 3), UserError);
  EXPECT_EQ(runtime::partitionFromCuts({2, 5}, 7),
            (std::vector<StageRange>{{0, 2}, {2, 5}, {5, 7}}));
  EXPECT_THROW(runtime::partitionFromCuts({0}, 7), UserError);
  EXPECT_THROW(runtime::partitionFromCuts({3, 3}, 7), UserError);
  EXPECT_THROW(runtime::partitionFromCuts({7}, 7), UserError);
}

TEST(Partition, StagesFromConfig) {
  auto c = makeConfig(mlpOptions(), "pipefb-sync", 0, 2, "keep", 8);
  c.devices.count = 6;
  EXPECT_EQ(runtime::stagesFor(c), 3);
  c.devices.count = 5;
  EXPECT_THROW(runtime::stagesFor(c), UserError);
  c = makeConfig(mlpOptions(), "1f1b", 3, 2, "keep", 8);
  c.devices.count = 2;
  try {
    runtime::stagesFor(c);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("devices.count"), std::string::npos) << e.what();
  }
  c.devices.count = 3;
  c.pipeline.partition = {1};
  EXPECT_THROW(runtime::stagesFor(c), UserError);  // 2 stages from cuts, 3 asked
}

TEST(PipelineEngine, MoreStagesThanLayersNamesPipelineStages) {
  auto cfg = makeConfig(mlpOptions(), "1f1b", 5, 2, "keep", 8);  // mlp has 4 layers
  auto model = buildSeeded(cfg.model);
  try {
    runtime::PipelineEngine e(*model, cfg, quietOptions(1));
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.stages"), std::string::npos) << e.what();
  }
}

TEST(PipelineEngine, ExplicitPartitionIsHonoured) {
  auto cfg = makeConfig(mlpOptions(), "gpipe", 2, 2, "keep", 8);
  cfg.pipeline.partition = {3};
  auto model = buildSeeded(cfg.model);
  runtime::PipelineEngine e(*model, cfg, quietOptions(1));
  EXPECT_EQ(e.partition(), (std::vector<runtime::StageRange>{{0, 3}, {3, 4}}));
  e.step(makeBatch(*model, 8, 5, 1));
  e.finish();
}

TEST(PipelineEquivalence, Mlp) {
  checkEquivalence({"mlp", mlpOptions(), 12}, {2, 3, 4}, {1, 3, 4});
}

TEST(PipelineEquivalence, Vgg16) {
  checkEquivalence({"vgg16", visionOptions("vgg16"), 4}, {2, 3, 4}, {2, 4});
}

TEST(PipelineEquivalence, Resnet50) {
  checkEquivalence({"resnet50", visionOptions("resnet50"), 8}, {2, 3, 4}, {2, 4});
}

TEST(PipelineEquivalence, Gpt2) { checkEquivalence({"gpt2", gpt2Options(), 4}, {2, 3, 4}, {2, 4}); }

// Issue 5: the stash goes through the data-transfer manager (pipefb-sync with S=2, 3 runs
// on 4 and 6 devices).
const std::vector<std::string> kOffloaded = {"offload", "checkpoint-offload"};
// Note [Plan policies in the runtime]: every stage its own policy, still gradient-exact.
TEST(PipelineEquivalenceMixed, Mlp) {
  checkEquivalence(
      {"mlp", mlpOptions()}, {4}, {2, 4},
      {"checkpoint,offload,keep,checkpoint-offload", "offload,checkpoint-offload,checkpoint,keep"});
}

TEST(PipelineEquivalenceMixed, Vgg16) {
  checkEquivalence({"vgg16", visionOptions("vgg16")}, {4}, {2},
                   {"checkpoint,offload,keep,checkpoint-offload"});
}

TEST(PipelineEquivalenceOffload, Mlp) {
  checkEquivalence({"mlp", mlpOptions(), 12}, {2, 3, 4}, {1, 3, 4}, kOffloaded);
}
TEST(PipelineEquivalenceOffload, Vgg16) {
  checkEquivalence({"vgg16", visionOptions("vgg16"), 4}, {2, 3}, {2, 4}, kOffloaded);
}
TEST(PipelineEquivalenceOffload, Resnet50) {
  checkEquivalence({"resnet50", visionOptions("resnet50"), 8}, {2, 3}, {4}, kOffloaded);
}
TEST(PipelineEquivalenceOffload, Gpt2) {
  checkEquivalence({"gpt2", gpt2Options(), 4}, {2, 3}, {2, 4}, kOffloaded);
}

// Note [Split backward in the runtime]: I and W separately, every stash policy, and the
// weights after three iterations (the split must not leak a gradient across a STEP).
const std::vector<Layout> kSplitKinds = {"zb-h1", "zb-h2", "pipefb-zb"};
TEST(PipelineEquivalenceSplit, Mlp) {
  checkEquivalence({"mlp", mlpOptions(), 12}, {2, 3, 4}, {1, 3, 4}, kAllStashes, kSplitKinds);
}
TEST(PipelineEquivalenceSplit, MlpMixedPolicies) {
  checkEquivalence({"mlp", mlpOptions()}, {4}, {2, 4},
                   {"checkpoint,offload,keep,checkpoint-offload"}, kSplitKinds);
}
TEST(PipelineEquivalenceSplit, Vgg16) {  // BatchNorm: IR restores its statistics
  checkEquivalence({"vgg16", visionOptions("vgg16"), 4}, {2, 3}, {2, 4}, kAllStashes, kSplitKinds);
}
TEST(PipelineEquivalenceSplit, Resnet50) {
  checkEquivalence({"resnet50", visionOptions("resnet50"), 8}, {3}, {4}, kAllStashes, kSplitKinds);
}
TEST(PipelineEquivalenceSplit, Gpt2) {
  checkEquivalence({"gpt2", gpt2Options(), 4}, {2, 3}, {2, 4}, kAllStashes, kSplitKinds);
}

// Devices that host several stages (issue 16, folded PipeFB; issue 18, interleaved-1f1b):
// still gradient-exact under every stash policy, and with a policy per stage. Odd S folds
// the middle stage onto one device (not split).
TEST(PipelineEquivalenceFolded, Mlp) {
  checkEquivalence({"mlp", mlpOptions(), 12}, {2, 3, 4}, {1, 3, 4}, kAllStashes, kFolded);
  checkEquivalence(
      {"mlp", mlpOptions()}, {4}, {2, 4},
      {"checkpoint,offload,keep,checkpoint-offload", "offload,checkpoint-offload,checkpoint,keep"},
      kFolded);
}
TEST(PipelineEquivalenceFolded, Vgg16) {
  checkEquivalence({"vgg16", visionOptions("vgg16"), 4}, {2, 3, 4}, {2, 4}, kAllStashes, kFolded);
}
TEST(PipelineEquivalenceFolded, Resnet50) {
  checkEquivalence({"resnet50", visionOptions("resnet50"), 8}, {2, 3}, {4}, kAllStashes, kFolded);
}
TEST(PipelineEquivalenceFolded, Gpt2) {
  checkEquivalence({"gpt2", gpt2Options(), 4}, {2, 3, 4}, {2}, kAllStashes, kFolded);
}
// Decoupled partitions (issue 16; Note [Decoupled partitions]): several segments a
// device, every segment's stash through the host pool to its backward device; still
// gradient-exact under every stash policy, and with a policy per segment.
TEST(PipelineEquivalenceDecoupled, Mlp) {
  checkEquivalence({"mlp", mlpOptions(), 12}, {3, 4}, {1, 3, 4}, kAllStashes, kDecoupled);
  checkEquivalence({"mlp", mlpOptions()}, {4}, {2}, {"checkpoint,offload,keep,checkpoint-offload"},
                   {kDecoupled[1], kDecoupled[2]});
}
TEST(PipelineEquivalenceDecoupled, Vgg16) {
  checkEquivalence({"vgg16", visionOptions("vgg16"), 4}, {3, 4}, {2}, kAllStashes, kDecoupled);
}
TEST(PipelineEquivalenceDecoupled, Resnet50) {  // BatchNorm on the forward devices
  checkEquivalence({"resnet50", visionOptions("resnet50"), 8}, {4}, {4}, kAllStashes,
                   {kDecoupled[1]});
}
TEST(PipelineEquivalenceDecoupled, Gpt2) {
  checkEquivalence({"gpt2", gpt2Options(), 4}, {3, 4}, {2}, kAllStashes,
                   {kDecoupled[0], kDecoupled[1]});
}

// Note [Recomputed last output]: under a checkpoint kind the last stage's F sends its output
// nowhere and keeps no copy of it (its B recomputes it on the other device); under offload
// it is sent. Either way the forward device ends the iteration holding what it started with.
TEST(PipelineEngine, RecomputingLastStageKeepsNoOutputOnItsForwardDevice) {
  for (const std::string stash : {"checkpoint", "checkpoint-offload", "offload"}) {
    SCOPED_TRACE(stash);
    auto cfg = makeConfig(mlpOptions(), "pipefb-sync", 2, 4, stash, 8);
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(2));
    const int S = e.numStages(), fd = e.forwardDevice(S - 1);
    ASSERT_NE(fd, e.backwardDevice(S - 1));
    int sends = 0;
    for (const auto& a : e.schedule().devices[fd])
      sends += a.type == schedules::ActionType::SendAct && a.stage == S - 1;
    EXPECT_EQ(sends, stash == "offload" ? 2 * 4 : 0);
    const int64_t before = e.deviceStats()[fd].live;
    for (int k = 0; k < 2; ++k) e.step(makeBatch(*model, 8, 5, 10 + k));
    EXPECT_EQ(e.deviceStats()[fd].live, before) << "device " << fd;
    e.finish();
  }
}

// Note [Loss in the recomputed graph] (schedules/Lowering.h): a recomputing head's B takes
// the loss inside its graph and lets the logits go before autograd runs, so it peaks at the
// loss's transient (log_softmax's result, its gradient and the logits' gradient: 3 logits)
// and not with the logits beside it (4, as when the loss read a detached copy). GPT-2 tiny
// with a vocabulary large enough for the logits to dominate the head stage alone.
TEST(PipelineEngine, RecomputingHeadHoldsNoLogitsBesideTheLoss) {
  model::ModelOptions m = gpt2Options();
  m.input_size = 64;     // T
  m.num_classes = 4096;  // V
  const int64_t batch = 8, M = 2;
  for (const std::string schedule : {"1f1b", "pipefb-sync"}) {
    SCOPED_TRACE(schedule);
    auto cfg = makeConfig(m, schedule, 2, M, "checkpoint", batch);
    cfg.pipeline.partition = {3};  // embed, block0, block1 | head
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(1));
    ASSERT_EQ(e.partition().back().first, 3);
    const int bd = e.backwardDevice(1);
    const int64_t logits = batch / M * m.input_size * m.num_classes * 4;
    const int64_t before = e.deviceStats()[bd].live;
    e.step(makeBatch(*model, batch, 100, 3));
    e.finish();
    const int64_t above = e.deviceStats()[bd].peak - before;
    EXPECT_GE(above, 3 * logits) << "the loss's transient";
    EXPECT_LT(above, 3 * logits + logits / 2) << "device " << bd << ", logits " << logits;
  }
}

// Note [Forward device memory] (planner/CostModel.h) and Note [Old forward copies in the
// simulator]: pipefb-async with a graph stash (offload) builds a new forward copy at RW while
// stashes made on the old one wait for their B, so a forward device's weights peak at twice
// its copy; under checkpoint-offload RW copies in place.
TEST(PipelineEngine, AsyncForwardDeviceHoldsTheOldCopyBesideTheNew) {
  for (const std::string stash : {"offload", "checkpoint-offload"}) {
    SCOPED_TRACE(stash);
    auto cfg = makeConfig(mlpOptions(), "pipefb-async", 2, 4, stash, 8);
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(3));
    const int fd = e.forwardDevice(1);
    const int64_t copy = e.deviceStats()[fd].live;  // the forward copy of stage 1
    ASSERT_GT(copy, 0);
    for (int k = 0; k < 3; ++k) e.step(makeBatch(*model, 8, 5, 20 + k));
    e.finish();
    const int64_t weights = e.deviceStats()[fd].peakByCategory[index(MemoryCategory::Weights)];
    EXPECT_EQ(weights, stash == "offload" ? 2 * copy : copy);
  }
}

TEST(PipelineEquivalenceInterleaved, Mlp) {
  checkEquivalence({"mlp", mlpOptions(), 12}, {2, 4}, {2, 4}, kAllStashes, kInterleaved);
  // Four stages on one device.
  checkEquivalence({"mlp", mlpOptions(), 12}, {4}, {3}, {"keep", "checkpoint"},
                   {{"interleaved-1f1b", false, 4}, {"interleaved-zb", false, 4}});
}
TEST(PipelineEquivalenceInterleaved, Vgg16) {
  checkEquivalence({"vgg16", visionOptions("vgg16"), 12}, {4, 6}, {6}, kAllStashes, kInterleaved);
  checkEquivalence({"vgg16", visionOptions("vgg16"), 4}, {6}, {2}, {"keep"},
                   {{"interleaved-1f1b", false, 3}});
}
// zbv: two stages per device in a V (stage s on device min(s, S-1-s)), I and W split.
const std::vector<Layout> kZbv = {"zbv"};
TEST(PipelineEquivalenceZbv, Mlp) {
  checkEquivalence({"mlp", mlpOptions(), 12}, {2, 4}, {1, 3, 4}, kAllStashes, kZbv);
  checkEquivalence({"mlp", mlpOptions()}, {4}, {2, 4},
                   {"checkpoint,offload,keep,checkpoint-offload"}, kZbv);
}
TEST(PipelineEquivalenceZbv, Vgg16) {
  checkEquivalence({"vgg16", visionOptions("vgg16"), 4}, {2, 4}, {2, 4}, kAllStashes, kZbv);
}
TEST(PipelineEquivalenceZbv, Resnet50) {
  checkEquivalence({"resnet50", visionOptions("resnet50"), 8}, {4}, {4}, kAllStashes, kZbv);
}
TEST(PipelineEquivalenceZbv, Gpt2) {
  checkEquivalence({"gpt2", gpt2Options(), 4}, {2, 4}, {2}, kAllStashes, kZbv);
}
// Note [Chunked loss]: the last stage's loss in chunks of 5 tokens (microbatches of 16
// and 32), the pipeline against one device with the same loss.
TEST(PipelineEquivalence, Gpt2WithAChunkedLoss) {
  model::ModelOptions o = gpt2Options();
  o.loss_chunk = 5;
  checkEquivalence({"gpt2", o, 8}, {2, 4}, {2, 4}, {"keep", "checkpoint"},
                   {"1f1b", "pipefb-sync", "zb-h1"});
}
TEST(PipelineEquivalenceInterleaved, Gpt2) {
  checkEquivalence({"gpt2", gpt2Options(), 4}, {4}, {2, 4}, kAllStashes, kInterleaved);
}

namespace {
model::ModelOptions wideMlp() {
  model::ModelOptions o = mlpOptions();
  o.input_size = 16;
  o.hidden = {256, 256, 256};
  return o;
}

// Largest stash bytes seen at the end of any action (where the contract counts).
std::vector<int64_t> stashAtActionEnds(const runtime::PipelineEngine& e) {
  std::vector<int64_t> out;
  for (const auto& recs : e.records()) {
    int64_t m = 0;
    for (const auto& r : recs) m = std::max(m, r.liveAfter[index(MemoryCategory::Stash)]);
    out.push_back(m);
  }
  return out;
}
}  // namespace

TEST(PipelineMemory, MeasuredStashPeaksMatchTheContract) {
  for (const std::string sched : {"1f1b", "gpipe"})
    for (int S : {2, 4}) {
      const int M = 6;
      SCOPED_TRACE(sched + " S=" + std::to_string(S));
      auto cfg = makeConfig(wideMlp(), sched, S, M, "keep", 48);
      auto model = buildSeeded(cfg.model);
      runtime::PipelineEngine e(*model, cfg, quietOptions(2));
      e.step(makeBatch(*model, 48, 5, 1));
      e.step(makeBatch(*model, 48, 5, 2));
      e.finish();
      auto perMb = e.stashBytesPerMicrobatch();
      auto measured = stashAtActionEnds(e);
      auto peaks = e.peakStashBytes();
      for (int s = 0; s < S; ++s) {
        const int want = sched == "1f1b" ? std::min(S - s, M) : M;
        EXPECT_EQ(e.contract().residentForward[s], want);
        ASSERT_GT(perMb[s], 0);
        const double expected = static_cast<double>(want) * perMb[s];
        EXPECT_NEAR(measured[s], expected, 0.05 * expected) << "device " << s;
        EXPECT_GE(peaks[s], measured[s]);  // the domain's own peak includes transients
      }
    }
}

// Note [Split backward in the runtime]: a stash stays on its device from F until W, so
// the measured stash peaks follow the contract's resident counts, which include the
// stashes whose I ran and whose W waits (deferredW). Past stage 0 such a stash has let its
// output go at I (the gradients I kept for W are working set; PlanRuns.SplitBackward*
// checks the devices' whole peaks against their plans): at most the resident stashes
// whole, at least those whose I has not run.
TEST(PipelineMemory, SplitBackwardStashPeaksMatchTheContract) {
  for (const std::string sched : {"zb-h1", "zb-h2"})
    for (int S : {2, 4}) {
      const int M = 8;
      SCOPED_TRACE(sched + " S=" + std::to_string(S));
      auto cfg = makeConfig(wideMlp(), sched, S, M, "keep", 64);
      auto model = buildSeeded(cfg.model);
      runtime::PipelineEngine e(*model, cfg, quietOptions(2));
      e.step(makeBatch(*model, 64, 5, 1));
      e.step(makeBatch(*model, 64, 5, 2));
      e.finish();
      const auto& c = e.contract();
      ASSERT_EQ(static_cast<int>(c.deferredW.size()), S);
      EXPECT_GT(c.deferredW[S - 1], 1);  // the last stage defers W's (Note [Lagged W])
      auto perMb = e.stashBytesPerMicrobatch();
      auto measured = stashAtActionEnds(e);
      for (int s = 0; s < S; ++s) {
        ASSERT_GT(perMb[s], 0);
        const double whole = static_cast<double>(c.residentForward[s]) * perMb[s];
        const int waiting = s > 0 ? c.deferredW[s] : 0;
        const double least = static_cast<double>(c.residentForward[s] - waiting) * perMb[s];
        EXPECT_LE(measured[s], 1.05 * whole) << "device " << s << ": " << c.residentForward[s]
                                             << " stashes of " << perMb[s] << " bytes";
        EXPECT_GE(measured[s], 0.95 * least)
            << "device " << s << ": " << c.residentForward[s] << " stashes of " << perMb[s]
            << " bytes, " << waiting << " of them past their I";
        if (s == 0) EXPECT_NEAR(measured[s], whole, 0.10 * whole);  // W from the output
      }
    }
}

// Devices that host several stages (interleaved-1f1b, v = 2 and all 4 stages on one
// device; zbv, whose W keeps its stash until it runs): each device's stash peak, at action ends, is
// the simulator's for the lowered schedule with each stage's measured stash bytes per microbatch
// (within 10%; the simulator charges every stash of every stage a device holds, so this also checks
// that the stages' stashes add up). Folded PipeFB's stashes go through the host pool, whose copies
// in flight depend on timing; its whole peaks are checked against the planner's simulator in
// plan_runs_test (PlanRuns.FoldedPipeFbPeaksWhereTheSimulatorSays).
TEST(PipelineMemory, SeveralStagesPerDeviceStashPeaksMatchTheSimulator) {
  struct Row {
    Layout layout;
    int S, M;
  };
  const std::vector<Row> rows = {{"zbv", 4, 6},
                                 {"zbv", 2, 6},
                                 {{"interleaved-1f1b", false, 2}, 4, 6},
                                 {{"interleaved-1f1b", false, 4}, 4, 6}};
  for (const Row& row : rows) {
    // zbv's I under checkpoint keeps what its recompute saved until W: a keep stash
    // (deferred_bytes), measured by the keep run before it. Even so zbv under checkpoint
    // peaks above the simulator (S=4: 41120 bytes measured on a device, 32768 simulated;
    // S=2: 41120 against 24736), so only its keep is held to 10% here (issue 18).
    std::vector<int64_t> graphBytes;
    for (const std::string stash : {"keep", "checkpoint"}) {
      if (row.layout.schedule == "zbv" && stash != "keep") continue;
      SCOPED_TRACE(row.layout.name() + " " + stash + " S=" + std::to_string(row.S));
      auto cfg = makeConfig(wideMlp(), row.layout.schedule, row.S, row.M, stash, 48);
      row.layout.apply(cfg);
      auto model = buildSeeded(cfg.model);
      runtime::PipelineEngine e(*model, cfg, quietOptions(2));
      e.step(makeBatch(*model, 48, 5, 1));
      e.step(makeBatch(*model, 48, 5, 2));
      e.finish();
      const auto perMb = e.stashBytesPerMicrobatch();
      sim::CostTable costs = sim::CostTable::uniform(row.S);
      for (int s = 0; s < row.S; ++s) {
        ASSERT_GT(perMb[s], 0);
        sim::StageCosts& c = costs.stages[s];
        c.stashBytes = c.checkpointBytes = perMb[s];
        if (stash == "keep") graphBytes.push_back(perMb[s]);
        c.deferredBytes = graphBytes.at(s);
        c.activationBytes = c.gradientBytes = c.weightVersionBytes = c.weightsBytes = 0;
        c.gradsBytes = c.optimizerStateBytes = c.workingSetBytes = 0;
        c.forwardWorkingSetBytes = 0;
      }
      const sim::SimResult r = sim::simulate(e.schedule(), costs);
      const auto measured = stashAtActionEnds(e);
      ASSERT_EQ(measured.size(), r.peakStashBytes.size());
      for (size_t d = 0; d < measured.size(); ++d) {
        const double want = static_cast<double>(r.peakStashBytes[d]);
        EXPECT_NEAR(measured[d], want, 0.1 * want) << "device " << d;
      }
    }
  }
}

// Note [Overlapping iterations]: zb-h2 with overlapIterations starts iteration 1's first
// forward while the last device still runs iteration 0's deferred W's (slowed down here so
// that the order does not depend on thread timing), and ends with the flushed run's weights.
TEST(PipelineOverlap, ZbH2FillsTheDrainWithTheNextIterationAndStaysExact) {
  constexpr int S = 4, M = 4, kIters = 3;
  auto cfg = makeConfig(mlpOptions(), "zb-h2", S, M, "keep", 16);
  std::vector<data::Batch> batches;
  for (int k = 0; k < kIters; ++k)
    batches.push_back(makeBatch(*buildSeeded(cfg.model), 16, 5, 300 + k));
  Reference ref(cfg);
  for (const auto& b : batches) ref.step(b, kIters);
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapping" : "flushed");
    auto model = buildSeeded(cfg.model);
    auto o = quietOptions(kIters);
    o.overlapIterations = overlap;
    // The workers start inside the constructor: wait for the engine to be known.
    std::atomic<const runtime::PipelineEngine*> engine{nullptr};
    o.beforeAction = [&](int d, int i) {
      while (!engine.load()) std::this_thread::yield();
      if (d == S - 1 &&
          engine.load()->schedule().devices[d][i].type == schedules::ActionType::WeightGrad)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    };
    runtime::PipelineEngine e(*model, cfg, o);
    engine.store(&e);
    for (const auto& b : batches) e.step(b);
    e.finish();
    std::string worst;
    EXPECT_LE(maxRelErr(*model, *ref.model, /*grads=*/false, &worst), 1e-5) << worst;
    // When iteration 1's first forward started on device 0, and iteration 0's last W ended on
    // device S-1.
    double firstF = -1, lastW = -1;
    const auto records = e.records();
    for (size_t j = 0; j < records[0].size(); ++j) {
      const auto& a = e.schedule().devices[0][j];
      if (a.type == schedules::ActionType::Forward && a.index == M && firstF < 0)
        firstF = records[0][j].start;
    }
    for (size_t j = 0; j < records[S - 1].size(); ++j) {
      const auto& a = e.schedule().devices[S - 1][j];
      if (a.type == schedules::ActionType::WeightGrad && a.index < M)
        lastW = std::max(lastW, records[S - 1][j].end);
    }
    ASSERT_GE(firstF, 0);
    ASSERT_GE(lastW, 0);
    if (overlap)
      EXPECT_LT(firstF, lastW) << "iteration 1 waited for iteration 0's drain";
    else
      EXPECT_GE(firstF, lastW) << "a flushed step() let iteration 1 start early";
  }
}

// Note [Decoupled partitions] in the runtime (issue 16, items 2 and 3): consecutive
// segments on one device pass activations and gradients in the device's own maps (no
// message to itself); every segment's stash leaves its forward device for the host pool
// and comes back on its backward device; a forward device holds only the weights of its
// range, and the weight gradients live on the backward devices.
TEST(PipelineMemory, DecoupledForwardDevicesHoldOnlyTheirRange) {
  for (const std::string stash : {"offload", "checkpoint"}) {
    SCOPED_TRACE(stash);
    auto cfg = makeConfig(wideMlp(), "pipefb-sync", 4, 2, stash, 16);
    test::place(cfg, "0/2 0/2 1/2 1/3");  // F: [0,2) on 0, [2,4) on 1; B: [0,3) on 2
    auto model = buildSeeded(cfg.model);
    std::vector<int64_t> layerBytes;
    for (size_t l = 0; l < model->numLayers(); ++l) {
      int64_t b = 0;
      for (const auto& p : model->layer(l)->parameters()) b += p.numel() * p.element_size();
      layerBytes.push_back(b);
    }
    runtime::PipelineEngine e(*model, cfg, quietOptions(2));
    e.step(makeBatch(*model, 16, 5, 1));
    e.step(makeBatch(*model, 16, 5, 2));
    e.finish();
    const auto& part = e.partition();
    ASSERT_EQ(part.size(), 4u);
    auto bytesOf = [&](int firstStage, int lastStage) {  // stages [first, last)
      int64_t b = 0;
      for (int64_t l = part[firstStage].first; l < part[lastStage - 1].last; ++l)
        b += layerBytes[l];
      return b;
    };
    const auto stats = e.deviceStats();
    const auto weights = index(MemoryCategory::Weights), grads = index(MemoryCategory::Grads);
    // Forward devices: the weights of their range, never more, and no gradients.
    EXPECT_EQ(stats[0].peakByCategory[weights], bytesOf(0, 2));
    EXPECT_EQ(stats[1].peakByCategory[weights], bytesOf(2, 4));
    EXPECT_EQ(stats[0].peakByCategory[grads], 0);
    EXPECT_EQ(stats[1].peakByCategory[grads], 0);
    // Between actions a forward device holds the stash F just built and the copies still
    // going out, at most kOffloadsInFlight of them (issue 16, item 3). One stash: what
    // F's graph saved, or what one OFF copied (its input included, which a segment fed
    // locally counts as stash: the previous segment's F made it).
    const auto perMb = e.stashBytesPerMicrobatch();
    const auto atEnds = stashAtActionEnds(e);
    const auto t = e.transferStats();
    for (int d : {0, 1}) {
      ASSERT_GT(t[d].offloads, 0) << d;
      int64_t unit = t[d].bytesD2H / t[d].offloads;
      for (int s = 2 * d; s < 2 * d + 2; ++s) unit = std::max(unit, perMb[s]);
      EXPECT_GT(atEnds[d], 0) << d;
      EXPECT_LE(atEnds[d], (1 + schedules::kOffloadsInFlight) * unit * 11 / 10) << "device " << d;
    }
    // Backward devices: the masters and their gradients.
    EXPECT_EQ(stats[2].peakByCategory[grads], bytesOf(0, 3));
    EXPECT_EQ(stats[3].peakByCategory[grads], bytesOf(3, 4));
    // No device sends to itself.
    const auto& sched = e.schedule();
    for (int d = 0; d < e.numDevices(); ++d)
      for (const auto& a : sched.devices[d])
        if (a.isSend() || a.isRecv())
          EXPECT_NE(a.peer, d) << schedules::toString(a) << " on device " << d;
    // Stashes: out of the forward devices, into the backward devices, through the host.
    for (int d : {0, 1}) {
      EXPECT_GT(t[d].bytesD2H, 0) << d;
      EXPECT_EQ(t[d].bytesH2D, 0) << d;
    }
    for (int d : {2, 3}) {
      EXPECT_EQ(t[d].bytesD2H, 0) << d;
      EXPECT_GT(t[d].bytesH2D, 0) << d;
    }
  }
}

TEST(PipelineMemory, OutOfMemoryNamesDeviceStopsWorkersAndKeepsOomInfo) {
  // gpipe: device 0 runs F0.0..F0.3 before any gradient can come back into its memory,
  // so the refused allocation is always a stash of F0.1 (no race with comm buffers).
  auto cfg = makeConfig(wideMlp(), "gpipe", 2, 4, "keep", 64);
  int64_t stash0 = 0;
  {
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(1));
    e.step(makeBatch(*model, 64, 5, 1));
    stash0 = e.stashBytesPerMicrobatch()[0];
  }
  ASSERT_GT(stash0, 0);
  auto model = buildSeeded(cfg.model);
  runtime::PipelineEngine e(*model, cfg, quietOptions(1));
  // Room for the weights, grads and this batch's inputs, and 1.5 of the 4 stashes that
  // gpipe keeps on device 0.
  auto batch = makeBatch(*model, 64, 5, 1);
  auto* dom = memory::findDomain("cpu:0");
  ASSERT_NE(dom, nullptr);
  const int64_t inputBytes = batch.input.numel() * 4;
  const int64_t capacity = dom->liveBytes() + inputBytes + stash0 * 3 / 2;
  dom->setCapacity(capacity);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    e.step(batch);
    dom->setCapacity(memory::kUnlimited);
    FAIL() << "expected an OutOfMemoryError";
  } catch (const OutOfMemoryError& err) {
    dom->setCapacity(memory::kUnlimited);
    const OomInfo& info = err.info();
    EXPECT_EQ(info.domain, "cpu:0");
    EXPECT_EQ(info.capacity, capacity);
    EXPECT_GT(info.requested, 0);
    EXPECT_GT(info.live + info.requested, capacity);
    EXPECT_EQ(info.category, MemoryCategory::Stash);
    EXPECT_GT(info.live_by_category[index(MemoryCategory::Stash)], 0);
    EXPECT_GT(info.live_by_category[index(MemoryCategory::Weights)], 0);
    EXPECT_FALSE(info.hint.empty());
    const std::string what = err.what();
    EXPECT_NE(what.find("out of memory on cpu:0"), std::string::npos) << what;
    // The grid marks the failing action: the second or third forward on device 0. Which
    // one depends on how soon device 1 has taken the sent activations off device 0's
    // comm buffers, a matter of thread timing (seen: F0.2 under CPU load).
    const bool marksF01 = what.find("at action F0.1 ") != std::string::npos &&
                          what.find("[*F0.1*]") != std::string::npos;
    const bool marksF02 = what.find("at action F0.2 ") != std::string::npos &&
                          what.find("[*F0.2*]") != std::string::npos;
    EXPECT_TRUE(marksF01 || marksF02) << what;
    EXPECT_TRUE(memory::findOutOfMemory(std::make_exception_ptr(err)).has_value());
    auto* p = dynamic_cast<const runtime::PipelineOutOfMemoryError*>(&err);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->device(), 0);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
  // Every worker has stopped: the engine refuses to go on, and its destructor returns.
  EXPECT_THROW(e.step(batch), std::logic_error);
}

namespace {

// Note [Asynchronous reference]
// The weight semantics of the asynchronous schedules, computed on one device from their
// definition rather than from the schedule:
//  * pipedream: one update per microbatch. Stage s of a pipeline of S stages runs
//    F(s,m) on the version after m-(S-s-1) updates (its 1F1B warm-up is S-s-1
//    forwards), and B(s,m) differentiates at that same stashed version;
//  * pipefb-async: one update per iteration; every forward of iteration k runs on the
//    version after k-1 updates (the forward device is one SyncWeights behind); with
//    pipeline.weight_prediction linear, on 2 W[v] - W[v-1] for that version v > 0. A
//    stage that is not split (folded PipeFB, odd S: the middle one) runs F and B on one
//    device, its STEP before its next forwards: synchronous, never predicted.
// Each update applies the gradient to the newest weights. The gradient of microbatch m
// is that of the whole model with each stage at its own version.
struct AsyncReference {
  config::Config config;
  std::shared_ptr<model::Model> model;
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::vector<torch::Tensor> params;
  std::vector<int> stageOf;                          // parameter index -> stage
  std::vector<std::vector<torch::Tensor>> versions;  // versions[u] = weights after u updates
  schedules::Placement placement;

  AsyncReference(const config::Config& c, const std::vector<runtime::StageRange>& partition)
      : config(c),
        model(buildSeeded(c.model)),
        placement(c.pipeline.placement.empty()
                      ? schedules::Placement::defaultFor(c.pipeline.schedule,
                                                         static_cast<int>(partition.size()))
                      : schedules::Placement::parse(c.pipeline.placement, "test")) {
    for (size_t s = 0; s < partition.size(); ++s)
      for (int64_t l = partition[s].first; l < partition[s].last; ++l)
        for (auto& p : model->layer(l)->parameters()) {
          params.push_back(p);
          stageOf.push_back(static_cast<int>(s));
        }
    EXPECT_EQ(params.size(), model->parameters().size());
    for (auto& p : params) p.mutable_grad() = torch::zeros_like(p);
    opt = train::makeOptimizer(c.training, params);
    snapshot();
  }
  void snapshot() {
    std::vector<torch::Tensor> v;
    for (auto& p : params) v.push_back(p.detach().clone());
    versions.push_back(std::move(v));
  }
  int versionOf(int stage, int64_t m) const {
    const int64_t S = config.pipeline.stages, M = config.pipeline.microbatches;
    if (config.pipeline.schedule == "pipedream") return std::max<int64_t>(0, m - (S - stage - 1));
    // pipefb-async: the first `lag` forwards of iteration k (all by default) run before the
    // weights of iteration k-1 arrive.
    const int64_t lag = config.pipeline.async_lag < 0 ? M : config.pipeline.async_lag;
    if (!placement.split(stage)) return m / M;
    return m % M < lag ? std::max<int64_t>(0, m / M - 1) : m / M;
  }
  // One iteration; returns the summed loss like PipelineEngine::step.
  double step(const data::Batch& b, int64_t k, int64_t total) {
    const int64_t M = config.pipeline.microbatches, n = b.input.size(0);
    const bool perMicrobatch = config.pipeline.schedule == "pipedream";
    // As the engine: auto or linear, on pipefb-async only.
    const bool predicts =
        config.pipeline.schedule == "pipefb-async" && config.pipeline.weight_prediction != "none";
    auto xs = b.input.chunk(M, 0);
    auto ts = b.target.chunk(M, 0);
    std::vector<torch::Tensor> acc;
    for (auto& p : params) acc.push_back(torch::zeros_like(p));
    double sum = 0;
    auto update = [&] {
      torch::NoGradGuard ng;
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].copy_(versions.back()[i]);
        params[i].mutable_grad().copy_(acc[i]);
        acc[i].zero_();
      }
      train::setLearningRate(*opt, train::learningRate(config.training, k, total));
      opt->step();
      snapshot();
    };
    for (int64_t j = 0; j < M; ++j) {
      const int64_t m = k * M + j;
      {
        torch::NoGradGuard ng;
        for (size_t i = 0; i < params.size(); ++i) {
          const int v = versionOf(stageOf[i], m);
          if (predicts && v > 0 && placement.split(stageOf[i]))
            params[i].copy_(2 * versions.at(v)[i] - versions.at(v - 1)[i]);
          else
            params[i].copy_(versions.at(v)[i]);
          params[i].mutable_grad().zero_();
        }
      }
      auto l = model->loss(model->forward(xs[j]), ts[j]) *
               (static_cast<double>(xs[j].size(0)) / static_cast<double>(n));
      l.backward();
      sum += l.item<double>();
      for (size_t i = 0; i < params.size(); ++i) acc[i] += params[i].grad();
      if (perMicrobatch) update();
    }
    if (!perMicrobatch) update();
    torch::NoGradGuard ng;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(versions.back()[i]);
    return sum;
  }
};

void checkAsyncSemantics(const Case& c, const std::string& sched, int S, int M,
                         const std::string& stash, const std::string& optimizer, int kIters = 4,
                         int lag = -1, const std::string& prediction = "none", bool folded = false,
                         const std::string& placement = "") {
  SCOPED_TRACE(c.name + " " + sched + (folded ? " folded " : " ") + placement + " " + stash + " " +
               optimizer + " S=" + std::to_string(S) + " M=" + std::to_string(M));
  auto cfg = makeConfig(c.model, sched, S, M, stash, c.batch);
  if (folded) test::fold(cfg);
  if (!placement.empty()) test::place(cfg, placement);
  cfg.pipeline.async_lag = lag;
  cfg.pipeline.weight_prediction = prediction;
  cfg.training.optimizer = optimizer;
  if (optimizer == "adam") cfg.training.lr = 1e-3;
  auto model = buildSeeded(c.model);
  runtime::PipelineEngine engine(*model, cfg, quietOptions(kIters));
  AsyncReference ref(cfg, engine.partition());
  std::vector<data::Batch> batches;
  for (int k = 0; k < kIters; ++k)
    batches.push_back(makeBatch(*model, c.batch, c.model.num_classes, 200 + k));
  std::vector<double> want;
  for (int k = 0; k < kIters; ++k) want.push_back(ref.step(batches[k], k, kIters));
  for (int k = 0; k < kIters; ++k) {
    double got = engine.step(batches[k]);
    EXPECT_NEAR(got, want[k], 1e-5 * std::max(1.0, std::abs(want[k]))) << "loss of iteration " << k;
  }
  engine.finish();
  std::string worst;
  double e = maxRelErr(*model, *ref.model, /*grads=*/false, &worst);
  EXPECT_LE(e, 1e-5) << "weights after " << kIters << " iterations: " << worst;
  // Buffers (BatchNorm statistics) too: every forward updates them, on any version.
  auto gotState = model->stateDict(), wantState = ref.model->stateDict();
  ASSERT_EQ(gotState.size(), wantState.size());
  for (size_t i = 0; i < gotState.size(); ++i)
    EXPECT_LE(relErr(gotState[i].second.to(torch::kDouble), wantState[i].second.to(torch::kDouble)),
              1e-5)
        << gotState[i].first;
}

}  // namespace

// The asynchronous schedules follow their weight semantics exactly (Note [Asynchronous
// reference]), under every stash policy and both optimizers.
TEST(PipelineAsync, WeightsFollowTheAsynchronousSemantics) {
  const Case mlp{"mlp", mlpOptions(), 12};
  for (const std::string sched : {"pipedream", "pipefb-async"})
    for (const std::string stash : {"keep", "checkpoint", "offload", "checkpoint-offload"})
      for (const std::string opt : {"sgd", "adam"}) {
        checkAsyncSemantics(mlp, sched, 2, 3, stash, opt);
        checkAsyncSemantics(mlp, sched, 4, 2, stash, opt);
      }
  checkAsyncSemantics({"vgg16", visionOptions("vgg16"), 4}, "pipedream", 3, 2, "keep", "adam");
  checkAsyncSemantics({"vgg16", visionOptions("vgg16"), 4}, "pipefb-async", 3, 2, "checkpoint",
                      "adam");
  checkAsyncSemantics({"vgg16", visionOptions("vgg16"), 8}, "pipefb-async", 2, 4, "keep", "adam",
                      12);
  // pipeline.async_lag: the first microbatch of each iteration one version behind, the
  // rest current.
  for (const std::string stash : {"keep", "checkpoint", "checkpoint-offload"})
    checkAsyncSemantics({"mlp", mlpOptions(), 12}, "pipefb-async", 3, 3, stash, "adam", 5, 1);
  // pipeline.weight_prediction: forwards on the linear extrapolation of the last two
  // versions, every stash kind (checkpoint kinds keep the prediction for their recompute).
  for (const std::string stash : {"keep", "checkpoint", "offload", "checkpoint-offload"})
    checkAsyncSemantics({"mlp", mlpOptions(), 12}, "pipefb-async", 2, 3, stash, "adam", 5, -1,
                        "linear");
  checkAsyncSemantics({"mlp", mlpOptions(), 12}, "pipefb-async", 3, 3, "checkpoint", "sgd", 5, 1,
                      "linear");
  // BatchNorm: forwards on weight snapshots update the stage's statistics.
  checkAsyncSemantics({"resnet50", visionOptions("resnet50"), 8}, "pipedream", 3, 2, "keep", "sgd");
}

// Folded pipefb-async (Note [Folded placements]) keeps pipefb-async's weight semantics.
TEST(PipelineAsync, FoldedPipefbAsyncFollowsTheAsynchronousSemantics) {
  const Case mlp{"mlp", mlpOptions(), 12};
  for (const std::string stash : {"keep", "checkpoint", "offload", "checkpoint-offload"})
    for (int S : {2, 3, 4}) {
      checkAsyncSemantics(mlp, "pipefb-async", S, 3, stash, "adam", 4, -1, "none", true);
      checkAsyncSemantics(mlp, "pipefb-async", S, 3, stash, "adam", 5, 1, "linear", true);
    }
}

// Decoupled pipefb-async (Note [Decoupled partitions]): every split segment's forwards
// one SyncWeights behind, as in the 2S form; a segment whose F and B share a device is
// synchronous.
TEST(PipelineAsync, DecoupledPipefbAsyncFollowsTheAsynchronousSemantics) {
  const Case mlp{"mlp", mlpOptions(), 12};
  for (const std::string stash : {"keep", "checkpoint", "offload", "checkpoint-offload"})
    for (const Layout& l : kDecoupled) {
      const int S = schedules::Placement::parse(l.placement, "test").numStages();
      checkAsyncSemantics(mlp, "pipefb-async", S, 3, stash, "adam", 4, -1, "none", false,
                          l.placement);
      checkAsyncSemantics(mlp, "pipefb-async", S, 3, stash, "adam", 5, 1, "linear", false,
                          l.placement);
    }
}

// Note [Overlapping iterations]: pipedream's step() returns once the losses are known,
// but the next iteration's inputs reach device 0 only when its list reaches that
// iteration's first forward. Device 0 is held up before B(0,0) here, long enough for the
// last stage's losses and the caller's next step(): fed then, device 0 would hold 2 new
// inputs beside the 2 that the stashes of microbatches 0 and 1 keep (the first linear
// saves its input); fed at F(0,2), at most 3 inputs are there at once.
TEST(PipelineAsync, PipedreamFeedsAnIterationWhenDeviceZeroReachesIt) {
  constexpr int S = 2, M = 2, kIters = 3;
  constexpr int64_t kBatch = 8;
  auto cfg = makeConfig(test::mlpOptions(16, {8}), "pipedream", S, M, "keep", kBatch);
  auto model = buildSeeded(cfg.model);
  auto o = quietOptions(kIters);
  std::atomic<const runtime::PipelineEngine*> engine{nullptr};
  o.beforeAction = [&](int d, int i) {
    while (!engine.load()) std::this_thread::yield();
    const schedules::Action& a = engine.load()->schedule().devices[d][i];
    if (d == 0 && a.type == schedules::ActionType::Backward && a.index == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  runtime::PipelineEngine e(*model, cfg, o);
  engine.store(&e);
  for (int k = 0; k < kIters; ++k) e.step(makeBatch(*model, kBatch, 5, 40 + k));
  e.finish();
  int64_t input = kBatch / M * static_cast<int64_t>(sizeof(float));  // one microbatch's
  for (int64_t n : model->sampleShape()) input *= n;
  const int64_t comm = e.deviceStats()[0].peakByCategory[index(MemoryCategory::CommBuffers)];
  EXPECT_GE(comm, 3 * input);  // two stashes' inputs beside the next one
  EXPECT_LT(comm, 4 * input) << "device 0 was fed an iteration before it reached it";
}

// Note [Busy seconds]: pipefb-async's STEP on a split stage waits for its forward device
// to receive the previous weights. On 2S devices (0/3 1/2) with one microbatch, cpu:2's
// STEP1.k waits for cpu:1's RW1.(k-1), which follows F1.k: held up 200 ms before each RW
// there, the STEPs wait, and the backward device's busy seconds leave that wait out.
TEST(PipelineAsync, BusySecondsLeaveOutTheStepsWaitForTheForwardDevice) {
  constexpr int S = 2, kIters = 4;
  auto cfg = makeConfig(mlpOptions(), "pipefb-async", S, 1, "offload", 8);
  test::place(cfg, "0/3 1/2");
  auto model = buildSeeded(cfg.model);
  auto o = quietOptions(kIters);
  std::atomic<const runtime::PipelineEngine*> engine{nullptr};
  o.beforeAction = [&](int d, int i) {
    while (!engine.load()) std::this_thread::yield();
    const runtime::PipelineEngine& en = *engine.load();
    if (d == en.forwardDevice(S - 1) &&
        en.schedule().devices[d][i].type == schedules::ActionType::RecvWeights)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
  };
  runtime::PipelineEngine e(*model, cfg, o);
  engine.store(&e);
  for (int k = 0; k < kIters; ++k) e.step(makeBatch(*model, 8, 5, 60 + k));
  e.finish();
  const int bd = e.backwardDevice(S - 1);
  const auto& list = e.schedule().devices[bd];
  const auto spans = e.records()[bd];
  double inside = 0, longestStep = 0;
  for (size_t j = 0; j < spans.size(); ++j) {
    if (!list[j].isCompute() && list[j].type != schedules::ActionType::Step) continue;
    inside += spans[j].seconds();
    if (list[j].type == schedules::ActionType::Step)
      longestStep = std::max(longestStep, spans[j].seconds());
  }
  ASSERT_GE(longestStep, 0.15) << "no STEP waited for the forward device";
  const double busy = e.deviceStats()[bd].busySeconds;
  EXPECT_GT(busy, 0);
  EXPECT_LT(busy, inside - 0.15);
}

TEST(PipelineAsync, PipedreamAndPipefbAsyncConverge) {
  config::Config base = makeConfig(mlpOptions(), "1f1b", 2, 4, "keep", 32);
  base.model.input_size = 8;
  base.model.num_classes = 4;
  base.model.hidden = {32, 32};
  base.data.name = "synthetic";
  base.data.synthetic_train = 1024;
  base.data.synthetic_test = 256;
  auto train = data::makeDataset(base.data, base.model, data::Split::Train, 1);
  auto test = data::makeDataset(base.data, base.model, data::Split::Test, 1);
  const int64_t iters = 80;
  auto accuracyOf = [&](const std::string& sched, const std::string& stash,
                        const std::string& placement = "") {
    auto cfg = base;
    cfg.pipeline.schedule = sched;
    cfg.pipeline.stash = stash;
    cfg.devices.count = sched.rfind("pipefb", 0) == 0 ? 4 : 2;
    if (!placement.empty()) test::place(cfg, placement);
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(iters));
    data::Loader loader(train, 32, true, 1);
    double first = 0, last = 0;
    for (int64_t k = 0; k < iters; ++k) {
      double l = e.step(loader.next());
      EXPECT_TRUE(std::isfinite(l));
      if (k < 10) first += l / 10;
      if (k >= iters - 10) last += l / 10;
    }
    e.finish();
    torch::NoGradGuard ng;
    std::vector<int64_t> idx(test->size());
    for (int64_t i = 0; i < test->size(); ++i) idx[i] = i;
    auto b = test->get(idx);
    double acc =
        model->forward(b.input).argmax(-1).eq(b.target).to(torch::kFloat).mean().item<double>();
    std::cout << sched << "/" << stash << (placement.empty() ? "" : " [" + placement + "]")
              << ": loss " << first << " -> " << last << ", accuracy " << acc << "\n";
    EXPECT_LT(last, first) << sched;
    return acc;
  };
  const double ref = accuracyOf("1f1b", "keep");
  EXPECT_GT(ref, 0.5);  // 4 classes: chance is 0.25
  for (const std::string stash : {"keep", "checkpoint", "offload", "checkpoint-offload"}) {
    EXPECT_GT(accuracyOf("pipedream", stash), ref - 0.1) << stash;
    EXPECT_GT(accuracyOf("pipefb-async", stash), ref - 0.1) << stash;
    // Decoupled (Note [Decoupled partitions]): one forward device feeds two backward ones.
    EXPECT_GT(accuracyOf("pipefb-async", stash, "0/1 0/2"), ref - 0.1) << stash;
  }
}

#include "pipefb/train/Trainer.h"

TEST(TrainerPipeline, ScheduleMatchesSingleDeviceAndWritesTrace) {
  auto cfgFor = [](const std::string& sched, const std::string& dir) {
    std::vector<std::string> sets = {"output.dir=" + dir,         "output.progress=false",
                                     "training.iterations=5",     "training.eval=false",
                                     "training.checkpoint=false", "pipeline.microbatches=4"};
    if (sched != "none") {
      sets.push_back("pipeline.schedule=" + sched);
      sets.push_back("devices.count=" + std::string(sched == "pipefb-sync" ? "4" : "2"));
      sets.push_back("pipeline.stash=checkpoint");
    }
    return config::loadConfig(std::string(PIPEFB_SOURCE_DIR) + "/configs/mlp-tiny.yaml", sets);
  };
  const fs::path root = test::scratchPath("runtime_trainer");
  fs::remove_all(root);
  train::Trainer ref(cfgFor("none", (root / "none").string()));
  ref.run();
  for (const std::string sched : {"1f1b", "pipefb-sync"}) {
    SCOPED_TRACE(sched);
    const fs::path dir = root / sched;
    train::Trainer t(cfgFor(sched, dir.string()));
    ASSERT_NE(t.pipeline(), nullptr);
    t.run();
    std::string worst;
    EXPECT_LE(maxRelErr(t.model(), ref.model(), false, &worst), 1e-5) << worst;

    std::ifstream tf(dir / "trace.json");
    ASSERT_TRUE(tf.good());
    auto trace = nlohmann::json::parse(tf);
    std::set<int> pids;
    int counters = 0, spans = 0;
    for (const auto& ev : trace["traceEvents"]) {
      if (ev["ph"] == "X") {
        pids.insert(ev["pid"].get<int>());
        if (ev["tid"] == 0) ++spans;  // the compute track; tid 1 is the copy engine
        EXPECT_GE(ev["dur"].get<double>(), 0.0);
      }
      if (ev["ph"] == "C") ++counters;
    }
    const int D = sched == "pipefb-sync" ? 4 : 2;
    EXPECT_EQ(static_cast<int>(pids.size()), D);  // one track per device
    EXPECT_EQ(spans, static_cast<int>(t.pipeline()->schedule().numActions()));  // one per action
    EXPECT_GT(counters, 0);

    std::ifstream sf(dir / "summary.json");
    auto summary = nlohmann::json::parse(sf);
    EXPECT_EQ(summary["devices"].size(), static_cast<size_t>(D + 1));  // + host
    EXPECT_GT(summary["devices"][0]["peak_by_category"]["weights"].get<int64_t>(), 0);
    EXPECT_GT(summary["pipeline"]["devices"][0]["category_peaks"]["stash"].get<int64_t>(), 0);
  }
}

TEST(PipelineErrors, FirstWorkerErrorIsReraisedWithTheGrid) {
  auto cfg = makeConfig(mlpOptions(), "1f1b", 3, 4, "keep", 8);
  auto model = buildSeeded(cfg.model);
  auto opts = quietOptions(2);
  runtime::PipelineEngine probe(*model, cfg, opts);  // to find B1.0 on device 1
  int target = -1;
  const auto& list = probe.schedule().devices[1];
  for (int i = 0; i < static_cast<int>(list.size()); ++i)
    if (schedules::toString(list[i]) == "B1.0") target = i;
  ASSERT_GE(target, 0);
  opts.beforeAction = [target](int d, int i) {
    if (d == 1 && i == target) throw std::runtime_error("injected failure");
  };
  auto model2 = buildSeeded(cfg.model);
  runtime::PipelineEngine e(*model2, cfg, opts);
  try {
    e.step(makeBatch(*model2, 8, 5, 1));
    FAIL() << "expected a PipelineError";
  } catch (const runtime::PipelineError& err) {
    const std::string what = err.what();
    EXPECT_EQ(err.device(), 1);
    EXPECT_EQ(err.actionIndex(), target);
    EXPECT_NE(what.find("injected failure"), std::string::npos) << what;
    EXPECT_NE(what.find("[*B1.0*]"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu:1"), std::string::npos) << what;
    EXPECT_TRUE(err.cause() != nullptr);
  }
  EXPECT_THROW(e.step(makeBatch(*model2, 8, 5, 2)), std::logic_error);
}

TEST(PipelineErrors, WatchdogReportsAStall) {
  auto cfg = makeConfig(mlpOptions(), "gpipe", 2, 2, "keep", 8);
  auto model = buildSeeded(cfg.model);
  auto opts = quietOptions(1);
  opts.stallTimeoutSeconds = 0.3;
  opts.beforeAction = [](int d, int i) {
    if (d == 0 && i == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  };
  runtime::PipelineEngine e(*model, cfg, opts);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    e.step(makeBatch(*model, 8, 5, 1));
    FAIL() << "expected a stall";
  } catch (const runtime::PipelineError& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("stalled"), std::string::npos) << what;
    EXPECT_NE(what.find("[*"), std::string::npos) << what;  // where each device waits
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5);
}

// ------------------------------------------------------------------ issue 5: offload

namespace {
int64_t maxPeak(const runtime::PipelineEngine& e) {
  int64_t p = 0;
  auto stats = e.deviceStats();
  for (size_t d = 0; d + 1 < stats.size(); ++d) p = std::max(p, stats[d].peak);  // not the host
  return p;
}
}  // namespace

TEST(PipelineOffload, ResidentStashesFollowTheLookaheadAndCountersAreReported) {
  const int S = 3, M = 6;
  for (const std::string sched : {"1f1b", "pipefb-sync"}) {
    SCOPED_TRACE(sched);
    auto cfg = makeConfig(wideMlp(), sched, S, M, "offload", 48);
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(2));
    e.step(makeBatch(*model, 48, 5, 1));
    e.step(makeBatch(*model, 48, 5, 2));
    e.finish();
    auto perMb = e.stashBytesPerMicrobatch();
    auto atEnds = stashAtActionEnds(e);
    auto tstats = e.transferStats();
    auto stats = e.deviceStats();
    const int lookahead = static_cast<int>(cfg.pipeline.lookahead);
    for (int s = 0; s < S; ++s) {
      ASSERT_GT(perMb[s], 0);
      const auto placement = schedules::Placement::defaultFor(sched, S);
      const int f = placement.forward(s), b = placement.backward(s);
      // Note [Resident offloaded stashes]: at most lookahead + 1 near B, plus one whose D2H
      // copy may still run, where keep would hold min(S - s, M).
      // One offloaded stash: what autograd saved (the stage input included, which F's
      // device counts as a comm buffer, hence more than perMb).
      ASSERT_GT(tstats[f].offloads, 0);
      const int64_t unit = std::max(perMb[s], tstats[f].bytesD2H / tstats[f].offloads);
      if (f == b) {
        EXPECT_LE(atEnds[b], (lookahead + 2) * unit * 11 / 10) << "device " << b;
      } else {
        EXPECT_LE(atEnds[b], (lookahead + 1) * unit * 11 / 10) << "backward device " << b;
        // A PipeFB forward device: the stash leaves with OFF; the previous one may still
        // be copying out (TransferOptions::maxOffloadsInFlight = 1).
        EXPECT_LE(atEnds[f], 2 * unit * 11 / 10) << "forward device " << f;
      }
    }
    // Nothing is left behind in the host pool or on the devices as stash.
    for (auto* dom : memory::allDomains())
      if (dom->name().rfind("cpu:", 0) == 0) EXPECT_EQ(dom->liveBytes(MemoryCategory::Stash), 0);
    EXPECT_EQ(e.hostPool().liveBytes, 0);
    EXPECT_GT(e.hostPool().peakBytes, 0);
    int64_t d2h = 0, h2d = 0;
    for (const auto& t : e.transferStats()) {
      d2h += t.bytesD2H;
      h2d += t.bytesH2D;
      EXPECT_LE(t.hiddenSeconds, t.copySeconds + 1e-9);
    }
    EXPECT_GT(d2h, 0);
    EXPECT_EQ(d2h, h2d);
    auto j = nlohmann::json::parse(e.summaryJson());
    ASSERT_TRUE(j.contains("transfers"));
    EXPECT_EQ(j["transfers"].size(), static_cast<size_t>(e.numDevices()));
    EXPECT_TRUE(j["transfers"][0].contains("overlap_pct"));
    EXPECT_TRUE(j["transfers"][0].contains("stall_seconds"));
    EXPECT_GT(j["host_pool"]["peak_bytes"].get<int64_t>(), 0);
  }
}

// Issue 5, "a budget that only offload can meet": with devices.memory below the peak of
// 1f1b-keep, 1f1b-keep fails with OutOfMemoryError while pipefb-sync with offload trains
// (and still matches single-device training).
TEST(PipelineOffload, ABudgetOnlyOffloadCanMeet) {
  // Activations must outweigh the classifier's weights, grads and optimizer state
  // (the stage that holds them is the same in both schedules).
  const int S = 4, M = 8;
  const int64_t batch = 256;
  auto opts = visionOptions("vgg16");
  auto peakOf = [&](const std::string& sched, const std::string& stash) {
    auto cfg = makeConfig(opts, sched, S, M, stash, batch);
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(2));
    e.step(makeBatch(*model, batch, 10, 1));
    e.step(makeBatch(*model, batch, 10, 2));
    e.finish();
    return maxPeak(e);
  };
  const int64_t keep = peakOf("1f1b", "keep");
  const int64_t fb = peakOf("pipefb-sync", "offload");
  std::cout << "peak device memory: 1f1b-keep " << keep << " B, pipefb-sync-offload " << fb
            << " B (" << 100.0 * fb / keep << "%)\n";
  ASSERT_LT(fb * 5 / 4, keep) << "the model does not separate the two policies";
  const int64_t budget = (fb * 5 / 4 + keep) / 2;

  {
    auto cfg = makeConfig(opts, "1f1b", S, M, "keep", batch);
    cfg.devices.memory = budget;
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(2));
    EXPECT_THROW(
        {
          e.step(makeBatch(*model, batch, 10, 1));
          e.step(makeBatch(*model, batch, 10, 2));
        },
        OutOfMemoryError);
  }
  {
    auto cfg = makeConfig(opts, "pipefb-sync", S, M, "offload", batch);
    cfg.devices.memory = budget;
    Reference ref(cfg);
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(2));
    for (uint64_t k = 0; k < 2; ++k) {
      auto b = makeBatch(*model, batch, 10, 1 + k);
      const double want = ref.step(b, 2);
      EXPECT_NEAR(e.step(b), want, 1e-5 * std::max(1.0, std::abs(want)));
    }
    e.finish();
    EXPECT_LE(maxPeak(e), budget);
  }
  for (int d = 0; d < 2 * S; ++d)
    memory::configureDomain(memory::virtualDeviceName(d), memory::kUnlimited);
}

// Note [Dropout streams]: with dropout, B's recompute (checkpoint) draws the masks its
// forward drew, so every stash policy gives the gradients of `keep`; and the masks do not
// depend on thread timing, so two runs agree bitwise.
TEST(PipelineDropout, RecomputeDrawsTheForwardsMasks) {
  auto opts = visionOptions("vgg16");
  opts.dropout = 0.5;
  auto gradsOf = [&](const std::string& sched, const std::string& stash) {
    auto cfg = makeConfig(opts, sched, 3, 2, stash, 4);
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine e(*model, cfg, quietOptions(1));
    e.step(makeBatch(*model, 4, 10, 5));
    e.finish();
    return model;
  };
  for (const std::string sched : {"1f1b", "pipefb-sync"}) {
    auto keep = gradsOf(sched, "keep");
    auto again = gradsOf(sched, "keep");
    std::string worst;
    EXPECT_EQ(maxRelErr(*again, *keep, /*grads=*/true, &worst), 0) << sched << ": " << worst;
    for (const std::string stash : {"checkpoint", "checkpoint-offload", "offload"}) {
      auto other = gradsOf(sched, stash);
      EXPECT_LE(maxRelErr(*other, *keep, /*grads=*/true, &worst), 1e-5)
          << sched << " " << stash << ": " << worst;
    }
  }
  // The masks are drawn: a model with dropout does not give the gradients of one without.
  auto noDrop = visionOptions("vgg16");
  auto cfg = makeConfig(noDrop, "1f1b", 3, 2, "keep", 4);
  auto plain = buildSeeded(noDrop);
  runtime::PipelineEngine e(*plain, cfg, quietOptions(1));
  e.step(makeBatch(*plain, 4, 10, 5));
  e.finish();
  std::string worst;
  EXPECT_GT(maxRelErr(*plain, *gradsOf("1f1b", "keep"), /*grads=*/true, &worst), 1e-3);
}

// pipeline.placement and a per-stage pipeline.lookahead: the engine runs the placement it
// is given, each stage keeps at most its own lookahead + 1 stashes near B, and the
// gradients are still those of single-device training.
TEST(PipelineOffload, PlacementAndPerStageLookaheadFromTheConfig) {
  const int S = 3, M = 6;
  auto cfg = makeConfig(wideMlp(), "pipefb-sync", S, M, "offload", 48);
  cfg.pipeline.placement = "0/4 1/5 2/3";
  cfg.pipeline.stage_lookahead = {0, 2, 1};
  cfg.pipeline.lookahead = 2;
  Reference ref(cfg);
  auto model = buildSeeded(cfg.model);
  runtime::PipelineEngine e(*model, cfg, quietOptions(1));
  EXPECT_EQ(e.schedule().placement.toString(), "0/4 1/5 2/3");
  auto batch = makeBatch(*model, 48, 5, 1);
  ref.step(batch, 1);
  e.step(batch);
  e.finish();
  std::string worst;
  EXPECT_LE(maxRelErr(*model, *ref.model, /*grads=*/true, &worst), 1e-5) << worst;
  auto perMb = e.stashBytesPerMicrobatch();
  auto atEnds = stashAtActionEnds(e);
  auto tstats = e.transferStats();
  const int backward[] = {4, 5, 3};
  for (int s = 0; s < S; ++s) {
    const int la = static_cast<int>(cfg.pipeline.stage_lookahead[s]);
    EXPECT_EQ(e.contract().residentBackward[s], std::min(e.contract().inFlight[s], la + 1));
    ASSERT_GT(tstats[s].offloads, 0);
    const int64_t unit = std::max(perMb[s], tstats[s].bytesD2H / tstats[s].offloads);
    EXPECT_LE(atEnds[backward[s]], (la + 1) * unit * 11 / 10) << "stage " << s;
  }
  // A bad placement names the key. (Device 0 running the forwards of stages 0 and 1 is a
  // decoupled placement now, Note [Decoupled partitions]; of stages 0 and 2 without 1 is
  // not.)
  cfg.pipeline.placement = "0/4 1/5 0/3";
  auto again = buildSeeded(cfg.model);
  try {
    runtime::PipelineEngine bad(*again, cfg, quietOptions(1));
    FAIL() << "expected a UserError";
  } catch (const UserError& err) {
    EXPECT_NE(std::string(err.what()).find("pipeline.placement"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("device 0 runs the forward of stages 0 and 2"),
              std::string::npos)
        << err.what();
  }
}
