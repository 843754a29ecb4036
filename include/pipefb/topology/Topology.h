#pragma once
// The machine as hwloc sees it (DESIGN.md, "Distributed"): cores, NUMA nodes and PCI
// devices. pipefb_topology prints it and writes a cluster spec from it; the planner
// uses it when no cluster spec is given (the virtual CPU devices share its cores);
// devices.bind: cores binds the device workers to its cores (Binding.h). Torch-free.
//
// Cores are hwloc's Core objects that this process may use (a cgroup or taskset
// restriction is respected, unlike std::thread::hardware_concurrency), in hwloc's
// logical order; a machine without Core objects reports one core per PU.
#include <cstdint>
#include <string>
#include <vector>

namespace pipefb::topology {

struct Core {
  int index = 0;         // logical: 0..cores-1
  int osIndex = -1;      // the kernel's core id
  std::vector<int> pus;  // the kernel's CPU numbers (what taskset and /proc/cpuinfo use)
  int numaNode = -1;     // logical index of its NUMA node, -1 if none
};

struct NumaNode {
  int index = 0;            // logical
  int osIndex = -1;         // the kernel's node id
  std::int64_t memory = 0;  // bytes local to the node
  std::vector<int> cores;   // logical core indexes
};

struct PciDevice {
  std::string busId;     // "0000:00:02.0"
  unsigned classId = 0;  // PCI class << 8 | subclass, e.g. 0x0300 VGA
  unsigned vendorId = 0, deviceId = 0;
  std::string className;  // "display", "network", ...
  std::string name;       // hwloc's name where it has one (often empty without pci.ids)
  std::vector<std::string> osDevices;  // "card0", "eth0", "sda", "cuda0", ...
  bool gpu = false;   // display/3D/accelerator class, or a GPU/co-processor OS device
  int numaNode = -1;  // logical NUMA node it hangs off, -1 = the whole machine
};

struct Topology {
  std::string source;  // "this machine" or "synthetic <description>"
  std::vector<Core> cores;
  std::vector<NumaNode> numaNodes;  // at least one (hwloc always reports one)
  std::vector<PciDevice> pci;
  int pus = 0;              // processing units (hardware threads) this process may use
  std::int64_t memory = 0;  // bytes, all NUMA nodes
  /// distances[a][b] between NUMA nodes as the firmware reports them (SLIT: 10 local);
  /// empty when the machine reports none.
  std::vector<std::vector<std::uint64_t>> numaDistances;

  int numCores() const { return static_cast<int>(cores.size()); }
  int numNumaNodes() const { return static_cast<int>(numaNodes.size()); }
  int numGpus() const;
  /// "2 cores, 2 PUs, 1 NUMA node, 7.8 GiB, 0 GPUs"
  std::string summary() const;
  /// The multi-line listing pipefb_topology prints.
  std::string describe() const;
};

/// This machine, loaded once per process (thread-safe). Throws std::runtime_error when
/// hwloc cannot load the topology.
const Topology& machine();

/// A synthetic topology in hwloc's synthetic syntax, e.g.
/// "package:2 numa:1(memory=8GB) core:4 pu:2" (tests, and pipefb_topology --synthetic).
/// Throws pipefb::UserError on a description hwloc refuses.
Topology synthetic(const std::string& description);

/// hwloc's version, "2.9.0".
std::string hwlocVersion();

}  // namespace pipefb::topology
