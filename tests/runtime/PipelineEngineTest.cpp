// The pipeline runtime against single-device training (DESIGN.md, "Correctness"), its
// memory contract, its errors and its trace.
#include "pipefb/runtime/PipelineEngine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "pipefb/common/Error.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/train/Optimizer.h"

using namespace pipefb;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  model::ModelOptions model;
  int64_t batch = 8;
};

model::ModelOptions mlpOptions() {
  model::ModelOptions o;
  o.name = "mlp";
  o.input_size = 6;
  o.channels = 1;
  o.num_classes = 5;
  o.hidden = {24, 20, 16};  // 4 layers
  return o;
}

model::ModelOptions visionOptions(const std::string& name) {
  model::ModelOptions o;
  o.name = name;
  o.width = 0.0625;
  o.input_size = 32;
  o.channels = 3;
  o.num_classes = 10;
  return o;
}

model::ModelOptions gpt2Options() {
  model::ModelOptions o;
  o.name = "gpt2";
  o.size = "tiny";
  o.input_size = 8;   // T
  o.num_classes = 32;  // V
  return o;
}

config::Config makeConfig(const model::ModelOptions& m, const std::string& schedule, int S, int M,
                          const std::string& stash, int64_t batch) {
  config::Config c;
  c.source = "<test>";
  c.model = m;
  c.training.optimizer = "sgd";
  c.training.lr = 0.05;
  c.training.momentum = 0.9;
  c.training.batch = batch;
  c.pipeline.schedule = schedule;
  c.pipeline.stages = S;
  c.pipeline.microbatches = M;
  c.pipeline.stash = stash;
  c.devices.count = schedule.rfind("pipefb", 0) == 0 ? 2 * S : S;
  return c;
}

data::Batch makeBatch(const model::Model& m, int64_t n, int64_t classes, uint64_t seed) {
  torch::manual_seed(seed);
  data::Batch b;
  std::vector<int64_t> shape = {n};
  for (auto s : m.sampleShape()) shape.push_back(s);
  if (m.inputDtype() == torch::kLong) {
    b.input = torch::randint(classes, shape, torch::kLong);
    b.target = torch::randint(classes, shape, torch::kLong);
  } else {
    b.input = torch::randn(shape);
    b.target = torch::randint(classes, {n}, torch::kLong);
  }
  return b;
}

std::shared_ptr<model::Model> buildSeeded(const model::ModelOptions& o) {
  torch::manual_seed(7);
  auto m = model::buildModel(o);
  m->train(true);
  return m;
}

// The reference: Trainer::step's gradient accumulation on one device.
struct Reference {
  std::shared_ptr<model::Model> model;
  std::unique_ptr<torch::optim::Optimizer> opt;
  config::Config config;
  int64_t steps = 0;
  explicit Reference(const config::Config& c) : config(c) {
    model = buildSeeded(c.model);
    for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
    opt = train::makeOptimizer(c.training, model->parameters());
  }
  double step(const data::Batch& b, int64_t total) {
    const int64_t M = config.pipeline.microbatches, n = b.input.size(0);
    opt->zero_grad();
    auto xs = b.input.chunk(M, 0);
    auto ts = b.target.chunk(M, 0);
    double sum = 0;
    for (size_t m = 0; m < xs.size(); ++m) {
      auto l = model->loss(model->forward(xs[m]), ts[m]) *
               (static_cast<double>(xs[m].size(0)) / static_cast<double>(n));
      l.backward();
      sum += l.item<double>();
    }
    train::setLearningRate(*opt, train::learningRate(config.training, steps++, total));
    opt->step();
    return sum;
  }
};

double relErr(const torch::Tensor& a, const torch::Tensor& b) {
  double scale = b.abs().max().item<double>();
  double diff = (a - b).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// Largest relative error over the named parameters (grads if `grads`).
double maxRelErr(const model::Model& got, const model::Model& want, bool grads,
                 std::string* worst) {
  auto g = got.namedParameters(), w = want.namedParameters();
  EXPECT_EQ(g.size(), w.size());
  double e = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    auto a = grads ? g[i].second.grad() : g[i].second;
    auto b = grads ? w[i].second.grad() : w[i].second;
    if (!a.defined() || !b.defined()) {
      *worst = g[i].first + " (undefined)";
      return 1e9;
    }
    double r = relErr(a, b);
    if (r > e) {
      e = r;
      *worst = g[i].first;
    }
  }
  return e;
}

runtime::EngineOptions quietOptions(int64_t iterations) {
  runtime::EngineOptions o;
  o.iterations = iterations;
  o.log = false;
  o.recordMemoryEvents = false;
  o.stallTimeoutSeconds = 30;
  return o;
}

// One iteration: gradients equal; three: weights equal (and losses).
void checkEquivalence(const Case& c, const std::vector<int>& stageCounts,
                      const std::vector<int>& microbatches) {
  constexpr int kIters = 3;
  for (const std::string sched : {"gpipe", "1f1b", "pipefb-sync"})
    for (const std::string stash : {"keep", "checkpoint"})
      for (int S : stageCounts)
        for (int M : microbatches) {
          SCOPED_TRACE(c.name + " " + sched + " " + stash + " S=" + std::to_string(S) +
                       " M=" + std::to_string(M));
          auto cfg = makeConfig(c.model, sched, S, M, stash, c.batch);
          Reference ref(cfg);
          auto model = buildSeeded(c.model);
          runtime::PipelineEngine engine(*model, cfg, quietOptions(kIters));
          std::vector<data::Batch> batches;
          for (int k = 0; k < kIters; ++k)
            batches.push_back(makeBatch(*model, c.batch, c.model.num_classes, 100 + k));
          for (int k = 0; k < kIters; ++k) {
            double want = ref.step(batches[k], kIters);
            double got = engine.step(batches[k]);
            EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want))) << "loss of iteration " << k;
            if (k == 0) {
              std::string worst;
              double e = maxRelErr(*model, *ref.model, /*grads=*/true, &worst);
              EXPECT_LE(e, 1e-5) << "gradient of " << worst;
            }
          }
          engine.finish();
          std::string worst;
          double e = maxRelErr(*model, *ref.model, /*grads=*/false, &worst);
          EXPECT_LE(e, 1e-5) << "weights after " << kIters << " steps: " << worst;
        }
}

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

TEST(PipelineEquivalence, Gpt2) {
  checkEquivalence({"gpt2", gpt2Options(), 4}, {2, 3, 4}, {2, 4});
}
