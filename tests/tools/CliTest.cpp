// The programs as a user runs them: exit codes and one-line errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "TestUtil.h"

namespace fs = std::filesystem;

namespace {

using pipefb::test::CommandResult;

CommandResult run(const std::string& args) { return pipefb::test::runProgram(args); }

std::string cfg(const std::string& name) {
  return std::string(PIPEFB_SOURCE_DIR) + "/configs/" + name;
}

std::string writeTemp(const std::string& name, const std::string& text) {
  fs::path p = pipefb::test::scratchPath("cli_" + name);
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST(PipefbTrain, BadInputExitsTwoWithOneLine) {
  struct Case {
    std::string args, mustContain;
  } cases[] = {
      {"pipefb_train --config " + cfg("mlp-tiny.yaml") + " --set training.lrr=1", "training.lrr"},
      {"pipefb_train --config " + cfg("mlp-tiny.yaml") + " --set training.batch=-3",
       "training.batch"},
      {"pipefb_train --config " + cfg("mlp-tiny.yaml") + " --set pipeline.microbatches=5",
       "pipeline.microbatches"},
      {"pipefb_train --config /nonexistent.yaml", "/nonexistent.yaml"},
      {"pipefb_train --config " + writeTemp("bad.yaml", "model:\n  name: [x\n"), "malformed YAML"},
      {"pipefb_train --config " + writeTemp("unk.yaml", "model:\n  nmae: vgg16\n"),
       "did you mean 'name'"},
      {"pipefb_train --config " + cfg("mlp-tiny.yaml") + " --bogus-flag", "bogus"},
      {"pipefb_train", "--config"},
      {"pipefb_train --config " + cfg("vgg16-single.yaml") + " --set data.path=/nonexistent/fm",
       "/nonexistent/fm"},
  };
  for (const auto& c : cases) {
    CommandResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.mustContain), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(pipefb::test::countLines(r.out), 1u) << c.args << "\n" << r.out;
  }
}

TEST(PipefbTrain, TinyRunSucceedsAndWritesRunFolder) {
  fs::path dir = pipefb::test::scratchPath("cli_run");
  fs::remove_all(dir);
  CommandResult r = run("pipefb_train --config " + cfg("mlp-tiny.yaml") +
                        " --set training.iterations=5 --set output.dir=" + dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 5/5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("samples/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir / "summary.json"));
  EXPECT_TRUE(fs::exists(dir / "model.pt"));
}

// Note [Planner partition in pipefb_train]: without pipeline.partition, the first run
// measures the model's profile into profiles/ of its working directory and plans on it;
// the next run reads the cache. The run folder keeps the plan the partition came from.
// Note [The planner's whole plan in pipefb_train]: a PipeFB config that pins no shape runs
// the plan pipefb_plan writes for its schedule, stash and microbatches on the same profile:
// the same stages, layers and devices.
TEST(PipefbTrain, PipeFbConfigRunsThePlanPipefbPlanWrites) {
  const fs::path work = pipefb::test::freshDir("cli_whole_plan");
  const std::string shape = " --config " + cfg("mlp-tiny.yaml") +
                            " --set pipeline.schedule=pipefb-sync --set devices.count=4"
                            " --set pipeline.microbatches=2 --set pipeline.stash=offload";
  CommandResult train = pipefb::test::runCommand(
      "cd " + work.string() + " && " + PIPEFB_BINARY_DIR + "/pipefb_train" + shape +
      " --set training.iterations=2 --set training.eval=false --set output.dir=" +
      (work / "run").string());
  ASSERT_EQ(train.code, 0) << train.out;
  EXPECT_NE(train.out.find("planned by the planner (measured profiles/mlp-mb16-"),
            std::string::npos)
      << train.out;
  fs::path profile;
  for (const auto& e : fs::directory_iterator(work / "profiles")) profile = e.path();
  ASSERT_FALSE(profile.empty());
  CommandResult plan =
      pipefb::test::runCommand("cd " + work.string() + " && " + PIPEFB_BINARY_DIR + "/pipefb_plan" +
                               shape + " --profile profiles/" + profile.filename().string() +
                               " --schedules pipefb-sync-offload --microbatches 2 -o planned.yaml");
  ASSERT_EQ(plan.code, 0) << plan.out;
  // Each stage's layers and devices, in order.
  auto stages = [](const fs::path& p) {
    std::ifstream in(p);
    std::string line, out;
    while (std::getline(in, line))
      if (line.find("  - layers:") == 0 || line.find("forward_device:") != std::string::npos ||
          line.find("backward_device:") != std::string::npos)
        out += line + "\n";
    return out;
  };
  const std::string ran = stages(work / "run" / "plan.yaml");
  EXPECT_FALSE(ran.empty());
  EXPECT_EQ(ran, stages(work / "planned.yaml"));
  fs::remove_all(work);
}

TEST(PipefbTrain, PlannerPartitionIsPlannedOnAMeasuredProfileCachedOnFirstUse) {
  const fs::path work = pipefb::test::freshDir("cli_partition");
  const std::string cmd = "cd " + work.string() + " && " + PIPEFB_BINARY_DIR +
                          "/pipefb_train --config " + cfg("mlp-tiny.yaml") +
                          " --set pipeline.schedule=1f1b --set devices.count=2"
                          " --set pipeline.microbatches=2 --set training.iterations=1"
                          " --set training.eval=false --set output.dir=" +
                          (work / "run").string();
  CommandResult first = pipefb::test::runCommand(cmd);
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("measuring the model's profile"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("partition by the planner (measured profiles/mlp-mb16-"),
            std::string::npos)
      << first.out;
  ASSERT_TRUE(fs::is_directory(work / "profiles"));
  int files = 0;
  for (const auto& e : fs::directory_iterator(work / "profiles")) files += e.is_regular_file();
  EXPECT_EQ(files, 1);  // the profile, and no temporary left behind
  std::ifstream plan(work / "run" / "plan.yaml");
  std::string text((std::istreambuf_iterator<char>(plan)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("profile: \"measured profiles/mlp-mb16-"), std::string::npos) << text;

  CommandResult second = pipefb::test::runCommand(cmd);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_EQ(second.out.find("measuring the model's profile"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("partition by the planner (measured profiles/mlp-mb16-"),
            std::string::npos)
      << second.out;
  fs::remove_all(work);
}

// No fit, no start: a config whose devices.memory no plan of its family fits exits 2
// before training, with one error line that names the smallest budget that fits; at that
// budget the same config trains, and one byte below it is refused again. PipeFB plans the
// whole pipeline (Note [The planner's whole plan in pipefb_train]); 1f1b plans the
// partition of its shape. Both refuse before the full profile (Note [No fit before the
// profile] in src/tools/pipefb_train.cpp).
TEST(PipefbTrain, NothingFitsExitsTwoNamingTheSmallestBudget) {
  for (const std::string schedule : {"pipefb-sync", "1f1b"}) {
    SCOPED_TRACE(schedule);
    const fs::path work = pipefb::test::freshDir("cli_nothing_fits");
    auto train = [&](const std::string& memory) {
      return pipefb::test::runCommand(
          "cd " + work.string() + " && " + PIPEFB_BINARY_DIR + "/pipefb_train --config " +
          cfg("mlp-tiny.yaml") + " --set pipeline.schedule=" + schedule +
          " --set devices.count=2 --set pipeline.microbatches=2 --set training.iterations=2"
          " --set training.eval=false --set devices.memory=" +
          memory + " --set output.dir=" + (work / "run").string());
    };
    CommandResult tiny = train("4KiB");
    ASSERT_EQ(tiny.code, 2) << tiny.out;
    EXPECT_FALSE(fs::exists(work / "run")) << tiny.out;
    // Note [No fit before the profile]: refused on the bytes alone, before the full
    // profile is measured and cached.
    EXPECT_FALSE(fs::exists(work / "profiles")) << tiny.out;
    const std::string error = tiny.out.substr(tiny.out.find("pipefb_train: error: "));
    EXPECT_EQ(pipefb::test::countLines(error), 1u) << tiny.out;
    EXPECT_NE(error.find("no " + schedule + "-"), std::string::npos) << error;
    EXPECT_NE(error.find("on 2 devices"), std::string::npos) << error;
    const std::string tag = "the smallest budget that fits is ";
    const auto at = error.find(tag);
    ASSERT_NE(at, std::string::npos) << error;
    const auto open = error.find('(', at);
    ASSERT_NE(open, std::string::npos) << error;
    const long long bytes = std::stoll(error.substr(open + 1));
    ASSERT_GT(bytes, 4096);
    CommandResult fits = train(std::to_string(bytes));
    EXPECT_EQ(fits.code, 0) << fits.out;
    fs::remove_all(work / "run");
    CommandResult below = train(std::to_string(bytes - 1));
    EXPECT_EQ(below.code, 2) << below.out;
    fs::remove_all(work);
  }
}

// No fit, no start for --plan: a plan file whose planned peak is over devices.memory exits
// 2 before training, naming the device, its planned peak and the budget that fits.
TEST(PipefbTrain, PlanOverItsBudgetExitsTwoBeforeTraining) {
  const fs::path work = pipefb::test::freshDir("cli_plan_over_budget");
  const std::string shape = " --config " + cfg("mlp-tiny.yaml") +
                            " --set pipeline.schedule=1f1b --set devices.count=2"
                            " --set pipeline.microbatches=2";
  CommandResult plan =
      pipefb::test::runCommand("cd " + work.string() + " && " + PIPEFB_BINARY_DIR + "/pipefb_plan" +
                               shape + " --schedules 1f1b-keep --microbatches 2 -o plan.yaml");
  ASSERT_EQ(plan.code, 0) << plan.out;
  auto train = [&](const std::string& memory) {
    return pipefb::test::runCommand("cd " + work.string() + " && " + PIPEFB_BINARY_DIR +
                                    "/pipefb_train" + shape +
                                    " --plan plan.yaml --set training.iterations=2"
                                    " --set training.eval=false --set devices.memory=" +
                                    memory + " --set output.dir=" + (work / "run").string());
  };
  CommandResult tiny = train("4KiB");
  ASSERT_EQ(tiny.code, 2) << tiny.out;
  EXPECT_EQ(pipefb::test::countLines(tiny.out), 1u) << tiny.out;
  EXPECT_NE(tiny.out.find("plan.yaml: device 0's planned peak"), std::string::npos) << tiny.out;
  EXPECT_NE(tiny.out.find("is over its devices.memory 4.00 KiB"), std::string::npos) << tiny.out;
  EXPECT_FALSE(fs::exists(work / "run")) << tiny.out;
  EXPECT_EQ(train("1GiB").code, 0);
  fs::remove_all(work);
}
