// Note [Copy backends] on GPUs (pipefb/offload/cuda/CudaCopyBackend.h).
#include "pipefb/offload/cuda/CudaCopyBackend.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <optional>
#include <string>
#include <utility>

#include "pipefb/common/Error.h"
#include "pipefb/memory/cuda/CudaMemory.h"
#include "pipefb/offload/HostPool.h"
#include "pipefb/offload/cuda/CudaCopyEngine.h"

namespace pipefb::offload {
namespace {

c10::cuda::CUDAStream currentStream() { return c10::cuda::getCurrentCUDAStream(); }

class CudaEventFence final : public CopyFence {
 public:
  explicit CudaEventFence(const c10::cuda::CUDAStream& producer) { event_.record(producer); }
  void block() override { event_.block(currentStream()); }

 private:
  at::cuda::CUDAEvent event_;
};

// A CudaCopyEngine whose jobs run with its stream current for LibTorch.
class CudaStreamEngine final : public CopyEngine {
 public:
  CudaStreamEngine(int gpu, std::string name) : name_(std::move(name)) {
    c10::cuda::CUDAGuard keep(static_cast<c10::DeviceIndex>(gpu));  // the engine sets the device
    engine_ = std::make_unique<CudaCopyEngine>(gpu);
    stream_ = c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(engine_->stream()),
                                               static_cast<c10::DeviceIndex>(gpu));
  }
  ~CudaStreamEngine() override { engine_->shutdown(); }
  void submit(std::function<void()> job) override {
    const c10::cuda::CUDAStream stream = *stream_;
    engine_->submit([stream, job = std::move(job)] {
      c10::cuda::CUDAStreamGuard guard(stream);
      job();
    });
  }
  void shutdown() override { engine_->shutdown(); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  std::unique_ptr<CudaCopyEngine> engine_;
  std::optional<c10::cuda::CUDAStream> stream_;  // no default constructor
};

class CudaCopyBackend final : public CopyBackend {
 public:
  explicit CudaCopyBackend(std::vector<int> gpuOfDevice) : gpuOfDevice_(std::move(gpuOfDevice)) {}

  std::string name() const override { return "cuda"; }

  std::unique_ptr<CopyEngine> makeEngine(int device, const std::string& role) override {
    PIPEFB_ASSERT(device >= 0 && device < static_cast<int>(gpuOfDevice_.size()),
                  "copy engine for unknown pipeline device " << device);
    const int gpu = gpuOfDevice_[device];
    return std::make_unique<CudaStreamEngine>(
        gpu, "cuda-copy:" + std::to_string(gpu) + "/d" + std::to_string(device) + ":" + role);
  }

  bool asyncCopies() const override { return true; }

  std::shared_ptr<CopyFence> fence() override {
    return std::make_shared<CudaEventFence>(currentStream());
  }

  void finish() override {
    currentStream().synchronize();
    memory::cuda::throwPendingOutOfMemory();  // Note [CUDA accounting]
  }

  void handOver(const std::vector<at::Tensor>& tensors, CopyFence* ready) override {
    if (ready) ready->block();
    const c10::cuda::CUDAStream stream = currentStream();
    for (const auto& t : tensors)
      if (t.defined() && t.is_cuda()) t.record_stream(stream);
  }

  at::Tensor emptyLike(const at::Tensor& like, const memory::MemoryDomain& domain) override {
    const int gpu = memory::cuda::gpuOfDomain(domain);
    if (gpu < 0) return at::empty(like.sizes(), like.options().device(at::kCPU));
    return at::empty(like.sizes(), like.options().device(
                                       at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(gpu))));
  }

  HostMemoryKind hostKind() const override { return HostMemoryKind::Pinned; }

  HostMemoryKind pinHost(void* block, std::size_t bytes) override {
    if (cudaHostRegister(block, bytes, cudaHostRegisterDefault) == cudaSuccess)
      return HostMemoryKind::Pinned;
    (void)cudaGetLastError();  // clear it: the block stays plain (copies then synchronize)
    return HostMemoryKind::Plain;
  }

  void unpinHost(void* block, std::size_t, HostMemoryKind kind) override {
    if (kind == HostMemoryKind::Pinned) cudaHostUnregister(block);
  }

 private:
  std::vector<int> gpuOfDevice_;
};

}  // namespace

std::shared_ptr<CopyBackend> cudaCopyBackend(std::vector<int> gpuOfDevice) {
  return std::make_shared<CudaCopyBackend>(std::move(gpuOfDevice));
}

}  // namespace pipefb::offload
