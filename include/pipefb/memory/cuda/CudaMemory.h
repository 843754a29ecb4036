#pragma once
// Memory domains of pipeline devices on GPUs (DESIGN.md, "Devices and memory
// accounting"; issue 17). Built and linked in every build (Note [CUDA sources]); runs
// only on a GPU.
//
// Note [CUDA accounting]
// Several pipeline devices may share one GPU (devices.count > GPUs): each is a memory
// domain of its own, named cudaDeviceName(device, gpu), with the capacity devices.memory
// and the categories of the virtual devices (weights, grads, optimizer_state, stash,
// working_set, comm_buffers). The CUDA caching allocator is shared by all of them, so its
// statistics cannot tell them apart. Instead a hook on the allocator (its trace tracker,
// LibTorch >= 2.2) sees every block it hands out or takes back, on the thread that asks
// for it, and charges the block to that thread's MemoryScope, exactly as the tracking
// allocator does on the CPU (MemoryScope.h): the device's worker thread and the copy
// engines that prefetch into it run inside its scope. Per-device peaks are therefore the
// domains' own accounting of allocated bytes (block sizes, rounded by the allocator to
// 512 bytes), and gpuMemory() gives the GPU's total from the allocator's statistics; the
// report shows both.
//
// The hook runs with the allocator's lock held, where nothing may throw. An allocation
// that takes a domain over its capacity is recorded there (the domain's OOM statistics,
// event and lastOutOfMemory(), as on the CPU) and raised as pipefb::OutOfMemoryError by
// throwPendingOutOfMemory() on the thread that allocated: the runtime calls it after
// every action, the copy backend after every copy. The memory was briefly used, unlike on
// a virtual device, but no action that went over its budget completes. The message names
// the device, the bytes and the smallest budget that fits (OomInfo::message()).
#include <cstdint>
#include <string>

#include "pipefb/memory/MemoryDomain.h"

namespace pipefb::memory::cuda {

/// "cuda:0/d3": pipeline device 3 on GPU 0.
std::string cudaDeviceName(int device, int gpu);

/// The GPU of pipeline device `device` of `devices` on `gpus` GPUs: contiguous blocks, so
/// that neighbouring stages share a GPU (4 devices on 1 GPU: all on 0; 4 on 2: 0 0 1 1).
int gpuOfDevice(int device, int devices, int gpus);

/// The domain of pipeline device `device` on `gpu` with capacity `capacity` (bytes or
/// kUnlimited); tensors charged to it live on cuda:`gpu` (gpuOfDomain()).
MemoryDomain& configureCudaDomain(int device, int gpu, int64_t capacity);
/// The GPU a domain of configureCudaDomain() is on; -1 for any other domain (host pool,
/// virtual devices).
int gpuOfDomain(const MemoryDomain& domain);

/// Installs the allocator hook of Note [CUDA accounting] (idempotent). Returns "" once it
/// is installed, else why it cannot be (this LibTorch has no trace hook).
std::string installCudaAccounting();
bool cudaAccountingInstalled();
/// Raises the OutOfMemoryError that the hook recorded on this thread, if any (once).
void throwPendingOutOfMemory();

/// One GPU's totals, from the CUDA caching allocator's statistics (getDeviceStats) and
/// the driver: what all pipeline devices on it hold together.
struct GpuMemory {
  int gpu = 0;
  std::string name;           // "NVIDIA H100 80GB HBM3"
  int64_t allocated = 0;      // current: bytes in tensors
  int64_t allocatedPeak = 0;  // peak since resetGpuPeaks()
  int64_t reserved = 0;       // current: bytes the allocator holds from the driver
  int64_t reservedPeak = 0;   // peak
  int64_t total = 0;          // the GPU's memory
};
GpuMemory gpuMemory(int gpu);
void resetGpuPeaks(int gpu);

}  // namespace pipefb::memory::cuda
