// pipefb_topology [--out cluster.yaml] [--devices N] [--device cpu] [--host-pool SIZE]
//
// Prints this machine's cores, NUMA nodes and PCI devices (GPUs where present) as hwloc
// sees them, and with --out writes a cluster spec of virtual CPU devices for
// `pipefb_plan --cluster` (Note [Detected cluster] in pipefb/planner/DetectedCluster.h).
// --synthetic describes a machine in hwloc's synthetic syntax instead (to see the spec of
// a two-socket box on a laptop).
//
// Exit codes: 0 success; 2 bad flag or value (one line); 1 hwloc failed.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Program.h"
#include "pipefb/common/Size.h"
#include "pipefb/planner/DetectedCluster.h"
#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/topology/Topology.h"

using namespace pipefb;

int main(int argc, char** argv) {
  CLI::App app{"pipefb_topology: this machine's cores, NUMA nodes and PCI devices (hwloc)"};
  std::string out, device = "cpu", configs, hostPool = "unlimited", syntheticText;
  int devices = 0;
  bool flatLinks = false;
  app.add_option("--out,-o", out, "write a cluster spec for pipefb_plan --cluster");
  app.add_option("--devices,-n", devices,
                 "virtual devices in the cluster spec (default: one per core)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--device", device, "device spec of each virtual device (default cpu)");
  app.add_option("--configs", configs,
                 "folder holding devices/ (default: the source tree's configs)");
  app.add_option("--host-pool", hostPool,
                 "host-pool capacity in the spec: a size such as 16GiB, 'memory' (this "
                 "machine's), or unlimited (default)");
  app.add_flag("--flat-links", flatLinks,
               "join every pair of devices by memcpy, ignoring NUMA nodes (for devices.bind: "
               "none)");
  app.add_option("--synthetic", syntheticText,
                 "a synthetic topology instead of this machine, e.g. 'package:2 core:4 pu:2'");
  return runProgram("pipefb_topology", app, argc, argv, [&] {
    const topology::Topology topo =
        syntheticText.empty() ? topology::machine() : topology::synthetic(syntheticText);
    // Every flag is checked before anything is printed (one line on a bad one).
    if (configs.empty()) configs = planner::configsDirFor("");
    const std::string devicesDir = configs + "/devices";
    const planner::DeviceSpec spec = planner::findDeviceSpec(device, devicesDir);
    planner::DetectedClusterOptions o;
    o.devices = devices;
    o.numaLinks = !flatLinks;
    if (hostPool == "memory") {
      o.hostPool = topo.memory;
    } else if (hostPool != "unlimited") {
      auto v = parseSize(hostPool);
      if (!v || *v <= 0)
        throw UserError("--host-pool: expected a size such as 16GiB, memory or unlimited, got '" +
                        hostPool + "'");
      o.hostPool = *v;
    }
    const planner::ClusterSpec cluster = planner::detectedClusterSpec(topo, spec, o);
    const std::string yaml = "# Written by pipefb_topology (hwloc " + topology::hwlocVersion() +
                             "): " + topo.summary() + ".\n" + planner::clusterSpecToYaml(cluster);
    planner::parseClusterSpec(yaml, out, devicesDir);  // reads back, or this is a bug
    std::ofstream f;
    if (!out.empty()) {
      f.open(out);
      if (!f) throw UserError("--out: cannot write '" + out + "'");
    }
    std::cout << topo.describe();
    if (out.empty()) return 0;
    if (!(f << yaml).flush()) throw std::runtime_error("writing " + out + " failed");
    std::cout << "wrote " << out << ": " << cluster.devices.size() << " " << spec.name
              << " devices sharing " << cluster.cores << " cores (plan with: pipefb_plan "
              << "--config CONFIG --cluster " << out << ")\n";
    return 0;
  });
}
