#include "pipefb/sim/SimReport.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipefb/common/Size.h"

namespace pipefb::sim {

namespace {

using json = nlohmann::ordered_json;

json categories(const CategoryBytes& b) {
  json o = json::object();
  for (MemoryCategory c : kAllMemoryCategories) o[toString(c)] = b[index(c)];
  return o;
}

}  // namespace

std::string simReportJson(const schedules::Schedule& s, const schedules::MemoryContract* contract,
                          const SimResult& r, const SimReportOptions& opt) {
  json j;
  j["schedule"] = s.kind;
  j["stages"] = s.numStages;
  j["microbatches"] = s.numMicrobatches;
  j["iterations"] = s.numIterations;
  j["devices"] = s.numDevices();
  j["policy"] = opt.policy;
  j["lookahead"] = opt.lookahead;
  j["costs"] = opt.costs;
  j["time_unit"] = "s";
  j["makespan"] = r.makespan;
  j["iteration_time"] = r.iterationTime;
  j["iteration_ends"] = r.iterationEnd;
  j["bubble_fraction"] = r.bubbleFraction;
  j["compute_devices"] = r.computeDevices;

  json devices = json::array();
  for (int d = 0; d < s.numDevices(); ++d) {
    const DeviceMemory& m = r.memory[d];
    json dj;
    dj["device"] = d;
    dj["busy_time"] = r.busy[d];
    dj["peak_bytes"] = m.peakBytes;
    dj["peak_time"] = m.peakTime;
    dj["peak_breakdown"] = categories(m.atPeak);
    dj["peak_by_category"] = categories(m.peakByCategory);
    dj["peak_stash_count"] = r.peakStashCount[d];
    dj["peak_stash_bytes"] = r.peakStashBytes[d];
    json byStage = json::object();
    for (int st = 0; st < s.numStages; ++st)
      if (s.placement.forward(st) == d || s.placement.backward(st) == d ||
          r.peakStashCountByStage[d][st] > 0)
        byStage[std::to_string(st)] = r.peakStashCountByStage[d][st];
    dj["peak_stash_count_by_stage"] = byStage;
    devices.push_back(dj);
  }
  j["per_device"] = devices;

  json stages = json::array();
  for (int st = 0; st < s.numStages; ++st) {
    int fd = s.placement.forward(st), bd = s.placement.backward(st);
    json sj;
    sj["stage"] = st;
    sj["forward_device"] = fd;
    sj["backward_device"] = bd;
    sj["peak_in_flight"] = r.peakInFlight[st];
    sj["peak_resident_forward"] = r.peakStashCountByStage[fd][st];
    sj["peak_resident_backward"] = r.peakStashCountByStage[bd][st];
    sj["peak_weight_versions"] = r.peakWeightVersions[st];
    if (contract) {
      sj["contract"] = {{"in_flight", contract->inFlight[st]},
                        {"resident_forward", contract->residentForward[st]},
                        {"resident_backward", contract->residentBackward[st]},
                        {"weight_versions", contract->weightVersions[st]}};
      if (static_cast<int>(contract->residentWeightVersions.size()) == s.numStages)
        sj["contract"]["resident_weight_versions"] = contract->residentWeightVersions[st];
    } else {
      sj["contract"] = nullptr;
    }
    stages.push_back(sj);
  }
  j["per_stage"] = stages;

  json host;
  host["peak_bytes"] = r.host.peakBytes;
  if (opt.includeMemory) {
    json tl = json::array();
    for (const HostPoolSample& h : r.host.timeline)
      tl.push_back({{"time", h.time},
                    {"stash_bytes", h.stashBytes},
                    {"weight_version_bytes", h.weightVersionBytes}});
    host["timeline"] = tl;
  }
  j["host_pool"] = host;

  if (opt.includeMemory) {
    json mt = json::array();
    for (int d = 0; d < s.numDevices(); ++d) {
      json samples = json::array();
      for (const MemorySample& m : r.memory[d].timeline) {
        json o = categories(m.bytes);
        o["time"] = m.time;
        o["total"] = m.total();
        samples.push_back(o);
      }
      mt.push_back({{"device", d}, {"samples", samples}});
    }
    j["memory_timeline"] = mt;
  }
  if (opt.includeActions) {
    json acts = json::array();
    for (int d = 0; d < s.numDevices(); ++d)
      for (size_t k = 0; k < s.devices[d].size(); ++k)
        acts.push_back({{"device", d},
                        {"step", k},
                        {"action", schedules::toString(s.devices[d][k])},
                        {"start", r.spans[d][k].start},
                        {"end", r.spans[d][k].end}});
    j["actions"] = acts;
  }
  return j.dump(2) + "\n";
}

std::string simSummaryText(const schedules::Schedule& s, const schedules::MemoryContract* contract,
                           const SimResult& r) {
  std::ostringstream os;
  char buf[256];
  os << "schedule " << s.kind << ": " << s.numStages << " stages x " << s.numMicrobatches
     << " microbatches x " << s.numIterations << " iteration(s) on " << s.numDevices()
     << " devices (placement F/B per stage: " << s.placement.toString() << ")\n";
  std::snprintf(buf, sizeof buf, "iteration time %.6g s, makespan %.6g s, bubble fraction %.4f\n",
                r.iterationTime, r.makespan, r.bubbleFraction);
  os << buf;
  std::snprintf(buf, sizeof buf, "%-6s %10s %12s %12s %12s\n", "device", "busy s", "peak memory",
                "peak stashes", "stash bytes");
  os << buf;
  for (int d = 0; d < s.numDevices(); ++d) {
    std::snprintf(buf, sizeof buf, "%-6d %10.4g %12s %12d %12s\n", d, r.busy[d],
                  formatBytes(r.memory[d].peakBytes).c_str(), r.peakStashCount[d],
                  formatBytes(r.peakStashBytes[d]).c_str());
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "host pool peak %s\n", formatBytes(r.host.peakBytes).c_str());
  os << buf;
  std::snprintf(buf, sizeof buf, "%-6s %10s %10s %10s\n", "stage", "in flight", "versions",
                contract ? "contract" : "");
  os << buf;
  for (int st = 0; st < s.numStages; ++st) {
    std::snprintf(buf, sizeof buf, "%-6d %10d %10d", st, r.peakInFlight[st],
                  r.peakWeightVersions[st]);
    os << buf;
    if (contract)
      os << "   in flight <= " << contract->inFlight[st]
         << ", versions <= " << contract->weightVersions[st];
    if (contract && static_cast<int>(contract->residentWeightVersions.size()) == s.numStages)
      os << " (resident <= " << contract->residentWeightVersions[st] << ")";
    os << "\n";
  }
  return os.str();
}

}  // namespace pipefb::sim
