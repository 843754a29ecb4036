#include "pipefb/report/ChromeTrace.h"

#include <algorithm>
#include <fstream>

#include "pipefb/common/Error.h"

namespace pipefb::report {

using nlohmann::json;

ChromeTrace::ChromeTrace(int64_t originNs) : origin_(originNs) {}

void ChromeTrace::addProcess(int pid, const std::string& name) {
  events_.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
  events_.push_back(
      {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
}

void ChromeTrace::addThread(int pid, int tid, const std::string& name) {
  events_.push_back({{"ph", "M"},
                     {"name", "thread_name"},
                     {"pid", pid},
                     {"tid", tid},
                     {"args", {{"name", name}}}});
}

void ChromeTrace::addSpan(int pid, int tid, const std::string& name, const std::string& category,
                          int64_t startNs, int64_t endNs, json args) {
  events_.push_back({{"ph", "X"},
                     {"name", name},
                     {"cat", category},
                     {"pid", pid},
                     {"tid", tid},
                     {"ts", static_cast<double>(startNs - origin_) / 1000.0},
                     {"dur", static_cast<double>(endNs - startNs) / 1000.0},
                     {"args", std::move(args)}});
}

void ChromeTrace::addMemoryCounter(int pid, const std::string& name, int64_t ns,
                                   const CategoryBytes& bytes) {
  json args = json::object();
  for (MemoryCategory c : kAllMemoryCategories) args[toString(c)] = bytes[index(c)];
  events_.push_back({{"ph", "C"},
                     {"name", name},
                     {"pid", pid},
                     {"ts", static_cast<double>(ns - origin_) / 1000.0},
                     {"args", args}});
}

void ChromeTrace::addMemoryEvents(const std::vector<memory::MemoryEvent>& events,
                                  std::map<int, CategoryBytes> base,
                                  const std::map<int, int>& pidOfDomain) {
  for (const auto& e : events) {
    auto pid = pidOfDomain.find(e.domain);
    if (pid == pidOfDomain.end()) continue;
    auto& b = base[e.domain];
    int64_t& v = b[index(e.category)];
    if (e.kind == memory::MemoryEventKind::Alloc) v += e.bytes;
    if (e.kind == memory::MemoryEventKind::Free) v = std::max<int64_t>(0, v - e.bytes);
    addMemoryCounter(pid->second, "memory events", e.time_ns, b);
  }
}

void ChromeTrace::write(const std::string& path, const json& otherData) const {
  json root = {{"traceEvents", events_}, {"displayTimeUnit", "ms"}, {"otherData", otherData}};
  std::ofstream f(path);
  if (!f) throw UserError("cannot write the trace to " + path);
  f << root.dump() << "\n";
  if (!f) throw UserError("cannot write the trace to " + path);
}

}  // namespace pipefb::report
