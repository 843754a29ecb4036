#include "pipefb/schedules/Schedule.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "pipefb/common/Error.h"

namespace pipefb::schedules {

IndexSpan indexSpan(const Schedule& s) {
  IndexSpan span;
  for (const auto& list : s.devices)
    for (const Action& a : list) {
      span.lo = std::min(span.lo, a.index);
      span.hi = std::max(span.hi, a.index);
    }
  return span;
}

int iterationOf(const Action& a, bool stepsPerMicrobatch, int M) {
  const bool stepLike = a.type == ActionType::Step || a.type == ActionType::SyncWeights ||
                        a.type == ActionType::RecvWeights || a.type == ActionType::AllReduce;
  if (stepLike) return stepsPerMicrobatch ? a.index / M : a.index;
  if (a.stash == StashKind::Weights &&
      (a.type == ActionType::Offload || a.type == ActionType::Prefetch ||
       a.type == ActionType::Drop))
    return -1;  // that of the action before it on its device
  return a.index / M;
}

std::size_t Schedule::numActions() const {
  std::size_t n = 0;
  for (const auto& d : devices) n += d.size();
  return n;
}

bool Schedule::operator==(const Schedule& o) const {
  return kind == o.kind && numStages == o.numStages && numMicrobatches == o.numMicrobatches &&
         numIterations == o.numIterations && placement == o.placement && devices == o.devices;
}

std::string toText(const Schedule& s) {
  std::ostringstream os;
  os << "# pipefb schedule (text form: docs/pipefb_sim.md)\n";
  os << "kind " << (s.kind.empty() ? "custom" : s.kind) << "\n";
  os << "stages " << s.numStages << "\n";
  os << "microbatches " << s.numMicrobatches << "\n";
  os << "iterations " << s.numIterations << "\n";
  os << "placement " << s.placement.toString() << "\n";
  for (int d = 0; d < s.numDevices(); ++d) {
    os << "device " << d << ":";
    for (const Action& a : s.devices[d]) os << " " << toString(a);
    os << "\n";
  }
  return os.str();
}

namespace {

int parseCount(const std::string& where, const std::string& key, const std::string& value,
               int minimum) {
  try {
    size_t used = 0;
    int v = std::stoi(value, &used);
    if (used == value.size() && v >= minimum) return v;
  } catch (const std::exception&) {
  }
  throw UserError(where + ": '" + key + "' must be an integer >= " + std::to_string(minimum) +
                  ", got '" + value + "'");
}

}  // namespace

Schedule parseSchedule(const std::string& text, const std::string& source) {
  Schedule s;
  s.kind = "custom";
  bool havePlacement = false, haveStages = false, haveMicrobatches = false;
  std::vector<std::vector<Action>> lists;
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    std::string where = source + ":" + std::to_string(lineNo);
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string key;
    if (!(ls >> key)) continue;
    if (key == "kind") {
      if (!(ls >> s.kind)) throw UserError(where + ": 'kind' needs a name");
    } else if (key == "stages" || key == "microbatches" || key == "iterations") {
      std::string value, extra;
      if (!(ls >> value) || (ls >> extra))
        throw UserError(where + ": '" + key + "' takes exactly one integer");
      int v = parseCount(where, key, value, 1);
      if (key == "stages") s.numStages = v, haveStages = true;
      if (key == "microbatches") s.numMicrobatches = v, haveMicrobatches = true;
      if (key == "iterations") s.numIterations = v;
    } else if (key == "placement") {
      std::string rest;
      std::getline(ls, rest);
      s.placement = Placement::parse(rest, where);
      havePlacement = true;
    } else if (key == "device") {
      std::string dev;
      if (!(ls >> dev) || dev.empty() || dev.back() != ':')
        throw UserError(where + ": expected 'device <n>:' followed by actions");
      dev.pop_back();
      int d = parseCount(where, "device", dev, 0);
      if (d >= kMaxDevices)
        throw UserError(where + ": device " + dev + " is out of range (0.." +
                        std::to_string(kMaxDevices - 1) + ")");
      if (static_cast<int>(lists.size()) <= d) lists.resize(d + 1);
      std::string tok;
      while (ls >> tok) {
        try {
          lists[d].push_back(parseAction(tok));
        } catch (const UserError& e) {
          throw UserError(where + ": " + e.what());
        }
      }
    } else {
      throw UserError(where + ": unknown key '" + key +
                      "'; allowed: kind, stages, microbatches, iterations, placement, device");
    }
  }
  // totalMicrobatches() is M x K in an int; action indices must stay below it anyway.
  if (static_cast<long long>(s.numMicrobatches) * s.numIterations > (1 << 27))
    throw UserError(source + ": microbatches x iterations is " +
                    std::to_string(static_cast<long long>(s.numMicrobatches) * s.numIterations) +
                    "; at most " + std::to_string(1 << 27) + " microbatches are allowed");
  if (!haveStages || !haveMicrobatches || !havePlacement)
    throw UserError(source + ": a schedule needs 'stages', 'microbatches' and 'placement' lines");
  if (s.placement.numStages() != s.numStages)
    throw UserError(source + ": placement names " + std::to_string(s.placement.numStages()) +
                    " stages but 'stages' is " + std::to_string(s.numStages));
  if (static_cast<int>(lists.size()) > s.placement.numDevices())
    throw UserError(source + ": device " + std::to_string(lists.size() - 1) +
                    " is not used by the placement (devices 0.." +
                    std::to_string(s.placement.numDevices() - 1) + ")");
  lists.resize(s.placement.numDevices());
  s.devices = std::move(lists);
  // Stage and peer ranges.
  for (int d = 0; d < s.numDevices(); ++d)
    for (const Action& a : s.devices[d]) {
      if (a.stage >= s.numStages)
        throw UserError(source + ": action " + toString(a) + " on device " + std::to_string(d) +
                        " names stage " + std::to_string(a.stage) + " but there are " +
                        std::to_string(s.numStages) + " stages");
      if ((a.isSend() || a.isRecv()) && a.peer >= s.numDevices())
        throw UserError(source + ": action " + toString(a) + " on device " + std::to_string(d) +
                        " names device " + std::to_string(a.peer) + " but there are " +
                        std::to_string(s.numDevices()) + " devices");
    }
  return s;
}

Schedule loadSchedule(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UserError("cannot open schedule file '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return parseSchedule(ss.str(), path);
}

void saveSchedule(const Schedule& s, const std::string& path) {
  std::ofstream f(path);
  if (!f) throw UserError("cannot write schedule file '" + path + "'");
  f << toText(s);
}

}  // namespace pipefb::schedules
