// Note [TorchScript models] (model/Model.h): models from Python, trained by the pipeline as
// the zoo's are. The fixtures come from tests/runtime/torchscript_models.py, run with the
// build's own Python (PIPEFB_PYTHON: torch 2.11 and torchvision).
#include <gtest/gtest.h>

#include <filesystem>

#include "Equivalence.h"
#include "pipefb/common/Error.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/train/Checkpoint.h"

using namespace pipefb;
namespace fs = std::filesystem;
using namespace test::equivalence;

namespace {

class TorchScriptEnv : public ::testing::Environment {
 public:
  void SetUp() override { memory::installTrackingAllocator(); }
  // The fixtures hold two resnet50s (about 200 MB): gone with the process.
  void TearDown() override { fs::remove_all(test::scratchPath("torchscript")); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new TorchScriptEnv);

// The fixtures' folder, written once per test binary run.
const std::string& fixtures() {
  static const std::string dir = [] {
    const std::string d = test::freshDir("torchscript");
    const auto r = test::runCommand(std::string(PIPEFB_PYTHON) + " " + PIPEFB_SOURCE_DIR +
                                    "/tests/runtime/torchscript_models.py " + d);
    EXPECT_EQ(r.code, 0) << r.out;
    return d;
  }();
  return dir;
}

model::ModelOptions scripted(const std::string& file, std::vector<int64_t> shape, int64_t classes) {
  model::ModelOptions o;
  o.name = "torchscript";
  o.path = fixtures() + "/" + file;
  o.sample_shape = std::move(shape);
  o.input_dtype = "float32";
  o.num_classes = classes;
  return o;
}

model::ModelOptions sequential() { return scripted("seq.pt", {1, 8, 8}, 5); }

TEST(TorchScript, LayersAreTheChildrenWithTheModulesKeys) {
  auto m = model::buildModel(sequential());
  // Flatten has no parameters: it runs with the first Linear (a stage must train something).
  ASSERT_EQ(m->numLayers(), 7u);
  EXPECT_EQ(m->layer(0)->name(), "0+1");
  EXPECT_EQ(m->layer(6)->name(), "7");
  std::vector<std::string> keys;
  for (const auto& [k, t] : m->stateDict()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"1.weight", "1.bias", "4.weight", "4.bias", "7.weight",
                                            "7.bias"}));
}

// Note [Dropout streams]: a user's nn.Sequential with dropout, pipelined under every stash
// policy (checkpoint recomputes its forward; offload moves its saved tensors), gives the
// weights of one device after 3 steps: the masks are the layers' own, whatever the stages.
TEST(TorchScript, SequentialWithDropoutGivesOneDevicesWeights) {
  checkEquivalence({"seq", sequential(), 8}, {2, 3}, {2, 4}, kAllStashes);
  // Folded PipeFB, and the split backwards (I and W apart, Note [Split backward in the
  // runtime]).
  checkEquivalence({"seq", sequential(), 8}, {2, 3}, {4}, kAllStashes, kFolded);
  checkEquivalence({"seq", sequential(), 8}, {2, 3}, {4}, kAllStashes,
                   {"zb-h1", "zb-h2", "pipefb-zb"});
}

TEST(TorchScript, DropoutIsDrawn) {
  // The masks are drawn at all: in eval mode the same batch gives another loss.
  auto m = model::buildModel(sequential());
  const data::Batch b = makeBatch(*m, 8, 5, 3);
  model::DropoutKey key(1, 0);
  m->train(true);
  const double trained = m->loss(m->forward(b.input), b.target).item<double>();
  m->train(false);
  const double evaluated = m->loss(m->forward(b.input), b.target).item<double>();
  EXPECT_GT(std::abs(trained - evaluated), 1e-4);
}

// One step of pipefb-sync with offload on 4 devices (2 stages, F and B apart) on the
// fixture's batch; the largest relative gradient error against `want` (the largest
// difference over the largest gradient, per tensor), under torchvision's own names.
double resnetStepError(const std::string& file, torch::ScalarType dtype, const std::string& want,
                       std::string* worstName, const std::string& precision = "fp32") {
  auto opts = scripted(file, {3, 32, 32}, 10);
  opts.input_dtype = dtype == torch::kDouble ? "float64" : "float32";
  auto cfg = makeConfig(opts, "pipefb-sync", 2, 2, "offload", 8);
  cfg.training.precision = precision;
  EXPECT_EQ(cfg.devices.count, 4);
  auto model = model::buildModel(opts);
  model->train(true);
  std::ifstream in(fixtures() + "/resnet50_ref.pt", std::ios::binary);
  const auto ref =
      torch::pickle_load(std::vector<char>(std::istreambuf_iterator<char>(in), {})).toGenericDict();
  data::Batch b;
  b.input = ref.at("x").toTensor().to(dtype);
  b.target = ref.at("y").toTensor();
  runtime::PipelineEngine engine(*model, cfg, quietOptions(1));
  engine.step(b);
  engine.finish();
  const auto grads = ref.at(want).toGenericDict();
  const auto got = model->namedParameters();
  EXPECT_EQ(got.size(), grads.size());
  double worst = 0;
  for (const auto& [name, p] : got) {
    EXPECT_TRUE(grads.contains(name)) << name << " is not a torchvision resnet50 parameter";
    if (!grads.contains(name)) return 1e9;
    const torch::Tensor w = grads.at(name).toTensor();
    const double e = relErr(p.grad().to(w.scalar_type()), w);
    if (e > worst) worst = e, *worstName = name;
  }
  return worst;
}

// Issue 34's goal: torchvision's resnet50 exported by the helper gives, after one step,
// the gradients of Python's autograd on torchvision's own module in float64, within 1e-5
// relative. Exported in float64 (model.input_dtype float64), so that the pipeline's own
// arithmetic is what is compared.
TEST(TorchScript, Resnet50GradientsMatchTorchvisionInFloat64) {
  std::string worst;
  const double e = resnetStepError("resnet50_f64.pt", torch::kDouble, "grads64", &worst);
  EXPECT_LE(e, 1e-5) << worst;
  std::cout << "float64: largest relative gradient error " << e << " (" << worst << ")\n";
}

// In float32, against Python's float32 autograd on the same module (Python's float32 is
// itself 2e-5 off its float64 at the worst tensor: the fixture's note).
TEST(TorchScript, Resnet50GradientsMatchTorchvisionInFloat32) {
  std::string worst;
  const double e = resnetStepError("resnet50.pt", torch::kFloat, "grads32", &worst);
  EXPECT_LE(e, 1e-5) << worst;
  std::cout << "float32: largest relative gradient error " << e << " (" << worst << ")\n";
}

// Issue 36: under bf16, one step matches Python's torch.autocast("cpu", dtype=bfloat16) on
// torchvision's own module within bf16's rounding: 2^-8 (half a bf16 ulp, relative) of the
// largest gradient of each tensor. The float32 result is 1e-2 or more away (checked), so the
// bound tells autocast from none.
TEST(TorchScript, Resnet50GradientsMatchPythonAutocastBf16) {
  std::string worst, worst32;
  const double e = resnetStepError("resnet50.pt", torch::kFloat, "grads_bf16", &worst, "bf16");
  EXPECT_LE(e, std::ldexp(1.0, -8)) << worst;
  const double off = resnetStepError("resnet50.pt", torch::kFloat, "grads_bf16", &worst32);
  EXPECT_GT(off, std::ldexp(1.0, -8)) << "fp32 is as close to autocast's as bf16: " << worst32;
  std::cout << "bf16: largest relative gradient error against Python's autocast " << e << " ("
            << worst << "); fp32 against it " << off << "\n";
}

TEST(TorchScript, ModelPtLoadsIntoTorchvisionStrict) {
  // The state_dict pipefb writes (model.pt, train/Checkpoint.h) has torchvision's keys.
  auto m = model::buildModel(scripted("resnet50.pt", {3, 32, 32}, 10));
  const std::string file = fixtures() + "/state.pt";
  train::saveStateDict(file, m->stateDict());
  const auto r = test::runCommand(
      std::string(PIPEFB_PYTHON) +
      " -c \"import torch, torchvision; m = torchvision.models.resnet50(num_classes=10); "
      "m.load_state_dict(torch.load('" +
      file + "'), strict=True); print('strict ok')\"");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("strict ok"), std::string::npos) << r.out;
}

// The same keys in the same order, and every tensor equal bit for bit.
void expectSameWeights(const train::NamedTensors& got, const train::NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << want[i].first;
  }
}

// Every program on a TorchScript model, as a user runs them: pipefb_profile measures it,
// pipefb_plan and pipefb_sweep plan on that profile (no analytic one exists), pipefb_train
// runs the plan with checkpoints, is killed after step 5 and resumes to the weights of an
// uninterrupted run bit for bit (dropout included: Note [Dropout streams]), and
// pipefb_report rebuilds the report.
TEST(TorchScript, EveryProgramRunsOnIt) {
  const std::string dir = fixtures(), config = dir + "/seq.yaml";
  std::ofstream(config) << "model: {name: torchscript, path: " << dir
                        << "/seq.pt, sample_shape: [1, 8, 8], num_classes: 5}\n"
                           "data: {name: synthetic, synthetic_train: 256, synthetic_test: 64}\n"
                           "training: {batch: 16, iterations: 8, checkpoint_every: 2, lr: 0.05}\n"
                           "devices: {count: 4}\n"
                           "pipeline: {schedule: pipefb-sync, microbatches: 4}\n";
  auto run = [&](const std::string& args) {
    auto r = test::runProgram(args);
    EXPECT_EQ(r.code, 0) << args << ":\n" << r.out;
    return r;
  };
  run("pipefb_profile --config " + config + " -o " + dir + "/profile.yaml");
  auto noProfile = test::runProgram("pipefb_plan --config " + config);
  EXPECT_EQ(noProfile.code, 2) << noProfile.out;
  EXPECT_NE(noProfile.out.find("pipefb_profile --config"), std::string::npos) << noProfile.out;
  run("pipefb_plan --config " + config + " --profile " + dir + "/profile.yaml --schedules " +
      "pipefb-sync-checkpoint -o " + dir + "/plan.yaml");
  run("pipefb_sweep --config " + config + " --profile " + dir + "/profile.yaml --budgets " +
      "200KiB,1MiB -o " + dir + "/sweep");
  EXPECT_TRUE(fs::exists(dir + "/sweep/sweep.csv"));
  const std::string train = "pipefb_train --config " + config + " --plan " + dir + "/plan.yaml";
  run(train + " --set output.dir=" + dir + "/full");
  auto killed =
      test::runCommand("PIPEFB_TEST_FAULT=kill-after-step:5 " + std::string(PIPEFB_BINARY_DIR) +
                       "/" + train + " --set output.dir=" + dir + "/killed");
  EXPECT_EQ(killed.code, 128 + 9) << killed.out;
  auto resumed = run("pipefb_train --resume " + dir + "/killed");
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  expectSameWeights(train::loadStateDict(dir + "/killed/model.pt"),
                    train::loadStateDict(dir + "/full/model.pt"));
  fs::remove(dir + "/full/report.html");
  run("pipefb_report " + dir + "/full");
  EXPECT_TRUE(fs::exists(dir + "/full/report.html"));
}

// One process per device (pipefb_launch): each rank's model.pt holds the stages whose
// masters it holds, and together they are the in-process run's weights, bit for bit, with
// dropout (the masks are (seed, layer, microbatch)'s on any process).
TEST(TorchScript, RanksWeightsAreTheInProcessRunsWeights) {
  const std::string dir = fixtures(), config = dir + "/ranks.yaml";
  std::ofstream(config) << "model: {name: torchscript, path: " << dir
                        << "/seq.pt, sample_shape: [1, 8, 8], num_classes: 5}\n"
                           "data: {name: synthetic, synthetic_train: 128, synthetic_test: 32}\n"
                           "training: {batch: 16, iterations: 3, eval: false, lr: 0.05}\n"
                           "devices: {count: 2}\n"
                           "pipeline: {schedule: 1f1b, microbatches: 4, partition: [3]}\n";
  auto one = test::runProgram("pipefb_train --config " + config + " --set output.dir=" + dir +
                              "/in-process");
  ASSERT_EQ(one.code, 0) << one.out;
  auto two =
      test::runProgram("pipefb_launch -n 2 -- " + std::string(PIPEFB_BINARY_DIR) +
                       "/pipefb_train --config " + config + " --set output.dir=" + dir + "/ranks");
  ASSERT_EQ(two.code, 0) << two.out;
  const auto whole = train::loadStateDict(dir + "/in-process/model.pt");
  auto parts = train::loadStateDict(dir + "/ranks/rank0/model.pt");
  const auto second = train::loadStateDict(dir + "/ranks/rank1/model.pt");
  EXPECT_FALSE(parts.empty());
  EXPECT_FALSE(second.empty());
  parts.insert(parts.end(), second.begin(), second.end());
  expectSameWeights(parts, whole);
}

}  // namespace
