#pragma once
// The tracking allocator: LibTorch's CPU allocator, replaced at start-up with
// c10::SetCPUAllocator, charges every allocation to the calling thread's
// MemoryScope (see MemoryScope.h) and refuses what would exceed the domain's
// capacity (see Note [Out of memory]).
//
// Note [Install before allocating]
// Call installTrackingAllocator() once, early in main() and in every test
// binary, before building models or tensors. Tensors whose storage was
// allocated before it are never seen: neither their allocation nor their free is
// counted. (That is safe, just invisible: their deleter is still c10's.)
//
// Each block carries a 64-byte header in front of the data holding the domain,
// category and size, so a free is charged to the allocating domain from any
// thread. The header is not charged: the accounting is the sum of the storages'
// nbytes, like the planner's numbers.
//
// This header does not include LibTorch; the implementation does.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>

#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryDomain.h"
#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/memory/MemoryStats.h"
#include "pipefb/memory/OutOfMemoryError.h"

namespace pipefb::memory {

/// Priority passed to c10::SetCPUAllocator (c10's own default registers with 0).
inline constexpr uint8_t kTrackingAllocatorPriority = 100;
/// Bytes of header in front of each tracked block (uncharged).
inline constexpr std::size_t kAllocationHeaderBytes = 64;

/// Installs the tracking allocator. Idempotent and thread-safe. See
/// Note [Install before allocating].
void installTrackingAllocator();
/// True if LibTorch's current CPU allocator is ours.
bool trackingAllocatorInstalled();

/// The OOM carried by `error`, if it is one: a pipefb::OutOfMemoryError, or a
/// c10::Error (or other std::exception) whose message contains an OOM message
/// (details then come from lastOutOfMemory(), or lastOutOfMemoryAnyThread()).
std::optional<OomInfo> findOutOfMemory(std::exception_ptr error);

/// Note [Intra-op threads] (MemoryScope.h): at::set_num_threads(1) on the calling thread,
/// for a device worker or a copy engine at its start. The calls are serialised: several
/// such threads start at once, and LibTorch's first calls allocate state that another
/// thread's call then locks without ordering we can see (ThreadSanitizer, offload_test's
/// TransferManager.PrefetchIssuedBeforeTheOffloadWaitsOnTheCopyEngine: two copy engines
/// starting together, a race inside libtorch_cpu).
void oneIntraOpThread();

}  // namespace pipefb::memory
