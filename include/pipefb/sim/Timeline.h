#pragma once
// ASCII timeline of a simulation: one row per device (plus a copy-engine row for devices
// that offload), time in columns.
//
// Legend: F(s,m) prints the digit m%10, B(s,m) the letter 'a'+m%10 (BR too), STEP '#',
// AR '*', idle '.'; copy rows: OFF 'o', PRE 'p'. A cell shows the action covering most of it.
#include <string>

#include "pipefb/schedules/Schedule.h"
#include "pipefb/sim/Simulator.h"

namespace pipefb::sim {

std::string renderTimeline(const schedules::Schedule& schedule, const SimResult& result,
                           int width = 100);

}  // namespace pipefb::sim
