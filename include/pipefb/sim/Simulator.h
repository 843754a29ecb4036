#pragma once
// Event-driven simulation of a lowered schedule (Note [Simulation model] in Simulator.cpp).
#include <array>
#include <cstdint>
#include <vector>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/schedules/ActionSpan.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/sim/CostTable.h"

namespace pipefb::sim {

struct SimOptions {
  bool recordMemoryTimeline = true;  // keep every sample (peaks are computed either way)
};

/// When an action ran, in seconds from 0 (the runtime's records are the same type).
using schedules::ActionSpan;

struct MemorySample {
  double time = 0;
  CategoryBytes bytes{};  // by pipefb::MemoryCategory, after every change at `time`
  std::int64_t total() const;
};

struct DeviceMemory {
  std::vector<MemorySample> timeline;  // empty unless recordMemoryTimeline
  std::int64_t peakBytes = 0;
  double peakTime = 0;
  CategoryBytes atPeak{};          // breakdown at the instant of the peak
  CategoryBytes peakByCategory{};  // each category's own peak
};

struct HostPoolSample {
  double time = 0;
  std::int64_t stashBytes = 0;
  std::int64_t weightVersionBytes = 0;
};

/// The host pool's occupancy over a simulation (the pool itself is offload::HostPool).
struct HostPoolMemory {
  std::vector<HostPoolSample> timeline;
  std::int64_t peakBytes = 0;
};

struct SimResult {
  std::vector<std::vector<ActionSpan>> spans;  // [device][action index]
  std::vector<double> busy;                    // compute seconds per device
  std::vector<DeviceMemory> memory;            // per device
  HostPoolMemory host;
  double makespan = 0;
  double iterationTime = 0;  // K == 1: makespan; else (end of last - end of first) / (K-1)
  double bubbleFraction = 0;
  std::vector<double> iterationEnd;          // per iteration: the last end of its actions
  std::vector<int> peakStashCount;           // per device
  std::vector<std::int64_t> peakStashBytes;  // per device
  std::vector<std::vector<int>> peakStashCountByStage;  // [device][stage]
  std::vector<int> peakInFlight;                        // per stage, device + host
  std::vector<int> peakWeightVersions;                  // per stage
  int computeDevices = 0;                               // devices with at least one compute action
};

/// Simulates a lowered schedule. A schedule that cannot finish throws
/// pipefb::schedules::ScheduleError with the step x device grid.
SimResult simulate(const schedules::Schedule& schedule, const CostTable& costs,
                   const SimOptions& options = {});

}  // namespace pipefb::sim
