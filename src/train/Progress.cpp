#include "pipefb/train/Progress.h"

#include <cmath>
#include <cstdio>

#include "pipefb/common/Size.h"

namespace pipefb::train {

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(s / 3600),
                  (long long)(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", (long long)s);
  return buf;
}

std::string formatProgress(const ProgressState& p) {
  char head[160];
  std::snprintf(head, sizeof head, "step %lld/%lld (epoch %lld) | loss %.4f | %.0f samples/s",
                (long long)p.step, (long long)p.total_steps, (long long)p.epoch, p.loss,
                p.samples_per_s);
  std::string out = head;
  for (const auto& m : p.memory) {
    out +=
        " | " + m.device + " " + formatBytes(m.live_bytes) + " (peak " + formatBytes(m.peak_bytes);
    if (m.capacity_bytes >= 0) out += " / " + formatBytes(m.capacity_bytes);
    out += ")";
  }
  double eta = p.step > 0 ? p.elapsed_s / p.step * (p.total_steps - p.step) : NAN;
  out += " | ETA " + formatDuration(eta);
  return out;
}

}  // namespace pipefb::train
