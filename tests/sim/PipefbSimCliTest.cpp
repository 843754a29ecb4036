// Runs the real pipefb_sim binary (build/pipefb_sim).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "TestUtil.h"

namespace {

using CliRun = pipefb::test::CommandResult;

CliRun pipefbSim(const std::string& args) { return pipefb::test::runProgram("pipefb_sim " + args); }

int lines(const std::string& s) { return static_cast<int>(pipefb::test::countLines(s)); }

}  // namespace

TEST(PipefbSimCliTest, TextOutputHasTimelineAndNumbers) {
  CliRun r = pipefbSim("--schedule 1f1b --stages 4 --microbatches 8");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("dev3"), std::string::npos);
  EXPECT_NE(r.out.find("bubble fraction 0.2727"), std::string::npos) << r.out;  // 3/11
  EXPECT_NE(r.out.find("iteration time"), std::string::npos);
  EXPECT_NE(r.out.find("peak stashes"), std::string::npos);
}

TEST(PipefbSimCliTest, JsonReportHasTheDocumentedFields) {
  CliRun r =
      pipefbSim("--schedule pipefb-sync --stages 3 --microbatches 4 --policy offload --json");
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* k :
       {"schedule", "stages", "microbatches", "iterations", "devices", "policy", "lookahead",
        "costs", "time_unit", "makespan", "iteration_time", "iteration_ends", "bubble_fraction",
        "compute_devices", "per_device", "per_stage", "host_pool", "memory_timeline", "actions"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["devices"], 6);
  ASSERT_EQ(j["per_device"].size(), 6u);
  for (const auto& d : j["per_device"])
    for (const char* k :
         {"device", "busy_time", "peak_bytes", "peak_time", "peak_breakdown", "peak_by_category",
          "peak_stash_count", "peak_stash_bytes", "peak_stash_count_by_stage"})
      EXPECT_TRUE(d.contains(k)) << k;
  // Forward device, offloading: M = 4 > 1, so it holds each copy until its next OFF (Note
  // [Held offloads] in schedules/HeldOffloads.h).
  EXPECT_EQ(j["per_device"][0]["peak_stash_count"], 1);
  EXPECT_TRUE(j["per_device"][0]["peak_breakdown"].contains("optimizer_state"));
  for (const auto& s : j["per_stage"])
    for (const char* k :
         {"stage", "forward_device", "backward_device", "peak_in_flight", "peak_resident_forward",
          "peak_resident_backward", "peak_weight_versions", "contract"})
      EXPECT_TRUE(s.contains(k)) << k;
  EXPECT_GT(j["host_pool"]["peak_bytes"].get<long long>(), 0);
  EXPECT_FALSE(j["actions"].empty());
  EXPECT_TRUE(j["actions"][0].contains("start"));
  EXPECT_TRUE(j["memory_timeline"][0]["samples"][0].contains("weights"));
}

TEST(PipefbSimCliTest, BadInputExitsTwoWithOneLine) {
  for (std::string args :
       {"--stages", "--stages x", "--bogus", "--schedule zigzag", "--policy ofload", "--stages 0",
        "--costs /nonexistent.json", "--lookahead -1", "--policy keep,keep"}) {
    CliRun r = pipefbSim(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << args << ": " << r.out;
    EXPECT_EQ(r.out.rfind("pipefb_sim: error: ", 0), 0u) << r.out;
  }
  CliRun r = pipefbSim("--schedule zigzag");
  EXPECT_NE(r.out.find("gpipe | 1f1b | pipedream | pipefb-sync | pipefb-async"), std::string::npos)
      << r.out;
}

TEST(PipefbSimCliTest, LoadsATextScheduleAndCostFile) {
  // A private directory, so parallel runs do not share files.
  std::string tmpl = std::string(PIPEFB_BINARY_DIR) + "/tests/sim/cli_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  std::string dir = tmpl;
  CliRun printed = pipefbSim("--schedule gpipe --stages 2 --microbatches 2 --print-schedule");
  ASSERT_EQ(printed.code, 0);
  std::string text = printed.out.substr(0, printed.out.find("\n\n") + 1);
  std::ofstream(dir + "/cli_schedule.txt") << text;
  std::ofstream(dir + "/cli_costs.json") << R"({"stage": {"forward": 0.5, "backward": 1.0}})";
  CliRun r = pipefbSim("--load " + dir + "/cli_schedule.txt --costs " + dir +
                       "/cli_costs.json --json --no-actions --no-memory-timeline");
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["makespan"].get<double>(), 3 * 1.5);  // (M+S-1)(F+B)
  EXPECT_FALSE(j.contains("actions"));
  EXPECT_TRUE(j["per_stage"][0]["contract"].is_null());
  // A broken schedule file: exit 2 and the grid.
  std::ofstream(dir + "/cli_broken.txt")
      << "stages 2\nmicrobatches 1\nplacement 0/0 1/1\ndevice 0: F0.0 B0.0\ndevice 1: F1.0 B1.0\n";
  CliRun bad = pipefbSim("--load " + dir + "/cli_broken.txt");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("missing receive"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("[*B0.0*]"), std::string::npos) << bad.out;
  std::filesystem::remove_all(dir);
}

// Note [Folded placements]: 4 stages on 4 devices, F(d) and B(3-d) on device d. With uniform
// costs every device is busy F + B per microbatch, and the bubble is below 1F1B's (3/11) on
// the same devices, far below the 2S-device form's.
TEST(PipefbSimCliTest, FoldedPlacementRunsOnSDevices) {
  auto bubble = [](const CliRun& r) {
    return nlohmann::json::parse(r.out)["bubble_fraction"].get<double>();
  };
  const std::string common = " --stages 4 --microbatches 8 --iterations 3 --json --no-actions";
  CliRun folded =
      pipefbSim("--schedule pipefb-sync --policy offload --placement \"0/3 1/2 2/1 3/0\"" + common);
  ASSERT_EQ(folded.code, 0) << folded.out;
  EXPECT_EQ(nlohmann::json::parse(folded.out)["devices"], 4);
  CliRun twoS = pipefbSim("--schedule pipefb-sync --policy offload" + common);
  CliRun oneFOneB = pipefbSim("--schedule 1f1b" + common);
  ASSERT_EQ(twoS.code, 0) << twoS.out;
  ASSERT_EQ(oneFOneB.code, 0) << oneFOneB.out;
  EXPECT_LT(bubble(folded), bubble(oneFOneB));
  EXPECT_LT(bubble(folded), bubble(twoS));
  // Odd S: the middle stage is not split.
  CliRun odd = pipefbSim(
      "--schedule pipefb-async --stages 3 --microbatches 4 --policy offload "
      "--placement \"0/2 1/1 2/0\" --no-actions --json");
  ASSERT_EQ(odd.code, 0) << odd.out;
  // Backwards of two stages that are not consecutive on one device are refused, with exit
  // code 2 and one line (Note [Decoupled partitions]).
  CliRun bad = pipefbSim("--schedule pipefb-sync --stages 3 --placement \"0/1 2/3 4/1\"");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("backward of stages 0 and 2 but not of the stages between"),
            std::string::npos)
      << bad.out;
  EXPECT_EQ(std::count(bad.out.begin(), bad.out.end(), '\n'), 1) << bad.out;
}

// Note [Decoupled partitions]: one forward device feeding three backward devices. With
// uniform costs (F = 1 ms, B = 2 ms, the checkpoint's recompute 1 ms) the forward device
// runs three 1 ms forwards per microbatch and each backward device one 3 ms backward: every
// device is equally busy.
TEST(PipefbSimCliTest, DecoupledPlacementRunsOneForwardDeviceFeedingThree) {
  for (const std::string kind : {"pipefb-sync", "pipefb-async"}) {
    CliRun r = pipefbSim("--schedule " + kind +
                         " --stages 3 --microbatches 6 --iterations 2 --policy checkpoint "
                         "--placement \"0/1 0/2 0/3\" --json --no-actions");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["devices"], 4);
    ASSERT_EQ(j["per_device"].size(), 4u) << r.out;
    const double f = j["per_device"][0]["busy_time"].get<double>();
    for (int d = 1; d < 4; ++d)  // B with its recompute: 3 ms against three 1 ms forwards
      EXPECT_NEAR(j["per_device"][d]["busy_time"].get<double>(), f, 1e-9) << kind << " " << d;
  }
}
