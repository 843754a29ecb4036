#pragma once
// Private to src/runtime: the stash registry. A StashEntry is what B(s,m) needs from
// F(s,m); it lives in its forward device's DeviceState::stashes until OFF hands it to the
// host registry (Chan::Stash) and the transfer manager, and B takes it back
// (PipelineEngine::Impl::takeStash, Stash.cpp).
//
// Note [Asynchronous host copies]
// (It replaces Note [Synchronous host copies].) OFF and PRE go through the data-transfer
// manager (pipefb/offload/TransferManager.h), one copy engine per device:
//  * OFF s.m hands the stash's tensors to the forward device's copy engine (D2H into the
//    host pool); the device copy goes when the copy is done, not at the end of OFF
//    (Note [Resident offloaded stashes]). What is offloaded: the stage input for the
//    checkpoint kinds; everything autograd saved (Note [Saved-tensor hooks]) for the
//    offload policy, and for keep on a split PipeFB stage (effectivePolicy()).
//    The rest of the entry (graph root, replica) travels through the host registry
//    (Chan::Stash) and holds no device memory.
//  * PRE s.m queues the H2D copy into the backward device's domain on its copy engine. It
//    never blocks the compute thread: when the OFF has not run yet (another device's), the
//    copy engine waits for it.
//  * B acquires the stash: it waits for the copy (counted as stall) or, with no PRE
//    before it, issues the copy itself.
//
// Note [The registry's only reference]
// The entry that OFF puts in the host registry is the only reference to it: B(s,m)
// fills it with the backward device's tensors (bringToDevice), so whoever else still held
// the entry would hold B's stash past B. OFF used to put a copy of its StashPtr and drop
// its own at its return; on a busy machine the forward device's thread was preempted
// there while B(s,m) ran on the backward device and ended, and that device's stash went
// only when the forward device's OFF returned: beside the next PRE's stash, a stash more
// than the schedule holds at B (mlp pipefb-async-checkpoint-offload S=3 M=1 folded, the
// device of F0 and B2 peaked at 2 of fc3's stashes in about 1 run of 15 under load, 1 in
// the others; PlanRunsTest seed 3 instance 45). Moved into the registry, the backward
// device's stash goes when B ends, on B's own thread, whatever the timing.
#include <torch/torch.h>

#include <memory>

#include "pipefb/offload/SavedTensorHooks.h"

namespace pipefb::runtime {

struct Replica;  // EngineImpl.h

// What B(s,m) needs from F(s,m) (DESIGN.md, "stash").
struct StashEntry {
  bool graph = false;    // keep: the autograd graph of F; else a checkpoint of the input
  torch::Tensor input;   // graph: the leaf F ran on; checkpoint: the saved stage input
  torch::Tensor output;  // graph: the root of the graph
  // graph: the weights it ran on; checkpoint: a snapshot, or null
  std::shared_ptr<Replica> replica;
  // graph under the offload policy: what autograd saved (Note [Saved-tensor hooks]).
  std::shared_ptr<offload::SavedTensorGroup> saved;
  bool onHost = false;       // its tensors are with the transfer manager
  int stage = 0, index = 0;  // (stage, microbatch): its transfer key
};
using StashPtr = std::shared_ptr<StashEntry>;

}  // namespace pipefb::runtime
