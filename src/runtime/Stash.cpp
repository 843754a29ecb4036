// The stash registry: OFF, PRE and DROP of stashes, and B's take (Stash.h, Note
// [Asynchronous host copies]). Weight versions go through WeightVersions.
#include "Stash.h"

#include <future>

#include "EngineImpl.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/schedules/HeldOffloads.h"

namespace pipefb::runtime {

StashPtr PipelineEngine::Impl::takeStash(DeviceState& dev, int stage, int mb) {
  auto it = dev.stashes.find({stage, mb});
  if (it != dev.stashes.end()) {
    StashPtr e = it->second;
    dev.stashes.erase(it);
    return e;
  }
  if (!isLocal(stages[stage].fDev)) {  // Note [Channels across processes]
    std::vector<Tensor> t;
    auto f = dev.remoteStash.find({stage, mb});
    if (f != dev.remoteStash.end()) {
      t = f->second.get();
      dev.remoteStash.erase(f);
    } else {
      memory::MemoryScope scope(MemoryCategory::Stash);
      t = options.group->recv(rankOf(stages[stage].fDev), tagOf({Chan::Stash, stage, mb, dev.id}));
    }
    auto e = std::make_shared<StashEntry>();
    e->input = t.at(0);
    e->stage = stage;
    e->index = mb;
    return e;
  }
  // Offloaded and not prefetched yet (its OFF ran after our PRE): fetch it now.
  StashPtr e = channels.take({Chan::Stash, stage, mb, -1}).stash;
  bringToDevice(dev, *e);
  return e;
}

void PipelineEngine::Impl::bringToDevice(DeviceState& dev, StashEntry& e) {
  if (!e.onHost) return;
  // Note [Prefetches across a flush]: the destinations of this iteration's prefetches.
  auto tensors = transfers->acquire(dev.id, {0, e.stage, e.index}, *dev.domain,
                                    MemoryCategory::Stash, prefetchEpoch(e.index));
  if (e.saved)
    e.saved->restore(std::move(tensors));
  else
    e.input = std::move(tensors.at(0));
  e.onHost = false;
}

// Note [Held offloads] (schedules/HeldOffloads.h): which OFFs keep their device copy, read
// off the lowered schedule, as the simulator reads it. Only a stash that goes to a local
// backward device goes through the transfer manager (Note [Channels across processes]).
void PipelineEngine::Impl::planHeldOffloads() {
  // Note [Copies held through the next compute] (WeightVersions.cpp)
  for (const auto& list : plan.schedule.devices)
    for (const Action& a : list)
      if (a.type == ActionType::Offload && a.stash == StashKind::Weights && !stages[a.stage].split)
        stages[a.stage].holdsThroughCompute = true;
  const std::vector<std::vector<int>> releases = schedules::heldOffloadReleases(
      plan.schedule, async, schedules::stepsPerMicrobatch(scheduleKind));
  for (DeviceState& dev : devices) {
    if (!isLocal(dev.id)) continue;
    const auto& list = plan.schedule.devices[dev.id];
    for (size_t i = 0; i < list.size(); ++i)
      if (releases[dev.id][i] >= 0 && isLocal(stages[list[i].stage].bDev))
        dev.heldOffloads.insert({list[i].stage, list[i].index});
  }
}

// Note [Prefetches across a flush] (schedules/HeldOffloads.h)
int PipelineEngine::Impl::prefetchEpoch(int microbatch) const {
  return schedules::prefetchEpoch(microbatch, M, async);
}

void PipelineEngine::Impl::planLaterPrefetches() {
  const std::vector<std::vector<bool>> later = schedules::prefetchesBoundLater(
      plan.schedule, async, schedules::stepsPerMicrobatch(scheduleKind));
  for (DeviceState& dev : devices) {
    if (!isLocal(dev.id)) continue;
    const auto& list = plan.schedule.devices[dev.id];
    for (size_t i = 0; i < list.size(); ++i)
      if (later[dev.id][i]) dev.laterPrefetches.insert({list[i].stage, list[i].index});
  }
}

void PipelineEngine::Impl::execOffload(DeviceState& dev, const Action& a) {
  if (a.stash == StashKind::Weights) return offloadVersion(dev, a);
  if (!isLocal(stages[a.stage].bDev)) {  // Note [Channels across processes]
    StashPtr e = takeFrom(dev.stashes, {a.stage, a.index}, "stash");
    PIPEFB_ASSERT(!e->graph, "a graph stash cannot cross processes");
    memory::MemoryScope scope(*host, MemoryCategory::CommBuffers);  // held until delivered
    const int to = stages[a.stage].bDev;
    options.group->send({e->input}, rankOf(to), tagOf({Chan::Stash, a.stage, a.index, to}));
    return;
  }
  // Note [Asynchronous host copies]
  StashPtr e = takeFrom(dev.stashes, {a.stage, a.index}, "stash");
  e->stage = a.stage;
  e->index = a.index;
  const bool hold = dev.heldOffloads.erase({a.stage, a.index}) > 0;  // Note [Held offloads]
  // Note [Copies held through the next compute] (WeightVersions.cpp)
  auto offload = [&](std::vector<Tensor> t) {
    if (stages[a.stage].holdsThroughCompute && !hold)
      return offloadThroughCompute(dev, {0, a.stage, a.index}, std::move(t), MemoryCategory::Stash);
    transfers->offload(dev.id, {0, a.stage, a.index}, std::move(t), MemoryCategory::Stash, hold);
  };
  if (!e->graph) {
    std::vector<Tensor> t{std::move(e->input)};
    e->input = Tensor();
    offload(std::move(t));
    e->onHost = true;
  } else if (e->saved) {
    offload(e->saved->take());
    e->onHost = true;
  }
  Message m;
  m.stash = std::move(e);  // Note [The registry's only reference]
  channels.put({Chan::Stash, a.stage, a.index, -1}, std::move(m));
}

void PipelineEngine::Impl::execPrefetch(DeviceState& dev, const Action& a) {
  if (a.stash == StashKind::Weights) return prefetchVersion(dev, a);
  if (!isLocal(stages[a.stage].fDev)) {  // Note [Channels across processes]
    auto group = options.group;
    memory::MemoryDomain* domain = dev.domain;
    const int from = rankOf(stages[a.stage].fDev);
    const int64_t tag = tagOf({Chan::Stash, a.stage, a.index, dev.id});
    dev.remoteStash[{a.stage, a.index}] =
        std::async(std::launch::async, [group, domain, from, tag] {
          memory::MemoryScope scope(*domain, MemoryCategory::Stash);
          return group->recv(from, tag);
        });
    return;
  }
  // Never blocks (Note [Asynchronous host copies]); B acquires. A graph stash that is not
  // offloaded (keep handed over on a split stage without saved tensors) has no copy.
  // Note [Copies held through the next compute]: a held copy is the stash itself.
  releaseHeldThroughCompute(dev, {0, a.stage, a.index});
  if (stages[a.stage].recompute || stages[a.stage].offloadSaved)
    transfers->prefetch(dev.id, {0, a.stage, a.index}, *dev.domain, MemoryCategory::Stash,
                        prefetchEpoch(a.index),
                        /*bindNow=*/!dev.laterPrefetches.count({a.stage, a.index}));
}

void PipelineEngine::Impl::execDrop(DeviceState& dev, const Action& a) {
  if (a.stash == StashKind::Weights) return dropVersion(dev, a);
  if (!dev.stashes.erase({a.stage, a.index})) {
    channels.tryTake({Chan::Stash, a.stage, a.index, -1});
    transfers->drop({0, a.stage, a.index});
  }
}

}  // namespace pipefb::runtime
