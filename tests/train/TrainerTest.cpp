#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/train/Checkpoint.h"
#include "pipefb/train/Optimizer.h"
#include "pipefb/train/Trainer.h"

using namespace pipefb;
namespace fs = std::filesystem;

namespace {

std::string tempDir(const std::string& name) { return test::freshDir("train_test_" + name); }

config::Config mlpConfig(const std::string& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"output.dir=" + dir, "output.progress=false"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return config::loadConfig(std::string(PIPEFB_SOURCE_DIR) + "/configs/mlp-tiny.yaml", sets);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(Trainer, RunWritesRunFolderAndLearns) {
  std::string dir = tempDir("run");
  train::Trainer trainer(mlpConfig(dir, {"training.iterations=60"}));
  auto s = trainer.run();
  EXPECT_EQ(s.steps, 60);
  EXPECT_EQ(s.samples, 60 * 32);
  EXPECT_GT(s.throughput_samples_per_s, 0);
  // 4 classes: chance is 0.25. The synthetic task is learnable.
  EXPECT_GT(s.test_accuracy, 0.6);

  for (const char* f : {"config.yaml", "metrics.csv", "summary.json", "model.pt"})
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  auto j = nlohmann::json::parse(readFile(dir + "/summary.json"));
  for (const char* k : {"test_accuracy", "throughput_samples_per_s", "wall_seconds", "devices"})
    EXPECT_TRUE(j.contains(k)) << k;
  ASSERT_EQ(j["devices"].size(), 1u);
  for (const char* k : {"name", "capacity_bytes", "peak_bytes", "peak_by_category"})
    EXPECT_TRUE(j["devices"][0].contains(k)) << k;
  EXPECT_DOUBLE_EQ(j["test_accuracy"].get<double>(), s.test_accuracy);

  // metrics.csv: a header and one row per step; the loss falls.
  std::ifstream csv(dir + "/metrics.csv");
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line.rfind("step,epoch,loss", 0), 0u) << line;
  std::vector<double> losses;
  while (std::getline(csv, line)) {
    auto a = line.find(','), b = line.find(',', a + 1), c = line.find(',', b + 1);
    losses.push_back(std::stod(line.substr(b + 1, c - b - 1)));
  }
  ASSERT_EQ(losses.size(), 60u);
  double first = (losses[0] + losses[1] + losses[2]) / 3,
         last = (losses[57] + losses[58] + losses[59]) / 3;
  EXPECT_LT(last, 0.7 * first);

  // The resolved config reloads to the same config.
  auto again = config::loadConfig(dir + "/config.yaml");
  EXPECT_EQ(config::toYaml(again), readFile(dir + "/config.yaml"));
}

TEST(Trainer, GradientAccumulationEqualsFullBatch) {
  // One step with 4 microbatches gives the same weights as one with 1.
  std::string dir = tempDir("accum");
  train::Trainer a(mlpConfig(dir, {"pipeline.microbatches=1", "training.eval=false"}));
  train::Trainer b(mlpConfig(dir, {"pipeline.microbatches=4", "training.eval=false"}));
  auto ds = data::makeDataset(a.config().data, a.config().model, data::Split::Train, 0);
  std::vector<int64_t> idx(32);
  for (int i = 0; i < 32; ++i) idx[i] = i * 3;
  auto batch = ds->get(idx);
  for (int step = 0; step < 3; ++step) {
    double la = a.step(batch), lb = b.step(batch);
    EXPECT_NEAR(la, lb, 1e-5 * std::abs(la));
  }
  auto pa = a.model().namedParameters(), pb = b.model().namedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    double err = (pa[i].second - pb[i].second).abs().max().item<double>() /
                 std::max(1e-12, pa[i].second.abs().max().item<double>());
    EXPECT_LT(err, 1e-5) << pa[i].first;
  }
}

// data.shuffle: false trains on the file's order: the first step of a run is a step on the
// data set's first batch (with shuffling, on a random one).
TEST(Trainer, UnshuffledRunTakesTheFilesOrder) {
  const std::vector<std::string> sets = {"data.shuffle=false", "training.iterations=1",
                                         "training.eval=false"};
  train::Trainer a(mlpConfig(tempDir("unshuffled_a"), sets));
  a.run();
  train::Trainer b(mlpConfig(tempDir("unshuffled_b"), sets));
  auto ds = data::makeDataset(b.config().data, b.config().model, data::Split::Train,
                              b.config().training.seed);
  std::vector<int64_t> idx(32);
  for (int i = 0; i < 32; ++i) idx[i] = i;
  b.step(ds->get(idx));
  auto pa = a.model().namedParameters(), pb = b.model().namedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::allclose(pa[i].second, pb[i].second, 1e-6, 1e-7)) << pa[i].first;
}

TEST(Trainer, DeviceCountMustMatchTheSchedule) {
  // 1f1b over 2 stages needs 2 devices; pipefb-sync over 2 stages needs 4.
  std::string dir = tempDir("sched");
  EXPECT_THROW(mlpConfig(dir, {"pipeline.schedule=1f1b", "pipeline.stages=2", "devices.count=3"}),
               UserError);
  EXPECT_THROW(
      mlpConfig(dir, {"pipeline.schedule=pipefb-sync", "pipeline.stages=2", "devices.count=2"}),
      UserError);
  EXPECT_NO_THROW(
      mlpConfig(dir, {"pipeline.schedule=pipefb-sync", "pipeline.stages=2", "devices.count=4"}));
}

TEST(LearningRate, WarmupCosineAndStep) {
  config::TrainingOptions o;
  o.lr = 1.0;
  o.warmup_steps = 10;
  o.lr_schedule = "cosine";
  EXPECT_DOUBLE_EQ(train::learningRate(o, 0, 110), 0.1);
  EXPECT_DOUBLE_EQ(train::learningRate(o, 9, 110), 1.0);
  EXPECT_NEAR(train::learningRate(o, 60, 110), 0.5, 1e-12);
  EXPECT_NEAR(train::learningRate(o, 110, 110), 0.0, 1e-12);
  o.lr_schedule = "step";
  o.step_every = 5;
  o.step_gamma = 0.5;
  EXPECT_DOUBLE_EQ(train::learningRate(o, 14, 100), 1.0);
  EXPECT_DOUBLE_EQ(train::learningRate(o, 15, 100), 0.5);
}

TEST(Checkpoint, AtomicWriteReplacesAndLeavesNoTemporary) {
  std::string dir = tempDir("atomic");
  std::string path = dir + "/f.bin";
  train::writeFileAtomically(path, "old");
  train::writeFileAtomically(path, "new contents");
  EXPECT_EQ(readFile(path), "new contents");
  for (auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "f.bin");
  // A failed write (the target is a non-empty folder) throws and leaves the folder intact.
  fs::create_directories(dir + "/d");
  train::writeFileAtomically(dir + "/d/keep", "x");
  EXPECT_THROW(train::writeFileAtomically(dir + "/d", "y"), std::exception);
  EXPECT_EQ(readFile(dir + "/d/keep"), "x");
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);  // only f.bin; no temporary left behind
}

TEST(Checkpoint, RoundTripsInCpp) {
  std::string path = tempDir("rt") + "/m.pt";
  train::NamedTensors t = {{"a.weight", torch::randn({3, 4})}, {"b", torch::arange(5)}};
  train::saveStateDict(path, t);
  auto back = train::loadStateDict(path);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].first, "a.weight");
  EXPECT_TRUE(torch::equal(back[0].second, t[0].second));
  EXPECT_TRUE(torch::equal(back[1].second, t[1].second));
  std::ofstream(path) << "garbage";
  EXPECT_THROW(train::loadStateDict(path), UserError);
}

TEST(Checkpoint, LoadsIntoTorchvisionResnet50InPython) {
  // The whole state_dict at default settings loads with strict=True into
  // torchvision.models.resnet50() under Python's torch 2.11 (torch.load's default
  // weights_only=True), and the tensors agree.
  std::string path = tempDir("py") + "/resnet50.pt";
  model::ModelOptions o;
  o.name = "resnet50";
  torch::manual_seed(1);
  auto m = model::buildModel(o);
  train::saveStateDict(path, m->stateDict());
  double sum = 0;
  for (auto& [k, v] : m->stateDict()) sum += v.to(torch::kDouble).sum().item<double>();
  auto r = pipefb::test::runCommand(
      std::string(PIPEFB_PYTHON) + " -c \"import torch, torchvision; d = torch.load('" + path +
      "'); m = torchvision.models.resnet50(); r = m.load_state_dict(d, strict=True); "
      "print(len(d), sum(float(v.double().sum()) for v in d.values()))\"");
  const std::string& out = r.out;
  ASSERT_EQ(r.code, 0) << out;
  std::istringstream is(out);
  size_t n = 0;
  double pySum = 0;
  is >> n >> pySum;
  EXPECT_EQ(n, m->stateDict().size()) << out;
  EXPECT_NEAR(pySum, sum, 1e-6 * std::abs(sum) + 1e-3) << out;
}
