// The planner inside pipefb_train: plan files applied to configs, and the planner's
// partition for a configured shape (TrainPlan.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

#include "pipefb/common/Error.h"
#include "pipefb/planner/ConfigPartition.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/TrainPlan.h"

namespace pipefb::planner {
namespace {

const char* kVgg = R"(
model: {name: vgg16, width: 0.25, input_size: 32, channels: 1, num_classes: 10}
training: {batch: 32}
devices: {count: 4}
pipeline: {schedule: 1f1b, microbatches: 4}
)";

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// A plan from the solver, written and read back, sets the config's pipeline.
Plan solvedPlan(const config::Config& cfg, const std::string& family, std::string* yaml,
                bool folded = false, OptimizerOffload opt = OptimizerOffload::None,
                bool decoupled = false) {
  Planning pl = setupPlanning(cfg, SetupOptions{});
  SolverOptions o = pl.solver;
  o.schedules = parseScheduleFamilies({family});
  o.simulateTop = 0;
  o.foldedPlacements = folded;
  o.decoupledPlacements = decoupled;
  o.optimizerOffload = opt;
  SolveResult r = solve(*pl.model, o);
  EXPECT_TRUE(r.feasible);
  *yaml = planToYaml(*pl.model, r.best, PlanContext{cfg.source, pl.model->profile().model});
  return r.best;
}

TEST(TrainPlan, RoundTripSetsThePipeline) {
  for (const char* family : {"1f1b-keep", "pipefb-sync-offload", "pipedream-checkpoint"}) {
    config::Config cfg = config::parseConfig(kVgg);
    std::string yaml;
    Plan plan = solvedPlan(cfg, family, &yaml);
    PlanSpec spec = parsePlan(yaml, "plan.yaml");
    EXPECT_FALSE(spec.overrides.empty());
    applyPlan(cfg, spec, "plan.yaml");
    EXPECT_EQ(cfg.pipeline.schedule, toString(plan.shape.kind)) << family;
    EXPECT_EQ(cfg.pipeline.stages, plan.shape.stages);
    EXPECT_EQ(cfg.pipeline.microbatches, plan.shape.microbatches);
    EXPECT_EQ(cfg.devices.count, plan.shape.chainLength());
    EXPECT_EQ(cfg.pipeline.partition, spec.partition());
    // Note [Plan policies in the runtime]: the plan's policy as it is (no renaming).
    const std::string want = std::string(family) == "1f1b-keep"             ? "keep"
                             : std::string(family) == "pipefb-sync-offload" ? "offload"
                                                                            : "checkpoint";
    EXPECT_EQ(cfg.pipeline.stash, want) << family;
  }
}

// Note [Folded placements]: a folded plan reads back as the same plan, and sets the
// config's placement and devices (S stages on S devices) for pipefb_train to run it.
TEST(TrainPlan, FoldedPlanReadsBackAndSetsThePlacement) {
  config::Config cfg = config::parseConfig(kVgg);
  std::string yaml;
  Plan plan = solvedPlan(cfg, "pipefb-sync-offload", &yaml, /*folded=*/true);
  ASSERT_TRUE(plan.shape.folded) << yaml;
  EXPECT_EQ(plan.shape.chainLength(), plan.shape.stages);
  EXPECT_NE(yaml.find("pipeline.placement=0/3 1/2 2/1 3/0"), std::string::npos) << yaml;
  PlanSpec spec = parsePlan(yaml, "plan.yaml");
  EXPECT_TRUE(spec.folded());
  Planning pl = setupPlanning(cfg, SetupOptions{});
  const Plan back = planFromSpec(*pl.model, spec);
  EXPECT_TRUE(back.shape.folded);
  EXPECT_DOUBLE_EQ(back.iterationTime, plan.iterationTime);
  EXPECT_EQ(back.deviceMemory, plan.deviceMemory);
  applyPlan(cfg, spec, "plan.yaml");
  EXPECT_EQ(cfg.pipeline.placement, "0/3 1/2 2/1 3/0");
  EXPECT_EQ(cfg.devices.count, 4);
  EXPECT_EQ(config::pipelineStages(cfg), 4);
  // The 2S-device form keeps the schedule's default placement.
  config::Config twoS = config::parseConfig(kVgg);
  solvedPlan(twoS, "pipefb-sync-offload", &yaml);
  applyPlan(twoS, parsePlan(yaml, "plan.yaml"), "plan.yaml");
  EXPECT_EQ(twoS.pipeline.placement, "");
  EXPECT_EQ(twoS.devices.count, 2 * twoS.pipeline.stages);
}

// Note [Decoupled partitions]: a plan file whose stages are the segments of decoupled
// forward and backward cuts (one forward device feeding three backward devices) reads back
// with its placement, and sets the config's placement, partition and devices.
TEST(TrainPlan, DecoupledPlanFileSetsThePlacement) {
  std::string yaml =
      "version: 1\nschedule: pipefb-sync\nmicrobatches: 4\nmicrobatch_size: 8\n"
      "batch: 32\nlayers: 16\nstages:\n";
  const std::vector<std::pair<int, int>> layers = {{0, 5}, {5, 10}, {10, 16}};
  for (int s = 0; s < 3; ++s)
    yaml += "  - layers: [" + std::to_string(layers[s].first) + ", " +
            std::to_string(layers[s].second) + "]\n    forward_device: 0\n" +
            "    backward_device: " + std::to_string(s + 1) + "\n    policy: checkpoint\n";
  const PlanSpec spec = parsePlan(yaml, "plan.yaml");
  EXPECT_EQ(spec.placement().toString(), "0/1 0/2 0/3");
  EXPECT_FALSE(spec.folded());
  config::Config cfg = config::parseConfig(kVgg);
  applyPlan(cfg, spec, "plan.yaml");
  EXPECT_EQ(cfg.pipeline.placement, "0/1 0/2 0/3");
  EXPECT_EQ(cfg.devices.count, 4);
  EXPECT_EQ(cfg.pipeline.partition, (std::vector<std::int64_t>{5, 10}));
  EXPECT_EQ(config::pipelineStages(cfg), 3);
  // A device whose backwards are not one run of consecutive stages is refused, naming it.
  std::string bad = yaml;
  bad.replace(bad.rfind("backward_device: 3"), 18, "backward_device: 1");
  EXPECT_NE(errorOf([&] {
              parsePlan(bad, "plan.yaml");
            }).find("plan.yaml: stages: device 1 runs the backward of stages 0 and 2"),
            std::string::npos)
      << errorOf([&] { parsePlan(bad, "plan.yaml"); });
}

// Note [Planner partition of a placement]: pipefb_train's planner partitions the default
// and the folded placements; a decoupled one (and a kind the planner does not model) is
// balanced by parameter bytes instead of refused for the devices of the 2S form.
TEST(TrainPlan, PlannerPartitionsDefaultAndFoldedPlacementsOnly) {
  config::Config cfg = config::parseConfig(kVgg, {"pipeline.schedule=pipefb-sync"});
  EXPECT_TRUE(plannerPartitions(cfg, 2));
  cfg.pipeline.placement = "0/3 1/2 2/1 3/0";  // folded
  EXPECT_TRUE(plannerPartitions(cfg, 4));
  cfg.pipeline.placement = "0/3 1/2";  // the default, given
  EXPECT_TRUE(plannerPartitions(cfg, 2));
  cfg.pipeline.placement = "0/1 0/2 0/3";  // one forward device feeds three backward ones
  EXPECT_FALSE(plannerPartitions(cfg, 3));
  config::Config zbv = config::parseConfig(kVgg, {"pipeline.schedule=zbv"});
  EXPECT_TRUE(plannerPartitions(zbv, 8));  // Note [Shared devices]
  config::Config looped = config::parseConfig(
      kVgg, {"pipeline.schedule=interleaved-1f1b", "pipeline.virtual_stages=4"});
  EXPECT_FALSE(plannerPartitions(looped, 8));  // v = 2 only
  looped.pipeline.virtual_stages = 2;
  EXPECT_TRUE(plannerPartitions(looped, 8));
}

// Note [The planner's whole plan in pipefb_train]: a PipeFB config that pins no shape is
// planned whole; anything pinned (placement, stages, partition, a per-stage list, another
// family) keeps the partition-only path.
TEST(TrainPlan, WholePipelineOnlyForPipeFbConfigsThatPinNoShape) {
  config::Config cfg = config::parseConfig(kVgg, {"pipeline.schedule=pipefb-sync"});
  EXPECT_TRUE(plansWholePipeline(cfg));
  EXPECT_TRUE(plansWholePipeline(config::parseConfig(kVgg, {"pipeline.schedule=pipefb-async"})));
  EXPECT_FALSE(plansWholePipeline(config::parseConfig(kVgg)));  // 1f1b
  for (const char* pin :
       {"pipeline.placement=0/3 1/2", "pipeline.stages=2", "pipeline.partition=[8]",
        "pipeline.partition_by=params", "pipeline.stash=[offload,keep]"}) {
    SCOPED_TRACE(pin);
    EXPECT_FALSE(
        plansWholePipeline(config::parseConfig(kVgg, {"pipeline.schedule=pipefb-sync", pin})));
  }
}

// The whole plan searches the partition-only plan's 2S shape among others, so it is never
// predicted slower; on the default-like VGG16 (4 devices, M = 4) pipefb-sync's is not the 2S
// shape; and it keeps the config's schedule, microbatches and stash policy.
TEST(TrainPlan, WholePipelineIsNoSlowerThanTheConfigsPlacement) {
  for (const char* kind : {"pipefb-sync", "pipefb-async"}) {
    SCOPED_TRACE(kind);
    config::Config cfg = config::parseConfig(
        kVgg, {std::string("pipeline.schedule=") + kind, "pipeline.stash=offload"});
    const WholePlan whole = planWholePipeline(cfg, "", cfg.source);
    ASSERT_FALSE(whole.planYaml.empty()) << whole.summary;
    const PlanSpec spec = parsePlan(whole.planYaml, "plan.yaml");
    config::Config applied = cfg;
    applyPlan(applied, spec, "plan.yaml");
    EXPECT_EQ(applied.pipeline.schedule, kind);
    EXPECT_EQ(applied.pipeline.microbatches, 4);
    EXPECT_EQ(applied.pipeline.stash, "offload");
    // pipefb-sync's 2S shape flushes with its forward devices idle half the time; pipefb-async
    // overlaps iterations, and the planner may keep 2S for it.
    if (std::string(kind) == "pipefb-sync")
      EXPECT_TRUE(spec.folded() || spec.decoupled()) << whole.summary;

    const Planning pl = setupPlanning(cfg, SetupOptions{});
    const PlannedPartition twoS = plannerPartition(*pl.model, cfg, 2);
    EXPECT_LE(spec.predictedIterationTime, twoS.plan.iterationTime * (1 + 1e-9)) << whole.summary;
  }
}

// Note [Optimizer placement search]: a plan's optimizer placement per stage goes into the
// plan file, reads back as the same plan, and becomes pipeline.optimizer_offload (one value,
// or the per-stage list); a plan file without it leaves the config's.
TEST(TrainPlan, OptimizerPlacementRoundTripsIntoTheConfig) {
  config::Config cfg = config::parseConfig(kVgg);
  std::string yaml;
  const Plan plan = solvedPlan(cfg, "1f1b-keep", &yaml, /*folded=*/false, OptimizerOffload::Host);
  ASSERT_GT(plan.stages.size(), 1u) << yaml;
  for (const auto& st : plan.stages) EXPECT_TRUE(st.optimizerOnHost);
  EXPECT_NE(yaml.find("optimizer: host"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("pipeline.optimizer_offload=host"), std::string::npos) << yaml;
  PlanSpec spec = parsePlan(yaml, "plan.yaml");
  Planning pl = setupPlanning(cfg, SetupOptions{});
  const Plan back = planFromSpec(*pl.model, spec);
  EXPECT_EQ(back.deviceMemory, plan.deviceMemory);
  EXPECT_EQ(back.hostBytes, plan.hostBytes);
  config::Config applied = cfg;
  applyPlan(applied, spec, "plan.yaml");
  EXPECT_EQ(applied.pipeline.optimizer_offload, "host");
  EXPECT_TRUE(applied.pipeline.stage_optimizer_offload.empty());
  PlanSpec mixed = spec;
  mixed.stages[0].optimizerOnHost = false;
  applied = cfg;
  applyPlan(applied, mixed, "plan.yaml");
  EXPECT_EQ(applied.pipeline.optimizer_offload, "host");
  ASSERT_EQ(applied.pipeline.stage_optimizer_offload.size(), mixed.stages.size());
  EXPECT_EQ(applied.pipeline.stage_optimizer_offload[0], "none");
  EXPECT_EQ(applied.pipeline.stage_optimizer_offload[1], "host");
  // A plan written before plans carried the placement keeps the config's.
  const std::string old = std::regex_replace(yaml, std::regex("\n    optimizer: [a-z]+[^\n]*"), "");
  config::Config host = config::parseConfig(kVgg, {"pipeline.optimizer_offload=host"});
  applyPlan(host, parsePlan(old, "old.yaml"), "old.yaml");
  EXPECT_EQ(host.pipeline.optimizer_offload, "host");
  const std::string bad = std::regex_replace(yaml, std::regex("optimizer: host"), "optimizer: gpu");
  EXPECT_NE(errorOf([&] { parsePlan(bad, "p.yaml"); }).find("allowed: device | host"),
            std::string::npos);
}

TEST(TrainPlan, RefusesOtherModelsAndAppliesMixedPolicies) {
  config::Config cfg = config::parseConfig(kVgg);
  std::string yaml;
  solvedPlan(cfg, "1f1b-keep", &yaml);
  PlanSpec spec = parsePlan(yaml, "plan.yaml");
  config::Config other = config::parseConfig(std::string(kVgg) + "\n", {"model.width=0.5"});
  EXPECT_NE(errorOf([&] { applyPlan(other, spec, "plan.yaml"); }).find("is for 'vgg16 width=0.25"),
            std::string::npos);
  PlanSpec fewer = spec;
  fewer.numLayers -= 1;
  EXPECT_NE(errorOf([&] { applyPlan(cfg, fewer, "plan.yaml"); }).find("layers"), std::string::npos);
  config::Config batch = config::parseConfig(kVgg, {"training.batch=64"});
  EXPECT_NE(errorOf([&] { applyPlan(batch, spec, "plan.yaml"); }).find("training.batch"),
            std::string::npos);
  PlanSpec mixed = spec;
  if (mixed.stages.size() > 1) {
    mixed.stages[1].policy = StashPolicy::Checkpoint;
    config::Config applied = cfg;
    applyPlan(applied, mixed, "plan.yaml");  // Note [Plan policies in the runtime]
    ASSERT_EQ(applied.pipeline.stage_stash.size(), mixed.stages.size());
    for (size_t k = 0; k < mixed.stages.size(); ++k)
      EXPECT_EQ(applied.pipeline.stage_stash[k], toString(mixed.stages[k].policy)) << k;
  }
  EXPECT_NE(errorOf([] { parsePlan("just text", "p.yaml"); }).find("not a plan file"),
            std::string::npos);
  EXPECT_NE(errorOf([] { parsePlan("version: 1\nschedule: [", "p.yaml"); }).find("p.yaml"),
            std::string::npos);
}

TEST(TrainPlan, PlannerPartitionBalancesTimeNotParameters) {
  config::Config cfg = config::parseConfig(kVgg);
  Planning pl = setupPlanning(cfg, SetupOptions{});
  PlannedPartition p = plannerPartition(*pl.model, cfg, 4);
  ASSERT_EQ(p.cuts.size(), 3u);
  EXPECT_TRUE(p.withinLimits);
  // The planner's cuts are the optimum for this one shape: every other partition into 4
  // stages (455 for VGG16's 16 layers) is no faster under the same cost model. (The
  // runtime's parameter balance is one of them.)
  const int L = pl.model->numLayers();
  int tried = 0;
  for (int a = 1; a < L; ++a)
    for (int b = a + 1; b < L; ++b)
      for (int c = b + 1; c < L; ++c) {
        Plan q = p.plan;
        const int cuts[5] = {0, a, b, c, L};
        for (int k = 0; k < 4; ++k) {
          q.stages[k].first = cuts[k];
          q.stages[k].last = cuts[k + 1];
        }
        evaluatePlan(*pl.model, q);
        EXPECT_LE(p.plan.iterationTime, q.iterationTime * (1 + 1e-9)) << rangesText(q);
        ++tried;
      }
  EXPECT_EQ(tried, 455);
}

// pipeline.stash as a list: pipefb_train's partition is planned for each stage's own
// policy (not the first stage's for all), and is the best partition for them.
TEST(TrainPlan, PlannerPartitionKeepsEachStagesPolicy) {
  config::Config cfg = config::parseConfig(kVgg);
  cfg.pipeline.stage_stash = {"checkpoint", "keep", "offload"};
  cfg.pipeline.stash = "checkpoint";
  Planning pl = setupPlanning(cfg, SetupOptions{});
  PlannedPartition p = plannerPartition(*pl.model, cfg, 3);
  ASSERT_EQ(p.plan.stages.size(), 3u);
  EXPECT_EQ(p.plan.stages[0].policy, StashPolicy::Checkpoint);
  EXPECT_EQ(p.plan.stages[1].policy, StashPolicy::Keep);
  EXPECT_EQ(p.plan.stages[2].policy, StashPolicy::Offload);
  const int L = pl.model->numLayers();
  for (int a = 1; a < L; ++a)
    for (int b = a + 1; b < L; ++b) {
      Plan q = p.plan;
      const int cuts[4] = {0, a, b, L};
      for (int k = 0; k < 3; ++k) {
        q.stages[k].first = cuts[k];
        q.stages[k].last = cuts[k + 1];
      }
      evaluatePlan(*pl.model, q);
      EXPECT_LE(p.plan.iterationTime, q.iterationTime * (1 + 1e-9)) << rangesText(q);
    }
  cfg.pipeline.stage_stash = {"keep", "keep"};
  EXPECT_NE(errorOf([&] {
              plannerPartition(*pl.model, cfg, 3);
            }).find("pipeline.stash: 2 values for 3 stages"),
            std::string::npos);
}

// Note [Devices and processes]: under WORLD_SIZE > 1 (pipefb_launch, torchrun) the
// config-derived cluster has a process per device, so pipefb_train's planner partition
// refuses a graph stash on a stage split across processes, and plans checkpoint-offload.
TEST(TrainPlan, MultiProcessRunsPlanWithAProcessPerDevice) {
  config::Config cfg = config::parseConfig(kVgg);
  cfg.pipeline.schedule = "pipefb-sync";
  cfg.pipeline.stash = "keep";
  const char* old = std::getenv("WORLD_SIZE");
  const std::string saved = old ? old : "";
  ::unsetenv("WORLD_SIZE");
  {
    Planning one = setupPlanning(cfg, SetupOptions{});
    EXPECT_TRUE(one.model->cluster().sameProcess(0, 3));
    EXPECT_EQ(plannerPartition(*one.model, cfg, 2).cuts.size(), 1u);
  }
  ::setenv("WORLD_SIZE", "4", 1);
  Planning many = setupPlanning(cfg, SetupOptions{});
  SetupOptions forced;
  forced.processes = "one";
  Planning forcedOne = setupPlanning(cfg, forced);
  if (old)
    ::setenv("WORLD_SIZE", saved.c_str(), 1);
  else
    ::unsetenv("WORLD_SIZE");
  EXPECT_FALSE(many.model->cluster().sameProcess(0, 3));
  EXPECT_TRUE(forcedOne.model->cluster().sameProcess(0, 3));
  const std::string e = errorOf([&] { plannerPartition(*many.model, cfg, 2); });
  EXPECT_NE(e.find("pipeline.stash: keep cannot cross processes: stage 0 runs F on rank 0 and B "
                   "on rank 3"),
            std::string::npos)
      << e;
  cfg.pipeline.stash = "checkpoint-offload";
  PlannedPartition p = plannerPartition(*many.model, cfg, 2);
  for (const auto& st : p.plan.stages) EXPECT_EQ(st.policy, StashPolicy::CheckpointOffload);
}

// Note [Replicated pipelines]: a plan with replicas writes them, reads them back (same
// predicted time) and sets pipeline.replicas; pipefb_plan --max-replicas searches them.
TEST(TrainPlan, ReplicasRoundTripIntoTheConfig) {
  config::Config cfg = config::parseConfig(kVgg);
  SetupOptions setup;
  setup.cores = 0;  // devices that do not share cores: replicas may be tried
  Planning pl = setupPlanning(cfg, setup);
  SolverOptions o = pl.solver;
  o.schedules = parseScheduleFamilies({"1f1b-keep"});
  o.simulateTop = 0;
  o.maxReplicas = 1;
  o.maxStages = 2;
  o.microbatches = 4;
  SolveResult r = solve(*pl.model, o);
  ASSERT_TRUE(r.feasible);
  Plan q = r.best;  // the same pipeline, twice, each on half the batch
  q.shape.replicas = 2;
  q.shape.microbatchSize /= 2;
  ASSERT_EQ(q.shape.microbatchSize * q.shape.microbatches * 2, cfg.training.batch);
  evaluatePlan(*pl.model, q);
  EXPECT_GT(q.stages[0].estimate.allReduceTime, 0);
  const std::string yaml =
      planToYaml(*pl.model, q, PlanContext{cfg.source, pl.model->profile().model});
  EXPECT_NE(yaml.find("replicas: 2"), std::string::npos) << yaml;
  PlanSpec spec = parsePlan(yaml, "plan.yaml");
  EXPECT_EQ(spec.replicas, 2);
  EXPECT_EQ(spec.batch, cfg.training.batch);
  EXPECT_DOUBLE_EQ(planFromSpec(*pl.model, spec).iterationTime, q.iterationTime);
  applyPlan(cfg, spec, "plan.yaml");
  EXPECT_EQ(cfg.pipeline.replicas, 2);
  EXPECT_EQ(cfg.devices.count, q.shape.chainLength());  // one replica's devices
  // A replicated plan whose batch is not replicas x microbatches x size is refused.
  const std::string bad = std::regex_replace(yaml, std::regex("replicas: 2"), "replicas: 3");
  EXPECT_NE(errorOf([&] {
              parsePlan(bad, "plan.yaml");
            }).find("batch must equal microbatches x microbatch_size x replicas"),
            std::string::npos);
}

// Seen under fuzz/PlanFuzzer (UBSan) while writing it: microbatches x microbatch_size overflowed
// int64 (UB) before the batch check.
TEST(TrainPlan, PlanFileBatchOverflowIsAUserError) {
  EXPECT_NE(errorOf([] {
              parsePlan(
                  "version: 1\nschedule: 1f1b\nmicrobatches: 4\n"
                  "microbatch_size: 4611686018427387904\nbatch: 0\nlayers: 1\nstages: []\n",
                  "p.yaml");
            }).find("batch must equal microbatches x microbatch_size"),
            std::string::npos);
}

}  // namespace
}  // namespace pipefb::planner
