#include "pipefb/sim/Timeline.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace pipefb::sim {

using schedules::Action;
using schedules::ActionType;

namespace {

char glyph(const Action& a) {
  switch (a.type) {
    case ActionType::Forward:
      return static_cast<char>('0' + a.index % 10);
    case ActionType::Backward:
    case ActionType::InputGrad:
      return static_cast<char>('a' + a.index % 10);
    case ActionType::WeightGrad:
      return static_cast<char>('A' + a.index % 10);
    case ActionType::Step:
      return '#';
    case ActionType::AllReduce:
      return '*';
    case ActionType::Offload:
      return 'o';
    case ActionType::Prefetch:
      return 'p';
    case ActionType::SendAct:
    case ActionType::RecvAct:
    case ActionType::SendGrad:
    case ActionType::RecvGrad:
    case ActionType::Drop:
    case ActionType::SyncWeights:
    case ActionType::RecvWeights:
      return 0;
  }
  return 0;
}

}  // namespace

std::string renderTimeline(const schedules::Schedule& s, const SimResult& r, int width) {
  width = std::max(10, width);
  const double T = r.makespan > 0 ? r.makespan : 1.0;
  const double dt = T / width;
  std::ostringstream os;
  char scale[128];
  std::snprintf(scale, sizeof scale, "time 0 .. %.6g s, one column = %.3g s\n", T, dt);
  os << scale;
  auto row = [&](int d, bool copyRow) {
    std::string cells(width, '.');
    std::vector<double> best(width, 0.0);
    for (size_t j = 0; j < s.devices[d].size(); ++j) {
      const Action& a = s.devices[d][j];
      bool isCopy = a.type == ActionType::Offload || a.type == ActionType::Prefetch;
      if (isCopy != copyRow) continue;
      char g = glyph(a);
      if (!g) continue;
      const ActionSpan& sp = r.spans[d][j];
      if (sp.end <= sp.start) continue;
      int c0 = std::max(0, static_cast<int>(sp.start / dt));
      int c1 = std::min(width - 1, static_cast<int>(sp.end / dt));
      for (int c = c0; c <= c1; ++c) {
        double overlap = std::min(sp.end, (c + 1) * dt) - std::max(sp.start, c * dt);
        if (overlap > best[c] + 1e-15 * T) {
          best[c] = overlap;
          cells[c] = g;
        }
      }
    }
    return cells;
  };
  for (int d = 0; d < s.numDevices(); ++d) {
    char label[32];
    std::snprintf(label, sizeof label, "dev%-3d     |", d);
    os << label << row(d, false) << "|\n";
    bool hasCopy = false;  // only copies that take time (free host links draw nothing)
    for (size_t j = 0; j < s.devices[d].size(); ++j) {
      const Action& a = s.devices[d][j];
      hasCopy |= (a.type == ActionType::Offload || a.type == ActionType::Prefetch) &&
                 r.spans[d][j].end > r.spans[d][j].start;
    }
    if (hasCopy) {
      std::snprintf(label, sizeof label, "dev%-3d copy|", d);
      os << label << row(d, true) << "|\n";
    }
  }
  os << "legend: F(s,m) = m%10 digit, B(s,m) = 'a'+m%10, STEP '#', AR '*', OFF 'o', PRE 'p', idle "
        "'.'\n";
  return os.str();
}

}  // namespace pipefb::sim
