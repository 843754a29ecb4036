#include "pipefb/offload/CopyBackend.h"

#include <sys/mman.h>
#include <torch/torch.h>

#include "pipefb/offload/HostPool.h"

namespace pipefb::offload {
namespace {

// Note [Copy backends]: the virtual devices' backend.
class CpuCopyBackend final : public CopyBackend {
 public:
  std::string name() const override { return "cpu"; }
  std::unique_ptr<CopyEngine> makeEngine(int device, const std::string& role) override {
    return std::make_unique<ThreadCopyEngine>(role == "copy"
                                                  ? "copy:" + std::to_string(device)
                                                  : "copy:" + std::to_string(device) + ":" + role);
  }
  at::Tensor emptyLike(const at::Tensor& like, const memory::MemoryDomain&) override {
    return at::empty(like.sizes(), like.options().device(at::kCPU));
  }
  HostMemoryKind hostKind() const override { return HostMemoryKind::Locked; }
  HostMemoryKind pinHost(void* block, std::size_t bytes) override {
    return mlock(block, bytes) == 0 ? HostMemoryKind::Locked : HostMemoryKind::Plain;
  }
  void unpinHost(void* block, std::size_t bytes, HostMemoryKind kind) override {
    if (kind == HostMemoryKind::Locked) munlock(block, bytes);
  }
};

}  // namespace

std::shared_ptr<CopyBackend> cpuCopyBackend() {
  static const auto backend = std::make_shared<CpuCopyBackend>();
  return backend;
}

}  // namespace pipefb::offload
