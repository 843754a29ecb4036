#pragma once
// Note [Out of memory]
// A memory domain refuses an allocation that would take its live bytes over its
// capacity, before any memory is taken, as a GPU would. The refusal is a
// pipefb::OutOfMemoryError thrown from inside LibTorch's CPU allocator, i.e. from
// inside whatever op allocated. In libtorch 1.13 the exception reaches the caller
// with its type intact through plain ops, intra-op parallel regions (OpenMP
// rethrows the exception_ptr) and autograd's backward() (the engine stores and
// rethrows the exception_ptr); tests/memory/TrackingAllocatorTest.cpp checks each
// path. Anything that does wrap it into a c10::Error (e.g. a TorchScript
// interpreter) keeps the message; pipefb::memory::findOutOfMemory() recognises
// both forms, and lastOutOfMemory() keeps the details per thread as a last resort.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/memory/MemoryStats.h"

namespace pipefb {

/// Everything known about one refused allocation.
struct OomInfo {
  std::string domain;                                    // "cpu:1", "host", ...
  MemoryCategory category = MemoryCategory::WorkingSet;  // the scope's category
  int64_t requested = 0;                                 // bytes asked for
  int64_t capacity = 0;                                  // bytes
  int64_t live = 0;  // bytes in use at the time (all categories)
  CategoryBytes live_by_category{};
  std::string hint;  // "HINT: ..." (may be empty)

  /// The smallest capacity that would have fit this request: live + requested.
  int64_t neededCapacity() const { return live + requested; }
  /// "out of memory on cpu:1: tried to allocate 12.00 MiB for stash; 1.98 GiB of
  /// 2.00 GiB in use (stash 1.20 GiB, weights 512.00 MiB). The smallest capacity
  /// that would fit is 2.01 GiB. HINT: ..."
  std::string message() const;
};

/// A memory domain refused an allocation. See Note [Out of memory].
class OutOfMemoryError : public std::runtime_error {
 public:
  explicit OutOfMemoryError(OomInfo info);
  const OomInfo& info() const { return info_; }

 private:
  OomInfo info_;
};

namespace memory {

/// Prefix of every OOM message; how a message wrapped by someone else is recognised.
inline constexpr const char* kOomMessagePrefix = "out of memory on ";

/// The last allocation refused on the calling thread (nullopt if none since the
/// last clear). Set before the exception is thrown.
std::optional<OomInfo> lastOutOfMemory();
/// The last allocation refused on any thread.
std::optional<OomInfo> lastOutOfMemoryAnyThread();
/// Clears both of the above.
void clearLastOutOfMemory();

}  // namespace memory
}  // namespace pipefb
