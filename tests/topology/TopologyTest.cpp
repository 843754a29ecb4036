// Topology detection, thread binding and the detected cluster spec (issue 8, part 3).
#include <gtest/gtest.h>
#include <hwloc.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "TestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"
#include "pipefb/planner/CostModel.h"
#include "pipefb/planner/DetectedCluster.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/Solver.h"
#include "pipefb/topology/Binding.h"
#include "pipefb/topology/Topology.h"

namespace fs = std::filesystem;
using namespace pipefb;

namespace {

const char* kTinyPipeline = R"(
model: {name: mlp, input_size: 8, channels: 1, num_classes: 4, hidden: [32, 32, 32]}
data: {name: synthetic, synthetic_train: 256, synthetic_test: 64}
training: {batch: 32, iterations: 2}
devices: {count: 2}
pipeline: {schedule: 1f1b, microbatches: 4}
)";

std::string devicesDir() { return std::string(PIPEFB_SOURCE_DIR) + "/configs/devices"; }

// Spins on this thread for `ms` so the kernel has scheduled it somewhere.
void spin(int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile double x = 0;
  while (std::chrono::steady_clock::now() < end) x = x + 1;
}

}  // namespace

TEST(Topology, DetectsThisMachine) {
  const topology::Topology& t = topology::machine();
  ASSERT_GE(t.numCores(), 1);
  ASSERT_GE(t.numNumaNodes(), 1);
  EXPECT_GE(t.pus, t.numCores());
  EXPECT_GT(t.memory, 0);
  int pus = 0;
  for (const auto& c : t.cores) {
    EXPECT_FALSE(c.pus.empty()) << "core " << c.index;
    EXPECT_GE(c.numaNode, 0) << "core " << c.index;
    EXPECT_LT(c.numaNode, t.numNumaNodes());
    pus += static_cast<int>(c.pus.size());
  }
  EXPECT_EQ(pus, t.pus);
  // The cores this process may run on are the ones hwloc reports.
  EXPECT_LE(t.pus, static_cast<int>(std::thread::hardware_concurrency()));
  const std::string text = t.describe();
  EXPECT_NE(text.find("machine: "), std::string::npos) << text;
  EXPECT_NE(text.find("core 0"), std::string::npos) << text;
  EXPECT_NE(text.find("NUMA node 0"), std::string::npos) << text;
}

TEST(Topology, SyntheticTwoNodes) {
  const topology::Topology t = topology::synthetic("numa:2 core:2 pu:2");
  ASSERT_EQ(t.numNumaNodes(), 2);
  ASSERT_EQ(t.numCores(), 4);
  EXPECT_EQ(t.pus, 8);
  EXPECT_EQ(t.cores[0].numaNode, 0);
  EXPECT_EQ(t.cores[3].numaNode, 1);
  EXPECT_EQ(t.numaNodes[1].cores, (std::vector<int>{2, 3}));
  EXPECT_EQ(topology::numaNodeOfCpus(t, t.cores[2].pus), 1);
  EXPECT_EQ(topology::numaNodeOfCpus(t, {t.cores[0].pus[0], t.cores[3].pus[0]}), -1);
  EXPECT_THROW(topology::synthetic("bogus:7"), UserError);
}

TEST(Topology, BindPolicyValues) {
  EXPECT_EQ(topology::parseBindPolicy("none"), topology::BindPolicy::None);
  EXPECT_EQ(topology::parseBindPolicy("cores"), topology::BindPolicy::Cores);
  try {
    topology::parseBindPolicy("core");
    FAIL() << "accepted 'core'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("devices.bind"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("none | cores"), std::string::npos) << e.what();
  }
  EXPECT_EQ(topology::coreForDevice(0, 2), 0);
  EXPECT_EQ(topology::coreForDevice(3, 2), 1);
}

TEST(Binding, ThreadRunsOnTheCoreItIsBoundTo) {
  const topology::Topology& t = topology::machine();
  for (int core = 0; core < t.numCores(); ++core) {
    std::vector<int> before, bound;
    int last = -2;
    std::thread th([&] {
      before = topology::thisThreadBinding();
      topology::bindThisThreadToCore(core);
      spin(20);
      bound = topology::thisThreadBinding();
      last = topology::thisThreadLastCpu();
    });
    th.join();
    EXPECT_EQ(bound, t.cores[core].pus) << "core " << core;
    EXPECT_NE(std::find(bound.begin(), bound.end(), last), bound.end())
        << "core " << core << " ran on CPU " << last;
    if (t.numCores() > 1) {
      EXPECT_NE(before, bound) << "the thread was bound before";
    }
  }
  EXPECT_THROW(topology::bindThisThreadToCore(t.numCores()), std::out_of_range);
}

TEST(Binding, HostMemoryNearTheBoundThread) {
  // Note [Host pool NUMA placement]: a no-op on one NUMA node; elsewhere the range lands on
  // the bound thread's node.
  const topology::Topology& t = topology::machine();
  const int core = t.numCores() - 1;
  bool bound = true;
  std::vector<char> block(1 << 20);
  std::thread th([&] {
    topology::bindThisThreadToCore(core);
    bound = topology::bindMemoryNearThisThread(block.data(), block.size());
  });
  th.join();
  EXPECT_EQ(bound, t.numNumaNodes() > 1);
  std::thread unbound([&] { bound = topology::bindMemoryNearThisThread(block.data(), 4096); });
  unbound.join();
  if (t.numNumaNodes() == 1) {
    EXPECT_FALSE(bound) << "one NUMA node: nothing to bind";
  }
}

TEST(DetectedCluster, NumaLinksAndRoundTrip) {
  const topology::Topology t = topology::synthetic("numa:2 core:2 pu:1");
  const planner::DeviceSpec cpu = planner::findDeviceSpec("cpu", devicesDir());
  planner::DetectedClusterOptions o;
  o.devices = 4;
  const planner::ClusterSpec c = planner::detectedClusterSpec(t, cpu, o);
  ASSERT_EQ(c.devices.size(), 4u);
  EXPECT_EQ(c.cores, 4);
  EXPECT_EQ(c.linkKinds[0][1], "memcpy");  // cores 0, 1: node 0
  EXPECT_EQ(c.linkKinds[1][2], "numa");    // core 2: node 1
  EXPECT_DOUBLE_EQ(c.links[0][1].bandwidth, cpu.pcieBandwidth);
  EXPECT_LT(c.links[1][2].bandwidth, c.links[0][1].bandwidth);
  const planner::ClusterSpec back =
      planner::parseClusterSpec(planner::clusterSpecToYaml(c), "back.yaml", devicesDir());
  EXPECT_EQ(back.cores, 4);
  EXPECT_EQ(back.links, c.links);
  EXPECT_EQ(back.toCluster({}).cores, 4);
  o.numaLinks = false;
  EXPECT_EQ(planner::detectedClusterSpec(t, cpu, o).linkKinds[1][2], "memcpy");
}

TEST(DetectedCluster, WrittenSpecPlans) {
  // What pipefb_topology --out writes for this machine loads back in the planner and plans.
  const planner::DeviceSpec cpu = planner::findDeviceSpec("cpu", devicesDir());
  planner::DetectedClusterOptions o;
  o.devices = 2;
  const planner::ClusterSpec c = planner::detectedClusterSpec(topology::machine(), cpu, o);
  const fs::path file = test::scratchPath("topology_cluster.yaml");
  std::ofstream(file) << planner::clusterSpecToYaml(c);
  const config::Config cfg = config::parseConfig(kTinyPipeline);
  planner::SetupOptions setup;
  setup.cluster = file.string();
  planner::Planning pl = planner::setupPlanning(cfg, setup);
  EXPECT_EQ(pl.model->cluster().numDevices(), 2);
  EXPECT_EQ(pl.model->cluster().cores, topology::machine().numCores());
  planner::SolverOptions so = pl.solver;
  so.maxMicrobatches = 8;
  const planner::SolveResult r = planner::solve(*pl.model, so);
  ASSERT_TRUE(r.feasible);
  EXPECT_GT(r.best.iterationTime, 0);
}

TEST(DetectedCluster, PlannerDefaultSharesDetectedCores) {
  // No cluster spec: devices.count virtual cpu devices sharing the detected cores.
  const config::Config cfg = config::parseConfig(kTinyPipeline);
  planner::Planning pl = planner::setupPlanning(cfg, planner::SetupOptions{});
  EXPECT_EQ(pl.model->cluster().numDevices(), 2);
  EXPECT_EQ(pl.model->cluster().cores, topology::machine().numCores());
  planner::SetupOptions notShared;
  notShared.cores = 0;
  EXPECT_EQ(planner::setupPlanning(cfg, notShared).model->cluster().cores, 0);
}

TEST(PipefbTopology, PrintsAndWritesASpec) {
  const fs::path file = test::scratchPath("topology_cli.yaml");
  fs::remove(file);
  auto r = test::runProgram("pipefb_topology --out " + file.string() + " --devices 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("machine: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GPUs: "), std::string::npos) << r.out;
  const planner::ClusterSpec c = planner::loadClusterSpec(file.string(), devicesDir());
  EXPECT_EQ(c.devices.size(), 3u);
  EXPECT_EQ(c.cores, topology::machine().numCores());
  auto s = test::runProgram("pipefb_topology --synthetic 'numa:2 core:2 pu:1'");
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("4 cores, 4 PUs, 2 NUMA nodes"), std::string::npos) << s.out;
}

TEST(PipefbTopology, BadFlagsExitTwoWithOneLine) {
  for (const std::string args :
       {"--devices 0", "--bogus", "--host-pool lots --out /tmp/pipefb_topology_x.yaml",
        "--device nosuch --out /tmp/pipefb_topology_x.yaml", "--synthetic 'bogus:3'"}) {
    auto r = test::runProgram("pipefb_topology " + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_EQ(test::countLines(r.out), 1u) << args << "\n" << r.out;
  }
}
