// Checkpoint and resume (issue 9): the atomic layout, kill-and-resume and determinism
// through pipefb_train as a user runs it, resume under another plan, torch.load in
// Python, and numerical faults.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "TestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/train/Checkpoint.h"

using namespace pipefb;
namespace fs = std::filesystem;

namespace {

std::string tempDir(const std::string& name) { return test::freshDir("ckpt_test_" + name); }

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A tiny deterministic MLP run of 8 steps with a checkpoint every 2.
std::string trainArgs(const std::string& dir, const std::string& extra = "") {
  return "pipefb_train --config " + std::string(PIPEFB_SOURCE_DIR) +
         "/configs/mlp-tiny.yaml --set training.iterations=8 --set training.checkpoint_every=2 "
         "--set training.deterministic=true --set training.eval=false "
         "--set output.progress=false --set output.dir=" +
         dir + " " + extra;
}

const char* kOneF1B =
    "--set pipeline.schedule=1f1b --set devices.count=2 "
    "--set pipeline.microbatches=2";

// Bitwise equality of two state_dict files, tensor by tensor.
void expectSameWeights(const std::string& a, const std::string& b) {
  auto x = train::loadStateDict(a), y = train::loadStateDict(b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].first, y[i].first);
    EXPECT_TRUE(torch::equal(x[i].second, y[i].second)) << x[i].first << " differs";
  }
}

}  // namespace

TEST(Checkpoint, ManifestLastPruningAndLatestSkipsIncomplete) {
  const std::string run = tempDir("layout");
  train::CheckpointState s;
  s.model = {{"w", torch::arange(6, torch::kFloat).reshape({2, 3})}};
  s.optimizer = {{"w/momentum_buffer", torch::ones({2, 3})}};
  s.torchRng = at::detail::getDefaultCPUGenerator().get_state();
  s.schedule = "none";
  for (int64_t step : {2, 4, 6}) {
    s.step = step;
    bool sawManifest = true;
    train::writeCheckpoint(run, s, 2, [&] {
      sawManifest =
          fs::exists(run + "/checkpoints/step-00000" + std::to_string(step) + "/manifest.json");
      EXPECT_TRUE(fs::exists(run + "/checkpoints/step-00000" + std::to_string(step) + "/model.pt"));
    });
    EXPECT_FALSE(sawManifest) << "the manifest must be written after the data files";
  }
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-000002")) << "keep 2: the oldest goes";
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step-000004/manifest.json"));
  EXPECT_EQ(train::latestCheckpoint(run), run + "/checkpoints/step-000006");
  // A newer checkpoint that died before its manifest is not taken.
  fs::create_directories(run + "/checkpoints/step-000008");
  fs::copy_file(run + "/checkpoints/step-000006/model.pt",
                run + "/checkpoints/step-000008/model.pt");
  EXPECT_EQ(train::latestCheckpoint(run), run + "/checkpoints/step-000006");
  auto back = train::readCheckpoint(train::latestCheckpoint(run));
  EXPECT_EQ(back.step, 6);
  ASSERT_EQ(back.model.size(), 1u);
  EXPECT_TRUE(torch::equal(back.model[0].second, s.model[0].second));
  EXPECT_TRUE(torch::equal(back.optimizer[0].second, s.optimizer[0].second));
  EXPECT_TRUE(torch::equal(back.torchRng, s.torchRng));
}

TEST(Checkpoint, TruncatedOrGarbledFileIsAUserErrorNamingIt) {
  const std::string run = tempDir("corrupt");
  train::CheckpointState s;
  s.step = 2;
  s.model = {{"w", torch::randn({64, 64})}};
  s.torchRng = at::detail::getDefaultCPUGenerator().get_state();
  const std::string dir = train::writeCheckpoint(run, s, 2);
  const std::string model = dir + "/model.pt";
  const std::string bytes = readFile(model);
  {
    std::ofstream(model, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    try {
      train::readCheckpoint(dir);
      FAIL() << "a truncated checkpoint was read";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("model.pt"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
  }
  {
    std::string garbled = bytes;
    garbled[garbled.size() / 2] ^= 0x5a;
    std::ofstream(model, std::ios::binary) << garbled;
    try {
      train::readCheckpoint(dir);
      FAIL() << "a garbled checkpoint was read";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("CRC-32"), std::string::npos) << e.what();
    }
  }
}

// The kill-and-resume test: SIGKILL after step 5 (checkpoints at 2 and 4), resume,
// and the final weights equal an uninterrupted run's bit for bit; also for a SIGKILL
// inside step 6's checkpoint, before its manifest (the resume must skip it).
void killAndResume(const std::string& name, const std::string& extra) {
  const std::string full = tempDir(name + "_full"), killed = tempDir(name + "_killed");
  auto a = test::runProgram(trainArgs(full, extra));
  ASSERT_EQ(a.code, 0) << a.out;
  auto b = test::runCommand("PIPEFB_TEST_FAULT=kill-after-step:5 " +
                            std::string(PIPEFB_BINARY_DIR) + "/" + trainArgs(killed, extra));
  EXPECT_EQ(b.code, 128 + 9) << "expected death by SIGKILL: " << b.out;
  EXPECT_FALSE(fs::exists(killed + "/model.pt"));
  EXPECT_EQ(train::latestCheckpoint(killed), killed + "/checkpoints/step-000004");
  auto c = test::runProgram("pipefb_train --resume " + killed);
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("resumed from " + killed + "/checkpoints/step-000004 at step 4"),
            std::string::npos)
      << c.out;
  expectSameWeights(full + "/model.pt", killed + "/model.pt");
  // metrics.csv: steps 1..8 once each.
  std::istringstream rows(readFile(killed + "/metrics.csv"));
  std::string line;
  std::getline(rows, line);
  int64_t expect = 1;
  while (std::getline(rows, line)) EXPECT_EQ(std::atoll(line.c_str()), expect++) << line;
  EXPECT_EQ(expect, 9);

  const std::string torn = tempDir(name + "_torn");
  auto d = test::runCommand("PIPEFB_TEST_FAULT=kill-before-manifest:6 " +
                            std::string(PIPEFB_BINARY_DIR) + "/" + trainArgs(torn, extra));
  EXPECT_EQ(d.code, 128 + 9) << d.out;
  EXPECT_TRUE(fs::exists(torn + "/checkpoints/step-000006/model.pt"));
  EXPECT_FALSE(fs::exists(torn + "/checkpoints/step-000006/manifest.json"));
  auto e = test::runProgram("pipefb_train --resume " + torn);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("step-000004 at step 4"), std::string::npos) << e.out;
  expectSameWeights(full + "/model.pt", torn + "/model.pt");
}

TEST(Checkpoint, KillAndResumeIsBitwiseIdenticalSingleDevice) { killAndResume("single", ""); }
TEST(Checkpoint, KillAndResumeIsBitwiseIdentical1F1B) { killAndResume("1f1b", kOneF1B); }
// Note [Autocast]: at bf16 the checkpoint holds the fp32 masters and Adam's fp32 state, and
// a resumed run is the uninterrupted one bit for bit.
TEST(Checkpoint, KillAndResumeIsBitwiseIdenticalAtBf16) {
  killAndResume("bf16", std::string(kOneF1B) +
                            " --set training.precision=bf16 --set training.optimizer=adam");
}
// Note [Loss scaling]: at fp16 the scaler's state is in the checkpoint. The scale starts
// where mlp-tiny's gradients overflow and doubles after every good step, so steps 1, 2, 4, 5
// and 7 are skipped and the state at step 4 is not the config's: a resume that started
// from training.loss_scale would skip other steps and end with other weights.
TEST(Checkpoint, KillAndResumeIsBitwiseIdenticalAtFp16WithTheLossScale) {
  const std::string fp16 = std::string(kOneF1B) +
                           " --set training.precision=fp16 --set training.optimizer=adam"
                           " --set training.loss_scale=2097152 --set training.loss_scale_window=1";
  killAndResume("fp16", fp16);
  const auto full = nlohmann::json::parse(
      readFile(test::scratchPath("ckpt_test_fp16_full").string() + "/summary.json"));
  const auto resumed = nlohmann::json::parse(
      readFile(test::scratchPath("ckpt_test_fp16_killed").string() + "/summary.json"));
  EXPECT_EQ(full.at("loss_scale").at("skipped_steps").get<int>(), 5);
  EXPECT_EQ(resumed.at("loss_scale"), full.at("loss_scale"));
}
TEST(Checkpoint, KillAndResumeIsBitwiseIdenticalPipeDream) {
  killAndResume("pipedream",
                "--set pipeline.schedule=pipedream --set devices.count=2 "
                "--set pipeline.microbatches=2");
}

// Note [Optimizer offload]: the host optimizer's state (Adam, on host master copies) is
// saved under the model's names and restored into the host pool.
TEST(Checkpoint, KillAndResumeIsBitwiseIdenticalWithOptimizerOffload) {
  killAndResume("pipefb_sync_optoff",
                "--set pipeline.schedule=pipefb-sync --set devices.count=4 "
                "--set pipeline.microbatches=2 --set training.optimizer=adam "
                "--set training.lr=0.01 --set pipeline.optimizer_offload=host");
  killAndResume("pipedream_optoff",
                "--set pipeline.schedule=pipedream --set devices.count=2 "
                "--set pipeline.microbatches=2 "
                "--set pipeline.optimizer_offload=[host,none]");
}

TEST(Checkpoint, DeterministicRunsAreBitwiseIdentical) {
  for (std::string extra : {std::string(""), std::string(kOneF1B)}) {
    SCOPED_TRACE(extra);
    const std::string a = tempDir("det_a"), b = tempDir("det_b");
    auto ra = test::runProgram(trainArgs(a, extra + " --set training.checkpoint_every=0"));
    auto rb = test::runProgram(trainArgs(b, extra + " --set training.checkpoint_every=0"));
    ASSERT_EQ(ra.code, 0) << ra.out;
    ASSERT_EQ(rb.code, 0) << rb.out;
    EXPECT_EQ(readFile(a + "/model.pt"), readFile(b + "/model.pt"));
    // And checkpointing does not change a synchronous run.
    const std::string c = tempDir("det_c");
    auto rc = test::runProgram(trainArgs(c, extra));
    ASSERT_EQ(rc.code, 0) << rc.out;
    expectSameWeights(a + "/model.pt", c + "/model.pt");
  }
}

// Resume a 1F1B run (2 stages) on one device and as gpipe on 3 stages: the merged
// weights are re-partitioned. Synchronous schedules compute the same gradients as
// one device, so the result matches the uninterrupted run up to float rounding.
TEST(Checkpoint, ResumeUnderAnotherPlanRepartitions) {
  const std::string full = tempDir("replan_full");
  ASSERT_EQ(test::runProgram(trainArgs(full, kOneF1B)).code, 0);
  for (std::string plan :
       {std::string("--set pipeline.schedule=none --set devices.count=1"),
        std::string("--set pipeline.schedule=gpipe --set devices.count=3 --set pipeline.stages=3 "
                    "--set pipeline.partition=[1,2]")}) {
    SCOPED_TRACE(plan);
    const std::string run = tempDir("replan");
    auto b = test::runCommand("PIPEFB_TEST_FAULT=kill-after-step:5 " +
                              std::string(PIPEFB_BINARY_DIR) + "/" + trainArgs(run, kOneF1B));
    ASSERT_EQ(b.code, 128 + 9) << b.out;
    auto c = test::runProgram("pipefb_train --resume " + run + " " + plan);
    ASSERT_EQ(c.code, 0) << c.out;
    auto m = nlohmann::json::parse(readFile(run + "/checkpoints/step-000008/manifest.json"));
    EXPECT_EQ(m["plan"]["stages"].size(), plan.find("gpipe") != std::string::npos ? 3u : 1u);
    auto x = train::loadStateDict(full + "/model.pt"), y = train::loadStateDict(run + "/model.pt");
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_TRUE(torch::allclose(x[i].second, y[i].second, 1e-4, 1e-5)) << x[i].first;
  }
}

TEST(Checkpoint, PythonTorchLoadReadsTheMergedStateDict) {
  const std::string run = tempDir("python");
  ASSERT_EQ(test::runProgram(trainArgs(run, kOneF1B)).code, 0);
  const std::string dir = run + "/checkpoints/step-000008";
  // Every stage's names from the manifest are keys of model.pt, with the values C++ wrote.
  auto sd = train::loadStateDict(dir + "/model.pt");
  const std::string script =
      "import json, torch\n"
      "d = '" +
      dir +
      "'\n"
      "sd = torch.load(d + '/model.pt')\n"
      "m = json.load(open(d + '/manifest.json'))\n"
      "names = [n for st in m['plan']['stages'] for n in st['names']]\n"
      "assert sorted(names) == sorted(sd.keys()), (names, list(sd.keys()))\n"
      "assert len(m['plan']['stages']) == 2\n"
      "opt = torch.load(d + '/optimizer.pt')\n"
      "assert all(k.split('/')[0] in sd for k in opt)\n"
      "print('sum', sum(float(v.double().sum()) for v in sd.values()))\n";
  std::ofstream(run + "/check.py") << script;
  auto r = test::runCommand(std::string(PIPEFB_PYTHON) + " " + run + "/check.py");
  ASSERT_EQ(r.code, 0) << r.out;
  double sum = 0;
  for (auto& [k, t] : sd) sum += t.to(torch::kDouble).sum().item<double>();
  EXPECT_NEAR(std::stod(r.out.substr(r.out.find("sum ") + 4)), sum, 1e-9 * (1 + std::abs(sum)));
}

// A NaN in step 5's input: exit 1 naming stage, microbatch and step; the checkpoint of
// step 4 stays complete and nothing later is written.
TEST(Checkpoint, NumericalFaultNamesStageMicrobatchStepAndKeepsLastCheckpoint) {
  struct Case {
    std::string extra, expect;
  };
  for (const Case& c :
       {Case{"", "non-finite loss (nan) at step 5, stage 0, microbatch 0 of 1"},
        Case{"--set training.check_numerics=all", "non-finite activation of layer"},
        Case{kOneF1B, "non-finite loss (nan) at step 5, stage 1, microbatch 0 of 2"},
        Case{std::string(kOneF1B) + " --set training.check_numerics=all",
             "non-finite activation (nan) at step 5, stage 0, microbatch 0 of 2"}}) {
    SCOPED_TRACE(c.extra);
    const std::string run = tempDir("nan");
    auto r = test::runCommand("PIPEFB_TEST_FAULT=nan-input:5 " + std::string(PIPEFB_BINARY_DIR) +
                              "/" + trainArgs(run, c.extra));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("the last good checkpoint " + run + "/checkpoints/step-000004 is kept"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(train::latestCheckpoint(run), run + "/checkpoints/step-000004");
    EXPECT_NO_THROW(train::readCheckpoint(run + "/checkpoints/step-000004"));
    EXPECT_FALSE(fs::exists(run + "/checkpoints/step-000006"));
    EXPECT_FALSE(fs::exists(run + "/model.pt"));
  }
  // check_numerics: off lets the NaN through (the run completes).
  const std::string run = tempDir("nan_off");
  auto r = test::runCommand("PIPEFB_TEST_FAULT=nan-input:5 " + std::string(PIPEFB_BINARY_DIR) +
                            "/" + trainArgs(run, "--set training.check_numerics=off"));
  EXPECT_EQ(r.code, 0) << r.out;
}
