#pragma once
// The progress line of long runs: step, loss, samples/s, per-device memory, ETA.
#include <cstdint>
#include <string>
#include <vector>

namespace pipefb::train {

struct DeviceMemoryReading {
  std::string device;  // "cpu:0"
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t capacity_bytes = -1;  // -1 = unlimited
};

struct ProgressState {
  int64_t step = 0;  // 1-based, steps done
  int64_t total_steps = 0;
  int64_t epoch = 0;
  double loss = 0;
  double samples_per_s = 0;
  double elapsed_s = 0;
  std::vector<DeviceMemoryReading> memory;
};

/// "step 120/1876 (epoch 1) | loss 0.4821 | 1234 samples/s | cpu:0 12.3 MiB (peak 20.1 MiB / 1.00
/// GiB) | ETA 1m23s"
std::string formatProgress(const ProgressState& state);

/// "1h02m", "3m07s", "12s".
std::string formatDuration(double seconds);

}  // namespace pipefb::train
