#pragma once
// The CUDA copy engine (DESIGN.md, "offload/"): a dedicated CUDA stream plus events,
// behind the CopyEngine interface, and pinned host memory (cudaHostAlloc). Built as
// pipefb_offload_cuda wherever /usr/local/cuda exists (it uses the CUDA runtime only, no
// CUDA LibTorch); it needs a GPU at run time (cudaAvailable()). TransferManager drives it
// through the CUDA copy backend (CudaCopyBackend.h, Note [Copy backends]), which runs
// LibTorch's copies on stream().
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
  /// The engine's stream (a cudaStream_t), for LibTorch (c10::cuda::getStreamFromExternal).
  void* stream() const { return stream_; }
  int device() const { return device_; }

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
