#pragma once
// Note [Chrome trace]
// trace.json is in the Chrome trace event format (Perfetto, chrome://tracing) and
// is written by this one class for every run: the pipeline runtime
// (PipelineEngine::writeTrace) and the single-device trainer (StepTrace). Layout:
//   - one process per device (pid = device index; the host pool is the last pid),
//     named by a "process_name" metadata event, ordered by "process_sort_index";
//   - thread 0 of a device is its compute track ("X" spans: actions or steps);
//   - thread 1 of a pipeline device is its copy engine ("copy engine"): one "X" span per
//     copy job, "D2H s.m" (cat "offload") or "H2D s.m" (cat "prefetch"), args bytes,
//     stage, index; the track exists (named) even when nothing was copied;
//   - memory as counter tracks ("C" events, args = live bytes per category):
//     "memory" is sampled at the end of every action / step, "memory events" is
//     the replayed ALLOC/FREE stream of the first iterations.
// Times are microseconds since the run's origin (memory::nowNs() clock).
// Torch-free: it only needs the accounting's plain structs.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/MemoryStats.h"

namespace pipefb::report {

class ChromeTrace {
 public:
  /// `originNs`: the nowNs() value that becomes ts = 0.
  explicit ChromeTrace(int64_t originNs);

  /// A device (or the host pool): process_name and process_sort_index = pid.
  void addProcess(int pid, const std::string& name);
  void addThread(int pid, int tid, const std::string& name);
  /// One "X" span [startNs, endNs].
  void addSpan(int pid, int tid, const std::string& name, const std::string& category,
               int64_t startNs, int64_t endNs, nlohmann::json args = nlohmann::json::object());
  /// One "C" event: live bytes per category.
  void addMemoryCounter(int pid, const std::string& name, int64_t ns, const CategoryBytes& bytes);
  /// Replays the ALLOC/FREE stream as "memory events" counters, starting from the live
  /// bytes `base` of each domain. Events of domains not in `pidOfDomain` are skipped.
  void addMemoryEvents(const std::vector<memory::MemoryEvent>& events,
                       std::map<int, CategoryBytes> base, const std::map<int, int>& pidOfDomain);
  /// Writes {"traceEvents": ..., "displayTimeUnit": "ms", "otherData": otherData}.
  /// Throws UserError when the file cannot be written.
  void write(const std::string& path, const nlohmann::json& otherData) const;

 private:
  int64_t origin_;
  nlohmann::json events_ = nlohmann::json::array();
};

}  // namespace pipefb::report
