#pragma once
// A cluster spec from the detected topology (pipefb/topology/Topology.h): what
// pipefb_topology --out writes, and what the planner uses for virtual CPU devices when
// no cluster spec is given (Setup.h). Torch-free.
//
// Note [Detected cluster]
// Virtual CPU devices on one machine: `devices` copies of `spec` (configs/devices/cpu.yaml
// by default) sharing the machine's cores (ClusterSpec::cores = the detected cores, so the
// cost model slows compute by cores/devices when more devices than cores compute at once;
// Note [Shared cores]). Links: device d runs on core d mod C (as devices.bind: cores
// places it, Binding.h); two devices on one NUMA node are joined by `memcpy` (the
// spec's pcie_bandwidth and host_latency: an in-process copy), two on different nodes by
// `numa`, whose bandwidth is memcpy's times local/remote distance from the firmware's
// NUMA distances, or half of it when the machine reports none (an assumption, not a
// measurement). GPUs are listed by pipefb_topology but not put in the spec: hwloc does
// not say which device spec (t4-16g, a100-40g, ...) a GPU is.
#include <cstdint>

#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/topology/Topology.h"

namespace pipefb::planner {

struct DetectedClusterOptions {
  int devices = 0;             // virtual devices; 0 = one per detected core
  std::int64_t hostPool = -1;  // bytes; -1 = unlimited
  bool numaLinks = true;       // false: every link memcpy (devices not bound to nodes)
};

ClusterSpec detectedClusterSpec(const topology::Topology& topo, const DeviceSpec& spec,
                                const DetectedClusterOptions& options);

}  // namespace pipefb::planner
