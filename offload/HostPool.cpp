#include "pipefb/offload/HostPool.h"

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
  std::shared_ptr<CopyBackend> backend;
  mutable std::mutex mu;
  std::multimap<int64_t, void*> free;  // size class -> cached block
  struct Block {
    int64_t size;
    HostMemoryKind kind;
  };
  std::map<void*, Block> blocks;  // every block held
  HostPoolStats stats;
  bool anyPlain = false;

  ~State() {
    for (auto& [p, b] : blocks) {
      backend->unpinHost(p, static_cast<size_t>(b.size), b.kind);
      std::free(p);
    }
  }
  void freeBlock(void* p, int64_t size) {  // mu held
    auto it = blocks.find(p);
    if (it != blocks.end()) {
      backend->unpinHost(p, static_cast<size_t>(size), it->second.kind);
      blocks.erase(it);
    }
    std::free(p);
    stats.blockBytes -= size;
  }
  void trimLocked() {
    for (auto& [size, p] : free) freeBlock(p, size);
    free.clear();
    stats.cachedBytes = 0;
  }
};

HostPool::HostPool(memory::MemoryDomain& domain, bool lockPages,
                   std::shared_ptr<CopyBackend> backend)
    : state_(std::make_shared<State>()) {
  state_->domain = &domain;
  state_->lockPages = lockPages;
  state_->backend = backend ? std::move(backend) : cpuCopyBackend();
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
      // Note [Host pool NUMA placement] (pipefb/topology/Binding.h): before pinHost touches
      // the pages; a no-op on one NUMA node.
      topology::bindMemoryNearThisThread(block, static_cast<size_t>(size));
      const HostMemoryKind kind = s.lockPages ? s.backend->pinHost(block, static_cast<size_t>(size))
                                              : HostMemoryKind::Plain;
      if (kind == HostMemoryKind::Plain) s.anyPlain = true;
      s.blocks[block] = {size, kind};
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
  return state_->backend->hostKind();
}

memory::MemoryDomain& HostPool::domain() const { return *state_->domain; }

}  // namespace pipefb::offload
