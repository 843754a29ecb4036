// Note [c10d backends] on NCCL (pipefb/dist/cuda/NcclGroup.h). Compiled with
// USE_C10D_NCCL, which ProcessGroupNCCL.hpp is guarded by.
#include "pipefb/dist/cuda/NcclGroup.h"

#include <c10/cuda/CUDAFunctions.h>

#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "../C10dBackend.h"
#include "pipefb/common/Error.h"

namespace pipefb::dist {

int ncclDeviceOf(const DistEnv& env) {
  const int gpus = static_cast<int>(c10::cuda::device_count());
  return gpus > 0 ? env.localRank % gpus : -1;
}

std::shared_ptr<ProcessGroup> makeNcclGroup(const DistEnv& env, const GroupOptions& options) {
  const int gpus = static_cast<int>(c10::cuda::device_count());
  if (gpus == 0)
    throw UserError(
        "distributed: the NCCL process group needs a GPU and none is visible; use "
        "devices.kind: cpu (gloo)");
  if (env.localRank >= gpus)
    throw UserError("LOCAL_RANK=" + std::to_string(env.localRank) +
                    ": NCCL needs one GPU per "
                    "rank and this host has " +
                    std::to_string(gpus) + " visible; launch at most " + std::to_string(gpus) +
                    " ranks per host");
  const auto gpu = static_cast<c10::DeviceIndex>(ncclDeviceOf(env));
  c10::cuda::set_device(gpu);  // NCCL's communicators and streams go to the current GPU
  detail::BackendSpec nccl;
  nccl.name = "nccl";
  nccl.device = c10::Device(c10::kCUDA, gpu);
  nccl.make = [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                 std::chrono::milliseconds timeout) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::intrusive_ptr<detail::C10dBackend>(
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts));
  };
  return detail::makeC10dGroup(env, options, std::move(nccl));
}

}  // namespace pipefb::dist
