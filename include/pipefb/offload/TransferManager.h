#pragma once
// The data-transfer manager (DESIGN.md, "offload/"): a host pool plus one copy engine
// per device.
//
//   offload(d, key, tensors)   device -> host on d's copy engine; each device tensor
//                              is released (its last reference dropped) only once its
//                              own copy has finished (Note [Release as copied]).
//   prefetch(d, key, domain)   host -> device on d's copy engine, into `domain`
//                              (the consuming device). It may be issued before the
//                              offload of `key` (another device's OFF that has not
//                              run yet): the copy then waits for it on the copy
//                              engine, never on the compute thread.
//   acquire(d, key, domain)    waits for the prefetch (issuing it if there was none)
//                              and returns the device tensors; the wait is d's stall.
//
// Note [Resident offloaded stashes]
// The device copy of an offloaded stash lives until its D2H copy ends, so a device
// holds one more stash than the schedule contract while a copy is in flight; the
// backward device holds at most lookahead + 1 prefetched ones (issued `lookahead`
// compute actions ahead, plus the one B consumes). This is what the planner's cost
// model assumes (Note [Planner cost model], CostModel.h).
//
// Note [Planned prefetch destinations]
// A prefetch's device tensors are allocated on the issuing thread when the plan issues
// it (PRE), not when the copy engine gets to it: from then on the device holds them, as
// the plan charges, whatever the copies' timing. Their sizes are the stage's layout,
// learnt at its first offload (every microbatch's stash, every weight version of a stage
// has the same one). A PRE issued before any offload of its stage (another device's OFF
// that has not run yet) gets them at the device's next acquire, at the latest the B that
// needs the first of them: B(s,m) acquires after OFF(s,m) was issued. So every B runs
// beside exactly the prefetches issued before it. Not while the same device's offload of
// that key is still copying (a same-device stage's PRE right after its OFF): that device
// copy is the stash itself, and the prefetch, queued behind the offload on the same copy
// engine, allocates when it runs (bound early, 1f1b-offload M=1 held the stash twice,
// +24% above the plan). Allocated by the copy engine instead,
// a split stage's backward device held 1 of the lookahead + 1 charged stashes at B or 2,
// depending on whether the next stash's copy landed before B peaked (PlanRunsTest:
// pipefb-async offload/keep 13% to 28% below the plan on backward devices).
//
// Note [Prefetches behind their stage's offloads]
// Nor while an offload of the same stage that the device issued before the prefetch is
// still copying: the prefetch is queued behind it on the same copy engine, so it cannot
// copy earlier, and bound early it would sit beside that offload's device copy. It is bound
// at the device's next bind once those copies are done, by the acquire after its wait (the
// wait for a later-queued copy is a wait for them), or by the copy engine when it starts it
// (whole, under the lock, so that an acquire finds it bound or not started). The stage's
// forward phase then ends as planned: gpt2-tiny gpipe-offload S=3 M=4 (PlanRunsTest seed 0
// instance 29) issues F0.7 OFF0.7 PRE0.4 SA0.7 PRE0.5, and bound when issued, PRE0.5 met
// OFF0.7 still copying on a loaded machine (3 stashes where Note [Prefetches after the
// forward phase] in schedules/Lowering.h charges 2): out of memory about one run in four.
// The simulator binds so too (Note [Prefetch destinations in the simulator]).
//
// Note [Release as copied]
// An offload job copies its tensors one after the other and drops each device tensor as
// soon as its own copy is done, not all of them at the end of the job: the device's
// stash shrinks while the copy runs. The copy usually overlaps the device's next F,
// whose stash grows meanwhile; releasing as copied lowers that overlap's peak (measured
// in experiments/offload_memory.sh; before/after in experiments/README.md). A tensor
// that shares its storage with a later one is freed with the last of them.
//
// Note [Held offload copies]
// An offload issued with `hold` keeps its device tensors after its copy is done, until
// its release point: the device's OFF maxOffloadsInFlight offloads later (by then its
// copy is done: that OFF waited for it), or a drop of its key. Not B's acquire: B runs
// on another device, and when it takes the stash is timing. A split stage's forward
// device holds an OFF when the same stage offloads again on it before the flush (any
// later OFF of that stage for an asynchronous schedule; Note [Held offloads] in
// schedules/HeldOffloads.h, which the simulator reads too), so it holds exactly what the memory
// contract charges it (Note [Offloads in flight], planner/CostModel.h): the stash F is building
// plus min(n - 1, kOffloadsInFlight) earlier ones, whatever the copies' timing. Released as copied
// instead, a forward device peaked at about one stash whenever the copy engine emptied a stash
// before the next F filled one (PlanRunsTest, seed 0: gpt2-tiny and resnet50/8 pipefb-sync/async
// keep and offload, forward devices 12% to 48% below the plan), and at two when it did not. The
// plan is the program: what a device holds does not depend on timing. It costs only memory the plan
// reserved anyway. Same-device stages, whose prefetches share the copy engine with their offloads,
// release as copied.
//
// Counters per device: bytes each way, copy time, copy intervals (for overlap with
// compute), stall time. All members are thread-safe.
//
// What differs between virtual devices and GPUs (engines, streams and their events, where
// tensors are made, how the host pool is pinned) is the manager's copy backend (Note
// [Copy backends], CopyBackend.h); TransferOptions::backend picks it.
#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/memory/MemoryDomain.h"
#include "pipefb/offload/CopyBackend.h"
#include "pipefb/offload/CopyEngine.h"
#include "pipefb/offload/HostPool.h"

namespace pipefb::offload {

/// What is moved: (kind, stage, index), e.g. (stash, 2, microbatch 5).
struct TransferKey {
  int kind = 0;  // caller-defined (the runtime: 0 stash, 1 weight version)
  int stage = 0;
  int index = 0;
  bool operator<(const TransferKey& o) const {
    return std::tie(kind, stage, index) < std::tie(o.kind, o.stage, o.index);
  }
};

/// Thrown by waits that close() interrupted.
struct TransferCancelled : std::runtime_error {
  TransferCancelled() : std::runtime_error("transfer cancelled: the manager was closed") {}
};

/// One copy job of a copy engine (also used for compute intervals, where only the times
/// are set). The trace draws each copy engine's jobs as a track of their own
/// (Note [Chrome trace], pipefb/report/ChromeTrace.h).
struct CopyInterval {
  int64_t startNs = 0, endNs = 0;  // memory::nowNs() clock
  bool toHost = false;             // true: an offload (D2H), false: a prefetch (H2D)
  int64_t bytes = 0;               // bytes copied by this job
  TransferKey key{};               // what was copied
};

/// Per device. Sums unless noted.
struct TransferCounters {
  int64_t bytesD2H = 0;
  int64_t bytesH2D = 0;
  int64_t offloads = 0;                 // count
  int64_t prefetches = 0;               // count
  double copySeconds = 0;               // time the copy engine spent copying
  double stallSeconds = 0;              // time acquire() waited
  std::vector<CopyInterval> intervals;  // each copy job, in order
};

struct TransferOptions {
  int numDevices = 1;
  bool lockHostPages = true;
  /// Backpressure: offload() waits (counted as stall) while this many D2H copies of the
  /// device are unfinished; 0 = unlimited. With 1, a device holds at most one stash
  /// being copied out besides the one it just made (Note [Resident offloaded stashes]).
  int maxOffloadsInFlight = 0;
  /// Note [Copy backends]; null: cpuCopyBackend() (virtual devices).
  std::shared_ptr<CopyBackend> backend = nullptr;
};

class TransferManager {
 public:
  /// `hostDomain`: the pool's accounting domain (its capacity is the pool's).
  TransferManager(memory::MemoryDomain& hostDomain, TransferOptions options);
  ~TransferManager();
  TransferManager(const TransferManager&) = delete;
  TransferManager& operator=(const TransferManager&) = delete;

  /// Takes the tensors (undefined ones stay undefined). A key may be offloaded again
  /// only after it was acquired or dropped.
  /// `hold`: keep the device tensors until the offload's release point instead of
  /// releasing each as copied (Note [Held offload copies]).
  void offload(int device, TransferKey key, std::vector<at::Tensor> tensors,
               MemoryCategory hostCategory = MemoryCategory::Stash, bool hold = false);
  /// Idempotent per key until acquire(). Note [Planned prefetch destinations]: its device
  /// tensors are allocated now (bindNow) or by the first acquire() on `device` of an
  /// epoch >= `epoch`, whichever comes first once the stage's layout is known.
  void prefetch(int device, TransferKey key, memory::MemoryDomain& target,
                MemoryCategory category = MemoryCategory::Stash, int epoch = 0,
                bool bindNow = true);
  /// Blocks until the tensors are in `target`; rethrows the copy's error (e.g. an
  /// OutOfMemoryError of the host pool or the device). Forgets the key. First allocates
  /// the destinations of `device`'s prefetches up to `epoch`.
  std::vector<at::Tensor> acquire(int device, TransferKey key, memory::MemoryDomain& target,
                                  MemoryCategory category = MemoryCategory::Stash,
                                  int epoch = std::numeric_limits<int>::max());
  /// Forgets the key (its copies finish and are freed).
  void drop(TransferKey key);
  /// Ends the hold of `key`'s offload (Note [Held offload copies]) before its release point:
  /// its device tensors go now if its copy is done, else when it is. No-op for a key that
  /// is not held.
  void releaseHold(TransferKey key);
  /// Copies src[i] into dst[i] (same sizes, both already allocated: no buffer is made on
  /// either side) on `device`'s second copy engine (a second stream on a GPU), after the
  /// copyInPlace() jobs queued before it: the first engine may be blocked by a prefetch
  /// that waits for an offload, which itself may wait for this copy. Counted as
  /// one D2H (toHost) or H2D job under `key`. The optimizer offload uses it (Note
  /// [Optimizer offload] in PipelineEngine.cpp). The returned future is ready when the
  /// copy is done; wait for it with wait().
  std::shared_future<void> copyInPlace(int device, TransferKey key, std::vector<at::Tensor> dst,
                                       std::vector<at::Tensor> src, bool toHost);
  /// Waits for a copyInPlace() job; the wait is `device`'s stall. Rethrows the copy's error.
  void wait(int device, const std::shared_future<void>& copy);
  /// Wakes every wait with TransferCancelled; queued copies still run. Idempotent.
  void close();
  /// Waits until every queued copy ran (tests, summaries).
  void synchronize();

  TransferCounters counters(int device) const;
  HostPoolStats hostPoolStats() const;
  HostMemoryKind hostMemoryKind() const;
  int numDevices() const;
  /// Runs `job` on each of `device`'s copy-engine threads (the stash engine and the
  /// in-place engine of copyInPlace), after the copies queued before it there (the runtime
  /// binds those threads to its device's core with it; Note [Device binding]).
  /// `job` must not throw.
  void runOnCopyEngine(int device, std::function<void()> job);
  /// Keys offloaded or prefetched and not yet acquired or dropped.
  size_t pending() const;

  /// Length of the intersection of two sorted interval lists, in seconds.
  static double overlapSeconds(const std::vector<CopyInterval>& copies,
                               const std::vector<CopyInterval>& compute);

 private:
  struct Entry;
  void runPrefetch(int device, TransferKey key, std::shared_ptr<Entry> e,
                   memory::MemoryDomain* target, MemoryCategory category);
  /// Note [Planned prefetch destinations]: allocates the destinations of `device`'s
  /// prefetches of epochs up to `epoch` whose stage layout is known and that have none
  /// yet; under mu_, on the thread that issues or acquires them.
  void bindDestinations(int device, int epoch);
  /// One prefetch's, unless it waits (Note [Prefetches behind their stage's offloads]).
  void bindDestination(TransferKey key, Entry& e);
  // The layout of each (kind, stage): meta tensors of its offload's sizes and dtypes
  // (undefined where the offload had an undefined tensor).
  std::map<std::pair<int, int>, std::vector<at::Tensor>> layouts_;
  void finishJob();

  std::shared_ptr<CopyBackend> backend_;
  HostPool pool_;
  std::vector<std::unique_ptr<CopyEngine>> engines_;
  std::vector<std::unique_ptr<CopyEngine>> inPlaceEngines_;  // copyInPlace()
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<TransferKey, std::shared_ptr<Entry>> entries_;
  std::vector<TransferCounters> counters_;
  int64_t queued_ = 0;  // jobs submitted and not finished
  std::vector<int> offloadsInFlight_;
  // Note [Held offload copies]: per device, the held offloads in OFF order.
  std::vector<std::deque<std::shared_ptr<Entry>>> held_;
  /// Moves `e`'s held device tensors (if any) to `out` and forgets the hold; under mu_.
  void release(Entry& e, std::vector<at::Tensor>& out);
  int maxOffloadsInFlight_ = 0;
  bool closed_ = false;
};

}  // namespace pipefb::offload
