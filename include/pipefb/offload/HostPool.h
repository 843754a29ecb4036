#pragma once
// The host pool (DESIGN.md, "offload/"): where offloaded stashes and weight versions
// wait for their backward. It has its own capacity and accounting (the "host" memory
// domain, devices.host_memory) and reuses blocks by size class.
//
// Memory kind: page-locked where it can be had, by the pool's copy backend (Note [Copy
// backends], CopyBackend.h): mlock(2) on virtual devices (bounded by RLIMIT_MEMLOCK),
// registered with the CUDA driver (pinned) under the CUDA backend. A block that cannot
// be locked stays plain, and kind() reports the weakest kind handed out.
//
// Accounting: a tensor from allocate() charges its nbytes (not the rounded block) to
// the domain, like the tracking allocator, so host numbers compare with device ones.
// Exhaustion is a pipefb::OutOfMemoryError raised by the domain before any block is
// touched; nothing is corrupted and the pool stays usable.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/memory/MemoryDomain.h"
#include "pipefb/offload/CopyBackend.h"

namespace pipefb::offload {

enum class HostMemoryKind { Pinned, Locked, Plain };
const char* toString(HostMemoryKind kind);

struct HostPoolStats {
  int64_t liveBytes = 0;          // sum, charged: nbytes of live tensors
  int64_t peakBytes = 0;          // peak of liveBytes
  int64_t blockBytes = 0;         // bytes of blocks held (in use + cached)
  int64_t cachedBytes = 0;        // bytes of free blocks kept for reuse
  int64_t allocations = 0;        // count: tensors handed out
  int64_t reuses = 0;             // count: of those, served from a cached block
  int64_t systemAllocations = 0;  // count: blocks taken from the system
};

class HostPool {
 public:
  /// `lockPages`: page-lock new blocks through `backend` (null: cpuCopyBackend(), mlock).
  explicit HostPool(memory::MemoryDomain& domain, bool lockPages = true,
                    std::shared_ptr<CopyBackend> backend = nullptr);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  /// A contiguous CPU tensor of `like`'s sizes and dtype in the pool, charged to the
  /// pool's domain under `category`. Throws OutOfMemoryError when the domain is full.
  /// The tensor may outlive the pool.
  at::Tensor allocate(const at::Tensor& like, MemoryCategory category = MemoryCategory::Stash);
  /// Frees the cached blocks.
  void trim();

  HostPoolStats stats() const;
  HostMemoryKind kind() const;
  memory::MemoryDomain& domain() const;

  /// Block size for a request: 4 KiB granules up to 64 KiB, then four classes per
  /// power of two (at most 25% rounding).
  static int64_t sizeClass(int64_t bytes);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace pipefb::offload
