// Round trips of the planner's files (plan files, device and cluster specs) and the
// infeasible-budget contract of pipefb_plan (issue 6: exit 2, the smallest feasible budget
// and its plan).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <regex>

#include "PlannerTestUtil.h"
#include "TestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/ProfileFile.h"

namespace pipefb::planner {
namespace {

namespace fs = std::filesystem;

const std::string kDevices = std::string(PIPEFB_SOURCE_DIR) + "/configs/devices";
const std::string kClusters = std::string(PIPEFB_SOURCE_DIR) + "/configs/clusters";

void expectSameDevice(const DeviceSpec& a, const DeviceSpec& b, const std::string& what) {
  EXPECT_EQ(a.name, b.name) << what;
  EXPECT_EQ(a.description, b.description) << what;
  EXPECT_EQ(a.peakFlops, b.peakFlops) << what;
  EXPECT_EQ(a.bf16Flops, b.bf16Flops) << what;
  EXPECT_EQ(a.fp16Flops, b.fp16Flops) << what;
  EXPECT_EQ(a.memory, b.memory) << what;
  EXPECT_EQ(a.hbmBandwidth, b.hbmBandwidth) << what;
  EXPECT_EQ(a.pcieBandwidth, b.pcieBandwidth) << what;
  EXPECT_EQ(a.hostLatency, b.hostLatency) << what;
  EXPECT_EQ(a.efficiency, b.efficiency) << what;
  EXPECT_EQ(a.layerOverhead, b.layerOverhead) << what;
}

// Note [Microbatch scaling]: the fixed time per pass round-trips; a profile written before
// profile method 7 has none, and scales as a whole as it did.
TEST(ProfileFiles, FixedTimesRoundTripAndOlderFilesScaleWhole) {
  Profile p = pipefb::planner::testing::timesProfile({0.004, 0.002});
  p.device = "cpu";
  p.microbatch = 16;
  p.layers[0].backward = 0.009;
  p.layers[0].forwardFixed = 0.0007;
  p.layers[0].backwardFixed = 0.0021;
  p.layers[0].recomputeFixed = 0.0006;
  const Profile q = parseProfile(profileToYaml(p), "round trip");
  ASSERT_EQ(q.numLayers(), 2);
  EXPECT_DOUBLE_EQ(q.layers[0].forwardFixed, 0.0007);
  EXPECT_DOUBLE_EQ(q.layers[0].backwardFixed, 0.0021);
  EXPECT_DOUBLE_EQ(q.layers[0].recomputeFixed, 0.0006);
  EXPECT_DOUBLE_EQ(q.layers[1].forwardFixed, 0);
  const std::string older =
      "model: \"m\"\ndevice: \"cpu\"\nmicrobatch: 16\nlayers:\n"
      "  - {name: \"l0\", forward: 0.004, backward: 0.009, output_bytes: 8, saved_bytes: 8, "
      "param_bytes: 4}\n";
  const Profile o = parseProfile(older, "older");
  EXPECT_DOUBLE_EQ(o.layers[0].forwardFixed, 0);
  EXPECT_DOUBLE_EQ(o.layers[0].backwardFixed, 0);
  EXPECT_DOUBLE_EQ(o.layers[0].recomputeFixed, 0);
  // At 1/16 of the microbatch: all of it scales in the older file, the fixed part not here.
  const CostModel whole(o, pipefb::planner::testing::freeCluster(1));
  const CostModel affine(q, pipefb::planner::testing::freeCluster(1));
  EXPECT_DOUBLE_EQ(whole.backwardTime(0, 1, 1.0 / 16), 0.009 / 16);
  EXPECT_DOUBLE_EQ(affine.backwardTime(0, 1, 1.0 / 16), 0.0021 + (0.009 - 0.0021) / 16);
}

// Note [Parameter-sized working sets]: B's working sets' fixed part round-trips and scales
// apart from the rest; a profile before method 8 scales them whole; a fixed part larger
// than its working set is refused with the keys' names.
TEST(ProfileFiles, FixedWorkingBytesRoundTripAndScaleApart) {
  Profile p = pipefb::planner::testing::timesProfile({0.004});
  p.device = "cpu";
  p.microbatch = 16;
  p.layers[0].workingBytes = 6658048;  // vgg16/8 fc6 at 16: its 6424576-byte gradient + 16 x 14592
  p.layers[0].gatheredWorkingBytes = 6658048;
  p.layers[0].workingFixedBytes = 6424576;
  p.layers[0].gatheredWorkingFixedBytes = 6424576;
  const Profile q = parseProfile(profileToYaml(p), "round trip");
  EXPECT_EQ(q.layers[0].workingFixedBytes, 6424576);
  EXPECT_EQ(q.layers[0].gatheredWorkingFixedBytes, 6424576);
  const CostModel affine(q, pipefb::planner::testing::freeCluster(1));
  EXPECT_EQ(affine.workingBytes(0, 1.0 / 16), 6424576 + 14592);
  EXPECT_EQ(affine.workingBytes(0, 4), 6424576 + 4 * 16 * 14592);
  Profile whole = q;
  whole.layers[0].workingFixedBytes = whole.layers[0].gatheredWorkingFixedBytes = 0;
  const Profile o = parseProfile(profileToYaml(whole), "older");
  EXPECT_EQ(CostModel(o, pipefb::planner::testing::freeCluster(1)).workingBytes(0, 1.0 / 16),
            6658048 / 16);
  std::string bad = profileToYaml(p);
  const std::string key = "working_fixed_bytes: 6424576";
  bad.replace(bad.find(key), key.size(), "working_fixed_bytes: 6658049");
  try {
    parseProfile(bad, "bad.yaml");
    ADD_FAILURE() << "a fixed part above its working set was accepted";
  } catch (const pipefb::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("working_fixed_bytes"), std::string::npos) << e.what();
  }
}

// Note [Bytes at every microbatch]: the bytes measured at other microbatch sizes round-trip;
// the model at such a size plans on them (its times scaled as ever), the model at a size
// not measured scales; a bytes_at entry without one entry per layer is refused.
TEST(ProfileFiles, BytesAtOtherMicrobatchesRoundTripAndArePlannedOn) {
  Profile p = pipefb::planner::testing::timesProfile({0.004, 0.002});
  p.device = "cpu";
  p.source = "measured";
  p.microbatch = 16;
  for (auto& l : p.layers) l.workingBytes = l.savedBytes = l.outputBytes = 1600;
  p.layers[0].forwardFixed = 0.001;
  MeasuredBytes one;
  one.microbatch = 1;
  one.inputBytes = 7;
  one.lossWorkingBytes = 11;
  for (int l = 0; l < 2; ++l) {
    LayerBytes b;
    b.outputBytes = b.savedBytes = 100;
    b.workingBytes = 300000 + l;  // not 1600 / 16: measured, not scaled
    b.gatheredWorkingBytes = b.forwardWorkingBytes = b.noGradForwardBytes = 300000;
    one.layers.push_back(b);
  }
  p.bytesAt.push_back(one);
  const Profile q = parseProfile(profileToYaml(p), "round trip");
  ASSERT_EQ(q.bytesAt.size(), 1u);
  EXPECT_EQ(q.bytesAt[0].microbatch, 1);
  EXPECT_EQ(q.bytesAt[0].inputBytes, 7);
  EXPECT_EQ(q.bytesAt[0].lossWorkingBytes, 11);
  EXPECT_EQ(q.bytesAt[0].layers[1].workingBytes, 300001);
  const CostModel base(q, pipefb::planner::testing::freeCluster(1));
  const CostModel& at1 = base.at(1);
  EXPECT_NE(&at1, &base);
  EXPECT_EQ(&base.at(1), &at1);  // one model per size
  EXPECT_EQ(at1.profile().microbatch, 1);
  EXPECT_EQ(at1.workingBytes(1, 1.0), 300001);
  EXPECT_EQ(at1.profile().inputBytes, 7);
  // The times scale as they would from the base (Note [Microbatch scaling]).
  EXPECT_DOUBLE_EQ(at1.forwardTime(0, 1, 1.0), base.forwardTime(0, 1, 1.0 / 16));
  EXPECT_DOUBLE_EQ(at1.backwardTime(0, 2, 1.0), base.backwardTime(0, 2, 1.0 / 16));
  EXPECT_EQ(&base.at(16), &base);
  EXPECT_EQ(&base.at(4), &base);                  // not measured at 4: scales
  EXPECT_EQ(at1.at(4).profile().microbatch, 16);  // from a view too
  EXPECT_EQ(at1.at(4).workingBytes(0, 0.25), base.workingBytes(0, 0.25));
  std::string bad = profileToYaml(p);
  bad.erase(bad.rfind("      - {"));
  try {
    parseProfile(bad, "bad.yaml");
    ADD_FAILURE() << "a bytes_at entry short of a layer was accepted";
  } catch (const pipefb::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml: bytes_at"), std::string::npos) << e.what();
  }
}

TEST(SpecFiles, EveryDeviceSpecRoundTrips) {
  int n = 0;
  for (const auto& name : deviceSpecNames(kDevices)) {
    const DeviceSpec spec = loadDeviceSpec(kDevices + "/" + name + ".yaml");
    const std::string yaml = deviceSpecToYaml(spec);
    expectSameDevice(parseDeviceSpec(yaml, name + " (written)"), spec, name + ":\n" + yaml);
    ++n;
  }
  EXPECT_GE(n, 6);  // v100-16g, a100-40g/80g, h100-80g, rtx3090-24g, t4-16g (+ cpu)
}

TEST(SpecFiles, EveryClusterSpecRoundTrips) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(kClusters)) {
    if (e.path().extension() != ".yaml") continue;
    const ClusterSpec spec = loadClusterSpec(e.path().string(), kDevices);
    const std::string yaml = clusterSpecToYaml(spec);
    const ClusterSpec back = parseClusterSpec(yaml, "written", kDevices);
    const std::string what = e.path().filename().string() + ":\n" + yaml;
    EXPECT_EQ(back.name, spec.name) << what;
    EXPECT_EQ(back.description, spec.description) << what;
    EXPECT_EQ(back.hostPool, spec.hostPool) << what;
    ASSERT_EQ(back.devices.size(), spec.devices.size()) << what;
    for (size_t d = 0; d < spec.devices.size(); ++d)
      expectSameDevice(back.devices[d], spec.devices[d], what);
    EXPECT_EQ(back.links, spec.links) << what;
    EXPECT_EQ(back.linkKinds, spec.linkKinds) << what;
    // And once more: the written form is a fixed point.
    EXPECT_EQ(clusterSpecToYaml(back), yaml);
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(SpecFiles, HandMadeMatrixWithUnnamedLinksRoundTrips) {
  ClusterSpec c = uniformClusterSpec(loadDeviceSpec(kDevices + "/t4-16g.yaml"), 3, Link{10e9, 1e-5},
                                     std::int64_t(64) << 30);
  c.links[0][2] = Link{1.25e9, 5e-5};  // one slower link, kind name not a link kind's
  c.linkKinds[0][2] = "-";
  for (int d = 0; d < 3; ++d) c.links[d][d] = Link{};  // unused (same device); files leave it out
  const ClusterSpec back = parseClusterSpec(clusterSpecToYaml(c), "written", kDevices);
  EXPECT_EQ(back.links, c.links);
  EXPECT_EQ(back.hostPool, c.hostPool);
  EXPECT_EQ(back.devices.size(), 3u);
}

// Note [Devices and processes]: `processes` in a cluster spec, its errors and round trip.
TEST(SpecFiles, ProcessesOfAClusterSpec) {
  const std::string head =
      "name: p\ndevices: [{spec: t4-16g, count: 4}]\nlink_kinds: {pcie: {bandwidth: 10GB}}\n"
      "default_link: pcie\n";
  auto parse = [&](const std::string& extra) {
    return parseClusterSpec(head + extra, "p.yaml", kDevices);
  };
  EXPECT_TRUE(parse("").processes.empty());
  EXPECT_EQ(parse("processes: per_device\n").processes, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(parse("processes: one\n").processes, (std::vector<int>{0, 0, 0, 0}));
  const ClusterSpec g = parse("processes: [[0, 3], [1, 2]]\n");
  EXPECT_EQ(g.processes, (std::vector<int>{0, 1, 1, 0}));
  const Cluster c = g.toCluster({});
  EXPECT_TRUE(c.sameProcess(0, 3));
  EXPECT_FALSE(c.sameProcess(0, 1));
  const ClusterSpec back = parseClusterSpec(clusterSpecToYaml(g), "written", kDevices);
  EXPECT_EQ(back.processes, g.processes) << clusterSpecToYaml(g);
  for (const std::string bad : {"processes: each\n", "processes: [[0, 1], [1, 2, 3]]\n",
                                "processes: [[0, 1], [2]]\n", "processes: [[0, 1], [2, 9]]\n"}) {
    try {
      parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("processes"), std::string::npos) << e.what();
    }
  }
}

// A plan written by planToYaml and read back (parsePlan, planFromSpec) is the same plan:
// shape, device chain, cuts, per-stage devices and policies (mixed ones included), and so
// the same predicted time and memory.
TEST(PlanFiles, SolvedPlansRoundTrip) {
  std::mt19937 rng(5);
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  int checked = 0, mixed = 0;
  for (int id = 0; id < 40; ++id) {
    Profile p;
    p.model = "rt" + std::to_string(id);
    p.inputBytes = 1000;
    const int L = 4 + id % 9;
    for (int l = 0; l < L; ++l) {
      LayerCost c;
      c.name = "l" + std::to_string(l);
      c.forward = uni(0.1, 2);
      c.backward = 2 * c.forward;
      c.recompute = c.forward;
      c.outputBytes = 1000;
      c.savedBytes = std::int64_t(uni(1000, 20000));
      c.paramBytes = c.gradBytes = std::int64_t(uni(100, 5000));
      c.optimizerBytes = 2 * c.paramBytes;
      c.step = 0.1 * c.forward;  // plan files carry each stage's share (step_time)
      p.layers.push_back(c);
    }
    Cluster cl = Cluster::uniform(4, 1.0, -1, Link{1e4, 1e-3}, Link{2e4, 1e-3});
    cl.devices[1].speed = 2;  // heterogeneous: chains are not all equal
    cl.devices[3].capacity = 40000;
    CostModel m(p, cl);
    const std::vector<std::string> families = {"1f1b", "pipedream", "pipefb-sync", "gpipe",
                                               "pipefb-async"};
    SolverOptions o = testing::only(families[id % families.size()], 8);
    o.budget = id % 2 ? 60000 : -1;
    o.asyncLag = (id / 5) % 2 ? 1 : -1;  // Note [Planned async lag]
    SolveResult r = solve(m, o);
    if (!r.feasible) continue;
    const Plan& plan = r.best;
    const std::string yaml =
        planToYaml(m, plan, PlanContext{"c.yaml", p.model, "literal", cl.name});
    const PlanSpec spec = parsePlan(yaml, "plan.yaml");
    const Plan back = planFromSpec(m, spec);
    const std::string what = "instance " + std::to_string(id) + ":\n" + yaml;
    EXPECT_EQ(back.shape.kind, plan.shape.kind) << what;
    EXPECT_EQ(back.shape.stages, plan.shape.stages) << what;
    EXPECT_EQ(back.shape.microbatches, plan.shape.microbatches) << what;
    EXPECT_EQ(back.shape.microbatchSize, plan.shape.microbatchSize) << what;
    EXPECT_EQ(back.shape.lookahead, plan.shape.lookahead) << what;
    EXPECT_EQ(back.shape.chain, plan.shape.chain) << what;
    // Note [Planned async lag]: a pipefb-async plan says its lag; plan files before it
    // (and the other kinds) say none, and the config's runs.
    EXPECT_EQ(back.shape.lag(), plan.shape.lag()) << what;
    EXPECT_EQ(spec.asyncLag.has_value(), plan.shape.kind == ScheduleKind::PipeFbAsync) << what;
    if (spec.asyncLag) {
      EXPECT_EQ(*spec.asyncLag, o.asyncLag < 0 ? plan.shape.microbatches : o.asyncLag) << what;
      EXPECT_FALSE(
          parsePlan(std::regex_replace(yaml, std::regex("async_lag:[^\n]*\n"), ""), "old.yaml")
              .asyncLag)
          << what;
    }
    ASSERT_EQ(back.stages.size(), plan.stages.size()) << what;
    bool isMixed = false;
    for (size_t k = 0; k < plan.stages.size(); ++k) {
      EXPECT_EQ(back.stages[k].first, plan.stages[k].first) << what;
      EXPECT_EQ(back.stages[k].last, plan.stages[k].last) << what;
      EXPECT_EQ(back.stages[k].forwardDevice, plan.stages[k].forwardDevice) << what;
      EXPECT_EQ(back.stages[k].backwardDevice, plan.stages[k].backwardDevice) << what;
      EXPECT_EQ(back.stages[k].policy, plan.stages[k].policy) << what;
      const double share = plan.stages[k].estimate.stepShare;
      EXPECT_GT(share, 0) << what;
      EXPECT_NEAR(spec.stages[k].predictedStepTime, share, 1e-5 * share) << what;
      EXPECT_NEAR(back.stages[k].estimate.stepShare, share, 1e-12 * share) << what;
      isMixed = isMixed || plan.stages[k].policy != plan.stages[0].policy;
    }
    // Plan files written before step_time still load, their step shares 0.
    const PlanSpec old =
        parsePlan(std::regex_replace(yaml, std::regex(" *step_time:[^\n]*\n"), ""), "old.yaml");
    ASSERT_EQ(old.stages.size(), spec.stages.size()) << what;
    for (const PlanStage& st : old.stages) EXPECT_EQ(st.predictedStepTime, 0) << what;
    EXPECT_EQ(back.iterationTime, plan.iterationTime) << what;
    EXPECT_EQ(back.deviceMemory, plan.deviceMemory) << what;
    EXPECT_EQ(back.hostBytes, plan.hostBytes) << what;
    // The file's own predictions (6 significant digits for times, bytes exact).
    EXPECT_NEAR(spec.predictedIterationTime, plan.iterationTime, 1e-5 * plan.iterationTime) << what;
    for (size_t d = 0; d < spec.predictedPeak.size(); ++d)
      EXPECT_EQ(spec.predictedPeak[d], plan.deviceMemory[d]) << what;
    mixed += isMixed;
    ++checked;
  }
  // Not all of the 40 are feasible (24 were while the cost model charged a split stage's
  // forward device RecvWeights' message, 2 W; it holds W since, Note [Forward device memory]).
  EXPECT_GE(checked, 20);
  EXPECT_GE(mixed, 1);
}

// Issue 6: an infeasible budget exits 2, prints the smallest feasible budget and its plan
// (the stage table), and that budget is feasible: planning at it succeeds.
TEST(PlanCli, InfeasibleBudgetGivesExit2TheSmallestBudgetAndItsPlan) {
  const std::string cfg = std::string(PIPEFB_SOURCE_DIR) + "/configs/vgg16-single.yaml";
  const std::string out =
      " -o " +
      (fs::temp_directory_path() / ("plan-cli-" + std::to_string(::getpid()) + ".yaml")).string();
  const auto r =
      test::runProgram("pipefb_plan --config " + cfg +
                       " --set devices.count=4 --set pipeline.schedule=1f1b --budget 4MiB" + out);
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("Nothing fits in 4.00 MiB per device."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("with this plan:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stage layers"), std::string::npos) << r.out;  // the plan's table
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m,
                                std::regex("smallest feasible budget: .* \\(--budget ([0-9]+)\\)")))
      << r.out;
  const std::int64_t smallest = std::stoll(m[1]);
  EXPECT_GT(smallest, 4 << 20);
  // The last line is the one-line error.
  const std::string last = r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1);
  EXPECT_NE(last.find("pipefb_plan: error: no plan fits the budget"), std::string::npos) << last;
  const auto ok = test::runProgram("pipefb_plan --config " + cfg +
                                   " --set devices.count=4 --set pipeline.schedule=1f1b --budget " +
                                   std::to_string(smallest) + "" + out);
  EXPECT_EQ(ok.code, 0) << ok.out;
  const auto below =
      test::runProgram("pipefb_plan --config " + cfg +
                       " --set devices.count=4 --set pipeline.schedule=1f1b --budget " +
                       std::to_string(smallest - 1) + "" + out);
  EXPECT_EQ(below.code, 2) << below.out;
}

// Issue 19: the planners choose the schedule, so the trainer's rules that tie
// pipeline.schedule to devices.count do not apply: a single-device config (schedule none)
// plans on devices.count devices, with the schedules of --schedules (or all).
TEST(PlanCli, PlansASingleDeviceConfigOnDevicesCount) {
  const std::string cfg = std::string(PIPEFB_SOURCE_DIR) + "/configs/vgg16-single.yaml";
  const fs::path dir = test::scratchPath("plan_any_config");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto train =
      test::runProgram("pipefb_train --config " + cfg +
                       " --set devices.count=4 --set output.dir=" + (dir / "run").string());
  ASSERT_EQ(train.code, 2) << train.out;  // the trainer's rule still holds for training
  const auto plan = test::runProgram("pipefb_plan --config " + cfg +
                                     " --set devices.count=4 --budget 256MiB -q -o " +
                                     (dir / "plan.yaml").string());
  ASSERT_EQ(plan.code, 0) << plan.out;
  EXPECT_NE(plan.out.find("(4 devices)"), std::string::npos) << plan.out;
  EXPECT_TRUE(fs::exists(dir / "plan.yaml"));
  const auto sweep = test::runProgram(
      "pipefb_sweep --config " + cfg +
      " --set devices.count=4 --budgets 256MiB,1GiB --schedules 1f1b,pipefb-sync -o " +
      (dir / "sweep").string());
  ASSERT_EQ(sweep.code, 0) << sweep.out;
  EXPECT_NE(sweep.out.find("2 budgets x 2 families"), std::string::npos) << sweep.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipefb::planner
