#include "pipefb/offload/HostPool.h"

#include <sys/mman.h>
#include <torch/torch.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "pipefb/common/Error.h"
#include "pipefb/topology/Binding.h"

namespace pipefb::offload {

const char* toString(HostMemoryKind kind) {
  switch (kind) {
    case HostMemoryKind::Pinned:
      return "pinned";
    case HostMemoryKind::Locked:
      return "locked";
    case HostMemoryKind::Plain:
      return "plain";
  }
  return "?";
}

struct HostPool::State {
  memory::MemoryDomain* domain = nullptr;
  bool lockPages = true;
  mutable std::mutex mu;
  std::multimap<int64_t, void*> free;  // size class -> cached block
  std::map<void*, bool> locked;        // every block held -> mlock succeeded
  HostPoolStats stats;
  bool anyPlain = false;

  ~State() {
    for (auto& [p, l] : locked) {
      if (l) munlock(p, 0);  // length 0 is harmless; pages unlock when freed anyway
      std::free(p);
    }
  }
  void freeBlock(void* p, int64_t size) {  // mu held
    auto it = locked.find(p);
    if (it != locked.end() && it->second) munlock(p, static_cast<size_t>(size));
    locked.erase(p);
    std::free(p);
    stats.blockBytes -= size;
  }
  void trimLocked() {
    for (auto& [size, p] : free) freeBlock(p, size);
    free.clear();
    stats.cachedBytes = 0;
  }
};

HostPool::HostPool(memory::MemoryDomain& domain, bool lockPages)
    : state_(std::make_shared<State>()) {
  state_->domain = &domain;
  state_->lockPages = lockPages;
}

HostPool::~HostPool() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->trimLocked();  // blocks still in use are freed by their tensors' deleters
}

int64_t HostPool::sizeClass(int64_t bytes) {
  constexpr int64_t kGranule = 4096;
  if (bytes <= 0) return kGranule;
  if (bytes <= 16 * kGranule) return (bytes + kGranule - 1) / kGranule * kGranule;
  int64_t p = 1;
  while (p * 2 < bytes) p *= 2;  // p < bytes <= 2p
  const int64_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

at::Tensor HostPool::allocate(const at::Tensor& like, MemoryCategory category) {
  const int64_t nbytes = static_cast<int64_t>(like.numel()) * like.element_size();
  const int64_t size = sizeClass(nbytes);
  State& s = *state_;
  s.domain->charge(category, nbytes);  // throws OutOfMemoryError, nothing taken
  void* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.free.find(size);
    if (it != s.free.end()) {
      block = it->second;
      s.free.erase(it);
      s.stats.cachedBytes -= size;
      ++s.stats.reuses;
    } else {
      // Keep what the pool holds within the domain's capacity: drop cached blocks first.
      const int64_t cap = s.domain->capacity();
      if (cap != memory::kUnlimited && s.stats.blockBytes + size > cap) s.trimLocked();
      block = std::aligned_alloc(4096, static_cast<size_t>(size));
      if (!block) {
        s.domain->release(category, nbytes);
        throw std::bad_alloc();
      }
      // Note [Host pool NUMA placement] (pipefb/topology/Binding.h): before mlock touches
      // the pages; a no-op on one NUMA node.
      topology::bindMemoryNearThisThread(block, static_cast<size_t>(size));
      bool ok = s.lockPages && mlock(block, static_cast<size_t>(size)) == 0;
      if (!ok) s.anyPlain = true;
      s.locked[block] = ok;
      s.stats.blockBytes += size;
      ++s.stats.systemAllocations;
    }
    ++s.stats.allocations;
    s.stats.liveBytes += nbytes;
    s.stats.peakBytes = std::max(s.stats.peakBytes, s.stats.liveBytes);
  }
  std::shared_ptr<State> keep = state_;
  auto deleter = [keep, size, nbytes, category](void* p) {
    keep->domain->release(category, nbytes);
    std::lock_guard<std::mutex> lock(keep->mu);
    keep->stats.liveBytes -= nbytes;
    keep->free.emplace(size, p);
    keep->stats.cachedBytes += size;
  };
  return torch::from_blob(block, like.sizes(), deleter,
                          torch::TensorOptions().dtype(like.dtype()).device(torch::kCPU));
}

void HostPool::trim() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->trimLocked();
}

HostPoolStats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

HostMemoryKind HostPool::kind() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->anyPlain || !state_->lockPages) return HostMemoryKind::Plain;
  return HostMemoryKind::Locked;
}

memory::MemoryDomain& HostPool::domain() const { return *state_->domain; }

}  // namespace pipefb::offload
