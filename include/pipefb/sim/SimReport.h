#pragma once
// What pipefb_sim prints: a text summary and the JSON report (docs/pipefb_sim.md, "JSON").
#include <string>

#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/sim/Simulator.h"

namespace pipefb::sim {

struct SimReportOptions {
  std::string policy = "keep";  // as given on the command line
  int lookahead = 1;
  std::string costs = "uniform";
  bool includeActions = true;  // "actions": every action's start/end
  bool includeMemory = true;   // "memory_timeline" and "host_pool.timeline"
};

/// The JSON document (pretty-printed). `contract` may be null (a loaded schedule).
std::string simReportJson(const schedules::Schedule& schedule,
                          const schedules::MemoryContract* contract, const SimResult& result,
                          const SimReportOptions& options);

/// Iteration time, bubble fraction, and per device: peak memory, peak stash count and bytes.
std::string simSummaryText(const schedules::Schedule& schedule,
                           const schedules::MemoryContract* contract, const SimResult& result);

}  // namespace pipefb::sim
