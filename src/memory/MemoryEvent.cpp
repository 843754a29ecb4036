#include "pipefb/memory/MemoryEvent.h"

#include <atomic>
#include <chrono>
#include <mutex>

namespace pipefb::memory {

const char* toString(MemoryEventKind kind) {
  switch (kind) {
    case MemoryEventKind::Alloc:
      return "ALLOC";
    case MemoryEventKind::Free:
      return "FREE";
    case MemoryEventKind::Oom:
      return "OOM";
  }
  return "?";
}

namespace {

const std::chrono::steady_clock::time_point& epoch() {
  static const auto t0 = std::chrono::steady_clock::now();
  return t0;
}
// Fix the epoch at load time rather than at the first event.
[[maybe_unused]] const auto& epochInit = epoch();

std::atomic<bool> recording{false};

// A bounded ring of events. Its storage comes from std::allocator, not from
// LibTorch's, so the event log never shows up in its own accounting.
struct Ring {
  std::mutex mu;
  std::vector<MemoryEvent> buf;  // capacity slots
  std::size_t head = 0;          // next write
  std::size_t size = 0;
  int64_t dropped = 0;
};

Ring& ring() {
  static Ring* r = new Ring();  // leaked: frees may be recorded during static destruction
  return *r;
}

}  // namespace

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              epoch())
      .count();
}

void setRecording(bool on, std::size_t capacity) {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mu);
  if (on) {
    if (capacity == 0) capacity = 1;
    if (r.buf.size() != capacity) {
      r.buf.assign(capacity, MemoryEvent{});
      r.head = r.size = 0;
      r.dropped = 0;
    }
  }
  recording.store(on, std::memory_order_release);
}

bool isRecording() { return recording.load(std::memory_order_acquire); }

std::vector<MemoryEvent> drainEvents() {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<MemoryEvent> out;
  out.reserve(r.size);
  const std::size_t cap = r.buf.size();
  for (std::size_t i = 0; i < r.size; ++i) out.push_back(r.buf[(r.head + cap - r.size + i) % cap]);
  r.size = 0;
  r.dropped = 0;
  return out;
}

int64_t droppedEvents() {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.dropped;
}

namespace detail {

bool recordingFast() { return recording.load(std::memory_order_relaxed); }

void recordEvent(const MemoryEvent& event) {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mu);
  const std::size_t cap = r.buf.size();
  if (cap == 0) return;
  r.buf[r.head] = event;
  r.head = (r.head + 1) % cap;
  if (r.size < cap)
    ++r.size;
  else
    ++r.dropped;
}

}  // namespace detail
}  // namespace pipefb::memory
