#include "pipefb/memory/MemoryDomain.h"

#include <algorithm>
#include <optional>

#include "pipefb/common/Error.h"
#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/OutOfMemoryError.h"

namespace pipefb::memory {

namespace detail {
void noteOutOfMemory(const OomInfo& info);  // OutOfMemoryError.cpp
}

namespace {
inline void add(Stat& s, int64_t bytes) {
  s.current += bytes;
  s.allocated += bytes;
  if (s.current > s.peak) s.peak = s.current;
}
inline void sub(Stat& s, int64_t bytes) {
  s.current -= bytes;
  s.freed += bytes;
}
}  // namespace

MemoryDomain::MemoryDomain(int id, std::string name, int64_t capacity, std::string oomHint)
    : id_(id), name_(std::move(name)), capacity_(capacity), oomHint_(std::move(oomHint)) {
  PIPEFB_ASSERT(capacity == kUnlimited || capacity >= 0, "bad capacity " << capacity);
}

void MemoryDomain::setCapacity(int64_t bytes) {
  PIPEFB_ASSERT(bytes == kUnlimited || bytes >= 0, "bad capacity " << bytes << " for " << name_);
  capacity_.store(bytes, std::memory_order_relaxed);
}

std::string MemoryDomain::oomHint() const {
  std::lock_guard<std::mutex> lock(mu_);
  return oomHint_;
}

void MemoryDomain::setOomHint(std::string hint) {
  std::lock_guard<std::mutex> lock(mu_);
  oomHint_ = std::move(hint);
}

void MemoryDomain::charge(MemoryCategory category, int64_t bytes) {
  PIPEFB_ASSERT(bytes >= 0, "negative charge " << bytes << " to " << name_);
  std::optional<OomInfo> oom;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t cap = capacity_.load(std::memory_order_relaxed);
    if (cap == kUnlimited || stats_.bytes.current + bytes <= cap) {
      add(stats_.bytes, bytes);
      add(stats_.category_bytes[index(category)], bytes);
      add(stats_.allocations, 1);
      if (stats_.bytes.current == stats_.bytes.peak) {
        // A new (or equal) peak: remember what it is made of.
        for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
          stats_.bytes_at_peak[i] = stats_.category_bytes[i].current;
      }
      if (detail::recordingFast())
        detail::recordEvent(
            {nowNs(), bytes, stats_.bytes.current, id_, MemoryEventKind::Alloc, category});
      return;
    }
    // Refused: nothing is charged. Rare, so the strings may be built under the lock.
    ++stats_.num_ooms;
    stats_.largest_refused = std::max(stats_.largest_refused, bytes);
    if (detail::recordingFast())
      detail::recordEvent(
          {nowNs(), bytes, stats_.bytes.current, id_, MemoryEventKind::Oom, category});
    oom.emplace();
    oom->domain = name_;
    oom->category = category;
    oom->requested = bytes;
    oom->capacity = cap;
    oom->live = stats_.bytes.current;
    oom->live_by_category = stats_.liveByCategory();
    oom->hint = oomHint_;
  }
  detail::noteOutOfMemory(*oom);
  throw OutOfMemoryError(std::move(*oom));
}

void MemoryDomain::release(MemoryCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  sub(stats_.bytes, bytes);
  sub(stats_.category_bytes[index(category)], bytes);
  sub(stats_.allocations, 1);
  if (detail::recordingFast())
    detail::recordEvent(
        {nowNs(), bytes, stats_.bytes.current, id_, MemoryEventKind::Free, category});
}

MemoryStats MemoryDomain::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryStats out = stats_;
  out.domain = name_;
  out.capacity = capacity();
  return out;
}

int64_t MemoryDomain::liveBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.bytes.current;
}

int64_t MemoryDomain::liveBytes(MemoryCategory category) const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.category_bytes[index(category)].current;
}

int64_t MemoryDomain::peakBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.bytes.peak;
}

void MemoryDomain::resetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes.peak = stats_.bytes.current;
  for (Stat& s : stats_.category_bytes) s.peak = s.current;
  stats_.allocations.peak = stats_.allocations.current;
  stats_.bytes_at_peak = stats_.liveByCategory();
  stats_.largest_refused = 0;
}

void MemoryDomain::resetStats() {
  std::lock_guard<std::mutex> lock(mu_);
  auto reset = [](Stat& s) { s = Stat{s.current, s.current, 0, 0}; };
  reset(stats_.bytes);
  for (Stat& s : stats_.category_bytes) reset(s);
  reset(stats_.allocations);
  stats_.bytes_at_peak = stats_.liveByCategory();
  stats_.num_ooms = 0;
  stats_.largest_refused = 0;
}

}  // namespace pipefb::memory
