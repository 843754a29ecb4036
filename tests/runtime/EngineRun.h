#pragma once
// What the runtime tests that train a PipelineEngine for a few steps share: the tracking
// allocator (device domains need it), random batches, and one trained run.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "pipefb/config/Config.h"
#include "pipefb/data/Dataset.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/model/Model.h"
#include "pipefb/runtime/PipelineEngine.h"

namespace pipefb::test {

/// Installs the tracking allocator before the binary's first test.
class TrackingAllocatorEnv : public ::testing::Environment {
 public:
  void SetUp() override { memory::installTrackingAllocator(); }
};

/// `n` batches of `batch` standard-normal samples of m's sample shape with targets in
/// [0, classes), the same for every call (seed 11).
inline std::vector<data::Batch> randomBatches(const model::Model& m, int n, int64_t batch,
                                              int64_t classes) {
  std::vector<data::Batch> out;
  torch::manual_seed(11);
  std::vector<int64_t> shape = {batch};
  for (auto s : m.sampleShape()) shape.push_back(s);
  for (int k = 0; k < n; ++k) {
    data::Batch b;
    b.input = torch::randn(shape);
    b.target = torch::randint(classes, {batch}, torch::kLong);
    out.push_back(b);
  }
  return out;
}

struct TrainedRun {
  std::shared_ptr<model::Model> model;
  std::unique_ptr<runtime::PipelineEngine> engine;
  std::vector<double> losses;
};

/// Builds c.model (seed 7) and trains it `iterations` steps on randomBatches of
/// c.training.batch through a PipelineEngine, then finishes the engine.
inline TrainedRun trainEngine(const config::Config& c, int iterations) {
  TrainedRun r;
  torch::manual_seed(7);
  r.model = model::buildModel(c.model);
  r.model->train(true);
  runtime::EngineOptions o;
  o.iterations = iterations;
  o.log = false;
  o.recordMemoryEvents = false;
  o.stallTimeoutSeconds = 30;
  r.engine = std::make_unique<runtime::PipelineEngine>(*r.model, c, o);
  for (const auto& b : randomBatches(*r.model, iterations, c.training.batch, c.model.num_classes))
    r.losses.push_back(r.engine->step(b));
  r.engine->finish();
  return r;
}

}  // namespace pipefb::test
