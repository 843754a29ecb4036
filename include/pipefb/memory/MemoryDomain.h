#pragma once
// A memory domain: the memory of one (virtual) device, or the host pool, with a
// capacity and live/peak accounting per category (DESIGN.md, "Devices and memory
// accounting"). The tracking allocator charges LibTorch allocations to domains;
// a CUDA backend or the offload manager can charge them directly.
//
// Domains are created through the registry (DomainRegistry.h) and live until the
// process exits, because every live allocation keeps a raw pointer to its domain.
//
// Thread safety: every member may be called from any thread. The accounting is
// guarded by one mutex per domain (uncontended in the pipeline: one compute and
// one copy thread per device), which keeps the capacity check, the per-category
// counters, the peak breakdown and the event log consistent with each other.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/memory/MemoryStats.h"

namespace pipefb::memory {

// alignas(64): no false sharing between domains, and MemoryScope packs the
// category into the low bits of a domain pointer.
class alignas(64) MemoryDomain {
 public:
  /// Use getOrCreateDomain() / configureDomain() instead.
  MemoryDomain(int id, std::string name, int64_t capacity, std::string oomHint);
  MemoryDomain(const MemoryDomain&) = delete;
  MemoryDomain& operator=(const MemoryDomain&) = delete;

  /// Dense index in the registry; what MemoryEvent::domain holds.
  int id() const { return id_; }
  const std::string& name() const { return name_; }

  /// Bytes, or kUnlimited. Lowering it below the live bytes refuses new allocations
  /// only; nothing is freed.
  int64_t capacity() const { return capacity_.load(std::memory_order_relaxed); }
  void setCapacity(int64_t bytes);
  bool unlimited() const { return capacity() == kUnlimited; }

  /// The "HINT: ..." sentence of this domain's OOM messages.
  std::string oomHint() const;
  void setOomHint(std::string hint);

  /// Charges `bytes` to `category`. When live + bytes > capacity it charges
  /// nothing, records an OOM (stats, event, lastOutOfMemory) and throws
  /// pipefb::OutOfMemoryError. `bytes` >= 0.
  void charge(MemoryCategory category, int64_t bytes);
  /// Undoes one charge() of the same category and size.
  void release(MemoryCategory category, int64_t bytes);

  MemoryStats stats() const;
  int64_t liveBytes() const;
  int64_t liveBytes(MemoryCategory category) const;
  int64_t peakBytes() const;
  /// Peaks (total, per category, live count) := current values.
  void resetPeak();
  /// Zeroes the sums and counts too (not the live values). For tests and sweeps.
  void resetStats();

 private:
  const int id_;
  const std::string name_;
  std::atomic<int64_t> capacity_;

  mutable std::mutex mu_;
  MemoryStats stats_;    // guarded by mu_; domain/capacity fields filled on read
  std::string oomHint_;  // guarded by mu_
};

}  // namespace pipefb::memory
