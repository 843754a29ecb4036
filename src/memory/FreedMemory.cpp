// Note [Keeping freed memory] in FreedMemory.h.
#include "pipefb/memory/FreedMemory.h"

#include <atomic>
#include <climits>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// Under a sanitizer malloc is the sanitizer's, whose mallopt does nothing.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PIPEFB_SANITIZED_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PIPEFB_SANITIZED_MALLOC 1
#endif
#endif

namespace pipefb::memory {
namespace {
std::atomic<bool> kept{false};
}  // namespace

bool keepFreedMemory() {
#if defined(__GLIBC__) && !defined(PIPEFB_SANITIZED_MALLOC)
  static std::once_flag once;
  std::call_once(once, [] {
    // Each call returns 1 on success; all three are plain parameters in glibc >= 2.10.
    const bool ok = mallopt(M_ARENA_MAX, 1) == 1 && mallopt(M_MMAP_MAX, 0) == 1 &&
                    mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
    kept = ok;
  });
  return kept;
#else
  return false;
#endif
}

bool keepingFreedMemory() { return kept; }

}  // namespace pipefb::memory
