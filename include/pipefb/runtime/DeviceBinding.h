#pragma once
// devices.bind for the pipeline's virtual devices (Note [Device binding] in
// pipefb/topology/Binding.h).
#include <string>

namespace pipefb::offload {
class TransferManager;
}

namespace pipefb::runtime {

/// Called by device `device`'s worker thread as it starts. Under devices.bind: cores it
/// binds the calling thread to core coreForDevice(device, cores) and queues the same
/// binding on the device's copy engine (ahead of any copy queued later; `transfers` may
/// be null); under none it does nothing. Never throws: binding is a placement hint, so a
/// thread hwloc cannot bind (a restricted container) stays unbound with a warning.
void bindDeviceThreads(const std::string& policy, int device, offload::TransferManager* transfers);

}  // namespace pipefb::runtime
