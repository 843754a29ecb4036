// The LibTorch layer of pipefb::memory: a c10::Allocator that charges the
// torch-free accounting (MemoryDomain, MemoryScope) and then takes memory from
// c10's own alloc_cpu/free_cpu.
#include "pipefb/memory/TrackingAllocator.h"

#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <new>

namespace pipefb::memory {
namespace {

// Lives in the kAllocationHeaderBytes in front of the data; 64 keeps the data at
// c10's 64-byte alignment (alloc_cpu aligns the block itself to 64).
struct BlockHeader {
  MemoryDomain* domain;
  int64_t bytes;
  MemoryCategory category;
};
static_assert(sizeof(BlockHeader) <= kAllocationHeaderBytes, "header too big");
static_assert(kAllocationHeaderBytes % 64 == 0, "header must keep the data 64-aligned");

inline BlockHeader* headerOf(void* data) {
  return reinterpret_cast<BlockHeader*>(static_cast<char*>(data) - kAllocationHeaderBytes);
}

// The DataPtr context is the data pointer itself (as in c10's default allocator),
// so raw_allocate/raw_deallocate work too.
void deleteBlock(void* data) {
  if (data == nullptr) return;
  BlockHeader* h = headerOf(data);
  h->domain->release(h->category, h->bytes);
  if (c10::memoryProfilingEnabled())
    c10::reportMemoryUsageToProfiler(data, -h->bytes, 0, 0, c10::Device(c10::DeviceType::CPU));
  c10::free_cpu(h);
}

class TrackingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (nbytes == 0) return {nullptr, nullptr, &deleteBlock, cpu};
    const ScopeTarget target = chargeTarget();
    const auto bytes = static_cast<int64_t>(nbytes);
    target.domain->charge(target.category, bytes);  // throws OutOfMemoryError, charging nothing
    void* block = nullptr;
    try {
      block = c10::alloc_cpu(nbytes + kAllocationHeaderBytes);
    } catch (...) {
      target.domain->release(target.category, bytes);  // the real allocator refused
      throw;
    }
    new (block) BlockHeader{target.domain, bytes, target.category};
    void* data = static_cast<char*>(block) + kAllocationHeaderBytes;
    if (c10::memoryProfilingEnabled()) c10::reportMemoryUsageToProfiler(data, bytes, 0, 0, cpu);
    return {data, data, &deleteBlock, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleteBlock; }

  // Host memory: a plain memcpy, as c10's default CPU allocator does.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

TrackingCpuAllocator& theAllocator() {
  static TrackingCpuAllocator* a = new TrackingCpuAllocator();  // static lifetime, never freed
  return *a;
}

}  // namespace

void installTrackingAllocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Create the well-known domains before the first allocation needs them.
    (void)unscopedDomain();
    (void)hostDomain();
    c10::SetCPUAllocator(&theAllocator(), kTrackingAllocatorPriority);
  });
}

bool trackingAllocatorInstalled() { return c10::GetCPUAllocator() == &theAllocator(); }

std::optional<OomInfo> findOutOfMemory(std::exception_ptr error) {
  if (!error) return std::nullopt;
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemoryError& e) {
    return e.info();
  } catch (const c10::Error& e) {
    what = e.what();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    return std::nullopt;
  }
  const auto at = what.find(kOomMessagePrefix);
  if (at == std::string::npos) return std::nullopt;
  // Wrapped: take the details recorded when it was refused, if they match.
  for (const auto& info : {lastOutOfMemory(), lastOutOfMemoryAnyThread()})
    if (info && what.find(info->message()) != std::string::npos) return info;
  for (const auto& info : {lastOutOfMemory(), lastOutOfMemoryAnyThread()})
    if (info && what.compare(at + std::strlen(kOomMessagePrefix), info->domain.size() + 1,
                             info->domain + ":") == 0)
      return info;
  // An OOM whose details are gone: keep what the message names.
  OomInfo info;
  const auto from = at + std::strlen(kOomMessagePrefix);
  info.domain = what.substr(from, what.find(": ", from) - from);
  return info;
}

void oneIntraOpThread() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  at::set_num_threads(1);
}

}  // namespace pipefb::memory
