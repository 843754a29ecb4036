#include "pipefb/report/StepTrace.h"

#include "pipefb/report/ChromeTrace.h"

namespace pipefb::report {

StepTrace::StepTrace(memory::MemoryDomain& device, int64_t skipSteps, int64_t spanSteps,
                     int64_t eventSteps)
    : device_(device), skipSteps_(skipSteps), spanSteps_(spanSteps), eventSteps_(eventSteps) {
  originNs_ = lastNs_ = memory::nowNs();
  if (skipSteps_ == 0) startRecording();
}

StepTrace::~StepTrace() {
  if (recording_) memory::setRecording(false);
}

void StepTrace::startRecording() {
  if (eventSteps_ <= 0 || spanSteps_ <= 0 || memory::isRecording()) return;
  base_ = device_.stats().liveByCategory();
  memory::setRecording(true);
  recording_ = true;
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
  if (steps_ >= skipSteps_ && steps_ < skipSteps_ + spanSteps_)
    spans_.push_back({steps_ + 1, lastNs_, now, device_.stats().liveByCategory()});
  lastNs_ = now;
  ++steps_;
  if (steps_ >= skipSteps_ + eventSteps_) stopRecording();
  if (steps_ == skipSteps_) startRecording();
}

void StepTrace::write(const std::string& path) {
  stopRecording();
  ChromeTrace trace(originNs_);
  trace.addProcess(0, device_.name());
  trace.addThread(0, 0, "compute");
  for (const Span& span : spans_) {
    trace.addSpan(0, 0, "step " + std::to_string(span.step), "step", span.startNs, span.endNs,
                  {{"step", span.step}});
    trace.addMemoryCounter(0, "memory", span.endNs, span.liveAfter);
  }
  trace.addMemoryEvents(events_, {{device_.id(), base_}}, {{device_.id(), 0}});
  trace.write(path, {{"schedule", "none"}, {"stages", 1}, {"steps_traced", spans_.size()}});
}

}  // namespace pipefb::report
