#include "pipefb/report/StepTrace.h"

#include "pipefb/report/ChromeTrace.h"

namespace pipefb::report {

StepTrace::StepTrace(memory::MemoryDomain& device, int64_t eventSteps, int64_t spanSteps)
    : device_(device), eventSteps_(eventSteps), spanSteps_(spanSteps) {
  base_ = device_.stats().liveByCategory();
  originNs_ = lastNs_ = memory::nowNs();
  if (eventSteps_ > 0 && !memory::isRecording()) {
    memory::setRecording(true);
    recording_ = true;
  }
}

StepTrace::~StepTrace() {
  if (recording_) memory::setRecording(false);
}

void StepTrace::stopRecording() {
  if (!recording_) return;
  auto ev = memory::drainEvents();
  events_.insert(events_.end(), ev.begin(), ev.end());
  memory::setRecording(false);
  recording_ = false;
}

void StepTrace::stepDone() {
  const int64_t now = memory::nowNs();
  if (steps_ < spanSteps_) spans_.push_back({lastNs_, now, device_.stats().liveByCategory()});
  lastNs_ = now;
  ++steps_;
  if (steps_ >= eventSteps_) stopRecording();
}

void StepTrace::write(const std::string& path) {
  stopRecording();
  ChromeTrace trace(originNs_);
  trace.addProcess(0, device_.name());
  trace.addThread(0, 0, "compute");
  for (size_t i = 0; i < spans_.size(); ++i) {
    trace.addSpan(0, 0, "step " + std::to_string(i + 1), "step", spans_[i].startNs, spans_[i].endNs,
                  {{"step", i + 1}});
    trace.addMemoryCounter(0, "memory", spans_[i].endNs, spans_[i].liveAfter);
  }
  trace.addMemoryEvents(events_, {{device_.id(), base_}}, {{device_.id(), 0}});
  trace.write(path, {{"schedule", "none"}, {"stages", 1}, {"steps_traced", spans_.size()}});
}

}  // namespace pipefb::report
