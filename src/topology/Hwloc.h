#pragma once
// Internal: the hwloc handles behind Topology.cpp and Binding.cpp.
#include <hwloc.h>

#include <memory>
#include <string>

namespace pipefb::topology::detail {

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using TopologyHandle = std::unique_ptr<hwloc_topology, TopologyDeleter>;

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;
inline Bitmap newBitmap() { return Bitmap(hwloc_bitmap_alloc()); }

/// This machine's topology, loaded once (with important PCI devices). hwloc allows
/// concurrent reads and binding calls on a loaded topology.
hwloc_topology_t machineHandle();

}  // namespace pipefb::topology::detail
