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
  bool operator==(const Link& o) const {
    return bandwidth == o.bandwidth && latency == o.latency;
  }
};

struct ClusterDevice {
  std::string name;          // "t4-16g:3"
  double speed = 1.0;        // compute speed relative to the profile's reference device
  std::int64_t capacity = -1;  // bytes; -1 = unlimited
  Link host;                 // device <-> host pool (its copy engine), each direction
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

  int numDevices() const { return static_cast<int>(devices.size()); }
  Link link(int a, int b) const { return a == b ? Link{} : links.at(a).at(b); }

  /// n identical devices, every pair joined by `link`.
  static Cluster uniform(int n, double speed, std::int64_t capacity, Link link, Link host,
                         std::int64_t hostPool = -1);

  /// Checks sizes and values; throws UserError naming the field.
  void validate() const;
};

}  // namespace pipefb::planner
