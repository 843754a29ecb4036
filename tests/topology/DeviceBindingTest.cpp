// devices.bind on the pipeline runtime (Note [Device binding]): every device's worker and
// copy-engine thread really run on the core they are bound to.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/offload/TransferManager.h"
#include "pipefb/runtime/DeviceBinding.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/topology/Binding.h"

using namespace pipefb;

namespace {

config::Config pipelineConfig(const std::string& bind) {
  config::Config c;
  c.source = "<test>";
  c.model.name = "mlp";
  c.model.input_size = 6;
  c.model.channels = 1;
  c.model.num_classes = 5;
  c.model.hidden = {24, 20, 16};
  c.training.batch = 8;
  c.pipeline.schedule = "1f1b";
  c.pipeline.stages = 2;
  c.pipeline.microbatches = 4;
  c.pipeline.stash = "offload";  // the copy engines work too
  c.devices.count = 2;
  c.devices.bind = bind;
  return c;
}

// What each device's worker saw: its binding and the CPU it was running on.
struct Seen {
  std::mutex mu;
  std::map<int, std::vector<int>> binding;
  std::map<int, std::vector<int>> lastCpus;
};

void runOneIteration(const config::Config& cfg, Seen& seen) {
  torch::manual_seed(3);
  auto model = model::buildModel(cfg.model);
  model->train(true);
  runtime::EngineOptions o;
  o.iterations = 1;
  o.log = false;
  o.recordMemoryEvents = false;
  o.beforeAction = [&seen](int d, int) {  // on device d's worker thread
    auto b = topology::thisThreadBinding();
    const int cpu = topology::thisThreadLastCpu();
    std::lock_guard<std::mutex> lock(seen.mu);
    seen.binding[d] = b;
    seen.lastCpus[d].push_back(cpu);
  };
  runtime::PipelineEngine engine(*model, cfg, o);
  data::Batch b;
  std::vector<int64_t> shape = {8};
  for (auto s : model->sampleShape()) shape.push_back(s);
  b.input = torch::randn(shape);
  b.target = torch::randint(5, {8}, torch::kLong);
  const double loss = engine.step(b);
  EXPECT_TRUE(std::isfinite(loss));
}

class DeviceBinding : public ::testing::Test {
 protected:
  void SetUp() override { memory::installTrackingAllocator(); }
};

}  // namespace

TEST_F(DeviceBinding, WorkersRunOnTheirCores) {
  const topology::Topology& t = topology::machine();
  Seen seen;
  runOneIteration(pipelineConfig("cores"), seen);
  ASSERT_EQ(seen.binding.size(), 2u);
  for (int d = 0; d < 2; ++d) {
    const auto& want = t.cores[topology::coreForDevice(d, t.numCores())].pus;
    EXPECT_EQ(seen.binding[d], want) << "cpu:" << d;
    for (int cpu : seen.lastCpus[d])
      EXPECT_NE(std::find(want.begin(), want.end(), cpu), want.end())
          << "cpu:" << d << " ran on CPU " << cpu;
  }
}

TEST_F(DeviceBinding, NoneLeavesThreadsUnbound) {
  std::vector<int> process;
  std::thread([&] { process = topology::thisThreadBinding(); }).join();
  Seen seen;
  runOneIteration(pipelineConfig("none"), seen);
  ASSERT_EQ(seen.binding.size(), 2u);
  for (int d = 0; d < 2; ++d) EXPECT_EQ(seen.binding[d], process) << "cpu:" << d;
}

TEST_F(DeviceBinding, CopyEngineFollowsItsDevice) {
  const topology::Topology& t = topology::machine();
  auto& host = memory::configureDomain("binding-test-host", memory::kUnlimited);
  offload::TransferManager transfers(host, offload::TransferOptions{2, false, 0});
  for (int d = 0; d < 2; ++d) {
    std::thread worker([&] { runtime::bindDeviceThreads("cores", d, &transfers); });
    worker.join();
    // Both copy threads of the device: the stash engine and copyInPlace's engine.
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::vector<int>> bound;
    transfers.runOnCopyEngine(d, [&] {
      std::lock_guard<std::mutex> lock(mu);
      bound.push_back(topology::thisThreadBinding());
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return bound.size() == 2; });
    ASSERT_EQ(bound.size(), 2u) << "copy:" << d;
    for (const auto& b : bound)
      EXPECT_EQ(b, t.cores[topology::coreForDevice(d, t.numCores())].pus) << "copy:" << d;
  }
}
