// Everything the planner can choose, the runtime runs (issue 15): per-stage stash
// policies and per-device capacities, from the config through runtime::resolvePlan into
// the engine (Note [The plan is the program], Note [Plan policies in the runtime]).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "EngineRun.h"
#include "PipelineConfig.h"
#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/TrainPlan.h"
#include "pipefb/runtime/ResolvePlan.h"

using namespace pipefb;

namespace {

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new test::TrackingAllocatorEnv);

const std::vector<std::string> kMixed = {"checkpoint", "offload", "keep", "checkpoint-offload"};

config::Config mlpConfig(const std::string& schedule, const std::vector<std::string>& stash) {
  auto c = test::pipelineConfig(test::mlpOptions(6, {24, 20, 16}), schedule, 4, 4, stash[0], 16);
  if (stash.size() > 1) c.pipeline.stage_stash = stash;
  c.training.deterministic = true;
  return c;
}

// Per parameter: max |a - b| / max |b|.
double worstRelativeDifference(const model::Model& got, const model::Model& want,
                               std::string* which) {
  const auto g = got.namedParameters(), w = want.namedParameters();
  EXPECT_EQ(g.size(), w.size());
  double worst = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    const double scale = w[i].second.abs().max().item<double>();
    const double diff = (g[i].second - w[i].second).abs().max().item<double>();
    const double r = scale > 0 ? diff / scale : diff;
    if (r >= worst) {
      worst = r;
      *which = g[i].first;
    }
  }
  return worst;
}

}  // namespace

TEST(MixedPlan, ConfigListsResolveToPerStagePoliciesAndPerDeviceCapacities) {
  const auto c = config::parseConfig(
      "model: {name: mlp, hidden: [24, 20, 16], input_size: 6}\n"
      "training: {batch: 16}\n"
      "devices: {count: 4, memory: [64MiB, 32MiB, unlimited, 16MiB], host_memory: 1GiB}\n"
      "pipeline: {schedule: 1f1b, microbatches: 4,\n"
      "           stash: [checkpoint, offload, keep, checkpoint-offload]}\n");
  EXPECT_EQ(c.pipeline.stage_stash, kMixed);
  EXPECT_EQ(c.devices.memory, 16LL << 20);  // the smallest, for one-device readers
  // The list survives the resolved config's round trip.
  EXPECT_EQ(config::parseConfig(config::toYaml(c)).pipeline.stage_stash, kMixed);
  EXPECT_EQ(config::parseConfig(config::toYaml(c)).devices.device_memory, c.devices.device_memory);

  runtime::ModelLayers layers{"mlp", {1, 1, 1, 1}};
  const auto plan = runtime::resolvePlan(c, layers, 2);
  ASSERT_EQ(plan.numStages(), 4);
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(schedules::toString(plan.stages[s].stash), kMixed[s]) << "stage " << s;
  EXPECT_EQ(plan.deviceCapacity,
            (std::vector<int64_t>{64LL << 20, 32LL << 20, schedules::kNoLimit, 16LL << 20}));
  EXPECT_EQ(plan.hostCapacity, 1LL << 30);
  EXPECT_EQ(plan.stashText(), "checkpoint,offload,keep,checkpoint-offload");
  // Lowered with each stage's own policy: only the offloaded stages (1, 3) have OFF actions.
  std::vector<int> offloads(4, 0);
  for (const auto& list : plan.lowered.schedule.devices)
    for (const auto& a : list)
      if (a.type == schedules::ActionType::Offload && a.stash == schedules::StashKind::Activation)
        ++offloads[a.stage];
  EXPECT_EQ(offloads, (std::vector<int>{0, 8, 0, 8}));
}

TEST(MixedPlan, WrongListLengthsAreUserErrorsNamingTheKey) {
  const std::string base =
      "model: {name: mlp, hidden: [24, 20, 16], input_size: 6}\ntraining: {batch: 16}\n";
  try {
    config::parseConfig(base +
                        "devices: {count: 4}\npipeline: {schedule: 1f1b, microbatches: 4, "
                        "stash: [keep, offload]}\n");
    FAIL() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.stash: 2 values for 4 stages"),
              std::string::npos)
        << e.what();
  }
  try {
    config::parseConfig(base +
                        "devices: {count: 4, memory: [1GiB, 1GiB, 1GiB]}\n"
                        "pipeline: {schedule: 1f1b, microbatches: 4}\n");
    FAIL() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("devices.memory: 3 values for 4 devices"),
              std::string::npos)
        << e.what();
  }
}

TEST(MixedPlan, PerDeviceCapacitiesConfigureEachDomain) {
  auto c = mlpConfig("1f1b", {"keep"});
  c.devices.device_memory = {256LL << 20, 128LL << 20, 64LL << 20, 32LL << 20};
  const auto r = test::trainEngine(c, 1);
  const auto stats = r.engine->deviceStats();
  for (int d = 0; d < 4; ++d) EXPECT_EQ(stats[d].capacity, *c.devices.device_memory[d]) << d;
}

// The goal: a mixed plan gives the same weights as a uniform keep plan with
// training.deterministic (relative difference <= 1e-5 per parameter), on every schedule.
TEST(MixedPlan, MixedStashGivesTheWeightsOfUniformKeep) {
  for (const auto& row : schedules::scheduleKinds()) {
    // The kinds the runtime runs: every kind without a split backward (I/W).
    if (row.splitBackward) continue;
    const std::string sched = row.name;
    SCOPED_TRACE(sched);
    const auto keep = test::trainEngine(mlpConfig(sched, {"keep"}), 3);
    const auto mixed = test::trainEngine(mlpConfig(sched, kMixed), 3);
    EXPECT_EQ(mixed.engine->plan().stashText(), "checkpoint,offload,keep,checkpoint-offload");
    std::string which;
    EXPECT_LE(worstRelativeDifference(*mixed.model, *keep.model, &which), 1e-5) << which;
    for (size_t k = 0; k < keep.losses.size(); ++k)
      EXPECT_NEAR(mixed.losses[k], keep.losses[k], 1e-5 * std::max(1.0, std::abs(keep.losses[k])));
  }
}

// Note [The plan is the program]: the planner's plan reaches the engine without loss. A
// solved plan, written as a plan file, read back, applied to the config (applyPlan) and
// resolved (resolvePlan, the one resolver) must give every stage the plan's layer range,
// devices, stash policy, optimizer placement and lookahead, and the plan's kind,
// microbatches and replicas. Mixed policies and mixed optimizer placements are forced in,
// so a key that applyPlan dropped (or resolvePlan ignored) fails here.
TEST(MixedPlan, SolvedPlansReachTheResolvedPlanWithoutLoss) {
  const config::Config base = config::parseConfig(
      "model: {name: vgg16, width: 0.25, input_size: 32, channels: 1, num_classes: 10}\n"
      "training: {batch: 32}\ndevices: {count: 4}\n"
      "pipeline: {schedule: 1f1b, microbatches: 4}\n");
  struct Case {
    const char* family;
    bool folded;
  };
  const std::vector<Case> cases = {{"1f1b-keep", false},
                                   {"pipedream-checkpoint", false},
                                   {"pipefb-sync-offload", false},
                                   {"pipefb-sync-offload", true},
                                   {"pipefb-async-checkpoint", true}};
  const std::vector<schedules::StashPolicy> policies = {
      schedules::StashPolicy::Checkpoint, schedules::StashPolicy::Offload,
      schedules::StashPolicy::Keep, schedules::StashPolicy::CheckpointOffload};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.family) + (c.folded ? " folded" : ""));
    planner::Planning pl = planner::setupPlanning(base, planner::SetupOptions{});
    planner::SolverOptions o = pl.solver;
    o.schedules = planner::parseScheduleFamilies({c.family});
    o.simulateTop = 0;
    o.foldedPlacements = c.folded;
    const planner::SolveResult r = planner::solve(*pl.model, o);
    ASSERT_TRUE(r.feasible);
    planner::PlanContext context;
    context.config = base.source;
    context.model = pl.model->profile().model;
    const std::string yaml = planner::planToYaml(*pl.model, r.best, context);
    planner::PlanSpec spec = planner::parsePlan(yaml, "plan.yaml");
    for (size_t s = 0; s < spec.stages.size(); ++s) {  // mixed, whatever the solver chose
      spec.stages[s].policy = policies[(s + 1) % policies.size()];
      spec.stages[s].optimizerOnHost = s % 2 == 0;
    }
    spec.optimizerGiven = true;
    spec.lookahead = 2;
    config::Config cfg = base;
    planner::applyPlan(cfg, spec, "plan.yaml");
    const runtime::ModelLayers layers{"vgg16", std::vector<std::int64_t>(spec.numLayers, 1)};
    const auto plan = runtime::resolvePlan(cfg, layers, 1);
    EXPECT_EQ(schedules::toString(plan.kind), spec.schedule);
    EXPECT_EQ(plan.microbatches, spec.microbatches);
    EXPECT_EQ(plan.replicas, spec.replicas);
    ASSERT_EQ(plan.numStages(), static_cast<int>(spec.stages.size()));
    for (int s = 0; s < plan.numStages(); ++s) {
      SCOPED_TRACE("stage " + std::to_string(s));
      const auto& got = plan.stages[s];
      const auto& want = spec.stages[s];
      EXPECT_EQ(got.first, want.first);
      EXPECT_EQ(got.last, want.last);
      EXPECT_EQ(got.forwardDevice, want.forwardDevice);
      EXPECT_EQ(got.backwardDevice, want.backwardDevice);
      EXPECT_EQ(got.stash, want.policy);
      EXPECT_EQ(got.optimizer == schedules::OptimizerPlacement::Host, want.optimizerOnHost);
      EXPECT_EQ(got.lookahead, spec.lookahead);
    }
    EXPECT_EQ(plan.numDevices(), spec.placement().numDevices());
  }
}
