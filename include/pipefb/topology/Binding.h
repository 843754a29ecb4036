#pragma once
// Binding threads and memory to this machine's cores and NUMA nodes with hwloc
// (devices.bind; README, "Topology and binding"). Torch-free.
//
// Note [Device binding]
// devices.bind: cores pins virtual device d's worker thread and its copy-engine thread
// to core d mod C (C = the detected cores, Topology.h): a device owns a core and its
// copies run next to the compute that made the stash. The default is none, the runtime's
// behaviour before: on this 2-core machine pinning cost 5% with as many devices as cores
// (1f1b, 2 devices: a pinned thread cannot use the idle core while its partner waits on a
// channel, nor escape a core another process uses) and saved 17% with twice as many
// (pipefb-sync, 4 devices + 4 copy threads), single runs on a shared machine
// (experiments/README.md, "Binding").
//
// Note [Host pool NUMA placement]
// The host pool's blocks are bound to the NUMA node of the thread that allocates them
// (a bound device worker or copy engine, so the node nearest that device) with
// hwloc_set_area_membind before they are first touched. On a machine with one NUMA node,
// or from an unbound thread, this does nothing.
#include <cstddef>
#include <string>
#include <vector>

#include "pipefb/topology/Topology.h"

namespace pipefb::topology {

enum class BindPolicy { None, Cores };

/// "none" | "cores" (the values devices.bind allows).
const std::vector<std::string>& bindPolicyNames();
/// Throws pipefb::UserError naming `key` on any other value.
BindPolicy parseBindPolicy(const std::string& text, const std::string& key = "devices.bind");

/// The core device `device` is bound to under BindPolicy::Cores: round-robin.
inline int coreForDevice(int device, int numCores) { return numCores > 0 ? device % numCores : 0; }

/// Binds the calling thread to every PU of machine().cores[core]
/// (hwloc_set_cpubind, HWLOC_CPUBIND_THREAD). Throws std::runtime_error on failure.
void bindThisThreadToCore(int core);
/// The calling thread's binding as kernel CPU numbers (hwloc_get_cpubind).
std::vector<int> thisThreadBinding();
/// The kernel CPU the calling thread last ran on (hwloc_get_last_cpu_location), -1 if
/// unknown.
int thisThreadLastCpu();

/// The logical NUMA node holding all of `cpus` (kernel CPU numbers) in `topo`, or -1 when
/// they span nodes (or the list is empty).
int numaNodeOfCpus(const Topology& topo, const std::vector<int>& cpus);

/// Note [Host pool NUMA placement]: binds [addr, addr + bytes) to the NUMA node of the
/// calling thread's binding. Returns false, doing nothing, when the machine has one NUMA
/// node or the thread is not bound within one node; true when it bound the range.
bool bindMemoryNearThisThread(void* addr, std::size_t bytes);

}  // namespace pipefb::topology
