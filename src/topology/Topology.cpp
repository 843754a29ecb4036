// The machine as hwloc sees it (Topology.h).
#include "pipefb/topology/Topology.h"

#include <cerrno>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "Hwloc.h"
#include "pipefb/common/Error.h"
#include "pipefb/common/Size.h"

namespace pipefb::topology {

namespace {

using detail::Bitmap;
using detail::newBitmap;
using detail::TopologyHandle;

std::vector<int> cpusOf(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

// "0-3,8" for a sorted list of CPU numbers.
std::string ranges(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (i) os << ",";
    os << v[i];
    if (j > i) os << "-" << v[j];
    i = j + 1;
  }
  return os.str();
}

std::string pciClassName(unsigned classId) {
  switch (classId >> 8) {
    case 0x01:
      return "storage";
    case 0x02:
      return "network";
    case 0x03:
      return "display";
    case 0x04:
      return "multimedia";
    case 0x05:
      return "memory";
    case 0x06:
      return "bridge";
    case 0x07:
      return "communication";
    case 0x08:
      return "system";
    case 0x0b:
      return "processor";
    case 0x0c:
      return "serial bus";
    case 0x12:
      return "accelerator";
    default:
      return "other";
  }
}

TopologyHandle load(const char* syntheticDescription) {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0)
    throw std::runtime_error(std::string("hwloc_topology_init failed: ") + std::strerror(errno));
  TopologyHandle h(t);
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (syntheticDescription != nullptr && hwloc_topology_set_synthetic(t, syntheticDescription) != 0)
    throw UserError(std::string("--synthetic: hwloc refuses '") + syntheticDescription +
                    "'; give a synthetic topology such as 'package:2 numa:1 core:4 pu:2'");
  if (hwloc_topology_load(t) != 0)
    throw std::runtime_error(std::string("hwloc_topology_load failed: ") + std::strerror(errno));
  return h;
}

int nodeOfSet(hwloc_topology_t t, hwloc_const_cpuset_t set) {
  if (set == nullptr || hwloc_bitmap_iszero(set)) return -1;
  const int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  if (n <= 1) return n == 1 ? 0 : -1;
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, i);
    if (node->cpuset != nullptr && hwloc_bitmap_isincluded(set, node->cpuset)) return i;
  }
  return -1;
}

Topology fromHandle(hwloc_topology_t t, std::string source) {
  Topology topo;
  topo.source = std::move(source);
  hwloc_obj_t root = hwloc_get_root_obj(t);
  topo.memory = static_cast<std::int64_t>(root->total_memory);
  topo.pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);

  const int numNodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < numNodes; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, i);
    NumaNode n;
    n.index = i;
    n.osIndex = static_cast<int>(o->os_index);
    n.memory = static_cast<std::int64_t>(o->attr->numanode.local_memory);
    topo.numaNodes.push_back(n);
  }

  // Cores, or PUs where the machine reports no Core objects.
  hwloc_obj_type_t coreType =
      hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  const int numCores = hwloc_get_nbobjs_by_type(t, coreType);
  for (int i = 0; i < numCores; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t, coreType, i);
    Core c;
    c.index = i;
    c.osIndex = static_cast<int>(o->os_index);
    c.pus = cpusOf(o->cpuset);
    c.numaNode = nodeOfSet(t, o->cpuset);
    if (c.numaNode >= 0) topo.numaNodes[c.numaNode].cores.push_back(i);
    topo.cores.push_back(c);
  }

  for (hwloc_obj_t o = hwloc_get_next_pcidev(t, nullptr); o != nullptr;
       o = hwloc_get_next_pcidev(t, o)) {
    const auto& a = o->attr->pcidev;
    PciDevice d;
    char bus[32];
    std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.%01x", a.domain, a.bus, a.dev, a.func);
    d.busId = bus;
    d.classId = a.class_id;
    d.vendorId = a.vendor_id;
    d.deviceId = a.device_id;
    d.className = pciClassName(a.class_id);
    if (o->name != nullptr) d.name = o->name;
    d.gpu = (a.class_id >> 8) == 0x03 || (a.class_id >> 8) == 0x12;
    for (hwloc_obj_t c = o->io_first_child; c != nullptr; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE) continue;
      if (c->name != nullptr) d.osDevices.push_back(c->name);
      if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_GPU ||
          c->attr->osdev.type == HWLOC_OBJ_OSDEV_COPROC)
        d.gpu = true;
    }
    hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(t, o);
    d.numaNode = numNodes > 1 && parent != nullptr ? nodeOfSet(t, parent->cpuset) : -1;
    topo.pci.push_back(d);
  }

  // The firmware's NUMA distances (SLIT), where it gives them.
  if (numNodes > 1) {
    unsigned nr = 1;
    hwloc_distances_s* dist = nullptr;
    if (hwloc_distances_get_by_type(t, HWLOC_OBJ_NUMANODE, &nr, &dist,
                                    HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0) == 0 &&
        nr >= 1) {
      if (static_cast<int>(dist->nbobjs) == numNodes) {
        topo.numaDistances.assign(numNodes, std::vector<std::uint64_t>(numNodes, 0));
        for (int a = 0; a < numNodes; ++a)
          for (int b = 0; b < numNodes; ++b)
            topo.numaDistances[dist->objs[a]->logical_index][dist->objs[b]->logical_index] =
                dist->values[a * numNodes + b];
      }
      hwloc_distances_release(t, dist);
    }
  }
  return topo;
}

}  // namespace

namespace detail {
hwloc_topology_t machineHandle() {
  static TopologyHandle handle = load(nullptr);
  return handle.get();
}
}  // namespace detail

int Topology::numGpus() const {
  int n = 0;
  for (const auto& d : pci) n += d.gpu ? 1 : 0;
  return n;
}

std::string Topology::summary() const {
  std::ostringstream os;
  os << numCores() << (numCores() == 1 ? " core, " : " cores, ") << pus
     << (pus == 1 ? " PU, " : " PUs, ") << numNumaNodes()
     << (numNumaNodes() == 1 ? " NUMA node, " : " NUMA nodes, ") << formatBytes(memory) << ", "
     << numGpus() << (numGpus() == 1 ? " GPU" : " GPUs");
  return os.str();
}

std::string Topology::describe() const {
  std::ostringstream os;
  os << "machine: " << summary() << " (" << source << "; hwloc " << hwlocVersion() << ")\n";
  for (const auto& n : numaNodes) {
    std::vector<int> cpus;
    for (int c : n.cores)
      for (int p : cores[c].pus) cpus.push_back(p);
    os << "NUMA node " << n.index << " (os " << n.osIndex << "): " << formatBytes(n.memory)
       << ", cores " << ranges(n.cores) << ", CPUs " << ranges(cpus) << "\n";
  }
  if (!numaDistances.empty()) {
    os << "NUMA distances (firmware, 10 = local):\n";
    for (const auto& row : numaDistances) {
      os << " ";
      for (auto v : row) os << " " << v;
      os << "\n";
    }
  }
  for (const auto& c : cores) {
    os << "core " << c.index << " (os " << c.osIndex << "): CPU" << (c.pus.size() == 1 ? " " : "s ")
       << ranges(c.pus) << ", NUMA node ";
    if (c.numaNode >= 0)
      os << c.numaNode;
    else
      os << "-";
    os << "\n";
  }
  if (pci.empty()) os << "PCI devices: none reported\n";
  for (const auto& d : pci) {
    char ids[48];
    std::snprintf(ids, sizeof ids, "[%04x] %04x:%04x", d.classId, d.vendorId, d.deviceId);
    os << "PCI " << d.busId << " " << ids << " " << d.className;
    if (!d.name.empty()) os << " \"" << d.name << "\"";
    if (d.gpu) os << " GPU";
    if (!d.osDevices.empty()) {
      os << " (";
      for (size_t i = 0; i < d.osDevices.size(); ++i) os << (i ? ", " : "") << d.osDevices[i];
      os << ")";
    }
    if (d.numaNode >= 0) os << ", NUMA node " << d.numaNode;
    os << "\n";
  }
  os << "GPUs: " << (numGpus() == 0 ? std::string("none") : std::to_string(numGpus())) << "\n";
  return os.str();
}

const Topology& machine() {
  static const Topology topo = fromHandle(detail::machineHandle(), "this machine");
  return topo;
}

Topology synthetic(const std::string& description) {
  TopologyHandle h = load(description.c_str());
  return fromHandle(h.get(), "synthetic " + description);
}

std::string hwlocVersion() { return HWLOC_VERSION; }  // the headers built against

}  // namespace pipefb::topology
