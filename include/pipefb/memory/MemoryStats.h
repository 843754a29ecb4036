#pragma once
// A snapshot of one memory domain's accounting (STYLE.md habit 8: a narrow
// allocator interface with a stats struct). Each field is tagged, as in c10's
// DeviceStats, with what kind of number it is:
//   count   - number of allocations / events
//   current - live value now
//   peak    - highest `current` since the domain was created or resetPeak()
//   sum     - monotone total since the domain was created
#include <array>
#include <cstdint>
#include <string>

#include "pipefb/common/MemoryCategory.h"

namespace pipefb::memory {

/// Capacity of a domain that never refuses an allocation.
inline constexpr int64_t kUnlimited = -1;

/// One statistic, like c10::CUDACachingAllocator::Stat.
struct Stat {
  int64_t current = 0;    // current
  int64_t peak = 0;       // peak
  int64_t allocated = 0;  // sum: everything ever added
  int64_t freed = 0;      // sum: everything ever removed
};

struct MemoryStats {
  std::string domain;
  int64_t capacity = kUnlimited;  // bytes, or kUnlimited

  Stat bytes;                                             // bytes, all categories
  std::array<Stat, kNumMemoryCategories> category_bytes;  // bytes, per category (own peaks)
  /// Per-category bytes at the instant `bytes.peak` was reached (current values,
  /// summing to bytes.peak): the breakdown a peak-memory report shows.
  CategoryBytes bytes_at_peak{};
  Stat allocations;             // count: live allocations (current/peak), made (allocated), freed
  int64_t num_ooms = 0;         // count: refused allocations
  int64_t largest_refused = 0;  // peak: largest refused request, bytes

  const Stat& operator[](MemoryCategory c) const { return category_bytes[index(c)]; }
  /// Current bytes of every category.
  CategoryBytes liveByCategory() const;
};

/// "stash 1.20 GiB, weights 512.00 MiB": non-zero categories, largest first;
/// "nothing" when all are zero.
std::string formatBreakdown(const CategoryBytes& bytes);

/// One line for logs: "cpu:0: 1.20 GiB live (peak 1.50 GiB) of 2.00 GiB; stash 1.00 GiB, ...".
std::string toString(const MemoryStats& stats);

}  // namespace pipefb::memory
