#include "pipefb/runtime/DeviceKind.h"

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdlib>

#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"

namespace pipefb::runtime {

std::string cudaUnavailableReason() {
  // hasCUDART: libtorch_cuda registered its hooks when it loaded (Note [One LibTorch]).
  if (!at::globalContext().hasCUDART())
    return "this LibTorch (" TORCH_VERSION ") has no CUDA backend loaded (libtorch_cuda)";
  if (torch::cuda::device_count() == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return std::string("LibTorch has CUDA, but no GPU is visible (CUDA_VISIBLE_DEVICES=") +
           (visible ? "'" + std::string(visible) + "'" : std::string("unset")) + ")";
  }
  return "the pipeline runtime does not place its stages on CUDA yet (its CUDA backend is "
         "built and linked only; issue 32)";
}

DeviceKind checkDeviceKind(const config::Config& config) {
  if (config.devices.kind == "cpu") return DeviceKind::Cpu;
  PIPEFB_ASSERT(config.devices.kind == "cuda", "devices.kind " << config.devices.kind);
  const std::string why = cudaUnavailableReason();
  if (!why.empty())
    throw UserError("devices.kind: cuda cannot run here: " + why +
                    "; allowed here: devices.kind: cpu");
  return DeviceKind::Cuda;
}

}  // namespace pipefb::runtime
