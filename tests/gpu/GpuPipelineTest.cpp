// The pipeline runtime with devices.kind: cuda (issue 17; ctest label `gpu`): several
// pipeline devices on one GPU. Built in every build; every test skips without a GPU, and
// fails while the runtime refuses cuda (Note [No silent fallback], DeviceKind.h, point 3).
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <iostream>

#include "PipelineConfig.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/model/Model.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/TrainPlan.h"
#include "pipefb/runtime/PipelineEngine.h"

namespace {

using namespace pipefb;

class GpuEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    memory::installTrackingAllocator();
    // Gradients are compared with the CPU's within 1e-4: no TF32 in matmuls or convs.
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new GpuEnv);

#define PIPEFB_NEED_GPU()                                                   \
  do {                                                                      \
    if (torch::cuda::device_count() == 0) GTEST_SKIP() << "no GPU visible"; \
  } while (0)

runtime::EngineOptions quiet(int64_t iterations) {
  runtime::EngineOptions o;
  o.iterations = iterations;
  o.log = false;
  o.stallTimeoutSeconds = 120;
  return o;
}

data::Batch batchFor(const model::Model& m, int64_t n, int64_t classes) {
  torch::manual_seed(11);
  std::vector<int64_t> shape = {n};
  for (auto s : m.sampleShape()) shape.push_back(s);
  return {torch::randn(shape), torch::randint(classes, {n}, torch::kLong)};
}

// One iteration of `c` on a fresh model (seed 7); the model's gradients, on the CPU.
std::vector<at::Tensor> gradientsOf(const config::Config& c) {
  torch::manual_seed(7);
  auto m = model::buildModel(c.model);
  m->train(true);
  runtime::PipelineEngine engine(*m, c, quiet(1));
  engine.step(batchFor(*m, c.training.batch, c.model.num_classes));
  engine.finish();
  std::vector<at::Tensor> g;
  for (const auto& p : m->parameters()) g.push_back(p.grad().detach().cpu());
  return g;
}

double relErr(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-12);
}

TEST(GpuPipeline, GradientsMatchTheCpuForEverySyncSchedule) {
  PIPEFB_NEED_GPU();
  const auto mlp = test::mlpOptions(32, {64, 64, 64});
  for (const std::string schedule : {"gpipe", "1f1b", "pipefb-sync"})
    for (const std::string stash : {"keep", "offload", "checkpoint-offload"}) {
      SCOPED_TRACE(schedule + " " + stash);
      auto cpu = test::pipelineConfig(mlp, schedule, 2, 4, stash, 16);
      auto gpu = cpu;
      gpu.devices.kind = "cuda";
      const auto a = gradientsOf(gpu), b = gradientsOf(cpu);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_LT(relErr(a[i], b[i]), 1e-4) << "parameter " << i;
    }
}

// configs/devices/h100-80g.yaml (h200-141g.yaml on an H200): the measured peak of every
// pipeline device (allocated bytes, Note [CUDA accounting]) within 10% of the planner's.
TEST(GpuPipeline, MeasuredPeaksAreWithinTenPercentOfThePlanner) {
  PIPEFB_NEED_GPU();
  config::Config c = test::pipelineConfig({}, "1f1b", 4, 8, "offload", 64);
  c.model.name = "resnet50";
  c.model.input_size = 224;
  c.model.channels = 3;
  c.model.num_classes = 1000;
  c.devices.kind = "cuda";
  c.devices.count = 4;
  const std::string gpuName = at::cuda::getDeviceProperties(0)->name;
  planner::SetupOptions setup;
  setup.device = gpuName.find("H200") != std::string::npos ? "h200-141g" : "h100-80g";
  setup.configsDir = std::string(PIPEFB_SOURCE_DIR) + "/configs";
  setup.profileMicrobatch = c.training.batch / c.pipeline.microbatches;
  auto planning = planner::setupPlanning(c, setup);
  const auto planned = planner::plannerPartition(*planning.model, c, 4);
  c.pipeline.partition = planned.cuts;
  torch::manual_seed(7);
  auto m = model::buildModel(c.model);
  runtime::PipelineEngine engine(*m, c, quiet(2));
  for (int k = 0; k < 2; ++k) engine.step(batchFor(*m, c.training.batch, c.model.num_classes));
  engine.finish();
  const auto stats = engine.deviceStats();
  for (int d = 0; d < 4; ++d) {
    const double predicted = static_cast<double>(planned.plan.deviceMemory.at(d));
    std::cout << stats[d].name << ": measured " << stats[d].peak << " B, planned " << predicted
              << " B\n";
    EXPECT_NEAR(static_cast<double>(stats[d].peak) / predicted, 1.0, 0.10) << stats[d].name;
  }
}

// The share of copy time hidden under compute, reported (not asserted: a benchmark).
TEST(GpuPipeline, ReportsTheCopyTimeHiddenUnderCompute) {
  PIPEFB_NEED_GPU();
  auto c = test::pipelineConfig(test::mlpOptions(256, {1024, 1024, 1024, 1024}), "pipefb-sync", 2,
                                8, "offload", 256);
  c.devices.kind = "cuda";
  torch::manual_seed(7);
  auto m = model::buildModel(c.model);
  runtime::PipelineEngine engine(*m, c, quiet(3));
  for (int k = 0; k < 3; ++k) engine.step(batchFor(*m, c.training.batch, c.model.num_classes));
  engine.finish();
  double copy = 0, hidden = 0;
  for (const auto& t : engine.transferStats()) {
    copy += t.copySeconds;
    hidden += t.hiddenSeconds;
  }
  ASSERT_GT(copy, 0) << "nothing was offloaded";
  std::cout << "copy time hidden under compute: " << 100.0 * hidden / copy << "% of " << copy
            << " s\n";
  EXPECT_LE(hidden, copy * (1 + 1e-9));
}

}  // namespace
