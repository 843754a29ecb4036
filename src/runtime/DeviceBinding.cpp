// devices.bind for the pipeline's virtual devices (DeviceBinding.h).
#include "pipefb/runtime/DeviceBinding.h"

#include <spdlog/spdlog.h>

#include "pipefb/offload/TransferManager.h"
#include "pipefb/topology/Binding.h"

namespace pipefb::runtime {

void bindDeviceThreads(const std::string& policy, int device, offload::TransferManager* transfers) {
  if (policy != "cores") return;  // the config allows none | cores
  int core = -1;
  try {
    const topology::Topology& topo = topology::machine();
    core = topology::coreForDevice(device, topo.numCores());
    topology::bindThisThreadToCore(core);
    std::string cpus;
    for (int c : topo.cores[core].pus) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    spdlog::info("devices.bind: cpu:{} worker and copy engine on core {} (CPU {})", device, core,
                 cpus);
  } catch (const std::exception& e) {
    spdlog::warn("devices.bind: cores: cpu:{}'s worker stays unbound: {}", device, e.what());
    return;
  }
  if (transfers == nullptr) return;
  transfers->runOnCopyEngine(device, [device, core] {
    try {
      topology::bindThisThreadToCore(core);
    } catch (const std::exception& e) {
      spdlog::warn("devices.bind: cores: cpu:{}'s copy engine stays unbound: {}", device, e.what());
    }
  });
}

}  // namespace pipefb::runtime
