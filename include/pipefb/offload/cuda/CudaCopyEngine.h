#pragma once
// The CUDA copy engine (DESIGN.md, "offload/"): a dedicated CUDA stream plus events,
// behind the CopyEngine interface, and pinned host memory (cudaHostAlloc) for the host
// pool. Built as pipefb_offload_cuda only where /usr/local/cuda exists; it needs a GPU at
// run time (cudaAvailable()). The LibTorch this project uses is CPU-only, so nothing
// wires this engine into TransferManager yet: it is the backend a CUDA build would use.
#include <cstddef>
#include <functional>
#include <string>

#include "pipefb/offload/CopyEngine.h"

namespace pipefb::offload {

/// True if the CUDA runtime loads and reports at least one device.
bool cudaAvailable();

class CudaCopyEngine final : public CopyEngine {
 public:
  /// Throws std::runtime_error if the device or the stream cannot be had.
  explicit CudaCopyEngine(int device);
  ~CudaCopyEngine() override;
  /// Jobs run in order on the engine's thread, with the device current.
  void submit(std::function<void()> job) override;
  void shutdown() override;
  std::string name() const override;
  /// Inside a job: copies `bytes` on the engine's stream (any direction, cudaMemcpyDefault)
  /// and returns once the copy's event completed.
  void copy(void* dst, const void* src, std::size_t bytes);

 private:
  int device_;
  void* stream_ = nullptr;  // cudaStream_t
  void* event_ = nullptr;   // cudaEvent_t
  ThreadCopyEngine thread_;
};

/// Page-locked host memory for the host pool; nullptr when CUDA cannot provide it.
void* cudaPinnedAlloc(std::size_t bytes);
void cudaPinnedFree(void* p);

}  // namespace pipefb::offload
