#pragma once
// MemoryScope: the RAII guard that says where the calling thread's allocations
// are charged, as (domain, category). Scopes nest and restore the enclosing one.
//
//   MemoryScope device(getOrCreateDomain("cpu:1"), MemoryCategory::WorkingSet);
//   ...
//   { MemoryScope s(MemoryCategory::Stash); keep = layer->forward(x); }  // same domain
//
// A free is always charged where its allocation was, whatever thread frees it
// (the tracking allocator records domain and category with each block).
//
// Note [Intra-op threads]
// LibTorch (the 2.11 wheel is built with OpenMP) runs parts of some ops on the
// intra-op pool's threads. Those threads never see a MemoryScope: OpenMP does not
// carry thread-locals, and ATen's parallel_for does not propagate
// ThreadLocalState (only at::launch does, and it has no slot for ours). Few ops
// allocate inside a parallel region, but some do (and any kernel may), so we
// support two configurations and test both (TrackingAllocatorTest.cpp,
// "IntraOp*"):
//   1. Pipeline device workers call at::set_num_threads(1) at thread start (one
//      intra-op thread per device, as issue 4 asks): ops then run entirely on
//      the scoped worker thread and attribution is exact. (With OpenMP this is
//      per thread for threads that already ran an op, but it also becomes the
//      default of threads that have not: tried with 1.13. Set it on every
//      worker explicitly.)
//   2. A single compute thread that keeps several intra-op threads (the
//      single-device trainer, the plain-LibTorch baseline) installs a
//      ScopeLeader on itself: allocations from threads without a scope of their
//      own are then charged to the leader's *current* scope, read at each
//      allocation. While the leader is inside an op, its intra-op helpers are
//      working for it, so this is exact for one compute thread. It is wrong only
//      if untagged threads allocate for someone else at the same time (a data
//      loader thread, say); give those threads their own MemoryScope.
// Without a scope and without a leader, allocations go to the "unscoped" domain
// as working_set, so nothing is lost.
// Measured (tests, 2 intra-op threads): a conv/linear/layer_norm/embedding
// forward+backward makes no allocation on a pool thread at all; a kernel that
// allocates inside at::parallel_for does, and is covered by the leader.
// Beware: at::parallel_for is an inline template and runs in parallel only in
// code compiled with -fopenmp; pipefb's own code is not, so its parallel_for
// loops run serially on the calling thread.
#include <cstdint>
#include <optional>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/memory/MemoryDomain.h"

namespace pipefb::memory {

/// Where an allocation is charged.
struct ScopeTarget {
  MemoryDomain* domain = nullptr;
  MemoryCategory category = MemoryCategory::WorkingSet;
};

class MemoryScope {
 public:
  MemoryScope(MemoryDomain& domain, MemoryCategory category);
  /// Same domain as the enclosing scope, new category. There must be an
  /// enclosing scope on this thread (a bug otherwise: InternalError).
  explicit MemoryScope(MemoryCategory category);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  uintptr_t previous_;
};

/// The calling thread's own scope; nullopt outside any MemoryScope.
std::optional<ScopeTarget> currentScope();

/// Where an allocation made now on the calling thread is charged: its own scope;
/// else the ScopeLeader's current scope; else (unscoped domain, working_set).
ScopeTarget chargeTarget();

/// See Note [Intra-op threads]. While alive, threads with no MemoryScope charge
/// their allocations to this thread's current scope. Nests (restores the previous
/// leader); must be destroyed on the thread that made it.
class ScopeLeader {
 public:
  ScopeLeader();
  ~ScopeLeader();
  ScopeLeader(const ScopeLeader&) = delete;
  ScopeLeader& operator=(const ScopeLeader&) = delete;

 private:
  const void* previous_;
};

}  // namespace pipefb::memory
