// Note [CUDA accounting] (pipefb/memory/cuda/CudaMemory.h).
#include "pipefb/memory/cuda/CudaMemory.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <optional>
#include <unordered_map>

#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/memory/OutOfMemoryError.h"

namespace pipefb::memory::cuda {
namespace {

// One block the caching allocator handed out, as the hook charged it.
struct Charge {
  MemoryDomain* domain;
  MemoryCategory category;
  int64_t bytes;
  bool charged;  // false: the domain refused it (a pending OOM)
};

struct Accounting {
  std::mutex mu;  // taken inside the allocator's lock, never the other way round
  std::unordered_map<uintptr_t, Charge> blocks;
  std::unordered_map<int, int> gpuOfDomain;  // MemoryDomain::id() -> GPU
  bool installed = false;
};

Accounting& accounting() {
  static auto* a = new Accounting();  // used by the allocator hook until exit
  return *a;
}

thread_local std::optional<OomInfo> pendingOom;

// The allocator hook's two events. No LibTorch call and no throw in here.
void onAlloc(uintptr_t addr, int64_t bytes) {
  const ScopeTarget target = chargeTarget();
  bool charged = true;
  try {
    target.domain->charge(target.category, bytes);
  } catch (const OutOfMemoryError& e) {
    charged = false;
    if (!pendingOom) pendingOom = e.info();
  }
  auto& a = accounting();
  std::lock_guard<std::mutex> lock(a.mu);
  a.blocks[addr] = {target.domain, target.category, bytes, charged};
}

void onFree(uintptr_t addr) {
  std::optional<Charge> c;
  {
    auto& a = accounting();
    std::lock_guard<std::mutex> lock(a.mu);
    auto it = a.blocks.find(addr);
    if (it == a.blocks.end()) return;  // the second event of one free, or from before install
    c = it->second;
    a.blocks.erase(it);
  }
  if (c->charged) c->domain->release(c->category, c->bytes);
}

}  // namespace

std::string cudaDeviceName(int device, int gpu) {
  return "cuda:" + std::to_string(gpu) + "/d" + std::to_string(device);
}

int gpuOfDevice(int device, int devices, int gpus) {
  if (gpus <= 0 || devices <= 0) return 0;
  return static_cast<int>(static_cast<int64_t>(device) * gpus / devices);
}

MemoryDomain& configureCudaDomain(int device, int gpu, int64_t capacity) {
  MemoryDomain& d = configureDomain(cudaDeviceName(device, gpu), capacity);
  d.setOomHint(
      "HINT: raise devices.memory, add pipeline devices or GPUs, or choose a stash "
      "policy that keeps less on the GPU (offload, checkpoint-offload)");
  auto& a = accounting();
  std::lock_guard<std::mutex> lock(a.mu);
  a.gpuOfDomain[d.id()] = gpu;
  return d;
}

int gpuOfDomain(const MemoryDomain& domain) {
  auto& a = accounting();
  std::lock_guard<std::mutex> lock(a.mu);
  auto it = a.gpuOfDomain.find(domain.id());
  return it == a.gpuOfDomain.end() ? -1 : it->second;
}

std::string installCudaAccounting() {
  static std::once_flag once;
  static std::string why;
  std::call_once(once, [] {
    if (c10::cuda::device_count() == 0) {
      why = "no GPU is visible, so there is no CUDA caching allocator to account";
      return;
    }
    // The allocator must exist before a hook can be attached: one allocation makes it.
    (void)at::empty({1}, at::TensorOptions().device(at::kCUDA));
    namespace cca = c10::cuda::CUDACachingAllocator;
    cca::attachAllocatorTraceTracker([](const cca::TraceEntry& te) {
      switch (te.action_) {
        case cca::TraceEntry::ALLOC:
          onAlloc(static_cast<uintptr_t>(te.addr_), static_cast<int64_t>(te.size_));
          break;
        case cca::TraceEntry::FREE_REQUESTED:
        case cca::TraceEntry::FREE_COMPLETED:
          onFree(static_cast<uintptr_t>(te.addr_));
          break;
        default:
          break;
      }
    });
    std::lock_guard<std::mutex> lock(accounting().mu);
    accounting().installed = true;
  });
  return why;
}

bool cudaAccountingInstalled() {
  std::lock_guard<std::mutex> lock(accounting().mu);
  return accounting().installed;
}

void throwPendingOutOfMemory() {
  if (!pendingOom) return;
  OomInfo info = std::move(*pendingOom);
  pendingOom.reset();
  throw OutOfMemoryError(std::move(info));
}

GpuMemory gpuMemory(int gpu) {
  const auto index = static_cast<c10::DeviceIndex>(gpu);
  // Stat arrays are indexed by StatType; 0 is AGGREGATE.
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  GpuMemory m;
  m.gpu = gpu;
  m.allocated = stats.allocated_bytes[0].current;
  m.allocatedPeak = stats.allocated_bytes[0].peak;
  m.reserved = stats.reserved_bytes[0].current;
  m.reservedPeak = stats.reserved_bytes[0].peak;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, gpu) == cudaSuccess) {
    m.name = prop.name;
    m.total = static_cast<int64_t>(prop.totalGlobalMem);
  }
  return m;
}

void resetGpuPeaks(int gpu) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(gpu));
}

}  // namespace pipefb::memory::cuda
