#include "pipefb/schedules/Placement.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <sstream>
#include <tuple>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/schedules/SharedDevices.h"

namespace pipefb::schedules {

Placement::Placement(std::vector<StagePlacement> stages) : stages_(std::move(stages)) {
  for (size_t s = 0; s < stages_.size(); ++s) {
    const StagePlacement& p = stages_[s];
    if (p.forward < 0 || p.backward < 0)
      throw UserError("placement of stage " + std::to_string(s) + " uses a negative device (" +
                      std::to_string(p.forward) + "/" + std::to_string(p.backward) +
                      "); devices are numbered from 0");
    // The same bound as the schedule text's "device <n>:" lines. Without it a placement
    // such as 0/2147483647 overflowed `+ 1`, and 0/2000000000 made parseSchedule allocate
    // two billion action lists (both seen under fuzz/ScheduleFuzzer's ASan/UBSan).
    if (p.forward >= kMaxDevices || p.backward >= kMaxDevices)
      throw UserError("placement of stage " + std::to_string(s) + " uses device " +
                      std::to_string(std::max(p.forward, p.backward)) + "; devices are numbered " +
                      "0.." + std::to_string(kMaxDevices - 1));
    numDevices_ = std::max({numDevices_, p.forward + 1, p.backward + 1});
  }
}

Placement Placement::sameDevice(int numStages) {
  std::vector<StagePlacement> v;
  for (int s = 0; s < numStages; ++s) v.push_back({s, s});
  return Placement(std::move(v));
}

Placement Placement::pipefb(int numStages) {
  std::vector<StagePlacement> v;
  for (int s = 0; s < numStages; ++s) v.push_back({s, 2 * numStages - 1 - s});
  return Placement(std::move(v));
}

Placement Placement::looped(int numStages, int v) {
  if (v < 1 || numStages % v != 0)
    throw UserError("pipeline.virtual_stages: " + std::to_string(numStages) +
                    " stages do not split into " + std::to_string(v) +
                    " stages per device; give a divisor of the stage count (>= 1)");
  std::vector<StagePlacement> out;
  for (int s = 0; s < numStages; ++s) {
    const int d = schedules::loopedDevice(s, numStages, v);
    out.push_back({d, d});
  }
  return Placement(std::move(out));
}

Placement Placement::vShape(int numStages) {
  if (numStages < 2 || numStages % 2 != 0)
    throw UserError("zbv: a V needs an even number of stages >= 2 (two per device), got " +
                    std::to_string(numStages));
  std::vector<StagePlacement> out;
  for (int s = 0; s < numStages; ++s) {
    const int d = foldedDevice(s, numStages);  // Note [Folded placements]
    out.push_back({d, d});
  }
  return Placement(std::move(out));
}

Placement Placement::folded(int numStages) {
  std::vector<StagePlacement> v;
  for (int s = 0; s < numStages; ++s) v.push_back({s, numStages - 1 - s});
  return Placement(std::move(v));
}

Placement Placement::decoupled(const std::vector<int>& forwardDevices,
                               const std::vector<int>& backwardDevices) {
  if (forwardDevices.size() != backwardDevices.size())
    throw UserError("a decoupled placement needs one forward and one backward device per " +
                    std::string("segment; got ") + std::to_string(forwardDevices.size()) +
                    " forward and " + std::to_string(backwardDevices.size()) + " backward devices");
  std::vector<StagePlacement> v;
  for (size_t s = 0; s < forwardDevices.size(); ++s)
    v.push_back({forwardDevices[s], backwardDevices[s]});
  return Placement(std::move(v));
}

namespace {
// Maximal runs of consecutive stages with the same device of one pass.
template <typename DeviceOf>
std::vector<Placement::StageRun> runsOf(int S, DeviceOf deviceOf) {
  std::vector<Placement::StageRun> out;
  for (int s = 0; s < S; ++s) {
    if (out.empty() || out.back().device != deviceOf(s))
      out.push_back({s, s + 1, deviceOf(s)});
    else
      out.back().last = s + 1;
  }
  return out;
}
}  // namespace

std::vector<Placement::StageRun> Placement::forwardRanges() const {
  return runsOf(numStages(), [&](int s) { return forward(s); });
}

std::vector<Placement::StageRun> Placement::backwardRanges() const {
  return runsOf(numStages(), [&](int s) { return backward(s); });
}

std::vector<Placement> Placement::everyPipefb(int numStages, int devices) {
  std::vector<Placement> out;
  if (numStages < 1 || devices < 1) return out;
  const int n = devices * devices;
  std::vector<int> code(numStages, 0);  // stage s: forward code / devices, backward code % devices
  for (;;) {
    std::vector<StagePlacement> v;
    for (int c : code) v.push_back({c / devices, c % devices});
    Placement p(std::move(v));
    try {
      p.checkFor("pipefb-sync", devices, "");
      out.push_back(std::move(p));
    } catch (const UserError&) {
    }
    int i = 0;
    while (i < numStages && ++code[i] == n) code[i++] = 0;
    if (i == numStages) return out;
  }
}

bool Placement::sharesDevices() const {
  std::map<int, int> forwardOf;
  for (int s = 0; s < numStages(); ++s) forwardOf[forward(s)] = s;
  for (int s = 0; s < numStages(); ++s) {
    auto it = forwardOf.find(backward(s));
    if (it != forwardOf.end() && it->second != s) return true;
  }
  return false;
}

Placement Placement::defaultFor(ScheduleKind kind, int numStages, int virtualStages) {
  switch (info(kind).placement) {  // Note [Adding a schedule kind]
    case DefaultPlacement::SameDevice:
      return sameDevice(numStages);
    case DefaultPlacement::PipeFb:
      return pipefb(numStages);
    case DefaultPlacement::Looped:
      return looped(numStages, virtualStages);
    case DefaultPlacement::VShape:
      return vShape(numStages);
  }
  PIPEFB_ASSERT(false, "a schedule kind without a default placement");
  return sameDevice(numStages);
}

Placement Placement::defaultFor(const std::string& kind, int numStages, int virtualStages) {
  return defaultFor(parseScheduleKind(kind), numStages, virtualStages);
}

// Note [Stages per device]: the ratios of the placements defaultFor() builds.
int Placement::devicesFor(ScheduleKind kind, int numStages, int virtualStages) {
  const StagesPerDevice r = stagesPerDevice(kind, virtualStages);
  return numStages % r.stages == 0 ? numStages / r.stages * r.devices : 0;
}

int Placement::stagesOn(ScheduleKind kind, int devices, int virtualStages) {
  const StagesPerDevice r = stagesPerDevice(kind, virtualStages);
  return devices % r.devices == 0 ? devices / r.devices * r.stages : 0;
}

std::string Placement::toString() const {
  std::string out;
  for (const StagePlacement& p : stages_) {
    if (!out.empty()) out += " ";
    out += std::to_string(p.forward) + "/" + std::to_string(p.backward);
  }
  return out;
}

Placement Placement::parse(const std::string& text, const std::string& where) {
  std::vector<StagePlacement> stages;
  std::istringstream in(text);
  std::string tok;
  auto device = [&](const std::string& tok, const std::string& part) {
    try {
      size_t used = 0;
      const int v = std::stoi(part, &used);
      if (used == part.size() && v >= 0) return v;
    } catch (const std::exception&) {
    }
    throw UserError(where + ": bad placement entry '" + tok +
                    "'; expected <forward device>/<backward device> per stage, e.g. 0/3 1/2");
  };
  while (in >> tok) {
    const auto slash = tok.find('/');
    if (slash == std::string::npos) device(tok, "");
    stages.push_back({device(tok, tok.substr(0, slash)), device(tok, tok.substr(slash + 1))});
  }
  if (stages.empty())
    throw UserError(where +
                    ": an empty placement; expected <forward>/<backward> per stage, e.g. 0/3 1/2");
  try {
    return Placement(std::move(stages));
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
}

void Placement::checkFor(const std::string& kind, int devices, const std::string& where) const {
  const ScheduleKind k = parseScheduleKind(kind);
  const bool split = usesSplitPlacement(k);
  // Note [Stages per device]: looped and V placements host several stages per device.
  const bool severalPerDevice = stagesPerDevice(k).stages > 1;
  std::map<int, int> forwardOf, backwardOf;  // device -> stage
  for (int s = 0; s < numStages(); ++s) {
    const StagePlacement& p = stages_[s];
    const std::string entry = "stage " + std::to_string(s) + " (" + std::to_string(p.forward) +
                              "/" + std::to_string(p.backward) + ")";
    if (std::max(p.forward, p.backward) >= devices)
      throw UserError(where + ": " + entry + " uses device " +
                      std::to_string(std::max(p.forward, p.backward)) + " but devices.count is " +
                      std::to_string(devices) + " (devices 0.." + std::to_string(devices - 1) +
                      ")");
    if (!split && p.forward != p.backward)
      throw UserError(where + ": " + entry + " runs F and B on two devices; " + kind +
                      " runs both on one device (use pipefb-sync or pipefb-async to split)");
    if (severalPerDevice || split) continue;
    for (auto [map, dev, pass] : {std::tuple{&forwardOf, p.forward, "forward"},
                                  std::tuple{&backwardOf, p.backward, "backward"}}) {
      auto [it, fresh] = map->emplace(dev, s);
      if (!fresh)
        throw UserError(where + ": device " + std::to_string(dev) + " runs the " + pass +
                        " of stages " + std::to_string(it->second) + " and " + std::to_string(s) +
                        "; a device runs at most one stage's " + pass);
    }
  }
  // Note [Decoupled partitions]: a pipefb device runs one forward range and one backward
  // range at most.
  if (split)
    for (auto [ranges, pass] :
         {std::pair{forwardRanges(), "forward"}, std::pair{backwardRanges(), "backward"}}) {
      std::map<int, StageRun> rangeOf;  // device -> its first range
      for (const StageRun& r : ranges) {
        auto [it, fresh] = rangeOf.emplace(r.device, r);
        if (!fresh)
          throw UserError(where + ": device " + std::to_string(r.device) + " runs the " + pass +
                          " of stages " + std::to_string(it->second.last - 1) + " and " +
                          std::to_string(r.first) + " but not of the stages between; a device " +
                          "runs the " + pass + "s of one run of consecutive stages (Note " +
                          "[Decoupled partitions])");
      }
    }
  if (split && numStages() > 0 &&
      std::none_of(stages_.begin(), stages_.end(),
                   [](const StagePlacement& p) { return p.forward != p.backward; }))
    throw UserError(where + ": " + kind + " splits at least one stage, but every stage runs F " +
                    "and B on one device (e.g. " + Placement::pipefb(numStages()).toString() +
                    ", or folded " + Placement::folded(numStages()).toString() + ")");
}

DecoupledStages decouple(std::int64_t numLayers, const PassPartition& forward,
                         const PassPartition& backward) {
  for (auto [pass, name] : {std::pair{&forward, "forward"}, std::pair{&backward, "backward"}}) {
    const std::string what = std::string("the ") + name + " partition";
    if (pass->devices.size() != pass->cuts.size() + 1)
      throw UserError(what + " has " + std::to_string(pass->cuts.size()) + " cuts and " +
                      std::to_string(pass->devices.size()) + " devices; give one device per " +
                      "range (cuts + 1)");
    std::int64_t previous = 0;
    for (std::int64_t c : pass->cuts) {
      if (c <= previous || c >= numLayers)
        throw UserError(what + " cuts at layer " + std::to_string(c) + "; cuts must increase " +
                        "and lie in (0, " + std::to_string(numLayers) + ")");
      previous = c;
    }
  }
  DecoupledStages out;
  std::set_union(forward.cuts.begin(), forward.cuts.end(), backward.cuts.begin(),
                 backward.cuts.end(), std::back_inserter(out.cuts));
  std::vector<int> fwd, bwd;
  size_t f = 0, b = 0;  // the range of each pass that segment s lies in
  for (size_t s = 0; s <= out.cuts.size(); ++s) {
    const std::int64_t first = s == 0 ? 0 : out.cuts[s - 1];
    while (f < forward.cuts.size() && forward.cuts[f] <= first) ++f;
    while (b < backward.cuts.size() && backward.cuts[b] <= first) ++b;
    fwd.push_back(forward.devices[f]);
    bwd.push_back(backward.devices[b]);
  }
  out.placement = Placement::decoupled(fwd, bwd);
  return out;
}

}  // namespace pipefb::schedules
