#pragma once
// The planner's cost model: what one stage costs in time and memory for a pipeline
// shape. The DP (Solver.h) and the exhaustive search (BruteForce.h) both call it, so the
// optimality test compares search strategies, never two cost models.
//
// Note [Planner cost model]
// Steady state, per microbatch of size b (the profile scaled by b / profile.microbatch,
// Note [Microbatch scaling]). Each device has three resources: a compute thread, a copy
// engine to the host pool, and one-way links to other devices. A stage's *time* is the
// busiest of the resources it uses:
//   same device:  compute = F + B (+R if checkpointed) + step/M;  copy = 2 x stash / host bw
//   PipeFB split: forward device: compute = F, copy = stash / host bw (offload);
//                 backward device: compute = B (+R) + step/M, copy = stash / host bw (prefetch)
//   (step/M: one step per iteration; PipeDream steps after every microbatch, so it pays
//   the whole step per microbatch, stepsPerMicrobatch(); the step's share includes the
//   excess of the first B after it, Note [Backward after a step]; PipeDream's F includes
//   its weight snapshot, Note [Weight snapshots])
//   boundary with the previous stage: activations one way, gradients the other, each
//   latency + bytes / bandwidth on its own link; a split last stage also sends its output
//   from its forward to its backward device.
// Copies and transfers hide under compute whenever they are shorter (they are separate
// resources), so the pipeline's pace tau is the largest of these over all stages, and
//   iteration time = (M + D - 1) x tau'  for flushing schedules (gpipe, 1f1b, pipefb-sync),
//                    D = devices along the chain (S, or 2S for PipeFB),
//                  = M x tau'            for asynchronous ones (pipedream, pipefb-async),
//   tau' = max(tau, corePace): device threads sharing fewer cores (Note [Shared cores]).
// Memory of a device, by category (the simulator's categories):
//   weights W; weight copies c x W (weightCopies: PipeDream S-s, else v-1), with an offload
//   kind and offloadWeights only min(c, lookahead + 1) x W (the contract's
//   residentStashedVersions, Note [Weight-version offload]; min(c, lookahead + 2) while
//   PipeDream's copies move, Note [Versions being copied out]; such a stage, but the last,
//   is charged its versions, stashes and inputs as held together at its starts, Note
//   [Held at a same-device stage's starts] in schedules/Lowering.h) and, when PipeDream's copies
//   move, c - 1 - floor(lookahead / 2) x W in the host pool (CostModel.cpp), their
//   OFFW/PREW on the copy engine; grads G and optimizer state O on the backward
//   device; stash = resident x stash bytes; working set = B's, in place or with the
//   gathered weight gradients (Note [Gathered weight gradients]), plus one recomputed graph while a
//   checkpointed B runs; a split stage's forward device: Note [Forward device memory].
//   stash bytes: offload = saved bytes of the stage; keep = those plus the stage's output
//   (the stash entry holds the graph root); checkpoint kinds = its input. Weights include
//   the layers' buffers (BatchNorm statistics, LayerCost::bufferBytes) on every device
//   holding a copy; comm buffers: Note [Comm buffers in the cost model].
//   resident: in-flight n from the schedule contract (inFlightStashes) when kept;
//   offloaded: min(n, lookahead + 1) near B plus one being copied out after F
//   (on a same device residentOffloadedStashes, Note [Prefetches after the forward phase]
//   in schedules/Lowering.h, and an offloaded last stage's outputs kept for the loss;
//   min(n, 1 + kOffloadsInFlight) on a split forward device, Note [Offloads in flight]).
//   host pool: n x stash bytes for each offloaded stage, and its weight copies off the device.
//
// Note [Step working set]
// The optimizer step allocates temporaries beyond its state (Adam: about 2x the largest
// parameter tensor, freed per parameter), measured per layer by the profiler
// (LayerCost::stepWorkingBytes). A stage's step transient is the largest of its layers'
// (the step walks the parameters one by one). It lands on the backward device:
//   flushing schedules step after the last B, when no stash is resident, so the device
//   needs max(stash + working set, step transient) above its states;
//   asynchronous ones step between microbatches with stashes in flight, so the transient
//   is charged on top of the stash: stash + max(working set, step transient); PipeDream
//   steps right after a B that let go of its weight copy (when it keeps copies), so there
//   the transient also has one copy's room: max(working set, step transient - W)
//   (a folded pipefb-async device counts the stashes at its STEPs, Note [Folded pace])
//   (measured: fc6 alone on a stage with 2 copies peaks at W + G + O + 2 W + B's working
//   set, 180.2 MB, not at 2 W + the transient, 205.8 MB).
// The excess over what the stash and working set already reserve is in WorkingSet.
// A device with several stages (Note [Shared devices]) runs its STEPs after its last B or
// W, so there the transient is charged beside the states alone, not beside the other
// stage's stashes (sharedDeviceMemory; StageEstimate::stepWorkingBytes).
//
// Note [Gathered weight gradients]
// The runtime's B on the master's own weights accumulates each parameter's gradient into
// its .grad as autograd makes it (Note [In-place weight gradients] in
// src/runtime/StageCompute.cpp): a fresh gradient lives only inside the layer's own working
// set, which the profiler measures so (planner/Profiler.cpp). B's working set is then
//   max over l in [first, last) of  ws(l) x scale,  and at the end the input gradient
// (stages after the first). gradientsInPlace() says which B's do: B on the master's
// weights and without gradient buckets, i.e. no replicas, no weight copy (copies == 0 on a
// stage that is not split), and on a split stage only pipefb-sync under a checkpoint kind
// (B recomputes on the master; a kept or offloaded graph was built on the forward copy).
// A split backward kind's W does the same on a stage whose F and B share a device, on the
// master's weights (weightGradientsInPlace(); its I makes no weight gradient).
// The others (PipeDream's copies, pipefb-async's versions and prediction, split kept
// graphs, the B that fills gradient buckets, and pipefb-zb's W on a split stage) ask autograd
// for the gradients of all the stage's parameters at once (torch::autograd::grad) and add
// them to the master's .grad after the whole backward. While B runs through layer l (last
// to first), the gradients of the layers after l are therefore held as fresh tensors
// beside l's own working set (which includes l's own gradients: the profile's
// gatheredWorkingBytes, measured with autograd::grad). Their working set is
//   max over l in [first, last) of  gws(l) x scale + G(l+1 .. last),
//   and at the end  G(first .. last) + the input gradient (stages after the first).
// (Measured, gathered: 4.2 MB on VGG16/4 stage 0 of 2 where the largest layer working set
// is 3.0. Charged gathered while the runtime ran in place, planner_fidelity's 1f1b stage 0
// of VGG16 w=1/4 measured 19.54 MiB against 22.55 predicted, +15.4%.)
//
// Note [Backward layer by layer]
// A fused B frees its stage's graph as it goes: autograd drops each node's saved tensors
// once the node ran, so while B runs through layer l (last to first) only the saved
// tensors of layers first .. l are live, beside l's working set (and, when B gathers, the
// gradients of the layers after it, Note [Gathered weight gradients]):
//   max over l in [first, last) of  saved(first .. l+1) + ws(l) (+ G(l+1 .. last)),
//   and at the end  the input gradient (+ G(first .. last)),
// plus the gradient of the stage's output, held throughout. Keep and offload have the
// whole graph in the stash B takes (Stash), so their working set is that less the graph;
// a checkpointed B recomputes F first (Note [Forward peak]), so its working set is the
// larger of the two. Charged whole (graph + the largest working set), VGG16/8 and
// AlexNet/8 stage 0 (checkpoint and offload, 1f1b, gpipe) peaked 15% to 18% below the
// plan (PlanRunsTest). Not on the last stage: B starts there with the loss beside the
// whole graph, so the last stage is charged whole, and at least that: the graph and the
// loss's transient (log_softmax, its gradient and the logits' gradient; measured by the
// profiler as Profile::lossWorkingBytes, 3 logits' worth on gpt2-tiny), plus F's and the
// recomputed output under a checkpoint kind (gpt2-tiny gpipe-checkpoint's last stage
// peaked 15% above the plan without the loss), and on a split last stage that does not
// recompute the output it was sent (Note [Recomputed last output]), a comm buffer held
// until the loss's backward is done: its stash is the graph alone (gpt2-tiny
// pipefb-async-keep S=3 M=1, the head's backward device peaked +12.4% without it, the
// logits beside the loss; PlanRunsTest seed 1). Charged layer by layer there, gpt2-tiny's
// last stage went out of memory (pipefb-sync-offload, both checkpoint-offload kinds).
// Not for split backward (I keeps the graph for W, Note [Split backward]).
// A checkpointed B recomputes on the stash's own tensor (startBackward detaches it, no
// copy), so what its first layer's graph saves of its input (LayerCost::savedInputBytes:
// a linear or conv layer saves all of it) is the stash, held once and charged in Stash:
// the recomputed graph is charged without it, layer by layer or whole. (Charged beside
// the stash, PlanRunsTest seed 0 instance 47, folded mlp pipefb-sync-checkpoint M=1, the
// device of F0 and B2 peaked 14.9% below the plan: fc3's recomputed graph is its input.)
// Before it recomputes, a checkpointed B copies the stage's buffers (BatchNorm's running
// statistics, which the recompute advances) and puts them back only at its end
// (startBackward's savedBuffers): their bytes are in its working set throughout. (Hidden
// by the double charge until then: seed 0 instance 35, resnet50/8 1f1b-checkpoint S=3
// M=2 at its smallest budget, went out of memory by 4 KiB on device 0, whose B held the
// 12520 bytes of stem..layer3.3's statistics.)
// Charged whole, a checkpointed B is also charged its recomputed output beside the
// output's gradient: execBackward holds it until autograd is done (seed 0 instances 31,
// 48 and 19, gpt2-tiny's head stage under pipefb-sync-checkpoint, gpipe-checkpoint and
// pipedream-checkpoint, peaked 1.8% to 3.6% above the plan once the stash was charged
// once: the logits beside their gradient in the head's B, or in block1's B beside its
// output's gradient, which the freed graph of the head had covered). Not the last stage's
// B (BR, not IR): it takes the loss in its recomputed graph and lets the output go before
// autograd runs (Note [Loss in the recomputed graph] in schedules/Lowering.h), so it is
// charged the graph beside the larger of the loss with the output until then
// (Profile::recomputedLossBytes) and the rest of B with the output's gradient.
//
// Note [What waits for W]
// Between I(s,m) and W(s,m) (Note [Split backward] in schedules/Action.h) the device keeps
// what W needs (DeferredWeightGrad, model/SplitBackward.h). Past stage 0 that is the
// stage's autograd graph (under keep and offload the stash it took back, under a
// checkpoint kind what IR's recompute saved: the whole graph, its input included) and the
// gradients flowing into its weight nodes (LayerCost::keptGradBytes); I lets the output and
// its gradient go, but not what the last layer's graph saves of the output. Stage 0 has no
// input gradient, so its W runs the whole backward from the output: it keeps the stash (or
// under a checkpoint kind the graph and the recomputed output) and the output's gradient.
// So one such stash is
//   past stage 0: graph + saved output + kept gradients;
//   stage 0:      graph + output (checkpoint kinds) or the stash (keep, offload), + the
//                 output's gradient.
// I makes the kept gradients as it goes: its working set holds them (backwardWorkingSet).
// Charged as a checkpoint (the stage input) until then, zb-h1-checkpoint on gpt2-tiny
// (S = 4, M = 4, PlanRunsTest's split-backward case) went out of memory in IR2.6 beside the
// graphs of W2.4 and W2.5: 1.72 MiB of stash where 128 KiB were charged. The cost model
// charges them at this size, the others at the stash's: at an I start the most that wait
// beside it (MemoryContract::deferredAtI) and I's working set, which holds I's own
// recomputed graph and no weight gradient; at a W start the others (deferredW counts W's
// own) and W's working set: its own stash's graph freed as autograd goes, beside the
// gathered weight gradients of the range (Note [Backward layer by layer], Note [Gathered
// weight gradients]) and its roots with their gradients (the kept ones, or stage 0's output
// and its gradient). The simulator keeps one from the end of I (CostTable::deferredBytes).
// (Charged the most that wait beside I's working set, zb-h1-checkpoint on gpt2-tiny was
// 13% to 20% above the plan on every device: 2 graphs wait only at a W start. With the
// kept gradients charged as the saved bytes and the output, before they were measured,
// gpt2-tiny zb-h1's head device peaked 12.8% below its plan: its output, the logits, goes
// at I.)
//
// Note [Loss scalars beside the backward]
// A last stage's B that takes the loss in its recomputed graph (Note [Loss in the recomputed
// graph]) runs autograd from the scaled loss with the seed ones_like(loss): two 0-dim
// tensors of the output's dtype (float32: the runtime trains in float32 only), held until
// autograd is done, beside the layers' working sets and the output's gradient that the
// head's backward reads (startBackward and execBackward, src/runtime/StageCompute.cpp).
// The profile's working sets are measured from the output's gradient, without them.
// (Hidden under a stash too many until Note [Stashes at a backward]: mlp
// pipefb-async-checkpoint-offload S=3 M=1, the device of F0 and B2 then peaked 8 bytes
// above the plan, fc3's B at 20496 + 256 + 8 bytes; PlanRunsTest seed 3 instance 45.)
//
// Note [Forward device memory]
// A split stage's forward device runs only F: its working set is F's peak beyond the stash
// it builds (Note [Forward peak]), or without autograd under a checkpoint kind (Note
// [Forward without autograd]). RecvWeights copies the new weights into
// the forward copy in place, tensor by tensor (Note [Weight syncs] in PipelineEngine.cpp):
// no message is held on the forward device (it used to be, and pipefb-sync's forward
// device then peaked at exactly 2 W). pipefb-async with a graph stash still has stashes
// referring to the old copy, so RecvWeights builds a new copy: the old copy stays until
// its stashes are consumed, so F runs beside 2 W. There pipefb-async's SyncWeights sends
// the weights themselves and the next STEP waits for RW (Note [Weights by reference] in
// runtime/WeightVersions.cpp): no snapshot. It sent a snapshot, held on the backward
// device until RW took it, and whether it was still there at B's peak was a race
// (resnet50/8 pipefb-async-keep S=2 M=4: the last stage's backward device peaked 17% below
// a plan that charged it; PlanRunsTest seed 0 21). The backward device also keeps the version
// B(s,m) runs on when a STEP came after F(s,m) (keepVersionsBeforeStep), old forward
// copy or not: charged as its weight copies on both kinds of stash (charged only on the
// forward device with a graph stash, resnet50/8 pipefb-async-keep's last backward device
// went out of memory by 56-120 KiB holding that version and the snapshot; PlanRunsTest).
// Under a checkpoint kind with weight prediction (Note [Weight prediction] in
// runtime/WeightVersions.h, on by default) the version kept is the prediction the
// forwards ran on, and the STEP makes the next prediction beside it, which SyncWeights
// sends by reference: 2 W of weight versions and no snapshot (it sent a snapshot, a
// third copy: resnet50/8 pipefb-async-checkpoint S=3 M=1 went out of memory at its
// smallest budget; PlanRunsTest seed 1). Without prediction (pipeline.weight_prediction:
// none) it is the version and a snapshot of the master: the same bytes.
//
// Note [Forward peak]
// F builds its stash layer by layer, so one microbatch's F peaks, over its layers l, at
//   saved(first .. l+1) + output(l) + F's working set(l)
// above what was live before it (the profile's numbers: what autograd keeps, the
// activation handed on, the transient beyond both), not at the whole stash plus the
// stage's largest working set: VGG16's early convolutions have the largest working sets
// and the smallest saved prefix. A split stage's forward device (keep/offload) is
// charged its earlier stashes still being copied out plus this peak (Stash: the stashes;
// WorkingSet: the peak beyond one stash). Measured, vgg16/8 pipefb-sync-keep S=2 M=1:
// cpu:0 at 3.18 MB, charged 4.99 MB before (stash + the largest working set).
//
// Note [Outputs kept between layers]
// A layer's savedBytes leave its output out, and count its input when its graph saves it
// (Note [Measured saved bytes] in Profiler.h): an output that the layer's own graph keeps
// (an in-place ReLU's result, savedOutputBytes) is in the stash through the next layer's
// savedInputBytes, if that layer saves it. ResNet's head does not (adaptive average pooling
// saves no input; its linear saves the pooled tensor, a new one): layer4.2's ReLU result,
// 1024 bytes a sample at width 1/8, was in no layer's saved bytes, and a stage holding
// layer4.2 and the head stashed that much above stashBytes (resnet50/8 pipefb-async-keep,
// M = 1, microbatch 8: offloaded 180736 bytes a stash against 172544 planned; the forward
// device held one such stash beside F's peak, +8192 bytes above the plan; PlanRunsTest seed
// 0 instance 34 and 8 more, all resnet50/8 PipeFB forward devices). So a range's graph adds,
// per layer j inside it after the first, max(0, savedOutput(j-1) - savedInput(j)); at its
// last layer stashBytes charges savedOutput (offload) or the output (keep) as before. F's
// peak at layer j holds those of the layers before j (j's own input is in its working
// set: the profiler's F holds it). Not for a profile that measured no savedInputBytes
// (analytic, or older): there 0 means not measured, and the analytic one's savedBytes
// already count what a ReLU keeps.
//
// Note [Forward without autograd]
// Under a checkpoint kind F runs with autograd off (execForward keeps a clone of the
// stage input and saves nothing): during layer l only its input, its output and its
// temporaries are live (LayerCost::noGradForwardBytes, measured so), beside the stage
// input that execForward holds until F returns. A split stage's forward device runs
// nothing else, so that is its working set; the profiled forwardWorkingBytes (autograd on,
// beyond what the layer saved and returned) missed the layers' outputs: vgg16/8
// pipefb-sync-checkpoint S=2 M=1 cpu:0 measured +54.7% above the plan.
//
// Note [Comm buffers in the cost model]
// Channels copy a message into the receiver's domain as comm_buffers. Charged:
//  * the iteration's M microbatch inputs, fed to stage 0's forward device (on a same-device
//    stage 0 once it ran every action before its first one of the iteration,
//    PipelineEngine::step, Note [Overlapping iterations]): all of them beside F(0,0), fewer
//    beside the later forwards; on a same-device stage 0, M - in-flight of them are still
//    waiting when B peaks, and M - 1 under an asynchronous kind (pipedream): from the
//    second iteration on, B(0, kM - n + 1) follows F(0, kM) with n stashes in flight;
//  * its M targets (Profile::targetBytes each) on the last stage's backward device;
//  * the gradient of a stage's output (or the loss's), held through all of B;
//  * the output a split last stage's B is sent, held through the loss (in B's working
//    set, Note [Backward layer by layer]).
// Not charged: activations and gradients that a sender posts before the receiver takes
// them (how many wait depends on timing; the measured misses are in PlanRunsTest.cpp).
//
// Note [Forward beside backward]
// A stage alone on its device with a fused B (gpipe, 1f1b, pipedream) peaks in B or in
// F. B runs beside the resident stashes, B's working set and the messages that can wait
// at a B start (Note [Waiting messages], counted at B starts only); F beside one stash
// fewer, F's own peak (the stash it builds, Note [Forward peak]) and the messages that
// can wait at any compute start. The stage is charged B's sum, and F's excess over it as
// working set. (Charged the activations that wait only at F starts beside B, gpipe's
// stages 1 and 2 of resnet50/8, S = 4, M = 4, measured 13.7% below the plan.)
//
// Note [Offloads in flight]
// Everything a split stage's forward device stashes leaves it through OFF and the
// device's copy engine (within one process; across processes the input is sent). The
// D2H copy releases each device tensor only when that tensor is copied (Note [Release
// as copied] in TransferManager.h), and the next F starts right after OFF, so a
// forward device holds the stash F is building plus the earlier ones still being
// copied out. How many those can be is not a matter of timing: a copy is usually much
// shorter than F (VGG16 width 1/4, stage 0: 1.5 ms against 5-8 ms), but the first copy
// of a run faults in the host pool's pages: 35 ms, over all of the next F (and the OFF
// after it waited 29 ms for it).
// The bound is the runtime's backpressure: OFF waits while kOffloadsInFlight D2H copies
// of the device are unfinished (TransferOptions::maxOffloadsInFlight), so the forward
// device holds at most min(n, 1 + kOffloadsInFlight) stashes. Measured (planner_fidelity,
// pipefb-sync, stage 0 on cpu:0): peak W + 2.375 stashes, the 0.375 being F's working
// set (allocated inside the saved-tensor hooks, so counted as stash): W + 2 stashes +
// F's working set + 128 KiB of comm buffers, 7.02 MiB; this charge predicts 6.96 MiB (it
// was W + 1 stash + working set, 5.53 MiB, -21%; the 2 W that pipefb-sync's forward
// device was charged until RecvWeights copied in place happened to cover the 2nd stash).
//
// Note [Optimizer offload in the cost model]
// PipelineShape::optimizerOnHost (pipeline.optimizer_offload: host, Note [Optimizer
// offload] in PipelineEngine.cpp): the optimizer state O, a master copy of the weights W
// and a gradient buffer G go to the host pool (hostBytes) instead of O on the backward
// device, and so does the step's transient (Note [Step working set]); the step pays its
// copies, G device->host and W host->device, on top of its compute (they are waited for,
// tensor by tensor). The flag is per stage: the solver costs each stage with its own
// placement and may choose it (Note [Optimizer placement search] in Solver.h).
//
// Note [Half-precision weights on a device]
// An analytic profile at bf16 or fp16 (Note [Half-precision training] in common/Precision.h)
// charges 6 bytes a parameter of weights on a backward device that steps: the fp32 master
// and the half copy F and B run on (LayerCost::halfCopyBytes). Two devices need less:
//  - a split stage's forward device runs F only, on the half copy: 2 bytes a parameter
//    (SyncWeights sends that copy). Charged as the fp32 master before, it held 3x the
//    weights it needs, and PipeFB, whose forward devices hold whole forward ranges, gained
//    least from half precision (experiments/README.md, "half_precision");
//  - with the optimizer in the host pool (Note [Optimizer offload in the cost model]), the
//    backward device holds the half copy and its half gradients, and the host pool the
//    fp32 master, the fp32 gradient buffer the step adds them into, and the states:
//    ZeRO-Offload's layout for mixed precision. STEP copies the half gradients down and
//    the new half copy up.
// Measured profiles and fp32 keep halfCopyBytes 0, and with it every charge as before: the
// runtime trains under autocast (Note [Autocast] in model/Model.h), whose weights are fp32
// on every device, so pipefb_train refuses plans made on this model (TrainPlan.cpp).
//
// Note [Backward after a step]
// The first B after an optimizer step costs more than the others: the runtime zeroes the
// stale gradients, and the fresh gradient tensors land on memory the allocator returned
// to the system while the step's temporaries were freed (page faults; on this machine
// about 0.5 ms per MB). The profiler measures B in that position
// (LayerCost::backwardAfterStep); the stage's excess, max(0, sum of that - sum of B), is
// parameter-sized, so it is not scaled by the microbatch. It is paid once per step: every
// microbatch for PipeDream, once per iteration otherwise (stepsPerMicrobatch()).
//
// Note [Weight snapshots]
// PipeDream runs F(s,m) on a snapshot of the current weights when a STEP comes before
// B(s,m) (stages with more than one microbatch in flight); a STEP follows every B, so
// every F makes one: a clone of every parameter of the stage (buffers are shared). The
// profiler measures each layer's clone (LayerCost::snapshot); it is charged to the
// forward device's compute per microbatch.
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/planner/Cluster.h"
#include "pipefb/planner/LayerCost.h"
#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/Placement.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/schedules/SharedDevices.h"
#include "pipefb/schedules/StashPolicy.h"

namespace pipefb::planner {

using schedules::StashPolicy;

// The one schedule-kind enum and its table (pipefb/schedules/ScheduleKind.h).
using schedules::isFlushing;
using schedules::parseScheduleKind;
using schedules::ScheduleKind;
using schedules::splitsBackward;
using schedules::toString;

/// Note [Loss scalars beside the backward]: one 0-dim float32 tensor.
inline constexpr std::int64_t kLossScalarBytes = 4;
/// The kinds the cost model prices (every kind: Note [Shared devices] for
/// interleaved-1f1b and zbv, Note [Simulated fill] for them and pipefb-zb).
bool plannerModels(ScheduleKind k);
/// Every kind the planner models, in enum order.
std::vector<ScheduleKind> allScheduleKinds();
/// The kinds the solver tries when no family is named: every kind it models but zb-h1,
/// zb-h2 and pipefb-zb, which are planned when named (--schedules, sweeps). Their waiting
/// messages and contracts are counted on generated schedules of S x M x 3 actions per
/// shape, too slow for bench_planner's goal of 2 s at 1000 layers x 64 devices (they took
/// it to 11 s when last included), which the default kinds meet in 0.78-0.86 s on a quiet
/// machine (experiments/README.md, planner_scaling). interleaved-1f1b and zbv are searched
/// up to kSharedExactLayers layers.
std::vector<ScheduleKind> defaultScheduleKinds();
/// Note [Zero-bubble fill]
/// zb-h1 and zb-h2 run one stage per device like 1f1b, with B split into I and W
/// (schedules/ZeroBubble.h). Their per-microbatch work is 1f1b's (F + I + W = F + B); what
/// changes is the fill/drain of a flushed iteration, in paces (of F + B):
///   1f1b: D - 1;  zb-h1: (D - 1)(F + I - W)/(F + B) (Note [Lagged W]);  zb-h2: 0 (steady
///   state, each stage steps after its own last W, the paper's post-validation);
/// with I and W from B by Note [I and W costs] (sim/CostTable.h), the profile's totals.
/// Their stashes come from the generated schedule's contract (contractFromOrder), W's
/// deferred ones included: up to S on every device for zb-h1 (1f1b's stage 0), 2S - 1
/// for zb-h2.
///
/// Note [Simulated fill]
/// zbv, interleaved-1f1b and pipefb-zb order their actions by list schedules
/// (ZeroBubble.h) that have no closed form for their fill. Their fill is measured: the
/// event simulator runs the generated schedule of (kind, S, M) for one flushed iteration
/// with every stage costing the profile's totals / S (F, and B split into I and W by Note
/// [I and W costs]), activations and gradients free, and
///   fill = (makespan / pace - M) / (D - 1),  pace = what one device computes per
///   microbatch (its stages' F + B), D = the chain's devices,
/// so that slots() gives back the simulated makespan for a balanced partition (SolverTest
/// checks interleaved-1f1b's against Megatron's 1 / v). The re-scoring simulates the
/// actual partition.
/// pipefb-zb's fill also pays what its split stages move on the way: each stash's hand-off
/// through the host pool (OFF, then PRE before I) and the weight sync (SW/RW) that the
/// next iteration's F waits for, each at the model's totals / S on stage 0's devices (the
/// graph stash; a checkpoint kind moves less). Communication-free, GPT-2 XL on 8x-t4-pcie
/// predicted 694.85 ms against 880.39 ms simulated, 161 ms of it the weight sync.
///
/// Note [Shared devices]
/// interleaved-1f1b, interleaved-zb and zbv run two stages on each device of their chain
/// (Placement:: looped with v = 2, the planner's only v; Placement::vShape), Note [Stages per
/// device]. A device's
///   time per microbatch = the sum of its stages' compute (F + B + their step shares), or
///     of their copy-engine times, whichever is more (each a resource, as for one stage);
///   memory = the sum of its stages' states (weights, grads, optimizer state, comm
///     buffers), plus the most, over the device's compute starts in the generated
///     schedule, of sum_s min(n_s, resident_s) x stash_s (Note [Stashes held together];
///     resident_s = the stashes the stage alone is charged, fewer under offload) plus the
///     working set of the stage whose action starts there;
/// and each link carries the messages of every boundary between its two devices (looped:
/// the boundaries of stages d and D + d on d-1 -> d, and of stage D on the wrap D-1 -> 0;
/// V: of stages d and S - d; the V's turn is local), its time their sum. The prefix DP
/// cannot see a device's two stages, so these shapes have a DP of their own (Note [Shared
/// search] in Solver.cpp).
/// The kind's chain puts forward and backward of a stage on different devices (PipeFB).
inline bool isSplit(ScheduleKind k) { return schedules::usesSplitPlacement(k); }
/// A split kind the solver also folds (Note [Folded search]) and decouples (Note
/// [Decoupled search]): not pipefb-zb, whose generator runs every stage on two devices of
/// its own (pipefbZb in ZeroBubble.h).
inline bool foldsAndDecouples(ScheduleKind k) { return isSplit(k) && k != ScheduleKind::PipeFbZb; }

/// Note [Planned async lag]
/// pipefb-async runs at pipeline.async_lag L (schedules::pipefbAsync; -1 means M): the
/// forward device runs the first L forwards of iteration k on the weights before STEP k-1,
/// then RecvWeights. The planner plans it at the lag it runs at (PipelineShape::asyncLag,
/// from the config, written to the plan file as async_lag, which pipefb_train runs): every
/// table generated from the schedule is made at that lag, and the in-flight stashes (M + L)
/// and weight versions (2, or 1 at L = 0) are the generated contract's, not a closed form.
/// The version kept for the backwards whose forwards ran before RecvWeights serves only the
/// first L backwards after the STEP (their last use; DROPW after it). On a decoupled
/// backward device (Note [Decoupled devices]) under checkpoint-offload with the versions
/// offloaded (Note [Weight-version offload]) and L = 1, each segment's version goes to the
/// host pool after its STEP and comes back `lookahead` compute actions before its one B, so
/// the device does not hold every segment's version at once, as the charge in
/// backwardMemory (versions summed over the segments) assumed. DecoupledDevice charges it
/// at the starts where the lowered schedule has it instead, counting the device's B order
/// (segment q at position q of the iteration's first microbatch, n segments, lookahead a):
///   B(q, 0): the versions of q .. q + a (prefetched; those before q are dropped), the last
///     segment's (its OFFW's copy is held through the device's next compute action, Note
///     [Copies held through the next compute] in runtime/WeightVersions.cpp) and those
///     whose OFFW came after the PRE that B(q, 0) waited on was issued (q' >= n + q - a:
///     their copy may still be going out);
///   B(q, M-1) and STEP(q): the versions of the segments that stepped before it whose OFFW
///     may still be going out (q - max(a, 1) .. q - 1) or whose PREW for the next
///     iteration was issued already (0 .. q - n + a, one more at the STEP), and at the
///     STEP its own (made before it, keepVersionsBeforeStep);
///   other B's: none. With L >= 2 every segment's version is there at the range's last
///   segment's B(., 0) (the sum, as before); other kinds of stash and the one-segment
///   devices keep the old charge, which their version's life does not lower. The versions'
///   BatchNorm statistics stay on the device (the peak held those of the segments whose B
///   had not run yet beside the one version: 49200 bytes on device 1, 5672 on device 3 of
///   the run below): charged with the states, every segment's (an upper bound). A version
///   is in the host pool from its OFFW to its PREW: charged there (hostBytes).
/// Time: below a whole iteration's lag the forwards after the first L wait for the previous
/// iteration's last STEP and SyncWeights, so the 2S chain fills and drains as a flush does,
/// by less: slots() = M + (2S - 1) x fill with the fill simulated on the generated schedule
/// at that lag in the steady state (Note [Simulated fill]; unit stages F = 1, B = 2, S = M =
/// 4: 16 units an iteration at lag 1, 18 at 0, against M x 2 = 8 that the cost model said
/// at every lag). Folded shapes already fill and drain; decoupled ones keep M paces here and
/// get their lag's time from the simulator's re-scoring (Solver.cpp), which runs the lag.
/// Measured (resnet50 224 px, decoupled 1 + 3 devices, M = 4, lookahead 0, checkpoint-offload,
/// experiments/pipefb_memory_measured.sh): planned at L = M and run at L = 1, the backward
/// devices peaked 10.05%, 6.6% and 5.4% below the plan, every byte of it the segments'
/// versions that were in the host pool (the host pool's weight_versions at the peak); run
/// at L = M they peaked at the plan to within 64 bytes.
///
/// Closed forms of the steady-state MemoryContract of schedules::makeSchedule (many
/// iterations); PlannerTest checks them against the generators.
/// `asyncLag`: pipefb-async's lag (Note [Planned async lag]); -1 = M, the others ignore it.
int inFlightStashes(ScheduleKind k, int S, int s, int M, int asyncLag = -1);
int weightVersions(ScheduleKind k, int S, int s, int M, int asyncLag = -1);
/// The lag pipefb-async runs at: asyncLag in [0, M], M for -1 (pipeline.async_lag's
/// meaning, schedules::pipefbAsync); -1 for the other kinds, which have none, so that the
/// tables keyed on it stay one per (kind, S, M).
int effectiveLag(ScheduleKind k, int M, int asyncLag);
/// Optimizer steps per microbatch: PipeDream updates after every microbatch (STEP s.m
/// follows B(s,m) in its generator), every other schedule once per iteration (1/M).
double stepsPerMicrobatch(ScheduleKind k, int M);
/// Weight copies held beside the live weights (category WeightVersions). PipeDream's
/// runtime stashes one copy per in-flight microbatch of stage s (n = S - s) next to the
/// master weights when n > 1, and none when n = 1 (measured in
/// experiments/results/planner_fidelity: 2 x W on stage 0 of 2, 0 on stage 1); the others
/// keep versions - 1.
int weightCopies(ScheduleKind k, int S, int s, int M, int asyncLag = -1);

std::vector<StashPolicy> allStashPolicies();

/// A pipeline shape without its partition: schedule, stages, microbatches, and the chain
/// of devices. Stage k runs F on chain[k] and B on chain[k] (same device) or on
/// chain[2S-1-k] (PipeFB: activations flow F0 -> ... -> F(S-1) -> B(S-1) -> ... -> B0), or,
/// folded (PipeFB on S devices, Note [Folded placements] in schedules/Placement.h), on
/// chain[S-1-k]: device chain[d] runs F(d) and B(S-1-d), and its time is the sum of the
/// two (Note [Folded pace]).
struct PipelineShape {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 1;
  int microbatches = 1;
  std::int64_t microbatchSize = 1;
  int lookahead = 1;
  /// What stage() costs the optimizer with (Note [Optimizer offload in the cost model]).
  bool optimizerOnHost = false;
  /// The DP chooses the optimizer's place per stage, host or backward device (Note
  /// [Optimizer placement search] in Solver.h); then optimizerOnHost is ignored.
  bool optimizerPerStage = false;
  /// pipeline.offload_weights: auto (true) moves an offloaded stage's stashed weight
  /// versions to the host pool (Note [Weight-version offload]); none (false) keeps them.
  bool offloadWeights = true;
  /// Note [Replicated pipelines] (Solver.h): R copies of the pipeline (pipeline.replicas),
  /// each on its own chainLength() devices and batch / R samples; microbatchSize is per
  /// replica. The chain is replica 0's.
  int replicas = 1;
  /// pipefb-async only: pipeline.async_lag, the forwards of an iteration that run before
  /// RecvWeights of the previous one; -1 = M (Note [Planned async lag]).
  int asyncLag = -1;
  /// effectiveLag of this shape: what every pipefb-async table is generated at.
  int lag() const;
  /// PipeFB only: B(k) on chain[S-1-k] instead of chain[2S-1-k] (S devices, not 2S).
  bool folded = false;
  /// PipeFB only, Note [Decoupled search]: forwardDevices = Df > 0 makes a decoupled
  /// shape. Every layer is a segment (stage k = layer k, stages = L); chain[0 .. Df) run the
  /// forward ranges in layer order, chain[Df + Db - 1 - r] the backward range r (so the
  /// device after the last forward device runs the last layers' backward).
  /// forwardRange[k] / backwardRange[k]: the range segment k belongs to (non-decreasing;
  /// the solver fills them in).
  int forwardDevices = 0, backwardDevices = 0;
  std::vector<int> forwardRange, backwardRange;
  bool decoupled() const { return forwardDevices > 0; }
  /// Device of forward range a / backward range r of a decoupled shape.
  int forwardRangeDevice(int a) const { return chain.at(a); }
  int backwardRangeDevice(int r) const {
    return chain.at(forwardDevices + backwardDevices - 1 - r);
  }
  std::vector<int> chain;
  /// When set (one per stage), stage k may use only stagePolicies[k]: a config's
  /// per-stage pipeline.stash list that pipefb_train partitions for (plannerPartition).
  std::vector<StashPolicy> stagePolicies;
  /// Whether the solver may give stage k the policy p (stagePolicies).
  bool policyAllowed(int k, StashPolicy p) const {
    return stagePolicies.empty() || stagePolicies.at(k) == p;
  }

  /// A shape before its device chain is chosen; microbatchSize = batch / microbatches.
  static PipelineShape of(ScheduleKind kind, int stages, int microbatches, std::int64_t batch,
                          int lookahead) {
    PipelineShape sh;
    sh.kind = kind;
    sh.stages = stages;
    sh.microbatches = microbatches;
    sh.microbatchSize = batch / microbatches;
    sh.lookahead = lookahead;
    return sh;
  }

  /// Note [Shared devices]: stages per chain device (2 for looped and V kinds, else 1).
  int stagesPerDevice() const { return schedules::Placement::stagesPerDevice(kind).stages; }
  bool sharesDevices() const { return stagesPerDevice() > 1; }
  /// The chain position of stage k's device (its default placement's device number).
  int position(int k) const {
    switch (schedules::info(kind).placement) {
      case schedules::DefaultPlacement::Looped:
        return schedules::loopedDevice(k, stages, stagesPerDevice());
      case schedules::DefaultPlacement::VShape:
        return schedules::Placement::foldedDevice(k, stages);
      case schedules::DefaultPlacement::SameDevice:
      case schedules::DefaultPlacement::PipeFb:
        break;
    }
    return k;
  }
  int forwardDevice(int k) const {
    return decoupled() ? forwardRangeDevice(forwardRange.at(k)) : chain.at(position(k));
  }
  int backwardDevice(int k) const {
    if (decoupled()) return backwardRangeDevice(backwardRange.at(k));
    if (sharesDevices()) return chain.at(position(k));
    if (!isSplit(kind)) return chain.at(k);
    return chain.at(folded ? stages - 1 - k : 2 * stages - 1 - k);
  }
  int chainLength() const {
    if (decoupled()) return forwardDevices + backwardDevices;
    if (sharesDevices()) return stages / stagesPerDevice();
    return isSplit(kind) && !folded ? 2 * stages : stages;
  }
  /// Stage k runs F and B on two devices (folded: every stage but the middle one of odd S).
  bool splits(int k) const { return isSplit(kind) && !(folded && 2 * k + 1 == stages); }
  /// The least pace the shared cores allow (Note [Shared cores]); CostModel::corePace()
  /// sets it once the chain is known; 0 = no bound.
  double corePace = 0;
  /// Fill/drain paces per device of a flushed iteration (Note [Zero-bubble fill], Note
  /// [Simulated fill]):
  /// CostModel::fill() sets it; 1 (1f1b's) until then.
  double fill = 1;
  /// Paces per iteration: M + (D - 1) x fill (flushing) or M (Note [Planner cost model]).
  double slots() const;
  /// Iteration time for pace tau: slots() x max(tau, corePace).
  double iterationTime(double tau) const;
};

/// Note [Devices and processes]: stage k of `shape` can only stash its input (a checkpoint
/// kind) when its forward and backward devices are in different processes. Replicated
/// pipelines (shape.replicas > 1) run one process per device, so there every split stage
/// is such a stage, whatever the cluster spec says.
bool inputStashOnly(const Cluster& cluster, const PipelineShape& shape, int k);

/// Note [Offloads in flight]: D2H copies a device may have unfinished before OFF waits.
using schedules::kOffloadsInFlight;

std::int64_t total(const CategoryBytes& b);

/// Which resource sets a stage's time.
enum class Resource {
  ForwardCompute,
  BackwardCompute,
  Compute,
  ForwardCopy,
  BackwardCopy,
  Copy,
  LinkIn,
  LinkOut
};
const char* toString(Resource r);

struct StageEstimate {
  StashPolicy policy = StashPolicy::Keep;     // as chosen
  StashPolicy effective = StashPolicy::Keep;  // effectivePolicy(policy, split)
  double forwardTime = 0;                     // seconds per microbatch on its forward device
  double backwardTime = 0;                    // incl. recompute
  double stepTime = 0;                        // per iteration
  double afterStepTime =
      0;  // extra of the first B after a step, per step (Note [Backward after a step])
  double allReduceTime =
      0;  // replicas > 1: the gradient all-reduce before each step (Note [Replicated pipelines])
  double snapshotTime = 0;  // weight snapshot per microbatch (Note [Weight snapshots])
  /// The step's share per microbatch on the backward device: (stepTime + afterStepTime +
  /// allReduceTime) x stepsPerMicrobatch(); part of backwardCompute (plan files' step_time).
  double stepShare = 0;
  double forwardCompute = 0, backwardCompute = 0;  // busy time per microbatch per device
  double forwardCopy = 0, backwardCopy = 0;        // copy-engine time per microbatch
  double linkIn = 0;   // boundary with the previous stage (0 for stage 0)
  double linkOut = 0;  // split last stage: F(S-1) -> B(S-1)
  double time = 0;     // the largest of the above (the stage's pace)
  Resource binding = Resource::Compute;
  std::int64_t stashBytes = 0;  // one stash
  /// Note [What waits for W]: one stash between its I and its W (split backward kinds).
  std::int64_t deferredStashBytes = 0;
  /// The stashes backwardMemory's stash category holds at most (a shared device counts its
  /// stages' stashes together, Note [Stashes held together]).
  int residentStashes = 0;
  /// One F's peak above what was live before it, the stash it builds included (Note
  /// [Forward peak]); a shared device charges it at the F starts (Note [Stashes held
  /// together]).
  std::int64_t forwardPeakBytes = 0;
  /// What B (or I or W) holds beyond the stashes while it runs, without the step's excess
  /// that backwardMemory's working set adds (Note [Step working set]); and the step's
  /// transient beyond the states (0 with the optimizer on the host). A shared device
  /// charges the first at B/I/W starts and the second at its STEPs, which come after its
  /// last B or W (Note [Stashes held together]).
  std::int64_t backwardWorkingBytes = 0;
  std::int64_t stepWorkingBytes = 0;
  /// A split backward's W: what it holds beyond the other stashes, its own included (Note
  /// [What waits for W]); 0 for the fused kinds.
  std::int64_t weightWorkingBytes = 0;
  /// Split: the stash that stays on the forward device after F while its D2H copy runs
  /// or is held, up to the device's next OFF (Note [Offloads in flight]); 0 when the stash
  /// is sent instead. A decoupled forward device charges it beside the next segment's F
  /// (Note [Decoupled devices]).
  std::int64_t copyingOutBytes = 0;
  /// Note [Planned async lag]: a decoupled backward device's kept weight version (the
  /// version its first B after a STEP runs on, which the lowering moves to the host pool and
  /// back) when it is on the device only near that B: charged at the B and STEP starts
  /// where it is there (DecoupledDevice), not in backwardMemory. 0 otherwise.
  std::int64_t windowedVersionBytes = 0;
  /// Decoupled stage 0: F(0,0)'s own input, beside it with the M - 1 others (charged in
  /// forwardMemory's comm buffers) in place of the copy before it (a flushing kind: none
  /// is there then), or beside that copy (firstInputBesideCopy: an asynchronous kind's
  /// copy is held across iterations) (Note [Decoupled devices]).
  std::int64_t firstInputBytes = 0;
  bool firstInputBesideCopy = false;
  /// Folded (Note [Folded pace]): of forwardMemory's and of backwardMemory's comm buffers,
  /// the messages that wait on their device at F starts only, never beside its B.
  std::int64_t forwardCommOnlyAtForward = 0, backwardCommOnlyAtForward = 0;
  /// Of forwardCommOnlyAtForward, the iteration's inputs.
  std::int64_t inputsOnlyAtForward = 0;
  /// Note [Messages held together] (schedules/Messages.h), a folded split stage: the
  /// waiting messages in forwardMemory's comm buffers (activations) and backwardMemory's
  /// (gradients, and the last stage's outputs), one of each kind's bytes, and the
  /// combinations that can wait together on its forward device (null when not folded).
  struct Messages {
    std::int64_t forward = 0, backward = 0;
    std::int64_t activation = 0, gradient = 0, output = 0;
    const std::vector<std::array<int, 3>>* together = nullptr;
    const std::vector<std::array<int, 3>>* togetherAtBackward = nullptr;
  } messages;
  int inFlight = 0;
  int versions = 1;
  CategoryBytes forwardMemory{};   // on the forward device (== backwardMemory if same)
  CategoryBytes backwardMemory{};  // on the backward device
  std::int64_t hostBytes = 0;
  bool same = true;  // forward device == backward device
  std::int64_t peakMemory() const;
};

class CostModel;

/// Note [Folded pace]
/// A folded shape's device chain[d] runs F(d) and B(S-1-d) (Note [Folded placements]):
///   its compute is F(d)'s forward device compute + B(S-1-d)'s backward device compute,
///   its copy engine the OFFs of one plus the PREs of the other, and
///   its memory both parts' states and resident stashes, plus the larger of what F holds
///   while it runs (its working set, the stash it builds and those still being copied
///   out) and what B holds while it runs (its working set and the copies still going out:
///   F builds no stash then), one runs at a time (Note [PipeFB device order]). Taking both
///   working sets less the smaller (as before) charged F's stash in the making beside B's
///   working set: 12.25 MiB too much on device 2 of ResNet50's (224 px, 4x-t4-pcie,
///   microbatch 8) smallest-budget folded plan, whose simulated peak holds B's working set
///   and prefetched stashes and no stash of F's (its copy is done by then; the copy still
///   going out is Note [Offloads in flight]'s bound, not timing). pipefb-async: the device
///   steps after B(S-1-d)'s last microbatch of the iteration, so its step transient is
///   charged beside only the stashes prefetched before that STEP, counted on the lowered
///   schedule (Note [Stashes at a step]; none on the first half's devices, whose next
///   prefetches go behind the next forwards' offloads, Note [Folded lookahead]) (vgg16/8
///   pipefb-async-keep S=3 M=4, the device of F0 and B2 peaked 11% and 17% below the plan
///   charged a transient beside B2's stash; PlanRunsTest seed 1 instance 5. Charging none
///   at the step on every device, S=2 M=1's second device went out of memory in its STEP
///   beside the next iteration's stash); it holds no weight snapshot (Note [Forward device
///   memory]). Its B runs beside the stashes of its stage that the lowered schedule has
///   there (Note [Stashes at a backward]), at most lookahead + 1: with M = 1 one, the
///   next PRE following the next F's OFF (charged lookahead + 1, mlp
///   pipefb-async-checkpoint-offload S=3 M=1's device of F0 and B2 peaked 11.0% below the
///   plan, a stash of fc3 less than charged; PlanRunsTest seed 3 instance 45).
///   Messages (Note [Waiting messages]) are charged beside B only as many as wait at the
///   device's B starts (WaitingMessages' counts at backward starts, and inputsAtBackward
///   for stage 0's inputs); the rest beside F. Under a flushing kind only: its STEPs,
///   whose transient is charged with B's working set, come after the iteration's last B,
///   beside no message, where an asynchronous kind's next inputs may wait. (Charged
///   beside B, mlp pipefb-sync-keep S=3 M=2, PlanRunsTest seed 1 instance 8, measured
///   10.3% and 9.9% below the plan on the devices of F0 and B2 and of F2 and B0: an input
///   and an activation charged beside B, where every F of the iteration runs before it);
/// the link chain[a] -> chain[a+1] carries boundary a+1's activations and boundary
/// S-1-a's gradients (the ring F0 -> ... -> F(S-1) -> B(S-1) -> ... -> B0 uses every link
/// one way), and chain[S-1] -> chain[0] the last stage's output. The pace tau is the
/// largest of these and of each stage's own time; iteration time = (M + S - 1) x tau as
/// for 1F1B, for pipefb-async too (a device finishes an iteration before the next one's
/// forwards, so folding gains async nothing but staleness). The middle stage of odd S is a
/// same-device stage.
double foldedDeviceTime(const StageEstimate& forwardPart, const StageEstimate& backwardPart);
std::int64_t foldedDeviceMemory(const StageEstimate& forwardPart,
                                const StageEstimate& backwardPart);

/// Note [Decoupled devices]
/// A decoupled shape (Note [Decoupled search] in Solver.h) runs every layer as its own
/// segment; a device runs the F of every segment of its forward range, or the B of every
/// segment of its backward range, one segment at a time. Every segment boundary is stashed
/// through the host pool (the segment's input under a checkpoint kind, its saved graph
/// under offload), so what a device holds at once is:
///   forward device: the weights (and async's old copies) and comm buffers of all its
///     segments, plus, at the F of one segment, the stash it builds, F's working set and
///     the stash of the device's OFF before it (Note [Offloads in flight]: with
///     kOffloadsInFlight = 1 that copy, held or still going out, is there until the next
///     OFF, the one after this F): the previous segment's of the same microbatch, or for
///     the range's first segment its last one's of the microbatch before (as many as a
///     one-segment range keeps, none beside the iteration's first F under a flush), or
///     for stage 0 its own input where that is more (F(0,0) runs beside all M inputs and
///     its stash's copy of the input, no copy going out; an asynchronous kind's copy is
///     held across iterations: both), the most over the segments. The largest F
///     beside the largest copy, charged together, over-charged resnet50/8 pipefb-sync-keep's
///     forward device 1 (layer3.0 to the head) by 17.5%: layer3.0's 482 KiB stash beside layer3.0's
///     own F, where that F holds only the head's 40 KiB beside it and layer3.1's F layer3.0's 482
///     KiB beside its 259 KiB; the rule also charges the copy going out beside the next F when M
///     = 1. (An unsplit segment's other stashes stay beside every F: charged as resident.)
///   backward device: weights, gradients, optimizer state and comm buffers of all its
///     segments, plus, at the B of one segment, what that B holds: the stashes resident
///     then and its own working set (one segment's recomputed graph under a checkpoint
///     kind, never a whole range's), the most over the segments. The device runs B of its
///     segments last to first, microbatch after microbatch, and prefetches `lookahead`
///     compute actions ahead (addOffload), so at B(k,m) it holds the stashes of the
///     lookahead + 1 B's from B(k,m) on in that order: k, k-1, ..., the range's first
///     segment, then its last one of microbatch m+1 (at most the B's left from B(k,0)).
///     The largest stashes and the largest working set each over all segments, charged
///     together, over-charged resnet50/8 pipefb-sync's first backward range (the stem's
///     384 KiB stash twice beside layer1.0's working set: 768 KiB where its B holds 448);
/// and per range boundary (CostModel::forwardRangeInput / backwardRangeOutput): the link
/// message's time and the messages that can wait there (Note [Waiting messages]; none
/// between two ranges of one pass of pipefb-sync, Note [Message rendezvous] in
/// schedules/Messages.h; the last backward range is sent no output when it recomputes,
/// Note [Recomputed last output]). Consecutive
/// segments on one device hand their activations and gradients over locally: no message.
/// Compute and copy times add up over the device's segments (each a resource of its own).
///
/// Note [Prefetch distance zero]
/// With lookahead 0 the lowering issues PRE s.m right before B(s,m) (Lowering.h), so the
/// backward device holds one prefetched stash, not lookahead + 1, and B waits for its copy:
/// a split stage's backward copy time adds to its backward compute instead of hiding
/// beside it (CostModel::stage). The decoupled search tries lookahead 0 beside the
/// configured one for every offloading policy (decoupledChoices, Solver.h): on GPT-2 small
/// at 1024 tokens (8x T4) the head's backward device then holds one 24 MiB input stash
/// beside its 6.18 GiB backward, as 1f1b's head stage does, for 2 ms more per microbatch.
struct DecoupledDevice {
  double compute = 0, copy = 0;
  std::int64_t resident = 0;  // summed over the segments
  /// What one segment's F or B holds beyond `resident`.
  struct Held {
    std::int64_t stashes = 0, working = 0;
    std::int64_t versions = 0;  // kept weight versions there then (Note [Planned async lag])
    std::int64_t total() const { return stashes + working + versions; }
  };
  /// Forward segments are added from the range's last to its first as well (the solver's
  /// DP extends a range to the left).
  void addForward(const StageEstimate& e);
  /// Backward segments are added from the range's last to its first (the order B runs
  /// them); `shape` gives the lookahead and the microbatches.
  void addBackward(const StageEstimate& e, const PipelineShape& shape);
  /// The segment's F (a forward range) or B (a backward range) that holds the most.
  Held peak() const;
  double time() const { return compute > copy ? compute : copy; }
  std::int64_t memory() const { return resident + peak().total(); }
  /// A part of memory() that never decreases as segments are added (the DP's floor).
  std::int64_t memoryFloor() const;

 private:
  std::vector<std::int64_t> stashes_, working_;  // backward, in the order added
  // Note [Planned async lag]: per segment in B order, its windowed version and its STEP's
  // transient; prefix sums of the versions (versionSum_[q] = sum of those before q).
  std::vector<std::int64_t> steps_, versionSum_{0};
  bool windowed_ = false;
  std::int64_t versionsIn(std::initializer_list<std::pair<int, int>> ranges) const;
  Held windowedPeak() const;
  int lookahead_ = 0, microbatches_ = 1;
  // The most over segments whose lookahead + 1 B's stay in one microbatch (backward), or
  // over the Fs whose OFF before them is the previous segment's (forward).
  Held inside_;
  Held window(int q) const;
  // Forward: the first segment's F (its stash being built, its working set) and the
  // copies of the range's last segment beside the next microbatch's first F.
  int forwardSegments_ = 0;
  Held firstF_;
  std::int64_t wrap_ = 0, firstInput_ = 0;
  bool firstInputBesideCopy_ = false;
};
/// A range boundary's charge: the message's link time and the bytes that can wait.
struct RangeBoundary {
  double time = 0;
  std::int64_t bytes = 0;
  /// The last backward range's output, sent at its receive: its link time adds to the
  /// range's (Note [Output at its receive in the cost model] in CostModel.cpp).
  bool atReceive = false;
  /// How long a range whose own work takes `load` per microbatch is busy with this boundary.
  double busy(double load) const { return atReceive ? load + time : std::max(load, time); }
};

/// One range of a decoupled plan on its device: segments [first, last) = layers
/// [firstLayer, lastLayer), the device's load and its boundary's message (Note [Decoupled
/// devices]).
struct DecoupledRange {
  bool backward = false;
  int index = 0;  // range number within its pass, in layer order
  int first = 0, last = 0;
  int firstLayer = 0, lastLayer = 0;
  int device = 0;
  DecoupledDevice load;
  RangeBoundary boundary;
};
/// The forward ranges, then the backward ranges, of a decoupled `shape` whose segment k
/// = layers [cuts[k], cuts[k+1]) has the estimate stages[k]; planLoad charges exactly these.
std::vector<DecoupledRange> decoupledRanges(const CostModel& model, const PipelineShape& shape,
                                            const std::vector<StageEstimate>& stages,
                                            const std::vector<int>& cuts);

/// Note [Planned reserve]
/// Every device's planned peak holds a stated reserve beside what the cost model charges:
/// bytes the planner cannot see from a profile, such as the allocator's rounding and
/// LibTorch's scratch space. It is a share of the device's charged bytes, rounded up:
/// kPlannedReservePerMille (0.5%) on the clusters pipefb's programs plan on (Setup.cpp;
/// Cluster::reservePerMille, 0 on a cluster made by hand, as the solver's literal tests
/// make). planLoad() adds it to each device a plan uses, the simulated peaks get it too
/// (simulatePlan), and the searches fit their estimates into what each device's limit
/// leaves with it (roomUnder), so a plan's printed peak is the promise: no device above it
/// (Note [A plan is an upper bound] in PlanRunsTest). The plan file states the share and
/// each device's bytes (`reserve_per_mille`, `reserve_bytes`).
/// Measured (PlanRunsTest, seeds 0 to 9, 500 instances on measured profiles): before Note
/// [Outputs kept between layers] 9 devices peaked 2048 to 8192 bytes (0.27% to 0.58%)
/// above the cost model's charge; with it those 9 are exact, and no device of the 500 peaks
/// above its plan. The reserve is the margin for what no run here has shown yet (CUDA's
/// caching allocator rounds a block up to 512 bytes). A fixed 16 KiB instead was 20% to 30% of
/// mlp's smallest devices (37 KiB to 93 KiB), which then peaked that far below their plans.
inline constexpr int kPlannedReservePerMille = 5;
/// The reserve beside `bytes` charged on a device: ceil(bytes x perMille / 1000).
std::int64_t plannedReserve(std::int64_t bytes, int perMille);
/// The most a device's estimates may charge so that they and their reserve fit `limit`
/// (< 0: no limit, returned as is).
std::int64_t roomUnder(std::int64_t limit, int perMille);
/// roomUnder() of every limit.
std::vector<std::int64_t> roomForEstimates(std::vector<std::int64_t> limits, int perMille);

/// Pace, memory per cluster device and host bytes of a partition (stage k = [cuts[k],
/// cuts[k+1]) with estimate stages[k]): evaluatePlan and the brute force both read it.
struct PlanLoad {
  double tau = 0;
  std::vector<std::int64_t> deviceMemory;   // with each device's reserve
  std::vector<std::int64_t> deviceReserve;  // Note [Planned reserve]
  std::int64_t hostBytes = 0;
};
PlanLoad planLoad(const CostModel& model, const PipelineShape& shape,
                  const std::vector<StageEstimate>& stages, const std::vector<int>& cuts);

/// Note [Shared devices]: one stage of a shared device, its index and its estimate.
struct HostedStage {
  int stage = 0;
  const StageEstimate* estimate = nullptr;
};
/// Compute or copies per microbatch, whichever is more, of a shared device's stages, and
/// at least v times its longest stage's compute.
///
/// Note [Balanced chunks]
/// Both shared generators rotate a device through its stages at one pace: Megatron's order
/// walks the chunks in groups of D microbatches, the V's list schedule alternates the two
/// chunks, and a device's stage waits for the same chunk's stage on the device before it.
/// A device whose two stages are unequal therefore paces like one with two copies of the
/// longer: the DP, charged only the sum, cut GPT-2 XL on 8x-t4-pcie into pairs of a 6.6 ms
/// and a 39.8 ms stage (interleaved-1f1b, predicted 534 ms, simulated 767 ms). So a
/// device's time is at least v x its longest stage's compute; balanced pairs (Megatron's
/// uniform chunks) pay nothing for it.
double sharedDeviceTime(const std::vector<HostedStage>& stages);
double sharedDeviceTime(const HostedStage* first, const HostedStage* last);
/// What the device at chain position `position` of a shared `shape` holds at its peak.
std::int64_t sharedDeviceMemory(const PipelineShape& shape, int position,
                                const std::vector<HostedStage>& stages);
/// Note [Stashes held together]: the counts of that device in the generated schedule.
const std::vector<schedules::HeldAtStart>& stashesHeldTogether(const PipelineShape& shape,
                                                               int position);
/// sharedDeviceMemory with those counts given (the DP's inner loop).
std::int64_t sharedDeviceMemory(const std::vector<schedules::HeldAtStart>& held,
                                const HostedStage* first, const HostedStage* last);

/// Prefix sums over a profile and the cluster, to cost stages in O(1) (except the
/// working-set maximum, which the caller may pass in).
class CostModel {
 public:
  CostModel(Profile profile, Cluster cluster);

  const Profile& profile() const { return profile_; }
  /// This model for shapes of `microbatchSize` samples: one on the profile measured at that
  /// size where there is one (Note [Bytes at every microbatch] in LayerCost.h), else this.
  /// The solver, the simulator's set-up, plan files and explanations take it per shape.
  const CostModel& at(std::int64_t microbatchSize) const;
  const Cluster& cluster() const { return cluster_; }
  int numLayers() const { return profile_.numLayers(); }

  /// Stage k = layers [first, last) in `shape`, under `policy`. `linkIn` is included.
  StageEstimate stage(const PipelineShape& shape, int k, int first, int last,
                      StashPolicy policy) const;
  /// Same, with the working-set maximum of [first, last) at the shape's microbatch
  /// (workingBytes(l, scale(shape))) given. `timesOnly`
  /// leaves the memory fields empty (the DP's cheap first look at a candidate).
  ///
  /// Note [Planner speed]
  /// bench_planner's 1000 layers x 64 devices calls this 1.6 million times, two thirds of
  /// them times-only, then simulates its best plans (Note [Simulator speed] in
  /// sim/Simulator.cpp, Note [Lowering speed] in schedules/Lowering.h). So a times-only
  /// look returns as soon as the time is known: before the waiting messages (Note [Waiting
  /// messages], whose table for a new shape is built on first use, Note [Waiting messages
  /// speed] in schedules/Messages.cpp), the stash counts and every memory term; scaled byte
  /// counts round inline (scaledBytes in LayerCost.h) and Placement::stagesPerDevice is
  /// inline. None of this changes a number: the same plans, times and bytes come out.
  StageEstimate stage(const PipelineShape& shape, int k, int first, int last, StashPolicy policy,
                      std::int64_t maxWorking, bool timesOnly = false) const;
  /// Time of the boundary in front of stage k (k >= 1), whose first layer is `first`.
  double linkTime(const PipelineShape& shape, int k, int first) const;
  /// Note [Folded pace]: the link chain[a] -> chain[a+1] of a folded shape carries the
  /// activations of the boundary at layer `actLayer` and the gradients of the one at
  /// `gradLayer` (boundary a+1 and boundary S-1-a); the sum of both messages' times.
  double foldedLinkTime(const PipelineShape& shape, int a, int actLayer, int gradLayer) const;
  /// Note [Decoupled devices]: what forward range a >= 1 of a decoupled shape, starting at
  /// layer `first`, pays for its input (from forward range a - 1's device).
  RangeBoundary forwardRangeInput(const PipelineShape& shape, int a, int first) const;
  /// What backward range r, ending at layer `last`, pays for the gradient of its output
  /// (from range r + 1's device), or, the last range, for the model's output (from the last
  /// forward device) unless the last segment's policy `lastPolicy` recomputes it (Note
  /// [Recomputed last output]: nothing then).
  RangeBoundary backwardRangeOutput(const PipelineShape& shape, int r, int last,
                                    StashPolicy lastPolicy) const;
  /// A lower bound of stage(...).time that never decreases as the stage grows.
  double computeLowerBound(const PipelineShape& shape, int k, int first, int last) const;
  /// Note [Waiting messages]: the bytes of the messages that can wait for stage k =
  /// [first, last): activations on its forward device, gradients (and the last stage's
  /// outputs when `outputTravels`, Note [Recomputed last output]) on its backward device.
  /// Every stash policy is charged them (CommBuffers); none for a decoupled shape. A stage
  /// alone on one device with a fused B (gpipe, 1f1b, pipedream) is charged the counts at
  /// its B starts beside B's peak, and `atForward`, the counts over all its compute starts,
  /// beside its F's peak (Note [Forward beside backward]).
  struct WaitingBytes {
    std::int64_t activations = 0, gradients = 0;
    std::int64_t atForward = 0;
    /// The activations of atForward alone: a stage with the forward phase first waits no
    /// gradient in its F phase (Note [Two phases]).
    std::int64_t activationsAtForward = 0;
    /// A folded split stage (Note [Folded pace]): the activations and gradients that wait
    /// at F starts of their device only, never at its B starts.
    std::int64_t activationsOnlyAtForward = 0, gradientsOnlyAtForward = 0;
    /// The last stage's outputs that can wait at its B starts but not beside its loss
    /// (Note [Outputs at the loss] in schedules/Messages.h): charged beside the rest of B
    /// only; `gradients` holds the others.
    std::int64_t outputsAfterLoss = 0;
  };
  WaitingBytes waitingBytes(const PipelineShape& shape, int k, int first, int last,
                            bool outputTravels) const;
  /// A lower bound of stage(...).peakMemory() that never decreases as the stage grows;
  /// maxWorking as for stage().
  std::int64_t memoryLowerBound(const PipelineShape& shape, int k, int first, int last,
                                std::int64_t maxWorking) const;
  /// Note [Shared cores]
  /// Virtual CPU devices are threads on one machine. When a shape runs more device
  /// threads (its chain length D) than the machine has cores C (Cluster::cores = C > 0),
  /// the threads share the cores: every device still computes at its profiled speed when
  /// it runs, but the cores must do the whole pipeline's work. So the pace is at least
  ///   corePace = W / (C x the slowest chain device's speed),
  /// W = the compute work of one microbatch over all layers: (F + B) x scale + (step +
  /// the excess of the B after it) x steps per microbatch (Note [Backward after a step];
  /// the excess over the whole model, a lower bound of the stages' sum), and
  /// iteration time = slots x max(tau, corePace). W does not depend on the partition or
  /// on the policies (recomputes, snapshots and copies are left out, so it is a lower
  /// bound), so corePace is a constant of the shape and the DP stays exact.
  /// The earlier model slowed every device by C / D; it charged 1f1b's 3-stage VGG16 plan
  /// (a light last stage, fc7..fc8) 1.5x its time (+50% against measured,
  /// experiments/README.md, planner_fidelity). This one ignores that threads contend
  /// unevenly (PipeFB's forward devices run their forwards in a burst), and it cannot
  /// see other processes on the machine.
  double speed(const PipelineShape& shape, int device) const {
    (void)shape;
    return cluster_.devices[device].speed;
  }
  /// Note [Shared cores]: W / (C x the slowest chain speed) when D > C > 0, else 0.
  double corePace(const PipelineShape& shape) const;
  /// Note [Zero-bubble fill], Note [Simulated fill]: PipelineShape::fill of the shape's
  /// kind, stages and microbatches for this profile.
  double fill(const PipelineShape& shape) const;
  /// Note [Shared devices]: the busiest link among the messages of `boundaries` (stage
  /// k >= 1 and its first layer): each boundary's activation on k-1's device -> k's, its
  /// gradient back, summed per link (0 between stages on one device).
  double linksTime(const PipelineShape& shape,
                   const std::vector<std::pair<int, int>>& boundaries) const;
  /// Capacity of a device under a per-device budget (-1 = none): min(budget, capacity).
  std::int64_t limit(int device, std::int64_t budget) const;

  /// Seconds of F, B and a checkpointed B's recompute of layers [first, last) on the
  /// profile's device at f x its microbatch (Note [Microbatch scaling]).
  double forwardTime(int first, int last, double f) const {
    return scaledTime(range(F_, first, last), range(Ffixed_, first, last), f);
  }
  double backwardTime(int first, int last, double f) const {
    return scaledTime(range(B_, first, last), range(Bfixed_, first, last), f);
  }
  double recomputeTime(int first, int last, double f) const {
    return scaledTime(range(R_, first, last), range(Rfixed_, first, last), f);
  }
  /// Unscaled sums over layers [first, last) at the profile's microbatch and device.
  double stepSum(int first, int last) const { return range(step_, first, last); }
  std::int64_t paramSum(int first, int last) const { return range(param_, first, last); }
  /// What a split stage's forward device holds of [first, last)'s weights (Note
  /// [Half-precision weights on a device]); paramSum but for analytic half profiles.
  std::int64_t forwardParamSum(int first, int last) const { return range(fwdParam_, first, last); }
  /// The graph F of [first, last) keeps (its stash less what it holds of the output):
  /// the layers' saved bytes and the outputs kept inside it (Note [Outputs kept between
  /// layers]).
  std::int64_t savedSum(int first, int last) const {
    return range(saved_, first, last) + keptInside(first, last);
  }
  /// What a split backward's I keeps of [first, last) for its W (LayerCost::keptGradBytes;
  /// Note [What waits for W]).
  std::int64_t keptGradSum(int first, int last) const { return range(keptGrad_, first, last); }
  /// The layers' saved bytes alone: the lower bound a B device holds of the graph while it
  /// runs B layer by layer (the kept outputs may be freed with their layers first).
  std::int64_t savedLayersSum(int first, int last) const { return range(saved_, first, last); }
  /// Note [Outputs kept between layers]: of layers [first, last), the outputs that a
  /// layer's graph keeps and the next layer's does not save (inside the range only).
  std::int64_t keptInside(int first, int last) const {
    return last > first + 1 ? kept_[last] - kept_[first + 1] : 0;
  }
  /// Parameters + gradients + optimizer state of layers [first, last).
  std::int64_t staticSum(int first, int last) const { return range(states_, first, last); }

  std::int64_t inputBytes(int layer) const;  // unscaled; layer 0: the model input
  /// Layer `layer`'s working set at f x the profile's microbatch (Note [Parameter-sized
  /// working sets] in LayerCost.h).
  std::int64_t workingBytes(int layer, double f) const {
    const LayerCost& c = profile_.layers[layer];
    return scaledBytes(c.workingBytes, c.workingFixedBytes, f);
  }
  /// Largest forward working set of [first, last), unscaled (Note [Forward device memory]).
  std::int64_t forwardWorking(int first, int last) const {
    return rangeMax(forwardWorkingMax_, first, last);
  }
  /// Note [Gathered weight gradients]: whether B of stage k under `policy` accumulates its
  /// weight gradients into .grad in place (else it gathers them).
  static bool gradientsInPlace(const PipelineShape& shape, int k, StashPolicy policy);
  /// The same for W of a split backward kind: in place on a stage whose F and B share a
  /// device and whose W runs on the master's weights (no weight copy), as execWeightGrad
  /// decides; gathered on pipefb-zb's split stages (a graph on the forward copy).
  static bool weightGradientsInPlace(const PipelineShape& shape, int k);
  /// B's working set of stage k = [first, last) at the shape's microbatch, in place or
  /// with the gathered weight gradients (Note [Gathered weight gradients]).
  std::int64_t backwardWorking(const PipelineShape& shape, int k, int first, int last,
                               bool inPlace) const;
  /// Note [Backward layer by layer]: the peak of a fused B of stage k = [first, last) with
  /// its own graph (saved tensors, or the recomputed ones) freed as B passes each layer;
  /// `onStash` of the graph is the stash, charged there (a recomputed graph's saved input).
  std::int64_t backwardLayered(const PipelineShape& shape, int k, int first, int last, bool inPlace,
                               std::int64_t onStash = 0) const;
  double scale(const PipelineShape& shape) const;

 private:
  template <typename T>
  static T range(const std::vector<T>& prefix, int a, int b) {
    return prefix[b] - prefix[a];
  }
  using SparseMax = std::vector<std::vector<std::int64_t>>;  // sparse table of range maxima
  static SparseMax buildMax(std::vector<std::int64_t> values);
  static std::int64_t rangeMax(const SparseMax& t, int first, int last);
  Profile profile_;
  Cluster cluster_;
  std::vector<double> F_, B_, R_, Ffixed_, Bfixed_, Rfixed_, step_, afterStep_, snapshot_;
  std::vector<std::int64_t> saved_, param_, buffer_, grad_, opt_, states_;
  // Note [Half-precision weights on a device]: forwardParamBytes, hostedGradBytes and
  // hostOptimizerBytes (LayerCost.h), summed.
  std::vector<std::int64_t> fwdParam_, hostedGrad_, hostOpt_;
  // Note [Outputs kept between layers]: kept_[l] sums, over the layers j in 1 .. l-1, what
  // layer j-1's graph keeps of its output that layer j's does not save.
  std::vector<std::int64_t> kept_;
  // Note [What waits for W]: LayerCost::keptGradBytes (unmeasured: saved + output), summed.
  std::vector<std::int64_t> keptGrad_;
  SparseMax stepWorkingMax_, forwardWorkingMax_;
  // Note [Forward peak]: per layer l, saved(0 .. l+1) + kept(l) + output(l) + F's working
  // set(l) (autograd on), and F's peak without autograd (Note [Forward without autograd]).
  SparseMax forwardPeakMax_, noGradForwardMax_;
  /// One microbatch's F of stage k = [first, last), unscaled: the peak above what was live
  /// before it (the stage input excluded), with autograd (`graph`) or without.
  std::int64_t forwardPeak(int k, int first, int last, bool graph) const;
  std::int64_t stepWorking(int first, int last) const {
    return rangeMax(stepWorkingMax_, first, last);
  }
  // Note [Gathered weight gradients]: per microbatch size, the range maxima of
  // scaled(ws(l)) - gradPrefix(l + 1) (gathered), and of that plus scaled(savedPrefix(l + 1))
  // (layered, Note [Backward layer by layer]); in place, the same without the gradient
  // prefix; built on first use (the planner is single-threaded today; the mutex keeps a
  // shared model safe anyway).
  struct GatherTables {
    SparseMax gathered, layered, inPlace, inPlaceLayered;
  };
  struct GatherCache {
    std::mutex mu;
    std::map<std::int64_t, GatherTables> tables;
  };
  const GatherTables& gatherTables(const PipelineShape& shape) const;
  std::shared_ptr<GatherCache> gather_ = std::make_shared<GatherCache>();
  // Note [Bytes at every microbatch]: the models at the sizes the profile measured.
  // Shared by a model and its views; `base` is the profile as measured.
  struct ViewCache {
    std::mutex mu;
    Profile base;
    std::map<std::int64_t, std::shared_ptr<const CostModel>> models;
  };
  std::shared_ptr<ViewCache> views_;
  bool isView_ = false;
};

}  // namespace pipefb::planner
