// The runtime's weight versions, their offload, the prediction and the weight syncs
// (WeightVersions.h and its Notes).
#include "WeightVersions.h"

#include "EngineImpl.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryScope.h"

namespace pipefb::runtime {

void collectTensors(const std::vector<std::shared_ptr<model::Layer>>& layers,
                    std::vector<Tensor>& params, std::vector<Tensor>& buffers) {
  for (const auto& l : layers) {
    for (auto& p : l->parameters()) params.push_back(p);
    for (auto& b : l->buffers()) buffers.push_back(b);
  }
}

// A copy of `params`/`buffers` in `domain` under `category`, as a replica of `stage`.
// shareBuffers: the replica's buffers are `buffers` themselves (Note [Snapshots share
// buffers]).
ReplicaPtr makeReplica(const std::shared_ptr<ShellPool>& pool, int stage, int version,
                       const std::vector<Tensor>& params, const std::vector<Tensor>& buffers,
                       memory::MemoryDomain& domain, MemoryCategory category, bool shareBuffers) {
  auto shell = pool->acquire(stage);
  PIPEFB_ASSERT(shell->params.size() == params.size() && shell->buffers.size() == buffers.size(),
                "replica shell of stage " << stage << " does not match the stage");
  {
    memory::MemoryScope scope(domain, category);
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < params.size(); ++i)
      shell->params[i].set_data(params[i].detach().clone());
    for (size_t i = 0; i < buffers.size(); ++i)
      shell->buffers[i].set_data(shareBuffers ? buffers[i].detach() : buffers[i].detach().clone());
  }
  auto* r = new Replica;
  r->stage = stage;
  r->version = version;
  r->layers = shell->layers;
  r->params = shell->params;
  r->buffers = shell->buffers;
  r->shell = std::move(shell);
  return ReplicaPtr(r, [pool](Replica* p) {
    p->params.clear();
    p->buffers.clear();
    p->layers.clear();
    pool->release(std::move(p->shell));
    delete p;
  });
}

void PipelineEngine::Impl::precomputeVersions(StageState& st) {
  const int N = static_cast<int>(K) * M;
  st.fVersion.assign(N, 0);
  st.bVersion.assign(N, 0);
  int v = 0;
  for (const Action& a : plan.schedule.devices[st.fDev]) {
    if (a.stage != st.index) continue;
    if (a.type == ActionType::RecvWeights) v = a.index + 1;
    if (a.type == ActionType::Step && !st.split) v = a.index + 1;
    if (a.type == ActionType::Forward) st.fVersion[a.index] = v;
  }
  v = 0;
  for (const Action& a : plan.schedule.devices[st.bDev]) {
    if (a.stage != st.index) continue;
    if (a.type == ActionType::Step) v = a.index + 1;
    if (a.isInputBackward()) st.bVersion[a.index] = v;
  }
  for (int m = 0; m < N; ++m)
    if (st.fVersion[m] != st.bVersion[m]) st.lastUse[st.fVersion[m]] = m;
}

// The weights F(s,m) runs on (Note [Weights, versions and replicas]).
ReplicaPtr PipelineEngine::Impl::forwardReplica(StageState& st, int mb) {
  if (st.split) return st.fwd;
  if (st.fVersion[mb] == st.bVersion[mb]) return st.master;
  // A STEP comes between F and B on this device: run on (and stash) a snapshot.
  // Note [Snapshots share buffers]: a snapshot versions the weights only. Its buffers are
  // the master's, so that the forwards it runs update the stage's BatchNorm statistics
  // (with copies, pipedream lost every update made on a snapshot).
  ReplicaPtr snap = st.snapshot.lock();
  // The validator refuses an OFFW before the version's last F; its storage is gone.
  PIPEFB_ASSERT(!(snap && snap->version == st.masterVersion && st.away.count(st.masterVersion)),
                "F" << st.index << "." << mb << " runs on weight version " << st.masterVersion
                    << ", which is in the host pool");
  if (!snap || snap->version != st.masterVersion) {
    snap = makeReplica(pool, st.index, st.masterVersion, st.master->params, st.master->buffers,
                       *devices[st.fDev].domain, MemoryCategory::WeightVersions,
                       /*shareBuffers=*/true);
    st.snapshot = snap;
    // Note [Weight-version offload in the runtime]: OFFW/DROPW find it here.
    if (st.offloadWeights) st.versions[st.masterVersion] = snap;
  }
  return snap;
}

ReplicaPtr PipelineEngine::Impl::backwardReplica(StageState& st, int mb, const StashEntry& e) {
  const int v = st.fVersion[mb];
  // Before B or its recompute reads it; a B on the live weights (fVersion == bVersion)
  // does not need the stashed copy of the same version number.
  if (st.fVersion[mb] != st.bVersion[mb] && st.away.count(v)) bringVersionBack(st, v);
  if (e.replica) return e.replica;
  if (st.predict && v > 0) {  // Note [Weight prediction]: F ran on the prediction
    if (v == st.masterVersion) return st.predicted;
  } else if (v == st.masterVersion) {
    return st.master;
  }
  auto it = st.versions.find(v);
  PIPEFB_ASSERT(it != st.versions.end(),
                "weight version " << v << " of stage " << st.index << " was not kept");
  return it->second;
}

void PipelineEngine::Impl::releaseVersion(StageState& st, int mb) {
  auto lu = st.lastUse.find(st.fVersion[mb]);
  if (lu != st.lastUse.end() && lu->second == mb) st.versions.erase(st.fVersion[mb]);
}

// Before STEP: the weight versions later work still needs.
void PipelineEngine::Impl::keepVersionsBeforeStep(DeviceState& dev, StageState& st) {
  // Keep the version that later backwards still recompute with (split + checkpoint):
  // the weights its forwards ran on. Note [Snapshots share buffers]: the weights only, as
  // the prediction (a recompute puts the statistics it advanced back, startBackward). It
  // copied the buffers: version 0 (never predicted) then held W + the buffers beside the
  // next prediction, more than the plan's 2 W (resnet50/8 pipefb-async-checkpoint-offload
  // S=3 M=1, the backward devices peaked 9832 and 10960 bytes, their stages' BatchNorm
  // statistics, above the plan; PlanRunsTest seed 3 instance 35).
  if (st.split && st.recompute && st.lastUse.count(st.masterVersion)) {
    if (st.predict && st.masterVersion > 0)
      st.versions[st.masterVersion] = st.predicted;
    else
      st.versions[st.masterVersion] =
          makeReplica(pool, st.index, st.masterVersion, st.master->params, st.master->buffers,
                      *dev.domain, MemoryCategory::WeightVersions, /*shareBuffers=*/true);
  }
  // Note [Weight prediction]: W[v] is kept in `predicted` (reused when no backward still
  // needs the previous prediction), and becomes W[v+1] + (W[v+1] - W[v]) after the step.
  if (st.predict) {
    if (!st.predicted || st.predicted.use_count() > 1) {
      st.predicted = makeReplica(pool, st.index, st.masterVersion + 1, st.master->params,
                                 st.master->buffers, *dev.domain, MemoryCategory::WeightVersions,
                                 /*shareBuffers=*/true);
    } else {
      torch::NoGradGuard noGrad;
      for (size_t i = 0; i < st.predicted->params.size(); ++i)
        st.predicted->params[i].copy_(st.master->params[i]);
      st.predicted->version = st.masterVersion + 1;
    }
  }
}

// After STEP: the prediction W[v+1] + (W[v+1] - W[v]) (Note [Weight prediction]).
void PipelineEngine::Impl::predictAfterStep(StageState& st) {
  if (!st.predict) return;
  torch::NoGradGuard noGrad;
  for (size_t i = 0; i < st.predicted->params.size(); ++i)
    st.predicted->params[i].mul_(-1).add_(st.master->params[i], 2);
}

// Note [Weight-version offload in the runtime]
// OFFW/PREW/DROPW (Note [Weight-version offload] in Lowering.h) move a stashed version's
// replica (Note [Weights, versions and replicas]) under TransferKey {1, stage, version},
// category weight_versions on the device and in the host pool:
//  * OFFW hands the parameters' bytes to the device's copy engine and leaves the replica's
//    parameters without storage: the StorageImpl each parameter shares with every view of
//    it (a pending autograd graph holds views, e.g. Linear's weight.t()) gives up its
//    DataPtr, which the copy owns and frees when its D2H copy is done (Note [Release as
//    copied]). Swapping storage like this is what FSDP does to free parameters that views
//    and graphs still name. Buffers stay (snapshots share the master's).
//  * PREW queues the H2D copy into the device's domain; B acquires it before it or its
//    recompute reads the version (stall counted) and the prefetched DataPtrs go back into
//    the same StorageImpls, so the graph, the snapshot and the stash see the weights again.
//  * DROPW forgets the version: the replica goes (with its last stash) and so does any
//    copy still in the host pool.
// Same-device stages (pipedream) keep their snapshots in StageState::versions from their
// first F to DROPW; split stages (pipefb-async, checkpoint kinds) keep the version made at
// STEP there as before.
namespace {
// The bytes of `p` as a tensor of their own; `p` (and its views) keep a storage without data.
Tensor takeStorage(const Tensor& p) {
  c10::StorageImpl* impl = p.storage().unsafeGetStorageImpl();
  PIPEFB_ASSERT(p.is_contiguous() && p.storage_offset() == 0 &&
                    impl->nbytes() == static_cast<size_t>(tensorBytes(p)),
                "a weight version's parameter does not own its storage");
  c10::Storage owned(c10::Storage::use_byte_size_t(), impl->nbytes(),
                     impl->set_data_ptr(c10::DataPtr(nullptr, impl->device())),
                     /*allocator=*/nullptr, /*resizable=*/false);
  torch::NoGradGuard noGrad;
  return torch::empty({0}, p.options()).set_(owned, 0, p.sizes(), p.strides());
}
// Gives `p`'s storage the bytes of `t` (same size, contiguous): the inverse of takeStorage.
void giveStorage(const Tensor& p, const Tensor& t) {
  c10::StorageImpl* dst = p.storage().unsafeGetStorageImpl();
  c10::StorageImpl* src = t.storage().unsafeGetStorageImpl();
  PIPEFB_ASSERT(!dst->data() && t.is_contiguous() && t.storage_offset() == 0 &&
                    src->nbytes() == dst->nbytes(),
                "weight version restored into a parameter of another size");
  dst->set_data_ptr(src->set_data_ptr(c10::DataPtr(nullptr, src->device())));
}
offload::TransferKey versionKey(int stage, int version) { return {1, stage, version}; }
}  // namespace

// Note [Copies held through the next compute]
// On a stage whose F and B run on one device and whose weight versions move (OFFW: the
// schedule stashes them, Note [Weight-version offload] in schedules/Lowering.h), the
// device copy of every offload, a version's or a stash's, is held (Note [Held offload
// copies] in offload/TransferManager.h) until the device's next compute action has ended
// (or its next offload is issued, or the same key is prefetched: then the copy is the
// prefetch's bytes), not released as copied: that action runs beside it every time, as the
// planner's cost model charges (Note [Held at a same-device stage's starts] in
// schedules/Lowering.h: the last offload a device issued is counted until it issues
// another), and after it the copy is gone once done. Released as copied, whether it was
// still there when that action peaked was the copy engine's timing. Measured (PlanRunsTest,
// analytic times): gpt2-tiny pipedream-offload S=3 M=4 (seed 0 instance 26): the
// embedding's device peaked in a B of its drain (no input waiting) beside 2 versions where
// 3 can be (B0.5 runs on version 3, version 4 is prefetched for B0.6, OFFW0.5 came right
// before), 12.1% below the plan; with versions held, 0.1% below. Seed 2's 21 and seed 3's
// 19 (M=2): -11.7% to -1.9% and -0.1%. resnet50/8 pipedream-offload S=3 M=2 (seed 2's 44):
// F0.2 runs after OFF0.1 and PRE0.0, beside 3 stashes when OFF0.1's copy lags; it did not,
// 19.1% below the plan that charged them; with stashes held too, -3.9%. Held until the device's
// next OFF instead (after its next F), stage 0 held lookahead + 3 versions in WeightOffloadTest,
// one more than charged; held to the end of the next compute, at most lookahead + 2 there.

void PipelineEngine::Impl::bringVersionBack(StageState& st, int v) {
  DeviceState& dev = devices[st.bDev];
  auto it = st.versions.find(v);
  PIPEFB_ASSERT(it != st.versions.end(), "weight version " << v << " of stage " << st.index
                                                           << " was offloaded and forgotten");
  auto tensors = transfers->acquire(dev.id, versionKey(st.index, v), *dev.domain,
                                    MemoryCategory::WeightVersions);
  const auto& params = it->second->params;
  PIPEFB_ASSERT(tensors.size() == params.size(), "weight version came back with "
                                                     << tensors.size() << " of " << params.size()
                                                     << " parameters");
  for (size_t i = 0; i < params.size(); ++i) giveStorage(params[i], tensors[i]);
  st.away.erase(v);
}

void PipelineEngine::Impl::offloadVersion(DeviceState& dev, const Action& a) {
  StageState& st = stages[a.stage];
  auto it = st.versions.find(a.index);
  if (it == st.versions.end() || st.away.count(a.index))
    throw InternalError("OFFW" + std::to_string(a.stage) + "." + std::to_string(a.index) +
                        ": that weight version is not on device " + std::to_string(dev.id));
  std::vector<Tensor> bytes;
  for (const auto& p : it->second->params) bytes.push_back(takeStorage(p));
  st.away.insert(a.index);
  // Note [Copies held through the next compute]
  offloadThroughCompute(dev, versionKey(a.stage, a.index), std::move(bytes),
                        MemoryCategory::WeightVersions);
}

void PipelineEngine::Impl::offloadThroughCompute(DeviceState& dev, offload::TransferKey key,
                                                 std::vector<Tensor> tensors,
                                                 MemoryCategory category) {
  transfers->offload(dev.id, key, std::move(tensors), category, /*hold=*/true);
  dev.heldThroughCompute.push_back(key);
}

void PipelineEngine::Impl::releaseHeldThroughCompute(DeviceState& dev) {
  for (const offload::TransferKey& k : dev.heldThroughCompute) transfers->releaseHold(k);
  dev.heldThroughCompute.clear();
}

void PipelineEngine::Impl::releaseHeldThroughCompute(DeviceState& dev, offload::TransferKey key) {
  auto& held = dev.heldThroughCompute;
  for (auto it = held.begin(); it != held.end(); ++it) {
    if (it->kind == key.kind && it->stage == key.stage && it->index == key.index) {
      transfers->releaseHold(key);
      held.erase(it);
      return;
    }
  }
}

void PipelineEngine::Impl::prefetchVersion(DeviceState& dev, const Action& a) {
  releaseHeldThroughCompute(dev, versionKey(a.stage, a.index));  // held: the same bytes
  transfers->prefetch(dev.id, versionKey(a.stage, a.index), *dev.domain,
                      MemoryCategory::WeightVersions);
}

void PipelineEngine::Impl::dropVersion(DeviceState& dev, const Action& a) {
  StageState& st = stages[a.stage];
  if (st.away.erase(a.index)) transfers->drop(versionKey(a.stage, a.index));
  st.versions.erase(a.index);
}

// Note [Weight syncs]
// Note [Weights by reference]
// pipefb-async with a graph stash: SyncWeights(s, k) sends the weights themselves (the
// master's, the host master's, or the prediction), not a snapshot, and STEP(s, k + 1)
// waits until RecvWeights(s, k) copied them into the forward device's new copy (the
// schedule's edge RW(s, k) -> STEP(s, k + 1), Note [Abstract run] in schedules/
// Validator.h). The backwards between only add to .grad. A snapshot was held on the
// backward device until RecvWeights, which the forward device runs after F(s, (k + 1)M):
// whether it was still there when B(s, (k + 1)M) peaked was a race (alexnet/8
// pipefb-async-offload S=2 M=1: exact in 4 runs, 15.9% below the plan in 2; resnet50/8
// pipefb-async-keep S=2 M=4: the last stage's device 17% below, holding none; PlanRunsTest).
// Only when the forward device is in this process (a message to another is a copy).
void PipelineEngine::Impl::execSyncWeights(DeviceState& dev, const Action& a) {
  StageState& st = stages[a.stage];
  const bool fromHost = st.optimizerOnHost && !st.predict;
  const std::vector<Tensor>& w = st.predict ? st.predicted->params
                                 : fromHost ? st.hostParams
                                            : st.master->params;
  const ChanKey key{Chan::Weights, a.stage, a.index, a.peer};
  if (!isLocal(a.peer)) return post(a.peer, key, w);
  Message m;
  if (!async) {
    m.tensors = w;
  } else if (st.predict && st.recompute) {
    // Under a checkpoint kind, the prediction itself, by reference: it is also the version
    // the coming backwards recompute with (keepVersionsBeforeStep keeps it and makes the
    // next prediction in a new replica, as it does while this message holds it: no STEP
    // writes into it before RecvWeights copied it). A snapshot of it was a third copy
    // beside the version and the next prediction (resnet50/8 pipefb-async-checkpoint
    // went out of memory holding all three; PlanRunsTest seed 1). Not for the graph
    // kinds, which keep no version: the prediction is reused in place at the next STEP.
    m.tensors = w;
    m.owner = st.predicted;
  } else if (!st.recompute && isLocal(st.fDev)) {
    // Note [Weights by reference]: the graph kinds' weights as they are; the next STEP
    // waits for RecvWeights.
    m.tensors = w;
    m.owner = st.predicted;
  } else {
    memory::MemoryScope scope(fromHost ? *host : *dev.domain, MemoryCategory::CommBuffers);
    torch::NoGradGuard noGrad;
    for (const auto& t : w) m.tensors.push_back(t.detach().clone());
  }
  channels.put(key, std::move(m));
}

void PipelineEngine::Impl::execRecvWeights(DeviceState& dev, const Action& a) {
  StageState& st = stages[a.stage];
  const ChanKey key{Chan::Weights, a.stage, a.index, dev.id};
  const bool local = isLocal(a.peer);
  Message m = local ? channels.take(key) : Message{receive(a.peer, key), nullptr, nullptr};
  std::vector<Tensor> w = std::move(m.tensors);  // m.owner: held until the copy is done
  // Note [Forward device memory] (planner/CostModel.h): pipefb-async with a graph stash
  // always builds a new copy and holds the old one until the next RecvWeights, so that F
  // runs beside 2 W, as the plan charges, from the first RecvWeights on. Decided by the
  // plan, not by whether a stash still used the copy (st.fwd.use_count(), timing: the
  // forward device then peaked at 1 W or 2 W from one run of a plan to the next).
  // The copy before the old one goes first: 2 W while the new one is built, never 3.
  if (async && !st.recompute) {
    st.previousFwd.reset();
    ReplicaPtr next = makeReplica(pool, st.index, a.index + 1, w, st.fwd->buffers, *dev.domain,
                                  MemoryCategory::Weights);
    st.previousFwd = std::move(st.fwd);
    st.fwd = std::move(next);
    // Note [Weights by reference]: copied; the backward device's next STEP may go.
    w.clear();
    m = Message{};
    {
      std::lock_guard<std::mutex> lock(mu);
      st.weightsReceived = a.index;
    }
    cv.notify_all();
    return;
  }
  if (st.fwd.use_count() == 1) {  // into place, tensor by tensor
    st.fwd->version = a.index + 1;
    if (local && st.optimizerOnHost && !st.predict) {  // from the host master: H2D
      waitCopy(dev, transfers->copyInPlace(dev.id, {2, a.stage, a.index}, st.fwd->params,
                                           std::move(w), /*toHost=*/false));
      return;
    }
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < w.size(); ++i) {
      st.fwd->params[i].copy_(w[i]);
      w[i] = Tensor();  // a snapshot shrinks as it is copied
    }
  } else {
    // A pending graph still uses the current copy: new weights go into a new copy.
    st.fwd = makeReplica(pool, st.index, a.index + 1, w, st.fwd->buffers, *dev.domain,
                         MemoryCategory::Weights);
  }
}

}  // namespace pipefb::runtime
