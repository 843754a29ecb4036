#include "pipefb/offload/cuda/CudaCopyEngine.h"

#include <cuda_runtime_api.h>

#include <stdexcept>

namespace pipefb::offload {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA copy engine: ") + what + ": " +
                             cudaGetErrorString(e));
}
}  // namespace

bool cudaAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

CudaCopyEngine::CudaCopyEngine(int device)
    : device_(device), thread_("cuda-copy:" + std::to_string(device)) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
  cudaEvent_t ev = nullptr;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  event_ = ev;
}

CudaCopyEngine::~CudaCopyEngine() {
  thread_.shutdown();
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CudaCopyEngine::submit(std::function<void()> job) {
  const int device = device_;
  thread_.submit([device, job = std::move(job)] {
    cudaSetDevice(device);
    job();
  });
}

void CudaCopyEngine::shutdown() { thread_.shutdown(); }

std::string CudaCopyEngine::name() const { return "cuda-copy:" + std::to_string(device_); }

void CudaCopyEngine::copy(void* dst, const void* src, std::size_t bytes) {
  auto s = static_cast<cudaStream_t>(stream_);
  auto ev = static_cast<cudaEvent_t>(event_);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
  check(cudaEventRecord(ev, s), "cudaEventRecord");
  check(cudaEventSynchronize(ev), "cudaEventSynchronize");
}

void* cudaPinnedAlloc(std::size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) return nullptr;
  return p;
}

void cudaPinnedFree(void* p) {
  if (p) cudaFreeHost(p);
}

}  // namespace pipefb::offload
