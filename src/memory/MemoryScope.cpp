#include "pipefb/memory/MemoryScope.h"

#include <atomic>

#include "pipefb/common/Error.h"
#include "pipefb/memory/DomainRegistry.h"

namespace pipefb::memory {
namespace {

// A thread's scope is one word: the domain pointer with the category in its low
// bits (MemoryDomain is 64-byte aligned). One word so that another thread (see
// ScopeLeader) reads domain and category consistently. 0 = no scope.
constexpr uintptr_t kCategoryMask = 63;
static_assert(alignof(MemoryDomain) >= 64, "the category lives in the low bits");
static_assert(kNumMemoryCategories <= kCategoryMask, "the category lives in the low bits");

thread_local std::atomic<uintptr_t> tlsScope{0};
std::atomic<const std::atomic<uintptr_t>*> leaderScope{nullptr};

inline uintptr_t pack(MemoryDomain& d, MemoryCategory c) {
  return reinterpret_cast<uintptr_t>(&d) | static_cast<uintptr_t>(index(c));
}
inline ScopeTarget unpack(uintptr_t w) {
  return {reinterpret_cast<MemoryDomain*>(w & ~kCategoryMask),
          static_cast<MemoryCategory>(w & kCategoryMask)};
}

}  // namespace

MemoryScope::MemoryScope(MemoryDomain& domain, MemoryCategory category)
    : previous_(tlsScope.load(std::memory_order_relaxed)) {
  tlsScope.store(pack(domain, category), std::memory_order_relaxed);
}

MemoryScope::MemoryScope(MemoryCategory category)
    : previous_(tlsScope.load(std::memory_order_relaxed)) {
  PIPEFB_ASSERT(previous_ != 0, "MemoryScope(" << toString(category)
                                               << ") needs an enclosing MemoryScope with a domain");
  tlsScope.store(pack(*unpack(previous_).domain, category), std::memory_order_relaxed);
}

MemoryScope::~MemoryScope() { tlsScope.store(previous_, std::memory_order_relaxed); }

std::optional<ScopeTarget> currentScope() {
  const uintptr_t w = tlsScope.load(std::memory_order_relaxed);
  if (w == 0) return std::nullopt;
  return unpack(w);
}

ScopeTarget chargeTarget() {
  uintptr_t w = tlsScope.load(std::memory_order_relaxed);
  if (w != 0) return unpack(w);
  if (const auto* leader = leaderScope.load(std::memory_order_acquire)) {
    w = leader->load(std::memory_order_relaxed);
    if (w != 0) return unpack(w);
  }
  static MemoryDomain& unscoped = unscopedDomain();
  return {&unscoped, MemoryCategory::WorkingSet};
}

ScopeLeader::ScopeLeader()
    : previous_(leaderScope.exchange(&tlsScope, std::memory_order_acq_rel)) {}

ScopeLeader::~ScopeLeader() {
  PIPEFB_ASSERT(leaderScope.load() == &tlsScope,
                "ScopeLeader destroyed on another thread, or out of nesting order");
  leaderScope.store(static_cast<const std::atomic<uintptr_t>*>(previous_),
                    std::memory_order_release);
}

}  // namespace pipefb::memory
