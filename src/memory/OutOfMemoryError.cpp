#include "pipefb/memory/OutOfMemoryError.h"

#include <mutex>

#include "pipefb/common/Size.h"

namespace pipefb {

std::string OomInfo::message() const {
  std::string msg = memory::kOomMessagePrefix + domain + ": tried to allocate " +
                    formatBytes(requested) + " for " + toString(category) + "; " +
                    formatBytes(live) + " of " + formatBytes(capacity) + " in use (" +
                    memory::formatBreakdown(live_by_category) + ")." +
                    " The smallest capacity that would fit is " + formatBytes(neededCapacity()) +
                    " (" + std::to_string(neededCapacity()) + " bytes).";
  if (!hint.empty()) msg += " " + hint;
  return msg;
}

OutOfMemoryError::OutOfMemoryError(OomInfo info)
    : std::runtime_error(info.message()), info_(std::move(info)) {}

namespace memory {
namespace {
thread_local std::optional<OomInfo> tlsLastOom;
std::mutex globalOomMu;
std::optional<OomInfo> globalLastOom;
}  // namespace

namespace detail {
// Called by MemoryDomain::charge before it throws.
void noteOutOfMemory(const OomInfo& info) {
  tlsLastOom = info;
  std::lock_guard<std::mutex> lock(globalOomMu);
  globalLastOom = info;
}
}  // namespace detail

std::optional<OomInfo> lastOutOfMemory() { return tlsLastOom; }

std::optional<OomInfo> lastOutOfMemoryAnyThread() {
  std::lock_guard<std::mutex> lock(globalOomMu);
  return globalLastOom;
}

void clearLastOutOfMemory() {
  tlsLastOom.reset();
  std::lock_guard<std::mutex> lock(globalOomMu);
  globalLastOom.reset();
}

}  // namespace memory
}  // namespace pipefb
