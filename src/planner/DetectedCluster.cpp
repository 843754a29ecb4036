// A cluster spec from the detected topology (DetectedCluster.h, Note [Detected cluster]).
#include "pipefb/planner/DetectedCluster.h"

#include <algorithm>

#include "pipefb/topology/Binding.h"

namespace pipefb::planner {

ClusterSpec detectedClusterSpec(const topology::Topology& topo, const DeviceSpec& spec,
                                const DetectedClusterOptions& o) {
  const int C = std::max(1, topo.numCores());
  const int D = o.devices > 0 ? o.devices : C;
  ClusterSpec c;
  c.name = std::to_string(D) + "x-" + spec.name + "-detected";
  c.description = std::to_string(D) + " virtual " + spec.name + " devices sharing " +
                  topo.summary() + " (hwloc, " + topo.source + ")";
  c.devices.assign(D, spec);
  c.hostPool = o.hostPool;
  c.cores = topo.numCores();
  const Link local{spec.pcieBandwidth, spec.hostLatency};
  std::vector<int> node(D, -1);
  for (int d = 0; d < D; ++d) {
    const int core = topology::coreForDevice(d, C);
    node[d] = core < topo.numCores() ? topo.cores[core].numaNode : -1;
  }
  c.links.assign(D, std::vector<Link>(D, local));
  c.linkKinds.assign(D, std::vector<std::string>(D, "memcpy"));
  for (int a = 0; a < D; ++a) c.links[a][a] = Link{}, c.linkKinds[a][a] = "-";  // unused
  for (int a = 0; a < D; ++a)
    for (int b = 0; b < D; ++b) {
      if (a == b || !o.numaLinks || node[a] < 0 || node[b] < 0 || node[a] == node[b]) continue;
      double ratio = 0.5;  // no distances reported: assumed
      const auto& dist = topo.numaDistances;
      if (!dist.empty() && dist[node[a]][node[b]] > 0)
        ratio = static_cast<double>(dist[node[a]][node[a]]) /
                static_cast<double>(dist[node[a]][node[b]]);
      c.links[a][b] = Link{local.bandwidth * ratio, local.latency};
      c.linkKinds[a][b] = "numa";
    }
  return c;
}

}  // namespace pipefb::planner
