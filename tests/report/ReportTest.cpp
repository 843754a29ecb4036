// Runs build/pipefb_train on tiny configs as a user does, and checks the report it
// leaves in the run folder (report.html, charts/*.svg, memory.json, trace.json).
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "TestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/report/Report.h"

namespace pipefb::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string runDir(const std::string& name) {
  return std::string(PIPEFB_BINARY_DIR) + "/test-runs/report/" + name;
}

/// Trains configs/mlp-tiny.yaml into a fresh folder with `extra` settings.
std::string train(const std::string& name, const std::string& extra) {
  const std::string dir = runDir(name);
  fs::remove_all(dir);
  auto r = test::runProgram("pipefb_train --config " + std::string(PIPEFB_SOURCE_DIR) +
                            "/configs/mlp-tiny.yaml --set output.dir=" + dir +
                            " --set output.progress=false " + extra);
  EXPECT_EQ(r.code, 0) << r.out;
  return dir;
}

void expectGnuplotSvg(const fs::path& p) {
  ASSERT_TRUE(fs::exists(p)) << p;
  std::string s = slurp(p);
  EXPECT_NE(s.find("<svg"), std::string::npos) << p;
  EXPECT_NE(s.find("Produced by GNUPLOT"), std::string::npos) << p;
  EXPECT_NE(s.find("<path"), std::string::npos) << p;
  EXPECT_NE(s.find(" d='M"), std::string::npos) << p << ": no path data";
}

/// Everything a run folder's report must satisfy; `devices` counts the compute devices.
void checkRunFolder(const std::string& dir, int devices, bool host) {
  const fs::path run(dir);
  const json summary = json::parse(slurp(run / "summary.json"));
  const json memory = json::parse(slurp(run / "memory.json"));
  const json trace = json::parse(slurp(run / "trace.json"));
  const std::string html = slurp(run / "report.html");

  // memory.json: one entry per summary device, same peak, breakdown sums to it.
  ASSERT_EQ(memory["devices"].size(), summary["devices"].size());
  ASSERT_EQ(summary["devices"].size(), static_cast<size_t>(devices + (host ? 1 : 0)));
  for (size_t i = 0; i < summary["devices"].size(); ++i) {
    const auto& s = summary["devices"][i];
    const auto& m = memory["devices"][i];
    EXPECT_EQ(m["name"], s["name"]);
    EXPECT_EQ(m["peak_bytes"], s["peak_bytes"]) << s["name"];
    int64_t sum = 0;
    for (const auto& [k, v] : m["at_peak"].items()) sum += v.get<int64_t>();
    EXPECT_EQ(sum, m["peak_bytes"].get<int64_t>()) << s["name"] << ": breakdown at the peak";
    if (i < static_cast<size_t>(devices)) {
      EXPECT_GT(m["peak_bytes"].get<int64_t>(), 0) << s["name"];
      // The moment comes from the trace; no sample can exceed the allocator's peak.
      ASSERT_TRUE(m["peak_time_ms"].is_number()) << s["name"];
      EXPECT_GE(m["peak_time_ms"].get<double>(), 0.0);
      EXPECT_LE(m["trace_peak_bytes"].get<int64_t>(), m["peak_bytes"].get<int64_t>());
      EXPECT_GT(m["trace_peak_bytes"].get<int64_t>(), 0);
      ASSERT_TRUE(m.contains("chart")) << s["name"];
      expectGnuplotSvg(run / m["chart"].get<std::string>());
    }
  }
  EXPECT_TRUE(memory["iteration_seconds"]["measured"].is_number());
  EXPECT_TRUE(memory["warnings"].is_array());

  // trace.json: one process per device (+ host), spans and memory counters on each device.
  std::map<int, std::string> names;
  std::map<int, int> spans, counters;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") names[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "X") ++spans[e["pid"]];
    if (e["ph"] == "C") {
      ++counters[e["pid"]];
      EXPECT_TRUE(e["args"].contains("stash"));
    }
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(devices + (host ? 1 : 0)));
  // A pipeline run (it has the host pool) names a copy-engine track on every device.
  std::set<int> copyTracks;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == 1 &&
        e["args"]["name"] == "copy engine")
      copyTracks.insert(e["pid"].get<int>());
  EXPECT_EQ(copyTracks.size(), host ? static_cast<size_t>(devices) : 0u);
  for (int d = 0; d < devices; ++d) {
    EXPECT_EQ(names[d], "cpu:" + std::to_string(d));
    EXPECT_GT(spans[d], 0) << "device " << d << " has no compute track";
    EXPECT_GT(counters[d], 0) << "device " << d << " has no memory counters";
  }

  // Charts: loss and throughput from metrics.csv, memory per device; all inlined.
  expectGnuplotSvg(run / "charts/loss.svg");
  expectGnuplotSvg(run / "charts/throughput.svg");
  EXPECT_NE(html.find("<html"), std::string::npos);
  for (const char* c : {"charts/loss.svg", "charts/throughput.svg", "charts/memory-cpu0.svg"})
    EXPECT_NE(html.find(c), std::string::npos) << c;
  size_t inlined = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1))
    ++inlined;
  // Timelines (the host pool's too, and details of the event stream) + loss + throughput.
  size_t timelines = 0;
  for (const auto& f : fs::directory_iterator(run / "charts"))
    if (f.path().extension() == ".svg" && f.path().filename().string().rfind("memory-", 0) == 0) {
      ++timelines;
      expectGnuplotSvg(f.path());
      EXPECT_NE(html.find("charts/" + f.path().filename().string()), std::string::npos) << f.path();
    }
  EXPECT_GE(timelines, static_cast<size_t>(devices + (host ? 1 : 0)));
  EXPECT_EQ(inlined, timelines + 2);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org"))  // no network resources
      << "report.html must be self-contained";
  for (const char* section :
       {"Warnings", "Peak memory per device", "Memory timelines", "Offload traffic",
        "Predicted against measured", "Loss and throughput", "Configuration"})
    EXPECT_NE(html.find(section), std::string::npos) << section;
  EXPECT_NE(html.find("name: mlp"), std::string::npos) << "config.yaml is not in the page";
}

TEST(ReportTest, SingleDeviceRunLeavesAReport) {
  const std::string dir = train("single", "");
  checkRunFolder(dir, 1, false);
  // The single-device trace records the event stream of the first steps: the replayed
  // counters must show the stash (activations saved for backward) at some point.
  const json trace = json::parse(slurp(fs::path(dir) / "trace.json"));
  int64_t maxStash = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "C" && e["name"] == "memory events")
      maxStash = std::max<int64_t>(maxStash, e["args"]["stash"].get<int64_t>());
  EXPECT_GT(maxStash, 0);
  // The first step of the 10 traced is in the event stream: it gets a chart of its own.
  const json memory = json::parse(slurp(fs::path(dir) / "memory.json"));
  EXPECT_EQ(memory["devices"][0]["chart_detail"], "charts/memory-cpu0-detail.svg");
}

// Issue 19, Note [Trace window]: output.trace_steps [skip, steps] traces only those
// steps, while summary.json and memory.json keep the peaks of the whole run.
TEST(ReportTest, TraceStepsKeepsAWindowAndThePeaksStayExact) {
  // One device: a span per step, named by its step.
  const std::string single = train("window-single", "--set output.trace_steps=[5,4]");
  const json trace = json::parse(slurp(fs::path(single) / "trace.json"));
  std::vector<int64_t> steps;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") steps.push_back(e["args"]["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{6, 7, 8, 9}));
  // A pipeline: 1f1b, 2 stages x 2 microbatches, 20 iterations; 3 traced.
  const std::string args =
      "--set pipeline.schedule=1f1b --set pipeline.stages=2 --set devices.count=2 "
      "--set pipeline.microbatches=2";
  const std::string whole = train("window-whole", args + " --set output.trace_steps=[0,20]");
  const std::string part = train("window-part", args + " --set output.trace_steps=[8,3]");
  auto forwards = [](const std::string& dir) {
    int n = 0;
    const json t = json::parse(slurp(fs::path(dir) / "trace.json"));
    for (const auto& e : t["traceEvents"]) n += e["ph"] == "X" && e.value("cat", "") == "F";
    return n;
  };
  EXPECT_EQ(forwards(whole), 20 * 2 * 2);  // every F of 20 iterations
  EXPECT_EQ(forwards(part), 3 * 2 * 2);    // iterations 9..11 only
  EXPECT_LT(fs::file_size(fs::path(part) / "trace.json"),
            fs::file_size(fs::path(whole) / "trace.json") / 2);
  // memory.json's peaks are the whole run's (summary.json, the domains' counters), not the
  // window's: at least the highest traced sample.
  const json memory = json::parse(slurp(fs::path(part) / "memory.json"));
  const json summary = json::parse(slurp(fs::path(part) / "summary.json"));
  for (const auto& d : memory["devices"]) {
    for (const auto& s : summary["devices"])
      if (s["name"] == d["name"]) EXPECT_EQ(d["peak_bytes"], s["peak_bytes"]) << d["name"];
    if (!d["trace_peak_bytes"].is_null())
      EXPECT_GE(d["peak_bytes"].get<int64_t>(), d["trace_peak_bytes"].get<int64_t>());
  }
}

TEST(ReportTest, PipelineRunLeavesAReportWithOneTrackPerDevice) {
  const std::string dir = train("1f1b",
                                "--set pipeline.schedule=1f1b --set pipeline.stages=2 "
                                "--set devices.count=2 --set pipeline.microbatches=2");
  checkRunFolder(dir, 2, true);
  // The host pool has a timeline even when nothing was offloaded.
  expectGnuplotSvg(fs::path(dir) / "charts/memory-host.svg");
  // 2 stages of a 2-layer-ish MLP: the runtime's spans name F and B actions of both stages.
  const json trace = json::parse(slurp(fs::path(dir) / "trace.json"));
  std::set<std::string> cats;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") cats.insert(e["cat"].get<std::string>());
  EXPECT_GE(cats.size(), 2u);
  EXPECT_EQ(trace["otherData"]["stages"], 2);
  // pipefb_train chose the partition with the planner: its plan is in the run folder and
  // the report compares its predictions with the run.
  ASSERT_TRUE(fs::exists(fs::path(dir) / "plan.yaml"));
  EXPECT_NE(slurp(fs::path(dir) / "plan.yaml").find("iteration_time:"), std::string::npos);
  const json memory = json::parse(slurp(fs::path(dir) / "memory.json"));
  EXPECT_TRUE(memory["iteration_seconds"]["predicted"].is_number()) << memory["iteration_seconds"];
}

TEST(ReportTest, OffloadRunShowsTrafficAndTheHostPoolTimeline) {
  const std::string dir = train("offload",
                                "--set pipeline.schedule=1f1b --set pipeline.stages=2 "
                                "--set devices.count=2 --set pipeline.microbatches=4 "
                                "--set pipeline.stash=offload --set training.iterations=6");
  checkRunFolder(dir, 2, true);
  const json memory = json::parse(slurp(fs::path(dir) / "memory.json"));
  ASSERT_EQ(memory["transfers"].size(), 2u);
  for (const auto& t : memory["transfers"]) {
    EXPECT_GT(t["bytes_d2h"].get<int64_t>(), 0) << t;
    EXPECT_EQ(t["bytes_d2h"], t["bytes_h2d"]) << "every offloaded stash comes back";
  }
  // The host pool held the offloaded stashes: its timeline is not flat.
  EXPECT_EQ(memory["devices"][2]["name"], "host");
  EXPECT_GT(memory["devices"][2]["trace_peak_bytes"].get<int64_t>(), 0);
  // trace.json: each device's copy engine is a track of its own (tid 1 of the device's
  // process) holding one span per copy job, and the spans add up to the counters.
  const json trace = json::parse(slurp(fs::path(dir) / "trace.json"));
  const json summary = json::parse(slurp(fs::path(dir) / "summary.json"));
  for (int d = 0; d < 2; ++d) {
    bool named = false;
    int64_t d2h = 0, h2d = 0, offloads = 0, prefetches = 0;
    double lastEnd = -1;
    for (const auto& e : trace["traceEvents"]) {
      if (e["pid"] != d || !e.contains("tid") || e["tid"] != 1) continue;
      if (e["ph"] == "M" && e["name"] == "thread_name") named = e["args"]["name"] == "copy engine";
      if (e["ph"] != "X") continue;
      const bool off = e["cat"] == "offload";
      EXPECT_TRUE(off || e["cat"] == "prefetch") << e;
      EXPECT_EQ(e["name"].get<std::string>().substr(0, 4), off ? "D2H " : "H2D ") << e;
      EXPECT_EQ(e["args"]["what"], "stash") << e;
      (off ? d2h : h2d) += e["args"]["bytes"].get<int64_t>();
      ++(off ? offloads : prefetches);
      // One engine copies one job at a time: its spans never overlap.
      EXPECT_GE(e["ts"].get<double>(), lastEnd - 1e-3) << e;
      lastEnd = e["ts"].get<double>() + e["dur"].get<double>();
    }
    const json& t = summary["pipeline"]["transfers"][d];
    EXPECT_TRUE(named) << "device " << d << " has no copy-engine track";
    EXPECT_EQ(d2h, t["bytes_d2h"].get<int64_t>()) << "device " << d;
    EXPECT_EQ(h2d, t["bytes_h2d"].get<int64_t>()) << "device " << d;
    EXPECT_EQ(offloads, t["offloads"].get<int64_t>()) << "device " << d;
    EXPECT_EQ(prefetches, t["prefetches"].get<int64_t>()) << "device " << d;
    EXPECT_GT(offloads + prefetches, 0) << "device " << d;
  }
  const std::string html = slurp(fs::path(dir) / "report.html");
  EXPECT_NE(html.find("offloaded (D2H)"), std::string::npos);
  EXPECT_EQ(html.find("No bytes moved"), std::string::npos);
}

TEST(ReportTest, ProgramRebuildsTheReportAndNamesBadInput) {
  const std::string dir = train("rebuild", "--set training.iterations=4");
  fs::remove(fs::path(dir) / "report.html");
  fs::remove(fs::path(dir) / "memory.json");
  fs::remove_all(fs::path(dir) / "charts");
  auto r = test::runProgram("pipefb_report " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(fs::path(dir) / "report.html"));
  expectGnuplotSvg(fs::path(dir) / "charts/memory-cpu0.svg");

  auto missing = test::runProgram("pipefb_report " + runDir("no-such-run"));
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("summary.json"), std::string::npos) << missing.out;

  // gnuplot missing is a failure with a hint, not a crash.
  EXPECT_THROW(
      {
        ReportOptions o;
        o.gnuplot = "/nonexistent/gnuplot";
        writeReport(dir, o);
      },
      std::runtime_error);
}

TEST(ReportTest, WarnsWhenADeviceIsNearItsCapacity) {
  // A run whose peak uses more than 95% of devices.memory: written by hand from a real
  // summary, with the capacity set just above the peak.
  const std::string dir = runDir("near-capacity");
  const std::string src = train("near-capacity-src", "--set training.iterations=2");
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"metrics.csv", "config.yaml", "trace.json"})
    fs::copy_file(fs::path(src) / f, fs::path(dir) / f);
  json s = json::parse(slurp(fs::path(src) / "summary.json"));
  s["devices"][0]["capacity_bytes"] = s["devices"][0]["peak_bytes"].get<int64_t>() + 1;
  std::ofstream(fs::path(dir) / "summary.json") << s.dump();
  auto r = writeReport(dir);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("within 5% of its capacity"), std::string::npos) << r.warnings[0];
  EXPECT_NE(slurp(r.html).find("within 5% of its capacity"), std::string::npos);
}

TEST(ReportTest, WarnsAboutStallsAndImbalancedStagesOnlyAboveTheThresholds) {
  const std::string src = train("warnings-src",
                                "--set pipeline.schedule=1f1b --set pipeline.stages=2 "
                                "--set devices.count=2 --set pipeline.microbatches=2 "
                                "--set pipeline.stash=offload --set training.iterations=4");
  const json base = json::parse(slurp(fs::path(src) / "summary.json"));
  ASSERT_EQ(base["pipeline"]["transfers"].size(), 2u);
  auto reportWith = [&](const std::string& name, double stall, double busy0, double busy1) {
    const std::string dir = runDir(name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* f : {"metrics.csv", "config.yaml", "trace.json"})
      fs::copy_file(fs::path(src) / f, fs::path(dir) / f);
    json s = base;
    s["wall_seconds"] = 10.0;
    s["pipeline"]["transfers"][1]["stall_seconds"] = stall;
    s["pipeline"]["devices"][0]["busy_seconds"] = busy0;
    s["pipeline"]["devices"][1]["busy_seconds"] = busy1;
    std::ofstream(fs::path(dir) / "summary.json") << s.dump();
    return writeReport(dir).warnings;
  };
  auto has = [](const std::vector<std::string>& w, const std::string& what) {
    for (const auto& x : w)
      if (x.find(what) != std::string::npos) return true;
    return false;
  };
  // 0.6 s of 10 s stalled (6%), 3 s against 2 s of compute (1.5x): both warned.
  auto w = reportWith("warnings-on", 0.6, 2.0, 3.0);
  EXPECT_TRUE(has(w, "cpu:1 stalled")) << ::testing::PrintToString(w);
  EXPECT_TRUE(has(w, "imbalanced stages: cpu:1")) << ::testing::PrintToString(w);
  // 0.4 s (4%) and 2.2 s against 2 s (1.1x): neither.
  w = reportWith("warnings-off", 0.4, 2.0, 2.2);
  EXPECT_FALSE(has(w, "stalled")) << ::testing::PrintToString(w);
  EXPECT_FALSE(has(w, "imbalanced")) << ::testing::PrintToString(w);
}

// Note [Why stages are imbalanced]: with the plan the partition came from, the warning
// says why the imbalance is there.
TEST(ReportTest, ImbalanceWarningSaysWhyWhenThePlannerChoseThePartition) {
  const std::string src = train("why-src",
                                "--set pipeline.schedule=1f1b --set pipeline.stages=2 "
                                "--set devices.count=2 --set pipeline.microbatches=2 "
                                "--set training.iterations=2");
  json s = json::parse(slurp(fs::path(src) / "summary.json"));
  s["pipeline"]["devices"][0]["busy_seconds"] = 2.0;
  s["pipeline"]["devices"][1]["busy_seconds"] = 3.0;
  auto warningWith = [&](const std::string& name, const std::string& plan) {
    const std::string dir = runDir(name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* f : {"metrics.csv", "config.yaml", "trace.json"})
      fs::copy_file(fs::path(src) / f, fs::path(dir) / f);
    std::ofstream(fs::path(dir) / "summary.json") << s.dump();
    if (!plan.empty()) std::ofstream(fs::path(dir) / "plan.yaml") << plan;
    for (const auto& w : writeReport(dir).warnings)
      if (w.find("imbalanced stages: cpu:1") != std::string::npos) return w;
    return std::string("(no imbalance warning)");
  };
  auto stage = [](int fd, int bd, double f, double b, double pace) {
    return "  - forward_device: " + std::to_string(fd) +
           "\n    backward_device: " + std::to_string(bd) +
           "\n    predicted: {forward_time: " + std::to_string(f) +
           ", backward_time: " + std::to_string(b) + ", pace: " + std::to_string(pace) + "}\n";
  };
  std::string w = warningWith("why-none", "");
  EXPECT_NE(w.find("let the planner choose it"), std::string::npos) << w;
  // PipeFB: F of the stage on cpu:0, its B (2.1x) on cpu:1.
  w = warningWith("why-split", "stages:\n" + stage(0, 1, 0.010, 0.021, 0.021));
  EXPECT_NE(w.find("the planner chose this partition"), std::string::npos) << w;
  EXPECT_NE(w.find("B is 2.1x F"), std::string::npos) << w;
  // Folded PipeFB (Note [Folded placements]): each device runs one stage's F and the other's
  // B, so the imbalance is not the design; this plan predicted 1.45x (0.029 / 0.020).
  w = warningWith("why-folded", "stages:\n" + stage(0, 1, 0.010, 0.019, 0.029) +
                                    stage(1, 0, 0.010, 0.010, 0.020));
  EXPECT_EQ(w.find("by design"), std::string::npos) << w;
  EXPECT_NE(w.find("which predicted 1.45x"), std::string::npos) << w;
  // Same-device stages whose predicted paces differ as the run did (1.4x against 1.5x).
  w = warningWith("why-expected", "stages:\n" + stage(0, 0, 0.005, 0.010, 0.020) +
                                      stage(1, 1, 0.008, 0.016, 0.028));
  EXPECT_NE(w.find("which predicted 1.40x"), std::string::npos) << w;
  EXPECT_NE(w.find("minimises the slowest stage"), std::string::npos) << w;
  // The plan predicted balance: its profile was wrong.
  w = warningWith("why-misjudged", "stages:\n" + stage(0, 0, 0.005, 0.010, 0.020) +
                                       stage(1, 1, 0.005, 0.010, 0.020));
  EXPECT_NE(w.find("which predicted only 1.00x"), std::string::npos) << w;
  EXPECT_NE(w.find("pipefb_profile --force"), std::string::npos) << w;
}

// Note [Why stages are imbalanced]: a decoupled PipeFB plan (F of every stage on cpu:0, B
// of stages 0-1 on cpu:2 and of stage 2 on cpu:1) has a forward-only device and two
// backward devices; the plan's prediction counts each stage's step on its backward device.
TEST(ReportTest, ImbalanceWarningJudgesBackwardDevicesByThePlanStepsIncluded) {
  const std::string src = train("why-decoupled-src",
                                "--set pipeline.schedule=1f1b --set pipeline.stages=2 "
                                "--set devices.count=2 --set pipeline.microbatches=2 "
                                "--set training.iterations=2");
  const json base = json::parse(slurp(fs::path(src) / "summary.json"));
  bool withSteps = true;  // false: a plan file written before step_time
  auto stage = [&](int bd, double f, double b, double step) {
    return "  - forward_device: 0\n    backward_device: " + std::to_string(bd) +
           "\n    predicted: {forward_time: " + std::to_string(f) +
           ", backward_time: " + std::to_string(b) +
           (withSteps ? ", step_time: " + std::to_string(step) : "") +
           ", pace: " + std::to_string(b + step) + "}\n";
  };
  // Predicted per microbatch: cpu:0 0.018 (F), cpu:2 0.018 (B 0.016 + steps 0.002),
  // cpu:1 0.032 (B 0.020 + step 0.012): 1.78x between the backward devices (1.25x without
  // the step).
  auto plan = [&] {
    return "stages:\n" + stage(2, 0.004, 0.008, 0.001) + stage(2, 0.004, 0.008, 0.001) +
           stage(1, 0.010, 0.020, 0.012);
  };
  auto warningWith = [&](const std::string& name, double busy0) {
    const std::string dir = runDir(name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* f : {"metrics.csv", "config.yaml", "trace.json"})
      fs::copy_file(fs::path(src) / f, fs::path(dir) / f);
    json s = base;
    s["pipeline"]["devices"][0]["busy_seconds"] = busy0;
    s["pipeline"]["devices"][1]["busy_seconds"] = 3.8;
    s["pipeline"]["devices"].push_back({{"name", "cpu:2"}, {"busy_seconds", 2.0}});
    std::ofstream(fs::path(dir) / "summary.json") << s.dump();
    std::ofstream(fs::path(dir) / "plan.yaml") << plan();
    for (const auto& w : writeReport(dir).warnings)
      if (w.find("imbalanced stages: cpu:1") != std::string::npos) return w;
    return std::string("(no imbalance warning)");
  };
  // cpu:1 against cpu:2 (1.90x), both backward devices: not the design; the plan predicted
  // 1.78x with the steps, close enough to the run's 1.90x to be the cut's.
  std::string w = warningWith("why-decoupled-backward", 2.5);
  EXPECT_NE(w.find("cpu:2 2.000 s (1.90x)"), std::string::npos) << w;
  EXPECT_EQ(w.find("by design"), std::string::npos) << w;
  EXPECT_EQ(w.find("B is"), std::string::npos) << w;
  EXPECT_NE(w.find("which predicted 1.78x (optimizer steps included)"), std::string::npos) << w;
  EXPECT_NE(w.find("minimises the slowest stage"), std::string::npos) << w;
  // cpu:1 against the forward-only cpu:0 (3.80x): the design, B/F = 0.036 / 0.018.
  w = warningWith("why-decoupled-forward", 1.0);
  EXPECT_NE(w.find("cpu:0 1.000 s (3.80x)"), std::string::npos) << w;
  EXPECT_NE(w.find("by design"), std::string::npos) << w;
  EXPECT_NE(w.find("B is 2.0x F"), std::string::npos) << w;
  // Without step_time the prediction is B alone, 1.25x, and the warning says so.
  withSteps = false;
  w = warningWith("why-decoupled-old-plan", 2.5);
  EXPECT_EQ(w.find("by design"), std::string::npos) << w;
  EXPECT_NE(w.find("which predicted only 1.25x (optimizer steps left out"), std::string::npos) << w;
}

TEST(ReportTest, PlanFileFillsThePredictedColumns) {
  const std::string dir = train("predicted",
                                "--set pipeline.schedule=1f1b --set pipeline.stages=2 "
                                "--set devices.count=2 --set pipeline.microbatches=2 "
                                "--set training.iterations=4");
  std::ofstream(fs::path(dir) / "plan.yaml") << "version: 1\nschedule: 1f1b\npredicted:\n"
                                                "  iteration_time: 0.125\n"
                                                "  peak_memory: [1048576, 2097152, 0, 0]\n";
  auto r = writeReport(dir);
  const json memory = json::parse(slurp(r.memoryJson));
  EXPECT_DOUBLE_EQ(memory["iteration_seconds"]["predicted"].get<double>(), 0.125);
  EXPECT_EQ(memory["devices"][0]["predicted_peak_bytes"], 1048576);
  EXPECT_EQ(memory["devices"][1]["predicted_peak_bytes"], 2097152);
  EXPECT_TRUE(memory["devices"][2]["predicted_peak_bytes"].is_null());  // the host pool
  const std::string html = slurp(r.html);
  EXPECT_NE(html.find("2.00 MiB"), std::string::npos);
  EXPECT_NE(html.find("0.1250"), std::string::npos);
  // A --plan that does not exist is bad input, named.
  ReportOptions o;
  o.plan = dir + "/missing-plan.yaml";
  EXPECT_THROW(writeReport(dir, o), UserError);
}

/// A decoded 8-bit PNG (colour types RGB and RGBA, not interlaced: what Chromium's
/// --screenshot writes). Returns false for anything else.
struct Image {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;  // rows of width * channels bytes
};
bool decodePng(const std::string& bytes, Image& img) {
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(bytes[at])) << 24) | (uint32_t(uint8_t(bytes[at + 1])) << 16) |
           (uint32_t(uint8_t(bytes[at + 2])) << 8) | uint32_t(uint8_t(bytes[at + 3]));
  };
  if (bytes.size() < 33 || bytes.compare(1, 3, "PNG") != 0) return false;
  std::string idat;
  for (size_t at = 8; at + 8 <= bytes.size();) {
    const uint32_t len = be32(at);
    const std::string type = bytes.substr(at + 4, 4);
    if (at + 12 + len > bytes.size()) return false;
    if (type == "IHDR") {
      img.width = int(be32(at + 8));
      img.height = int(be32(at + 12));
      const int depth = uint8_t(bytes[at + 16]), colour = uint8_t(bytes[at + 17]);
      const int interlace = uint8_t(bytes[at + 20]);
      if (depth != 8 || (colour != 2 && colour != 6) || interlace != 0) return false;
      img.channels = colour == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      idat.append(bytes, at + 8, len);
    }
    at += 12 + len;
  }
  const size_t stride = size_t(img.width) * img.channels;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf rawLen = raw.size();
  if (img.channels == 0 ||
      uncompress(raw.data(), &rawLen, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
          Z_OK ||
      rawLen != raw.size())
    return false;
  img.pixels.assign(stride * img.height, 0);
  const int bpp = img.channels;
  for (int y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &img.pixels[y * stride];
    const uint8_t* up = y > 0 ? &img.pixels[(y - 1) * stride] : nullptr;
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= size_t(bpp) ? out[x - bpp] : 0, b = up ? up[x] : 0;
      const int c = up && x >= size_t(bpp) ? up[x - bpp] : 0;
      int pred = 0;
      switch (filter) {
        case 0:
          pred = 0;
          break;
        case 1:
          pred = a;
          break;
        case 2:
          pred = b;
          break;
        case 3:
          pred = (a + b) / 2;
          break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default:
          return false;
      }
      out[x] = uint8_t(in[x] + pred);
    }
  }
  return true;
}

/// Renders `html` (a file) with headless Chromium into `png`. Flags for a container, as
/// root: --no-sandbox (the setuid sandbox needs a non-root user), --disable-dev-shm-usage
/// (Docker's /dev/shm is 64 MiB), --disable-gpu, and a throwaway profile folder.
test::CommandResult screenshot(const fs::path& html, const fs::path& png, int width, int height) {
  const fs::path profile = png.parent_path() / (png.stem().string() + "-chromium-profile");
  fs::create_directories(profile);
  return test::runCommand(
      "timeout 120 /usr/bin/chromium --headless --no-sandbox --disable-gpu "
      "--disable-dev-shm-usage --disable-quic --no-first-run --disable-background-networking "
      "--disable-component-update --disable-sync --hide-scrollbars --user-data-dir=" +
      profile.string() + " --screenshot=" + png.string() + " --window-size=" +
      std::to_string(width) + "," + std::to_string(height) + " file://" + html.string());
}

struct Ink {
  size_t coloured = 0, inked = 0;
};
/// Pixels of rows [y0, y1): clearly coloured (channel spread > 48: the charts' category
/// fills and curves) and not white (text, axes, borders too).
Ink inkIn(const Image& img, int y0, int y1) {
  Ink ink;
  for (int y = std::max(0, y0); y < std::min(img.height, y1); ++y)
    for (int x = 0; x < img.width; ++x) {
      const uint8_t* p = &img.pixels[(size_t(y) * img.width + x) * img.channels];
      const int hi = std::max({p[0], p[1], p[2]}), lo = std::min({p[0], p[1], p[2]});
      if (hi - lo > 48) ++ink.coloured;
      if (lo < 230) ++ink.inked;
    }
  return ink;
}

// Issue 19: scripts/setup installs Debian's chromium, so this runs in CI (not skipped).
TEST(ReportTest, ChromiumRendersTheChartsToAPng) {
  ASSERT_TRUE(fs::exists("/usr/bin/chromium"))
      << "/usr/bin/chromium is absent: scripts/setup installs it (apt-get install chromium)";
  const std::string dir = train("chromium", "--set training.iterations=6");
  const fs::path png = fs::path(dir) / "report.png";
  auto r = screenshot(fs::path(dir) / "report.html", png, 1200, 2000);
  ASSERT_TRUE(fs::exists(png)) << r.out;
  // A blank page compresses to a few KiB; charts with text and fills do not.
  EXPECT_GT(fs::file_size(png), 40u * 1024) << "the screenshot looks blank";
  Image img;
  ASSERT_TRUE(decodePng(slurp(png), img)) << png << " is not an 8-bit RGB(A) PNG";
  EXPECT_EQ(img.width, 1200);
  EXPECT_EQ(img.height, 2000);
  const size_t n = size_t(img.width) * img.height;
  // The first screen holds the tables and two stacked memory charts: their fills cover
  // several percent of it (5.4% coloured, 13.5% non-white for this run); a blank page
  // or one whose SVGs failed has none.
  const Ink page = inkIn(img, 0, img.height);
  EXPECT_GT(page.coloured, n / 50) << page.coloured << " coloured pixels of " << n;
  EXPECT_GT(page.inked, n / 20) << page.inked << " non-white pixels of " << n;

  // Each chart on its own: the same report.html, with a style and a script appended that
  // hide everything but the charts (visibility) and stack every `.chart` box in a band of
  // kBand px. Each band must carry the chart's ink: a chart that failed to draw (an empty
  // <div>, an SVG with no paths) leaves its band white.
  const std::string html = slurp(fs::path(dir) / "report.html");
  size_t charts = 0;
  for (size_t at = html.find("class=\"chart\""); at != std::string::npos;
       at = html.find("class=\"chart\"", at + 1))
    ++charts;
  ASSERT_GE(charts, 2u) << "report.html has no charts";
  constexpr int kBand = 320, kChart = 300, kWidth = 800;
  const std::string inject =
      "<style>body *{visibility:hidden} .chart,.chart *{visibility:visible}"
      ".chart{position:absolute!important;left:0;margin:0;padding:0;width:" +
      std::to_string(kWidth) + "px;height:" + std::to_string(kChart) +
      "px;overflow:hidden;background:#fff} .chart svg{width:" + std::to_string(kWidth) +
      "px!important;height:" + std::to_string(kChart) +
      "px!important;max-width:none}</style><script>document.querySelectorAll('.chart')"
      ".forEach((c,i)=>{c.style.top=(i*" +
      std::to_string(kBand) + ")+'px'});</script>";
  std::string one = html;
  const auto body = one.rfind("</body>");
  one.insert(body == std::string::npos ? one.size() : body, inject);
  const fs::path chartsHtml = fs::path(dir) / "charts-only.html";
  std::ofstream(chartsHtml) << one;
  const fs::path chartsPng = fs::path(dir) / "charts-only.png";
  r = screenshot(chartsHtml, chartsPng, kWidth, int(charts) * kBand);
  ASSERT_TRUE(fs::exists(chartsPng)) << r.out;
  Image each;
  ASSERT_TRUE(decodePng(slurp(chartsPng), each)) << chartsPng;
  ASSERT_EQ(each.height, int(charts) * kBand);
  for (size_t i = 0; i < charts; ++i) {
    const Ink ink = inkIn(each, int(i) * kBand, int(i) * kBand + kChart);
    const size_t area = size_t(kWidth) * kChart;
    // Axes, tick labels and a key are ~2% of the band; data drawn in colour adds more.
    EXPECT_GT(ink.inked, area / 100) << "chart " << i << " of " << charts << ": " << ink.inked
                                     << " non-white pixels of " << area;
    EXPECT_GT(ink.coloured, area / 500) << "chart " << i << " of " << charts << ": " << ink.coloured
                                        << " coloured pixels of " << area;
  }
}

}  // namespace
}  // namespace pipefb::report
