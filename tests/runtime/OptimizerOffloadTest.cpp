// pipeline.optimizer_offload: host (Note [Optimizer offload] in PipelineEngine.cpp):
// the weights equal those of the same run with the optimizer on the device, the
// optimizer state and the master copies are charged to the host pool and not to any
// device, STEP's copies are counted, and RecvWeights makes no second copy of the
// weights on the forward device (Note [Weight syncs]).
#include <gtest/gtest.h>

#include "../PipelineConfig.h"
#include "EngineRun.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryDomain.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/train/Optimizer.h"

using namespace pipefb;

namespace {

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new test::TrackingAllocatorEnv);

// Four layers whose first one is much larger than any activation of a microbatch.
model::ModelOptions mlp() { return test::mlpOptions(8, {256, 64, 32}); }

config::Config makeConfig(const std::string& schedule, const std::string& optimizer,
                          const std::string& where) {
  auto c = test::pipelineConfig(mlp(), schedule, 2, 4, "keep", 8);
  c.training.optimizer = optimizer;
  c.training.weight_decay = 0.01;
  if (optimizer == "adam") c.training.lr = 0.01;
  c.pipeline.optimizer_offload = where;
  return c;
}

using test::TrainedRun;

int64_t bytesOf(const std::vector<torch::Tensor>& ts) {
  int64_t b = 0;
  for (const auto& t : ts) b += t.numel() * t.element_size();
  return b;
}

int64_t stageParamBytes(const TrainedRun& r, int stage) {
  const auto& range = r.engine->partition().at(stage);
  int64_t b = 0;
  for (int64_t i = range.first; i < range.last; ++i)
    b += bytesOf(r.model->layer(static_cast<size_t>(i))->parameters());
  return b;
}

}  // namespace

// Weights (and losses) after several steps are those of the run without the option,
// bit for bit: the host optimizer sees the same gradients and runs the same code on
// each tensor (pipefb-async: the prediction and the snapshots read the device master,
// which STEP updates in place before it ends).
TEST(OptimizerOffload, WeightsEqualTheDeviceOptimizers) {
  for (const std::string sched : {"1f1b", "pipefb-sync", "pipefb-async"})
    for (const std::string opt : {"adam", "sgd"}) {
      SCOPED_TRACE(sched + " " + opt);
      constexpr int kIters = 4;
      TrainedRun dev = test::trainEngine(makeConfig(sched, opt, "none"), kIters);
      TrainedRun host = test::trainEngine(makeConfig(sched, opt, "host"), kIters);
      for (int k = 0; k < kIters; ++k) EXPECT_EQ(dev.losses[k], host.losses[k]) << "loss " << k;
      auto a = dev.model->namedParameters(), b = host.model->namedParameters();
      ASSERT_EQ(a.size(), b.size());
      bool changed = false;
      torch::manual_seed(7);
      auto initial = model::buildModel(makeConfig(sched, opt, "none").model)->parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first << " differs";
        changed = changed || !torch::equal(a[i].second, initial[i]);
      }
      EXPECT_TRUE(changed) << "the steps did not change the weights";
    }
}

// The optimizer state is in the host pool's domain and on no device; the host holds a
// master copy and a gradient buffer; STEP's gradient (D2H) and weight (H2D) copies are
// counted on the backward device's copy engine.
TEST(OptimizerOffload, StateIsChargedToTheHostPoolNotTheDevice) {
  constexpr int kIters = 3;
  for (const std::string sched : {"1f1b", "pipefb-sync"}) {
    SCOPED_TRACE(sched);
    // The domains (cpu:d, host) are the process's: read one run's peaks and let its
    // tensors go before the next run.
    std::vector<runtime::DeviceStats> withDev;
    std::vector<std::vector<std::pair<std::string, torch::Tensor>>> wantState;
    {
      TrainedRun dev = test::trainEngine(makeConfig(sched, "adam", "none"), kIters);
      withDev = dev.engine->deviceStats();
      for (int s = 0; s < dev.engine->numStages(); ++s) {
        wantState.emplace_back();
        for (const auto& [n, t] : train::optimizerState(
                 dev.engine->optimizer(s),
                 dev.engine->optimizerParameters(s, dev.model->namedParameters())))
          wantState.back().emplace_back(n, t.clone());
      }
    }
    TrainedRun host = test::trainEngine(makeConfig(sched, "adam", "host"), kIters);
    auto withHost = host.engine->deviceStats();
    const int S = host.engine->numStages();
    int64_t total = 0;
    for (int s = 0; s < S; ++s) total += stageParamBytes(host, s);
    const int D = host.engine->numDevices();
    ASSERT_EQ(static_cast<int>(withHost.size()), D + 1);
    const size_t opt = index(MemoryCategory::OptimizerState);
    const size_t grads = index(MemoryCategory::Grads);
    const size_t weights = index(MemoryCategory::Weights);
    for (int s = 0; s < S; ++s) {
      const int b = host.engine->backwardDevice(s);
      // Adam: exp_avg and exp_avg_sq, one each per parameter tensor.
      EXPECT_GE(withDev[b].peakByCategory[opt], 2 * stageParamBytes(host, s)) << "stage " << s;
      EXPECT_EQ(withHost[b].peakByCategory[opt], 0) << "stage " << s;
      // The device keeps its weights and gradients.
      EXPECT_EQ(withHost[b].peakByCategory[grads], withDev[b].peakByCategory[grads]);
      EXPECT_LT(withHost[b].peak, withDev[b].peak) << "stage " << s;
      const auto t = host.engine->transferStats()[b];
      EXPECT_GE(t.bytesD2H, kIters * stageParamBytes(host, s)) << "gradients copied D2H";
      EXPECT_GE(t.bytesH2D, kIters * stageParamBytes(host, s)) << "weights copied H2D";
      EXPECT_EQ(&host.engine->optimizerDomain(s), memory::findDomain(memory::kHostDomain));
    }
    const auto& h = withHost[D];
    EXPECT_EQ(h.name, "host");
    EXPECT_GE(h.peakByCategory[opt], 2 * total);
    EXPECT_EQ(h.peakByCategory[weights], total);  // the master copies
    EXPECT_EQ(h.peakByCategory[grads], total);    // the gradient buffers
    EXPECT_EQ(withDev[D].peakByCategory[opt], 0);
    // Checkpoints see the host optimizer's state under the model's names.
    const auto names = host.model->namedParameters();
    int64_t entries = 0;
    for (int s = 0; s < S; ++s) {
      auto st = train::optimizerState(host.engine->optimizer(s),
                                      host.engine->optimizerParameters(s, names));
      const auto& want = wantState.at(s);
      ASSERT_EQ(st.size(), want.size());
      for (size_t i = 0; i < st.size(); ++i) {
        EXPECT_EQ(st[i].first, want[i].first);
        EXPECT_TRUE(torch::equal(st[i].second, want[i].second)) << st[i].first;
      }
      entries += static_cast<int64_t>(st.size());
    }
    EXPECT_EQ(entries, 3 * static_cast<int64_t>(names.size()));  // step, exp_avg, exp_avg_sq
  }
}

// Note [Weight syncs]: on a synchronous split schedule RecvWeights copies the weights
// into the forward copy in place; no full copy of them lands on the forward device as a
// message (it used to: comm_buffers peaked at the stage's weights).
TEST(OptimizerOffload, RecvWeightsMakesNoSecondCopyOnTheForwardDevice) {
  for (const std::string where : {"none", "host"}) {
    SCOPED_TRACE(where);
    TrainedRun r = test::trainEngine(makeConfig("pipefb-sync", "sgd", where), 3);
    auto stats = r.engine->deviceStats();
    const int f = r.engine->forwardDevice(0);
    const int64_t w = stageParamBytes(r, 0);
    EXPECT_EQ(stats[f].peakByCategory[index(MemoryCategory::Weights)], w);
    EXPECT_LT(stats[f].peakByCategory[index(MemoryCategory::CommBuffers)], w / 4)
        << "weights of " << w << " bytes";
    if (where == "host") {  // sent from the host master: H2D on the forward device
      EXPECT_GE(r.engine->transferStats()[f].bytesH2D, 3 * w);
    }
  }
}
