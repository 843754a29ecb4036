// Weight versions in the host pool (Note [Weight-version offload] in schedules/Lowering.h,
// Note [Weight-version offload in the runtime] in PipelineEngine.cpp): pipedream and
// pipefb-async train to the same weights and gradients whether their stashed versions
// stay on the device or go through the host pool, and a device holds no more versions
// between actions than the lookahead allows.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../PipelineConfig.h"
#include "EngineRun.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryDomain.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/schedules/WeightVersions.h"

using namespace pipefb;

namespace {

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new test::TrackingAllocatorEnv);

// Weights much larger than a microbatch's activations, so that versions dominate.
model::ModelOptions mlp() { return test::mlpOptions(16, {128, 96, 64, 32}); }

using test::TrainedRun;

int countWeightActions(const schedules::Schedule& s, schedules::ActionType t) {
  int n = 0;
  for (const auto& list : s.devices)
    for (const auto& a : list) n += a.type == t && a.stash == schedules::StashKind::Weights;
  return n;
}

// The largest relative difference between the two models' weights, and their gradients.
double maxRelDiff(const model::Model& a, const model::Model& b, bool grads) {
  auto pa = a.parameters(), pb = b.parameters();
  EXPECT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    torch::Tensor x = grads ? pa[i].grad() : pa[i], y = grads ? pb[i].grad() : pb[i];
    if (!x.defined() || !y.defined()) {
      EXPECT_EQ(x.defined(), y.defined()) << i;
      continue;
    }
    double scale = std::max(1e-12, y.abs().max().item<double>());
    worst = std::max(worst, (x - y).abs().max().item<double>() / scale);
  }
  return worst;
}

}  // namespace

TEST(WeightOffload, PipedreamMatchesKeepWithVersionsInTheHostPool) {
  const int S = 3, M = 4, K = 3;
  for (const std::string stash : {"offload", "checkpoint-offload"}) {
    SCOPED_TRACE(stash);
    auto keepCfg = test::pipelineConfig(mlp(), "pipedream", S, M, "keep", 16);
    auto offCfg = test::pipelineConfig(mlp(), "pipedream", S, M, stash, 16);
    TrainedRun keep = test::trainEngine(keepCfg, K);
    TrainedRun off = test::trainEngine(offCfg, K);
    const auto& sched = off.engine->schedule();
    ASSERT_GT(countWeightActions(sched, schedules::ActionType::Offload), 0);
    ASSERT_GT(countWeightActions(sched, schedules::ActionType::Prefetch), 0);
    ASSERT_GT(countWeightActions(sched, schedules::ActionType::Drop), 0);
    ASSERT_EQ(keep.losses.size(), off.losses.size());
    for (size_t k = 0; k < keep.losses.size(); ++k)
      EXPECT_NEAR(off.losses[k], keep.losses[k], 1e-6 * std::max(1.0, std::abs(keep.losses[k])));
    EXPECT_LE(maxRelDiff(*off.model, *keep.model, false), 1e-6) << "weights";
    EXPECT_LE(maxRelDiff(*off.model, *keep.model, true), 1e-6) << "gradients";
    // The versions went through the host pool and none is left anywhere.
    int64_t d2h = 0;
    for (const auto& t : off.engine->transferStats()) d2h += t.bytesD2H;
    EXPECT_GT(d2h, 0);
    for (auto* dom : memory::allDomains()) {
      if (dom->name().rfind("cpu:", 0) == 0) {
        EXPECT_EQ(dom->liveBytes(MemoryCategory::WeightVersions), 0) << dom->name();
      }
    }
    EXPECT_EQ(off.engine->hostPool().liveBytes, 0);
  }
}

// pipefb-async keeps the version its forwards ran on, on the backward device, for the
// checkpoint kinds' recompute; under checkpoint-offload the schedule drops it (it is needed
// by the first B after the STEP that made it, so it never leaves: Note [Weight-version
// offload]). The weights match the keep counterpart.
TEST(WeightOffload, PipefbAsyncCheckpointOffloadMatchesKeep) {
  const int S = 2, M = 3, K = 4;
  for (int lag : {-1, 1}) {
    SCOPED_TRACE("async_lag " + std::to_string(lag));
    auto keepCfg = test::pipelineConfig(mlp(), "pipefb-async", S, M, "keep", 12);
    keepCfg.pipeline.async_lag = lag;
    auto offCfg = keepCfg;
    offCfg.pipeline.stash = "checkpoint-offload";
    TrainedRun keep = test::trainEngine(keepCfg, K);
    TrainedRun off = test::trainEngine(offCfg, K);
    EXPECT_GT(countWeightActions(off.engine->schedule(), schedules::ActionType::Drop), 0);
    for (size_t k = 0; k < keep.losses.size(); ++k)
      EXPECT_NEAR(off.losses[k], keep.losses[k], 1e-6 * std::max(1.0, std::abs(keep.losses[k])));
    EXPECT_LE(maxRelDiff(*off.model, *keep.model, false), 1e-6) << "weights";
    EXPECT_LE(maxRelDiff(*off.model, *keep.model, true), 1e-6) << "gradients";
  }
}

// Between actions a device holds at most lookahead + 1 stashed versions of its stage, plus
// one whose D2H copy may still run (Note [Resident offloaded stashes]); pipedream with
// the versions kept holds S - s of them on stage s, which breaks that bound on stage 0.
TEST(WeightOffload, ResidentVersionsFollowTheLookahead) {
  const int S = 4, M = 4, K = 3;
  auto maxVersionsBetweenActions = [&](const std::string& offloadWeights, int lookahead,
                                       std::vector<double>& out) {
    auto cfg = test::pipelineConfig(mlp(), "pipedream", S, M, "checkpoint-offload", 16);
    cfg.pipeline.lookahead = lookahead;
    cfg.pipeline.offload_weights = offloadWeights;
    TrainedRun r = test::trainEngine(cfg, K);
    // The contract the run checked against, as its summary states it: min(S - s, L + 1).
    auto contract = nlohmann::json::parse(r.engine->summaryJson())["contract"];
    EXPECT_EQ(contract["resident_weight_versions"][0].get<int>(),
              offloadWeights == "none" ? S : std::min(S, lookahead + 1));
    auto records = r.engine->records();
    out.assign(S, 0);
    for (int s = 0; s < S; ++s) {
      int64_t versionBytes = 0;  // one version of stage s: its parameters
      for (int64_t l = r.engine->partition()[s].first; l < r.engine->partition()[s].last; ++l)
        for (const auto& p : r.model->layer(static_cast<size_t>(l))->parameters())
          versionBytes += p.numel() * p.element_size();
      int64_t peak = 0;  // device s runs stage s (pipedream)
      for (const auto& rec : records[s])
        peak = std::max(peak, rec.liveAfter[index(MemoryCategory::WeightVersions)]);
      out[s] = static_cast<double>(peak) / static_cast<double>(versionBytes);
    }
    return r.engine->schedule();
  };
  for (int lookahead : {0, 1, 2}) {
    SCOPED_TRACE("lookahead " + std::to_string(lookahead));
    std::vector<double> versions;
    auto sched = maxVersionsBetweenActions("auto", lookahead, versions);
    EXPECT_GT(countWeightActions(sched, schedules::ActionType::Offload), 0);
    for (int s = 0; s < S; ++s)
      EXPECT_LE(versions[s], std::min(S - s, lookahead + 2) + 1e-9) << "stage " << s;
  }
  // The bound is one the kept versions break: stage 0 holds S of them.
  std::vector<double> kept;
  auto sched = maxVersionsBetweenActions("none", 1, kept);
  EXPECT_EQ(countWeightActions(sched, schedules::ActionType::Offload), 0);
  EXPECT_GT(kept[0], 1 + 2 + 1e-9);
  EXPECT_NEAR(kept[0], S, 1e-9);
}
