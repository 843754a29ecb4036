// Binding threads and memory with hwloc (Binding.h).
#include "pipefb/topology/Binding.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "Hwloc.h"
#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"

namespace pipefb::topology {

using detail::machineHandle;
using detail::newBitmap;

const std::vector<std::string>& bindPolicyNames() {
  static const std::vector<std::string> names = {"none", "cores"};
  return names;
}

BindPolicy parseBindPolicy(const std::string& text, const std::string& key) {
  if (text == "none") return BindPolicy::None;
  if (text == "cores") return BindPolicy::Cores;
  throw UserError(key + ": unknown value '" + text + "'" + didYouMean(text, bindPolicyNames()) +
                  "; allowed: " + joinAllowed(bindPolicyNames()));
}

void bindThisThreadToCore(int core) {
  const Topology& topo = machine();
  if (core < 0 || core >= topo.numCores())
    throw std::out_of_range("bindThisThreadToCore: core " + std::to_string(core) + " of " +
                            std::to_string(topo.numCores()));
  auto set = newBitmap();
  for (int cpu : topo.cores[core].pus) hwloc_bitmap_set(set.get(), static_cast<unsigned>(cpu));
  if (hwloc_set_cpubind(machineHandle(), set.get(), HWLOC_CPUBIND_THREAD) != 0)
    throw std::runtime_error("binding a thread to core " + std::to_string(core) +
                             " failed (hwloc_set_cpubind): " + std::strerror(errno));
}

std::vector<int> thisThreadBinding() {
  auto set = newBitmap();
  std::vector<int> out;
  if (hwloc_get_cpubind(machineHandle(), set.get(), HWLOC_CPUBIND_THREAD) != 0) return out;
  for (int i = hwloc_bitmap_first(set.get()); i >= 0; i = hwloc_bitmap_next(set.get(), i))
    out.push_back(i);
  return out;
}

int thisThreadLastCpu() {
  auto set = newBitmap();
  if (hwloc_get_last_cpu_location(machineHandle(), set.get(), HWLOC_CPUBIND_THREAD) != 0) return -1;
  return hwloc_bitmap_first(set.get());
}

int numaNodeOfCpus(const Topology& topo, const std::vector<int>& cpus) {
  if (cpus.empty()) return -1;
  int node = -2;
  for (int cpu : cpus) {
    int found = -1;
    for (const auto& c : topo.cores)
      for (int p : c.pus)
        if (p == cpu) found = c.numaNode;
    if (found < 0 || (node != -2 && found != node)) return -1;
    node = found;
  }
  return node;
}

bool bindMemoryNearThisThread(void* addr, std::size_t bytes) {
  const Topology& topo = machine();
  if (topo.numNumaNodes() <= 1 || addr == nullptr || bytes == 0) return false;
  const int node = numaNodeOfCpus(topo, thisThreadBinding());
  if (node < 0) return false;  // not bound within one node: leave the kernel's first touch
  auto nodeset = newBitmap();
  hwloc_bitmap_only(nodeset.get(), static_cast<unsigned>(topo.numaNodes[node].osIndex));
  return hwloc_set_area_membind(machineHandle(), addr, bytes, nodeset.get(), HWLOC_MEMBIND_BIND,
                                HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_MIGRATE) == 0;
}

}  // namespace pipefb::topology
