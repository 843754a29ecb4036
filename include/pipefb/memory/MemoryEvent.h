#pragma once
// The event stream of the memory domains (ALLOC / FREE / OOM), from which the
// reports draw memory timelines. Recording is opt-in: while it is off, charging
// costs one relaxed atomic load more than without the stream. While it is on,
// events go into a bounded ring (oldest dropped first, and counted).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "pipefb/common/MemoryCategory.h"

namespace pipefb::memory {

enum class MemoryEventKind : unsigned char { Alloc, Free, Oom };

/// "ALLOC", "FREE", "OOM".
const char* toString(MemoryEventKind kind);

struct MemoryEvent {
  int64_t time_ns = 0;     // steady clock, since processEpochNs() (see nowNs())
  int64_t bytes = 0;       // allocated, freed, or refused
  int64_t live_after = 0;  // the domain's live bytes (all categories) after the event
  int domain = -1;         // MemoryDomain::id(); domainById(domain).name()
  MemoryEventKind kind = MemoryEventKind::Alloc;
  MemoryCategory category = MemoryCategory::WorkingSet;
};

inline constexpr std::size_t kDefaultEventCapacity = std::size_t{1} << 18;  // ~8 MiB of events

/// Nanoseconds on the steady clock since a fixed point early in the process
/// (the first use of this library). The runtime's trace uses the same clock.
int64_t nowNs();

/// Starts (on=true) or stops recording. Starting with a different capacity
/// discards the recorded events; starting again with the same one keeps them.
void setRecording(bool on, std::size_t capacity = kDefaultEventCapacity);
bool isRecording();

/// The recorded events, oldest first, and forgets them. Per domain, events are in
/// the order the domain's accounting saw them (so live_after is consistent).
std::vector<MemoryEvent> drainEvents();
/// How many events were dropped because the ring was full, since the last drain.
int64_t droppedEvents();

namespace detail {
/// Appends one event if recording. Called by MemoryDomain with its lock held.
void recordEvent(const MemoryEvent& event);
bool recordingFast();
}  // namespace detail

}  // namespace pipefb::memory
