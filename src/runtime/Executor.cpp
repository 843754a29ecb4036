// The engine's workers: one thread per device of this process runs its action list
// through one exhaustive switch (STYLE.md habit 3), with one exec...() per action in the
// file of its concept (StageCompute, Channels, Stash, WeightVersions, OptimizerStep,
// GradBuckets). A worker's first failure stops the pipeline; raiseFailure() re-raises it
// on the caller's thread with the step x device grid.
#include "EngineImpl.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/runtime/DeviceBinding.h"
#include "pipefb/schedules/ScheduleError.h"
#include "pipefb/schedules/Validator.h"

namespace pipefb::runtime {

void PipelineEngine::Impl::workerMain(int d) {
  // Note [Intra-op threads] in MemoryScope.h: one intra-op thread per device worker.
  memory::oneIntraOpThread();
  bindDeviceThreads(options.bind, d, transfers.get());  // Note [Device binding]
  DeviceState& dev = devices[d];
  memory::MemoryScope scope(*dev.domain, MemoryCategory::WorkingSet);
  const auto& list = plan.schedule.devices[d];
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    if (aborted.load()) return;
    const Action& a = list[i];
    current[d] = i;
    try {
      fetchExternal(dev, a);  // waiting for step() is not part of the action
      if (options.beforeAction) options.beforeAction(d, i);
      dev.waitedNs = 0;
      int64_t start = memory::nowNs();
      execute(dev, a);
      if (a.isCompute())
        releaseHeldThroughCompute(dev);  // Note [Copies held through the next compute]
      int64_t end = memory::nowNs();
      schedules::ActionSpan r;
      r.start = secondsSinceOrigin(start);
      r.end = secondsSinceOrigin(end);
      r.liveAfter = dev.domain->stats().liveByCategory();
      {
        std::lock_guard<std::mutex> lock(mu);
        dev.records.push_back(r);
        // Note [Busy seconds]: without the action's waits for other devices.
        if (a.isCompute() || a.type == ActionType::Step)
          dev.busy += static_cast<double>(end - start - dev.waitedNs) * 1e-9;
        done[d] = i + 1;
        ++progress;
      }
      cv.notify_all();
    } catch (const Cancelled&) {
      return;
    } catch (const offload::TransferCancelled&) {
      return;
    } catch (...) {
      fail(d, i, std::current_exception());
      return;
    }
  }
}

void PipelineEngine::Impl::fail(int d, int i, std::exception_ptr e) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!failure) failure = Failure{d, i, e, ""};
    first = failure->error == e;
  }
  if (options.group && first) {
    // Note [Channels across processes]: the job's first failure goes to the rendezvous
    // store, so that ranks that only see a neighbour go can name where it started.
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
    }
    published = "rank " + std::to_string(options.group->rank()) + " at action " +
                schedules::toString(plan.schedule.devices[d][i]) + ": " +
                what.substr(0, what.find('\n'));
    options.group->publishFailure(published);
  }
  aborted = true;
  channels.close();
  if (transfers) transfers->close();
  if (options.group) options.group->abort();  // wakes this process's c10d receives
  cv.notify_all();
}

// Inputs and targets come from step(); the wait for them is idle time, not the action.
void PipelineEngine::Impl::fetchExternal(DeviceState& dev, const Action& a) {
  if (a.type == ActionType::Forward && a.stage == 0 && !dev.inputs.count({0, a.index}))
    dev.inputs[{0, a.index}] = channels.take({Chan::Input, 0, a.index, dev.id}).tensors.at(0);
  if (a.isInputBackward() && a.stage == S - 1 && !dev.targets.count({S - 1, a.index}))
    dev.targets[{S - 1, a.index}] =
        channels.take({Chan::Target, S - 1, a.index, dev.id}).tensors.at(0);
}

// STYLE.md habit 3: one exhaustive switch (-Werror=switch), one exec...() per action.
void PipelineEngine::Impl::execute(DeviceState& dev, const Action& a) {
  switch (a.type) {
    case ActionType::Forward:
      return execForward(dev, a);
    case ActionType::Backward:
      return execBackward(dev, a);
    case ActionType::SendAct:
      return execSendAct(dev, a);
    case ActionType::RecvAct:
      return execRecvAct(dev, a);
    case ActionType::SendGrad:
      return execSendGrad(dev, a);
    case ActionType::RecvGrad:
      return execRecvGrad(dev, a);
    case ActionType::Offload:
      return execOffload(dev, a);
    case ActionType::Prefetch:
      return execPrefetch(dev, a);
    case ActionType::Drop:
      return execDrop(dev, a);
    case ActionType::Step:
      return execStep(dev, a);
    case ActionType::SyncWeights:
      return execSyncWeights(dev, a);
    case ActionType::RecvWeights:
      return execRecvWeights(dev, a);
    case ActionType::AllReduce:
      return execAllReduce(dev, a);
    case ActionType::InputGrad:
      return execInputGrad(dev, a);
    case ActionType::WeightGrad:
      return execWeightGrad(dev, a);
  }
  PIPEFB_ASSERT(false, "unknown action type " << static_cast<int>(a.type));
}

// ------------------------------------------------------------------------ control

void PipelineEngine::Impl::stopWorkers() {
  if (joined) return;
  if (options.group) {  // wake this process's c10d receives unless all is done
    bool pending = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (int d = 0; d < D; ++d)
        pending = pending || done[d] < static_cast<int>(plan.schedule.devices[d].size());
    }
    if (pending) options.group->abort();
  }
  aborted = true;
  channels.close();
  if (transfers) transfers->close();
  for (auto& w : workers)
    if (w.joinable()) w.join();
  joined = true;
  // Free what the workers left behind on this thread (the domains keep counting).
  channels.clear();
  for (auto& d : devices) {
    d.acts.clear();
    d.grads.clear();
    d.inputs.clear();
    d.targets.clear();
    d.stashes.clear();
    d.remoteStash.clear();
  }
}

void PipelineEngine::Impl::raiseFailure() {
  stopWorkers();
  Failure f = *failure;
  std::vector<schedules::GridMark> marks;
  std::string where;
  if (f.device >= 0) {
    marks.push_back({f.device, f.action});
    where = "device " + std::to_string(f.device) + " (" + devices[f.device].domain->name() +
            ") at action " + schedules::toString(plan.schedule.devices[f.device][f.action]) +
            " (step " + std::to_string(f.action) + ")";
  } else {
    for (int d = 0; d < D; ++d)
      if (current[d] < static_cast<int>(plan.schedule.devices[d].size()) &&
          done[d] < static_cast<int>(plan.schedule.devices[d].size()))
        marks.push_back({d, current[d]});
  }
  const std::string grid = schedules::formatPipelineOrder(plan.schedule, marks);
  if (!f.error) throw PipelineError(f.stall + "\n" + grid, -1, -1, nullptr);
  std::string what;
  try {
    std::rethrow_exception(f.error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  if (options.group) {  // name where a cascade of failures started
    const std::string origin = options.group->firstFailure();
    if (!origin.empty() && origin != published) what += "; the job's first failure: " + origin;
    // Note [Gone ranks] (ProcessGroup.cpp): no first failure (the store went with rank 0, or
    // a rank was killed): name the ranks of this host whose process is gone.
    if (origin.empty()) {
      std::string gone;
      for (int r : options.group->goneRanks())
        if (what.find("rank " + std::to_string(r) + " is gone") == std::string::npos)
          gone += (gone.empty() ? "rank " : ", rank ") + std::to_string(r);
      if (!gone.empty()) what += "; gone on this host: " + gone;
    }
  }
  std::string msg = "pipeline " + kind + " failed on " + where + ": " + what + "\n" + grid;
  if (auto oom = memory::findOutOfMemory(f.error))
    throw PipelineOutOfMemoryError(*oom, msg, f.device, f.action);
  throw PipelineError(msg, f.device, f.action, f.error);
}

}  // namespace pipefb::runtime
