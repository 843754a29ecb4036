#pragma once
// The devices the solver places stages on: speed, capacity and links. Built from a
// cluster spec (DeviceSpec.h) or by hand in tests. Torch-free.
#include <cstdint>
#include <string>
#include <vector>

namespace pipefb::planner {

/// One-way link. time(bytes) = latency + bytes / bandwidth; bandwidth 0 = unlimited.
struct Link {
  double bandwidth = 0;  // bytes per second
  double latency = 0;    // seconds
  double time(std::int64_t bytes) const {
    if (bytes <= 0) return 0;
    return latency + (bandwidth > 0 ? static_cast<double>(bytes) / bandwidth : 0.0);
  }
  bool operator==(const Link& o) const { return bandwidth == o.bandwidth && latency == o.latency; }
};

struct ClusterDevice {
  std::string name;            // "t4-16g:3"
  double speed = 1.0;          // compute speed relative to the profile's reference device
  std::int64_t capacity = -1;  // bytes; -1 = unlimited
  Link host;                   // device <-> host pool (its copy engine), each direction
  /// Note [Devices and processes]: devices with the same number share one pipefb process.
  int process = 0;
};

struct Cluster {
  std::string name;
  std::vector<ClusterDevice> devices;
  /// links[a][b]: a -> b. links[a][a] is ignored (same device: free).
  std::vector<std::vector<Link>> links;
  std::int64_t hostPool = -1;  // host-pool capacity in bytes; -1 = unlimited
  /// Note [Shared cores]: > 0 when the devices' compute threads share this many cores
  /// (pipefb's virtual CPU devices on one machine); 0 = every device computes alone.
  int cores = 0;
  /// Note [Planned reserve] (CostModel.h): the share of its charged bytes, per mille, that
  /// every device's planned peak holds beside them. 0 for a cluster made by hand (the
  /// solver's literal tests); kPlannedReservePerMille on the clusters pipefb's programs
  /// plan on (Setup.cpp).
  int reservePerMille = 0;

  int numDevices() const { return static_cast<int>(devices.size()); }
  /// Note [Devices and processes]
  /// A stage whose forward and backward devices are in different processes can only
  /// stash its input (the checkpoint kinds): an autograd graph cannot move between
  /// processes (Note [Channels across processes] in PipelineEngine.cpp). Within one process
  /// (pipefb's virtual devices, the default: every device has process 0) every policy
  /// works. A cluster spec says `processes: per_device` or lists groups; a config-derived
  /// cluster has one process per device when the run is multi-process (Setup.h).
  bool sameProcess(int a, int b) const {
    return a == b || devices.at(a).process == devices.at(b).process;
  }
  /// Gives every device its own process.
  void processPerDevice() {
    for (int d = 0; d < numDevices(); ++d) devices[d].process = d;
  }
  Link link(int a, int b) const { return a == b ? Link{} : links.at(a).at(b); }

  /// n identical devices, every pair joined by `link`.
  static Cluster uniform(int n, double speed, std::int64_t capacity, Link link, Link host,
                         std::int64_t hostPool = -1);

  /// Checks sizes and values; throws UserError naming the field.
  void validate() const;
};

}  // namespace pipefb::planner
