#include "pipefb/offload/TransferManager.h"

#include <torch/torch.h>

#include <algorithm>

#include "pipefb/common/Error.h"
#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/MemoryScope.h"

namespace pipefb::offload {

struct TransferManager::Entry {
  bool offloadIssued = false, offloaded = false;
  bool prefetchIssued = false, ready = false;
  bool dropped = false;
  // Note [Held offload copies]: the device tensors of a held offload, from the end of its
  // copy until its release point (holding: not released yet).
  bool holding = false;
  std::vector<at::Tensor> heldDevice;
  std::vector<at::Tensor> host;    // after the offload, until the prefetch copied it
  std::vector<at::Tensor> device;  // after the prefetch
  // Note [Planned prefetch destinations]: where the prefetch copies to, allocated when
  // it was issued (or at the device's next acquire), until the copy takes them.
  int offloadDevice = -1, prefetchDevice = -1, epoch = 0;
  memory::MemoryDomain* target = nullptr;
  MemoryCategory category = MemoryCategory::Stash;
  bool copyStarted = false;
  std::vector<at::Tensor> destination;
  // Note [Prefetches behind their stage's offloads]: this device's offloads of the same
  // stage queued ahead of this prefetch and not yet copied when it was issued.
  // (Weak: an entry may wait behind its own offload, and an entry that is gone is done.)
  std::vector<std::weak_ptr<Entry>> behind;
  std::shared_ptr<CopyFence> copied;  // after the prefetch's copies (Note [Copy backends])
  std::exception_ptr error;
};

TransferManager::TransferManager(memory::MemoryDomain& hostDomain, TransferOptions options)
    : backend_(options.backend ? options.backend : cpuCopyBackend()),
      pool_(hostDomain, options.lockHostPages, backend_),
      counters_(std::max(1, options.numDevices)),
      offloadsInFlight_(std::max(1, options.numDevices), 0),
      held_(std::max(1, options.numDevices)),
      maxOffloadsInFlight_(options.maxOffloadsInFlight) {
  for (int d = 0; d < std::max(1, options.numDevices); ++d) {
    engines_.push_back(backend_->makeEngine(d, "copy"));
    inPlaceEngines_.push_back(backend_->makeEngine(d, "in-place"));
  }
}

TransferManager::~TransferManager() {
  close();
  for (auto& e : engines_) e->shutdown();  // before pool_ goes: queued jobs use it
  for (auto& e : inPlaceEngines_) e->shutdown();
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  held_.clear();
}

void TransferManager::release(Entry& e, std::vector<at::Tensor>& out) {
  if (!e.holding) return;
  e.holding = false;
  for (auto& t : e.heldDevice) out.push_back(std::move(t));
  e.heldDevice.clear();
  for (auto& q : held_) {
    auto it = std::find_if(q.begin(), q.end(), [&](const auto& p) { return p.get() == &e; });
    if (it != q.end()) q.erase(it);
  }
}

void TransferManager::offload(int device, TransferKey key, std::vector<at::Tensor> tensors,
                              MemoryCategory hostCategory, bool hold) {
  PIPEFB_ASSERT(device >= 0 && device < numDevices(), "offload on unknown device " << device);
  std::shared_ptr<Entry> e;
  std::vector<at::Tensor> released;  // freed outside the lock, after it
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (maxOffloadsInFlight_ > 0 && offloadsInFlight_[device] >= maxOffloadsInFlight_) {
      const int64_t start = memory::nowNs();
      cv_.wait(lock, [&] { return closed_ || offloadsInFlight_[device] < maxOffloadsInFlight_; });
      counters_[device].stallSeconds += (memory::nowNs() - start) * 1e-9;
      if (closed_) throw TransferCancelled();
    }
    ++offloadsInFlight_[device];
    auto& slot = entries_[key];
    if (!slot) slot = std::make_shared<Entry>();
    e = slot;
    PIPEFB_ASSERT(!e->offloadIssued, "stash (" << key.kind << "," << key.stage << "," << key.index
                                               << ") offloaded twice");
    e->offloadIssued = true;
    e->offloadDevice = device;
    ++queued_;
    // Note [Planned prefetch destinations]: the stage's layout, for prefetches to come.
    auto& layout = layouts_[{key.kind, key.stage}];
    if (layout.empty()) {
      for (const auto& t : tensors)
        layout.push_back(t.defined() ? at::empty(t.sizes(), t.options().device(at::kMeta))
                                     : at::Tensor());
    }
    // Note [Held offload copies]: this OFF is the release point of the held copies more
    // than maxOffloadsInFlight - 1 OFFs back (their copies are done: the wait above).
    auto& q = held_[device];
    const size_t keep = maxOffloadsInFlight_ > 0 ? maxOffloadsInFlight_ - 1 : 0;
    while (q.size() > keep) release(*q.front(), released);
    if (hold) {
      e->holding = true;
      q.push_back(e);
    }
  }
  released.clear();
  auto job = std::make_shared<std::vector<at::Tensor>>(std::move(tensors));
  // Compute before offload: the copy reads what this thread's stream queued so far.
  std::shared_ptr<CopyFence> produced = backend_->fence();
  engines_[device]->submit([this, device, key, e, job, hostCategory, produced, hold] {
    const int64_t start = memory::nowNs();
    std::vector<at::Tensor> host;
    int64_t bytes = 0;
    std::exception_ptr error;
    try {
      if (produced) produced->block();
      for (auto& t : *job) {
        if (!t.defined()) {
          host.emplace_back();
          continue;
        }
        at::Tensor h = pool_.allocate(t, hostCategory);
        h.copy_(t, backend_->asyncCopies());
        backend_->finish();  // before t goes (Note [Release as copied])
        bytes += static_cast<int64_t>(t.numel()) * t.element_size();
        host.push_back(std::move(h));
        if (!hold) t = at::Tensor();  // Note [Release as copied]
      }
    } catch (...) {
      error = std::current_exception();
      host.clear();
    }
    const int64_t end = memory::nowNs();
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Note [Held offload copies]: kept until the release point unless it came already.
      if (hold && e->holding && !error) e->heldDevice = std::move(*job);
    }
    // Note [Planned prefetch destinations]: what no hold keeps (its hold ended while it
    // copied, e.g. the same key's PRE right after its OFF) goes before `offloaded` lets this
    // key's prefetch bind beside it, not after: freed after the lock below, the device held
    // the stash and its prefetch's destination at once whenever this thread was preempted
    // there while the device's B acquired (gpt2-tiny pipedream-offload S=2 M=4: B0.6 beside
    // stash 6 and stash 7 twice, out of memory about one run in ten under load).
    job->clear();  // not held, or what the loop did not reach (an error)
    {
      std::lock_guard<std::mutex> lock(mu_);
      --offloadsInFlight_[device];
      if (!e->dropped) e->host = std::move(host);
      e->error = error;
      e->offloaded = true;
      auto& c = counters_[device];
      c.bytesD2H += bytes;
      ++c.offloads;
      c.copySeconds += (end - start) * 1e-9;
      c.intervals.push_back({start, end, /*toHost=*/true, bytes, key});
    }
    host.clear();  // a dropped stash: freed before synchronize() can return
    finishJob();
  });
}

void TransferManager::prefetch(int device, TransferKey key, memory::MemoryDomain& target,
                               MemoryCategory category, int epoch, bool bindNow) {
  PIPEFB_ASSERT(device >= 0 && device < numDevices(), "prefetch on unknown device " << device);
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = entries_[key];
    if (!slot) slot = std::make_shared<Entry>();
    e = slot;
    if (e->prefetchIssued) return;
    e->prefetchIssued = true;
    e->prefetchDevice = device;
    e->epoch = epoch;
    e->target = &target;
    e->category = category;
    // Note [Prefetches behind their stage's offloads]
    for (const auto& [k, o] : entries_)
      if (k.kind == key.kind && k.stage == key.stage && o->offloadDevice == device &&
          o->offloadIssued && !o->offloaded)
        e->behind.push_back(o);
    ++queued_;
  }
  memory::MemoryDomain* t = &target;
  engines_[device]->submit(
      [this, device, key, e, t, category] { runPrefetch(device, key, e, t, category); });
  // Note [Planned prefetch destinations]: after the submit, so that an out-of-memory
  // error here leaves no job uncounted (a copy that started first allocates them itself).
  if (!bindNow) return;
  std::lock_guard<std::mutex> lock(mu_);
  bindDestinations(device, epoch);
}

void TransferManager::runPrefetch(int device, TransferKey key, std::shared_ptr<Entry> e,
                                  memory::MemoryDomain* target, MemoryCategory category) {
  std::vector<at::Tensor> host, planned;
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // The offload may not have been issued yet (another device's OFF): wait for it here,
    // on the copy engine.
    cv_.wait(lock, [&] { return e->offloaded || e->dropped || closed_; });
    if (!e->offloaded || e->dropped) {
      e->error = std::make_exception_ptr(TransferCancelled());
      e->ready = true;
      --queued_;
      cv_.notify_all();
      return;
    }
    host = std::move(e->host);
    error = e->error;
    // Note [Prefetches behind their stage's offloads]: allocated whole before the lock
    // goes, so that an acquire that binds after its wait finds it bound or started.
    if (!error) {
      try {
        bindDestination(key, *e);
      } catch (...) {
        error = std::current_exception();
      }
    }
    e->copyStarted = true;
    planned = std::move(e->destination);
  }
  const int64_t start = memory::nowNs();
  std::vector<at::Tensor> dev;
  int64_t bytes = 0;
  if (!error) {
    try {
      memory::MemoryScope scope(*target, category);
      for (size_t i = 0; i < host.size(); ++i) {
        const at::Tensor& h = host[i];
        if (!h.defined()) {
          dev.emplace_back();
          continue;
        }
        // Note [Planned prefetch destinations]: into the planned tensors when they fit.
        const bool fits = i < planned.size() && planned[i].defined() &&
                          planned[i].sizes() == h.sizes() && planned[i].dtype() == h.dtype();
        at::Tensor d = fits ? std::move(planned[i]) : backend_->emptyLike(h, *target);
        d.copy_(h, backend_->asyncCopies());
        bytes += static_cast<int64_t>(h.numel()) * h.element_size();
        dev.push_back(std::move(d));
      }
      backend_->finish();  // before the host copies go back to the pool
    } catch (...) {
      error = std::current_exception();
      dev.clear();
    }
  }
  host.clear();  // back to the pool
  planned.clear();
  const int64_t end = memory::nowNs();
  std::shared_ptr<CopyFence> copied = error ? nullptr : backend_->fence();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!e->dropped) e->device = std::move(dev);
    e->copied = std::move(copied);
    e->error = error;
    e->ready = true;
    auto& c = counters_[device];
    c.bytesH2D += bytes;
    ++c.prefetches;
    c.copySeconds += (end - start) * 1e-9;
    c.intervals.push_back({start, end, /*toHost=*/false, bytes, key});
  }
  dev.clear();  // a dropped stash: freed before synchronize() can return
  finishJob();
}

std::vector<at::Tensor> TransferManager::acquire(int device, TransferKey key,
                                                 memory::MemoryDomain& target,
                                                 MemoryCategory category, int epoch) {
  prefetch(device, key, target, category, epoch, /*bindNow=*/false);
  std::shared_ptr<Entry> e;
  const int64_t start = memory::nowNs();
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  PIPEFB_ASSERT(it != entries_.end(),
                "stash (" << key.kind << "," << key.stage << "," << key.index << ") is not known");
  e = it->second;
  bindDestinations(device, epoch);  // Note [Planned prefetch destinations]
  cv_.wait(lock, [&] { return e->ready || closed_; });
  counters_[device].stallSeconds += (memory::nowNs() - start) * 1e-9;
  if (!e->ready) throw TransferCancelled();
  entries_.erase(key);
  // Note [Prefetches behind their stage's offloads]: those the wait let bind.
  bindDestinations(device, epoch);
  // Note [Held offload copies]: a held device copy stays until the device's next OFF,
  // whenever B takes the stash (B's device and time are not the forward device's).
  if (e->error) std::rethrow_exception(e->error);
  lock.unlock();
  // Prefetch before compute: this thread's stream waits for the copies.
  backend_->handOver(e->device, e->copied.get());
  return std::move(e->device);
}

void TransferManager::drop(TransferKey key) {
  std::shared_ptr<Entry> e;
  std::vector<at::Tensor> released;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    e = it->second;
    e->dropped = true;
    entries_.erase(it);
    release(*e, released);
  }
  released.clear();
  cv_.notify_all();
  e->host.clear();  // NOLINT: nobody else reads a dropped entry's tensors
  e->device.clear();
  e->destination.clear();
}

void TransferManager::releaseHold(TransferKey key) {
  std::vector<at::Tensor> released;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) release(*it->second, released);
}

void TransferManager::bindDestinations(int device, int epoch) {
  for (auto& [key, e] : entries_) {
    if (e->prefetchDevice != device || e->epoch > epoch || e->copyStarted || e->ready || e->dropped)
      continue;
    bindDestination(key, *e);
  }
}

void TransferManager::bindDestination(TransferKey key, Entry& e) {
  if (!e.destination.empty()) return;
  // The device's own offload of this key still holds its device copy: the prefetch
  // follows it on the same copy engine and allocates once it is done.
  if (e.offloadDevice == e.prefetchDevice && !e.offloaded) return;
  // Note [Prefetches behind their stage's offloads]
  for (const auto& w : e.behind)
    if (auto o = w.lock(); o && !o->offloaded) return;
  e.behind.clear();
  auto layout = layouts_.find({key.kind, key.stage});
  if (layout == layouts_.end()) return;
  memory::MemoryScope scope(*e.target, e.category);
  for (const auto& like : layout->second)
    e.destination.push_back(like.defined() ? backend_->emptyLike(like, *e.target) : at::Tensor());
}

std::shared_future<void> TransferManager::copyInPlace(int device, TransferKey key,
                                                      std::vector<at::Tensor> dst,
                                                      std::vector<at::Tensor> src, bool toHost) {
  PIPEFB_ASSERT(device >= 0 && device < numDevices(), "copy on unknown device " << device);
  PIPEFB_ASSERT(dst.size() == src.size(),
                "copyInPlace: " << dst.size() << " targets for " << src.size() << " sources");
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = done->get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++queued_;
  }
  auto job = std::make_shared<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>>(
      std::move(dst), std::move(src));
  std::shared_ptr<CopyFence> produced = backend_->fence();
  inPlaceEngines_[device]->submit([this, device, key, toHost, done, job, produced] {
    const int64_t start = memory::nowNs();
    int64_t bytes = 0;
    std::exception_ptr error;
    try {
      torch::NoGradGuard noGrad;
      if (produced) produced->block();
      for (size_t i = 0; i < job->first.size(); ++i) {
        at::Tensor& d = job->first[i];
        at::Tensor& s = job->second[i];
        if (!d.defined() || !s.defined()) continue;
        d.copy_(s, backend_->asyncCopies());
        backend_->finish();
        bytes += static_cast<int64_t>(s.numel()) * s.element_size();
        s = at::Tensor();
      }
    } catch (...) {
      error = std::current_exception();
    }
    job->first.clear();
    job->second.clear();
    const int64_t end = memory::nowNs();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& c = counters_[device];
      (toHost ? c.bytesD2H : c.bytesH2D) += bytes;
      c.copySeconds += (end - start) * 1e-9;
      c.intervals.push_back({start, end, toHost, bytes, key});
    }
    if (error)
      done->set_exception(error);
    else
      done->set_value();
    finishJob();
  });
  return future;
}

void TransferManager::wait(int device, const std::shared_future<void>& copy) {
  const int64_t start = memory::nowNs();
  copy.wait();
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.at(device).stallSeconds += (memory::nowNs() - start) * 1e-9;
  }
  copy.get();
}

void TransferManager::finishJob() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --queued_;
  }
  cv_.notify_all();
}

void TransferManager::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void TransferManager::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queued_ == 0; });
}

TransferCounters TransferManager::counters(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_.at(device);
}

HostPoolStats TransferManager::hostPoolStats() const { return pool_.stats(); }
HostMemoryKind TransferManager::hostMemoryKind() const { return pool_.kind(); }
int TransferManager::numDevices() const { return static_cast<int>(engines_.size()); }

void TransferManager::runOnCopyEngine(int device, std::function<void()> job) {
  PIPEFB_ASSERT(device >= 0 && device < numDevices(), "copy engine of unknown device " << device);
  engines_[device]->submit(job);
  inPlaceEngines_[device]->submit(std::move(job));
}

size_t TransferManager::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

double TransferManager::overlapSeconds(const std::vector<CopyInterval>& copies,
                                       const std::vector<CopyInterval>& compute) {
  auto sorted = [](std::vector<CopyInterval> v) {
    std::sort(v.begin(), v.end(),
              [](const CopyInterval& a, const CopyInterval& b) { return a.startNs < b.startNs; });
    return v;
  };
  const auto a = sorted(copies), b = sorted(compute);
  int64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].startNs, b[j].startNs);
    const int64_t hi = std::min(a[i].endNs, b[j].endNs);
    if (hi > lo) total += hi - lo;
    if (a[i].endNs < b[j].endNs)
      ++i;
    else
      ++j;
  }
  return total * 1e-9;
}

}  // namespace pipefb::offload
