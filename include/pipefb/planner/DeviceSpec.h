#pragma once
// Device and cluster specs (configs/devices/*.yaml, configs/clusters/*.yaml; format in
// docs/planner.md). They let the planner cost hardware it cannot run on. Torch-free.
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/common/Precision.h"
#include "pipefb/planner/Cluster.h"

namespace pipefb::planner {

struct DeviceSpec {
  std::string name;         // "t4-16g"
  std::string description;  // free text
  double peakFlops = 0;     // FP32 FLOP/s the trainer's kernels can use (dense)
  /// Dense bf16 and fp16 FLOP/s (tensor cores; `bf16_flops`, `fp16_flops`); 0: the device
  /// has none, and cannot plan at that precision (Note [Half-precision training]).
  double bf16Flops = 0, fp16Flops = 0;
  std::int64_t memory = 0;   // usable bytes
  double hbmBandwidth = 0;   // device memory bytes/s
  double pcieBandwidth = 0;  // host <-> device bytes/s (pinned), each direction
  double hostLatency = 10e-6;
  /// Fraction of peak FLOP/s and HBM bandwidth that training kernels reach. The spec
  /// file states where its number comes from.
  double efficiency = 0.5;
  double layerOverhead = 20e-6;  // seconds per layer per pass (launches, small kernels)
};

/// FLOP/s at a training precision: peakFlops, bf16Flops or fp16Flops. A UserError naming the
/// spec and its key when the device has none at that precision.
double flopsAt(const DeviceSpec& spec, Precision precision);

/// Parses a device spec; errors name the file and key.
DeviceSpec parseDeviceSpec(const std::string& yaml, const std::string& source);
DeviceSpec loadDeviceSpec(const std::string& path);
/// `nameOrPath` is a file, or a name looked up as <devicesDir>/<name>.yaml.
DeviceSpec findDeviceSpec(const std::string& nameOrPath, const std::string& devicesDir);
/// Names of the specs in a directory, for error messages.
std::vector<std::string> deviceSpecNames(const std::string& devicesDir);

/// A cluster spec resolved against its device specs.
struct ClusterSpec {
  std::string name;
  std::string description;
  std::vector<DeviceSpec> devices;  // one per device, in order
  std::vector<std::vector<Link>> links;
  std::vector<std::vector<std::string>> linkKinds;  // names, for reports
  std::int64_t hostPool = -1;
  /// `cores: N` (Note [Shared cores]): the devices' compute threads share N cores of one
  /// machine (pipefb_topology writes it for virtual CPU devices); 0 = each has its own.
  int cores = 0;
  /// Note [Devices and processes] (Cluster.h): the process of each device; empty = one
  /// process for all. `processes: one | per_device | [[0, 1], [2, 3]]` in the spec.
  std::vector<int> processes;

  /// The solver's view: the given speeds (analyticSpeeds(), or 1 for a measured profile
  /// on one kind of device), capacities from the specs, host links from PCIe.
  Cluster toCluster(const std::vector<double>& speeds) const;
};

ClusterSpec parseClusterSpec(const std::string& yaml, const std::string& source,
                             const std::string& devicesDir);
ClusterSpec loadClusterSpec(const std::string& path, const std::string& devicesDir);

/// n identical devices of one spec joined by one link kind (used when a config names
/// devices.count and no cluster file is given).
ClusterSpec uniformClusterSpec(const DeviceSpec& spec, int n, Link link,
                               std::int64_t hostPool = -1);

/// The spec as YAML that parseDeviceSpec / parseClusterSpec read back to an equal spec
/// (numbers with 17 significant digits; a cluster's devices by spec name, one entry per
/// device, and every link in a matrix of its link kinds).
std::string deviceSpecToYaml(const DeviceSpec& spec);
std::string clusterSpecToYaml(const ClusterSpec& spec);

/// "10us", "2ms", "1e-5" -> seconds; "12GB", "900GiB", "1.2e10" -> bytes/s.
double parseSeconds(const std::string& text, const std::string& key);
double parseBandwidth(const std::string& text, const std::string& key);

}  // namespace pipefb::planner
