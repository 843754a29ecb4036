#include "pipefb/memory/MemoryStats.h"

#include <algorithm>
#include <vector>

#include "pipefb/common/Size.h"

namespace pipefb::memory {

CategoryBytes MemoryStats::liveByCategory() const {
  CategoryBytes out{};
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) out[i] = category_bytes[i].current;
  return out;
}

std::string formatBreakdown(const CategoryBytes& bytes) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    if (bytes[i] != 0) order.push_back(i);
  // Largest first; ties keep the enum order.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return bytes[a] > bytes[b]; });
  if (order.empty()) return "nothing";
  std::string out;
  for (std::size_t i : order) {
    if (!out.empty()) out += ", ";
    out += toString(kAllMemoryCategories[i]);
    out += ' ';
    out += formatBytes(bytes[i]);
  }
  return out;
}

std::string toString(const MemoryStats& s) {
  std::string out =
      s.domain + ": " + formatBytes(s.bytes.current) + " live (peak " + formatBytes(s.bytes.peak) +
      ") of " + (s.capacity == kUnlimited ? std::string("unlimited") : formatBytes(s.capacity)) +
      "; " + formatBreakdown(s.liveByCategory());
  if (s.num_ooms > 0) out += "; " + std::to_string(s.num_ooms) + " refused";
  return out;
}

}  // namespace pipefb::memory
