#pragma once
// The trace of a single-device run (pipeline.schedule none): the runtime writes
// its own (PipelineEngine::writeTrace); the trainer has no actions, so this
// records one span per step and the memory event stream of the first steps,
// and writes trace.json in the same format (Note [Chrome trace]).
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/memory/MemoryDomain.h"
#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/MemoryStats.h"

namespace pipefb::report {

class StepTrace {
 public:
  /// The trace window (output.trace_steps): step spans are kept for `spanSteps` steps
  /// after the first `skipSteps`; the event stream of `device` is recorded (unless
  /// someone else records already) for the window's first `eventSteps` steps.
  explicit StepTrace(memory::MemoryDomain& device, int64_t skipSteps = 0, int64_t spanSteps = 1000,
                     int64_t eventSteps = 2);
  ~StepTrace();
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  /// Marks the end of a step (it started at the previous mark, or at construction).
  void stepDone();
  /// Stops recording and writes trace.json to `path`.
  void write(const std::string& path);

 private:
  void startRecording();
  void stopRecording();

  struct Span {
    int64_t step;  // 1-based
    int64_t startNs, endNs;
    CategoryBytes liveAfter;
  };
  memory::MemoryDomain& device_;
  int64_t skipSteps_, spanSteps_, eventSteps_;
  int64_t originNs_, lastNs_;
  int64_t steps_ = 0;
  bool recording_ = false;
  CategoryBytes base_{};
  std::vector<memory::MemoryEvent> events_;
  std::vector<Span> spans_;
};

}  // namespace pipefb::report
