// The per-stage estimate: CostModel::stage(), a stage's times and its bytes on each of its
// devices (Note [Planner cost model] in CostModel.h).
#include <algorithm>

#include "CostModelDetail.h"
#include "pipefb/common/Error.h"
#include "pipefb/planner/CostModel.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"

namespace pipefb::planner {

using detail::asyncStashesAtBackward;
using detail::foldedStashesAtBackward;
using detail::foldedStashesAtStep;
using detail::forwardBesideBackward;
using detail::generatedContract;
using detail::outputAtReceive;
using detail::phasedStages;
using detail::pipedreamHeld;
using detail::residentStashBytes;
using detail::scaled;
using detail::waitingFor;

namespace {

// Note [What waits for W]: the stash category at an I start (beside I's working set wsI,
// charged as B's), and what a W start holds beyond that.
struct DeferredCharge {
  std::int64_t stash = 0, excess = 0;
};
// `residentI` and `residentW`: the stashes at those starts (the deferred ones included).
DeferredCharge chargeDeferred(const StageEstimate& e, int residentI, int residentW, int atI,
                              int atW, std::int64_t wsI) {
  const std::int64_t stashI = residentStashBytes(e, residentI, atI);
  // W's own stash is in its working set.
  const std::int64_t atWeight =
      atW > 0 ? residentStashBytes(e, residentW - 1, atW - 1) + e.weightWorkingBytes : 0;
  return {stashI, std::max<std::int64_t>(0, atWeight - stashI - wsI)};
}
}  // namespace

StageEstimate CostModel::stage(const PipelineShape& shape, int k, int first, int last,
                               StashPolicy policy) const {
  std::int64_t ws = 0;
  const double f = scale(shape);
  for (int l = first; l < last; ++l) ws = std::max(ws, workingBytes(l, f));
  return stage(shape, k, first, last, policy, ws);
}

StageEstimate CostModel::stage(const PipelineShape& shape, int k, int first, int last,
                               StashPolicy policy, std::int64_t maxWorking, bool timesOnly) const {
  PIPEFB_ASSERT(first < last && first >= 0 && last <= numLayers(),
                "bad stage [" << first << "," << last << ")");
  const double f = scale(shape);
  const int S = shape.stages, M = shape.microbatches;
  const bool split = shape.splits(k);
  // A PipeFB stage that is not split (folded, odd S: the middle one) runs F and B on one
  // device (Note [PipeFB device order]): min(M, S + 1) stashes, one version, no weight
  // messages.
  const bool unsplitPipeFb = isSplit(shape.kind) && !split;
  // Note [Decoupled devices]: a segment's links and waiting messages are its range's.
  const bool decoupled = shape.decoupled();
  const int fd = shape.forwardDevice(k), bd = shape.backwardDevice(k);
  const ClusterDevice& fdev = cluster_.devices[fd];
  const ClusterDevice& bdev = cluster_.devices[bd];

  StageEstimate e;
  e.policy = policy;
  e.effective = schedules::effectivePolicy(policy, split);
  e.same = !split;
  const bool ckpt = schedules::isCheckpoint(e.effective);
  const bool off = schedules::isOffloaded(e.effective);

  const std::int64_t W = range(param_, first, last);
  const std::int64_t G = range(grad_, first, last);
  // Note [Optimizer offload in the cost model]
  const std::int64_t O = shape.optimizerOnHost ? 0 : range(opt_, first, last);
  const std::int64_t hostOptimizer = shape.optimizerOnHost ? W + G + range(opt_, first, last) : 0;
  // Weights on a device: the parameters and the buffers (BatchNorm statistics) of its copy.
  const std::int64_t Wres = W + range(buffer_, first, last);
  const std::int64_t graph = scaled(range(saved_, first, last), f);
  const std::int64_t input = scaled(inputBytes(first), f);
  const std::int64_t output = scaled(profile_.layers[last - 1].outputBytes, f);
  // Note [Comm buffers in the cost model]: the iteration's inputs wait on stage 0's forward
  // device, its targets on the last stage's backward device.
  const std::int64_t oneInput = k == 0 ? scaled(profile_.inputBytes, f) : 0;
  const std::int64_t targetsFed = k == S - 1 ? M * scaled(profile_.targetBytes, f) : 0;
  // Note [Waiting messages]: activations sent to F ahead of it, gradients (and the last
  // stage's outputs) sent to B ahead of it. A folded device is charged both of its
  // stages' counts (each the most over the device's compute starts: an upper bound).
  // Note [Recomputed last output]: a recomputing B(S-1) is sent no output.
  const bool outputTravels = k == S - 1 && schedules::lastOutputTravels(split, ckpt);
  // (Memory only: the DP's times-only look, Note [Planner speed], never reads them.)
  const WaitingBytes waiting =
      timesOnly ? WaitingBytes{} : waitingBytes(shape, k, first, last, outputTravels);
  const std::int64_t actsWaiting = waiting.activations, gradsWaiting = waiting.gradients;
  // A kept graph (not offloaded) also holds the stage's output: execForward's stash entry
  // keeps the graph root, and the profile's saved bytes leave the output out. An offloaded
  // graph holds what of it the last layer's graph saved (Note [Measured saved bytes]).
  const std::int64_t savedOutput = scaled(profile_.layers[last - 1].savedOutputBytes, f);
  e.stashBytes = ckpt ? input : graph + (off ? savedOutput : output);
  // Note [What waits for W]
  e.deferredStashBytes = (ckpt ? graph + output : e.stashBytes) + output;
  const int copies = unsplitPipeFb ? 0 : weightCopies(shape.kind, S, k, M, shape.asyncLag);
  // Note [Weight-version offload] (Lowering.h): an offloaded stage's stashed versions go to
  // the host pool; the contract's count stays on the device (pipefb-async's one copy always
  // stays). PipeDream moves one version per microbatch (OFFW after its F, PREW lookahead
  // compute actions before its B) when compute runs in between: 2 (copies - 1) compute
  // actions separate F(s,m) from B(s,m) in the steady state. Each version is away for
  // 2 (copies - 1) - lookahead of them, one F and one B per version, so at most
  // copies - 1 - floor(lookahead / 2) are in the host pool at once (more than the
  // copies - deviceCopies the device's bound leaves: the device's count is taken at
  // compute starts). The host pool's weight-version peak simulated (pipefb_sim --schedule
  // pipedream --policy offload --microbatches 8 --iterations 3, S = 2..5, lookahead 0..3)
  // equals the stages' sum of this in 13 of 16 cases and is one version below it in 3.
  const bool offW = off && shape.offloadWeights;
  const int deviceCopies =
      offW ? schedules::residentStashedVersions(copies, shape.lookahead) : copies;
  const bool movesCopies = offW && shape.kind == ScheduleKind::PipeDream && copies > 0 &&
                           2 * (copies - 1) > shape.lookahead;
  const int hostCopies = movesCopies ? copies - 1 - shape.lookahead / 2 : 0;

  // Times (Note [Planner cost model]).
  const double fspeed = speed(shape, fd), bspeed = speed(shape, bd);
  e.forwardTime = forwardTime(first, last, f) / fspeed;
  e.backwardTime =
      (backwardTime(first, last, f) + (ckpt ? recomputeTime(first, last, f) : 0.0)) / bspeed;
  e.stepTime = range(step_, first, last) / bspeed +
               (shape.optimizerOnHost ? bdev.host.time(G) + bdev.host.time(W) : 0.0);
  // Not scaled by the microbatch: the excess is parameter-sized.
  e.afterStepTime = std::max(0.0, range(afterStep_, first, last) - range(B_, first, last)) / bspeed;
  // Note [Replicated pipelines] (Solver.h): a ring all-reduce of the stage's gradients
  // over the R replicas' backward devices before every step, charged to the backward
  // device like the step (not hidden under the backward: the bound is conservative).
  if (shape.replicas > 1) {
    const int R = shape.replicas;
    const Link ring = cluster_.link(bd, (bd + 1) % cluster_.numDevices());
    e.allReduceTime = 2.0 * (R - 1) * ring.latency +
                      (ring.bandwidth > 0 ? 2.0 * (R - 1) / R * double(G) / ring.bandwidth : 0.0);
  }
  e.stepShare =
      (e.stepTime + e.afterStepTime + e.allReduceTime) * stepsPerMicrobatch(shape.kind, M);
  const double stepPerMb = e.stepShare;
  // Note [Weight snapshots]: one per F when PipeDream keeps copies (a STEP after every B).
  if (shape.kind == ScheduleKind::PipeDream && copies > 0)
    e.snapshotTime = range(snapshot_, first, last) / fspeed;
  e.linkIn = decoupled ? 0.0 : linkTime(shape, k, first);
  if (outputTravels && !decoupled)
    e.linkOut = cluster_.link(fd, bd).time(scaled(profile_.layers[last - 1].outputBytes, f));

  // Times: the busiest of the stage's resources. The DP's times-only look stops here
  // (Note [Planner speed]): what follows is memory.
  if (split) {
    e.forwardCompute = e.forwardTime + e.snapshotTime;
    e.backwardCompute = e.backwardTime + stepPerMb;
    e.forwardCopy = off ? fdev.host.time(e.stashBytes) : 0;
    e.backwardCopy = off ? bdev.host.time(e.stashBytes) : 0;
    if (shape.lookahead == 0) {  // Note [Prefetch distance zero]
      e.backwardCompute += e.backwardCopy;
      e.backwardCopy = 0;
    }
    if (e.linkOut > 0 && outputAtReceive(shape.kind, S, M, shape.folded, shape.lag())) {
      // Note [Output at its receive in the cost model]
      e.forwardCompute += e.linkOut;
      e.backwardCompute += e.linkOut;
    }
    struct {
      double t;
      Resource r;
    } rs[] = {{e.forwardCompute, Resource::ForwardCompute},
              {e.backwardCompute, Resource::BackwardCompute},
              {e.forwardCopy, Resource::ForwardCopy},
              {e.backwardCopy, Resource::BackwardCopy},
              {e.linkIn, Resource::LinkIn},
              {e.linkOut, Resource::LinkOut}};
    e.time = -1;
    for (auto& x : rs)
      if (x.t > e.time) e.time = x.t, e.binding = x.r;
  } else {
    e.forwardCompute = e.backwardCompute =
        e.forwardTime + e.snapshotTime + e.backwardTime + stepPerMb;
    e.forwardCopy = e.backwardCopy = (off ? 2 * fdev.host.time(e.stashBytes) : 0) +
                                     (movesCopies ? 2 * fdev.host.time(W) : 0);  // OFFW + PREW
    e.time = e.forwardCompute;
    e.binding = Resource::Compute;
    if (e.forwardCopy > e.time) e.time = e.forwardCopy, e.binding = Resource::Copy;
    if (e.linkIn > e.time) e.time = e.linkIn, e.binding = Resource::LinkIn;
  }
  if (timesOnly) return e;
  e.inFlight = unsplitPipeFb ? schedules::unsplitPipefbInFlight(S, M)
                             : inFlightStashes(shape.kind, S, k, M, shape.asyncLag);
  e.versions = unsplitPipeFb ? 1 : weightVersions(shape.kind, S, k, M, shape.asyncLag);
  auto w = [](CategoryBytes& m, MemoryCategory c, std::int64_t v) { m[index(c)] += v; };
  {  // Note [Forward peak]; under a checkpoint kind the stash is the input
    const std::int64_t fpeak = scaled(forwardPeak(k, first, last, !ckpt), f);
    e.forwardPeakBytes = ckpt ? fpeak + e.stashBytes : std::max(fpeak, e.stashBytes);
  }
  // Note [Gathered weight gradients]: B's working set (plus the recomputed graph), and
  // the gradient of the stage's output (received, or the loss's), which B holds throughout
  // and the profile's working set leaves out (measured beside, not inside, a layer's B).
  // (It is at least the largest layer working set, maxWorking, that the caller passes.)
  // Note [Backward layer by layer]: a fused B before the last stage is charged its graph
  // as it frees it (the own stash is in Stash: keep and offload charge the rest above it).
  // The last stage is charged whole, and at least what its B starts with: the loss (a
  // measured profile's lossWorkingBytes, the output's gradient included) beside the whole
  // graph, and under a checkpoint kind the recomputed output and F's (if it is there).
  const bool layered = !splitsBackward(shape.kind) && k < S - 1;
  const bool inPlace = gradientsInPlace(shape, k, policy);
  const std::int64_t loss = k == S - 1 ? scaled(profile_.lossWorkingBytes, f) : 0;
  // Note [Backward layer by layer]: a checkpointed B recomputes on the stashed input itself,
  // so what its first layer's graph saves of that input is in Stash, not beside it.
  const std::int64_t onStash = ckpt ? scaled(profile_.layers[first].savedInputBytes, f) : 0;
  // It also copies the stage's buffers before the recompute and puts them back at its end.
  const std::int64_t buffersCopy = ckpt ? range(buffer_, first, last) : 0;
  auto backwardWs = [&] {
    if (layered) {
      const std::int64_t peak = backwardLayered(shape, k, first, last, inPlace, onStash);
      // A checkpointed B first recomputes F with autograd (Note [Forward peak]), and holds
      // the recomputed output through the backward (a kept one is in the stash).
      return ckpt
                 ? std::max(peak + output, scaled(forwardPeak(k, first, last, true), f) - onStash) +
                       output + buffersCopy
                 : peak - graph + output;
    }
    // Checkpointed: the recomputed graph and output, held until B ends, and before the
    // last stage F's output as well; the last stage's loss reads the recomputed one, and
    // its F keeps none (Note [Recomputed last output]). A split last stage that does not
    // recompute reads the output it was sent (its stash is the graph alone).
    // Note [Loss in the recomputed graph]: a last stage's B that recomputes (not I) lets
    // the output go once the loss is taken in its graph; the loss's transient with the
    // output until then is the profile's recomputedLossBytes.
    const bool lossInGraph =
        k == S - 1 && schedules::lossInRecomputedGraph(ckpt, splitsBackward(shape.kind));
    const std::int64_t recomputedGraph = ckpt ? graph - onStash + buffersCopy : 0;
    const std::int64_t recomputed = recomputedGraph + (ckpt && !lossInGraph ? output : 0);
    // Note [Loss scalars beside the backward] (CostModel.h): B's root and its seed.
    const std::int64_t lossScalars = lossInGraph ? 2 * kLossScalarBytes : 0;
    // Note [What waits for W]: an I makes no weight gradient (W does, charged at its start).
    const bool noWeightGrads = inPlace || splitsBackward(shape.kind);
    const std::int64_t whole =
        std::max(maxWorking, backwardWorking(shape, k, first, last, noWeightGrads)) + recomputed +
        output + lossScalars;
    if (lossInGraph)
      return std::max(whole, recomputedGraph + scaled(profile_.recomputedLossBytes, f));
    // Note [Outputs at the loss]: the outputs that arrive only after the loss wait beside
    // the rest of B (comm buffers, charged here as B's).
    return std::max(
        whole + waiting.outputsAfterLoss,
        ckpt ? recomputed + (k == S - 1 ? 0 : output) + loss : (outputTravels ? output : 0) + loss);
  };
  // Note [What waits for W]: W runs autograd on its own stash's graph, which it frees as it
  // goes (Note [Backward layer by layer]), for the gathered weight gradients, beside the
  // output and its gradient, the graph's root and seed.
  e.weightWorkingBytes =
      splitsBackward(shape.kind)
          ? std::max(maxWorking, backwardLayered(shape, k, first, last, false, 0)) + 2 * output
          : 0;
  // Note [Step working set]: what the step transient needs beyond stash + working set.
  const std::int64_t stepWs = shape.optimizerOnHost ? 0 : stepWorking(first, last);
  e.stepWorkingBytes = stepWs;
  const bool flushing = isFlushing(shape.kind) || unsplitPipeFb;
  // Of `resident` stashes, `atStep` are still there when STEP starts (all of them between
  // an asynchronous schedule's microbatches, none after a flush's last B).
  // `stash`: the stash category's charge; `atStep` (plain) stashes of it are still there.
  auto stepExcess = [&](std::int64_t stash, int atStep, std::int64_t working) {
    const std::int64_t gone = std::max<std::int64_t>(0, stash - atStep * e.stashBytes);
    return std::max<std::int64_t>(0, stepWs - (gone + working));
  };
  if (split) {
    const std::int64_t wsB = backwardWs();
    e.backwardWorkingBytes = wsB;
    // Forward device (Note [Forward device memory]): weights, the stash until its offload
    // copy is done, F's working set; RecvWeights copies into place. pipefb-async with a
    // graph stash keeps the old copy beside the new one (not on the backward device), its
    // buffers too (resnet50/8 pipefb-async-keep's forward devices: 2 x Wres at the peak).
    const bool oldCopyOnForward = shape.kind == ScheduleKind::PipeFbAsync && !ckpt;
    // Note [Offloads in flight]: the stash F is building plus, through the copy engine,
    // up to kOffloadsInFlight earlier ones whose D2H copy has not finished.
    const int viaCopyEngine = inputStashOnly(cluster_, shape, k) ? 0 : kOffloadsInFlight;
    const std::int64_t fstash = std::min(e.inFlight, 1 + viaCopyEngine) * e.stashBytes;
    e.copyingOutBytes = viaCopyEngine > 0 ? e.stashBytes : 0;
    // Note [Forward peak]: the stash F is building is part of F's own peak.
    const std::int64_t fpeak = scaled(forwardPeak(k, first, last, !ckpt), f);
    const std::int64_t fws = ckpt ? fpeak : std::max<std::int64_t>(0, fpeak - e.stashBytes);
    w(e.forwardMemory, MemoryCategory::Weights, Wres);
    w(e.forwardMemory, MemoryCategory::WeightVersions, oldCopyOnForward ? Wres : 0);
    w(e.forwardMemory, MemoryCategory::Stash, fstash);
    w(e.forwardMemory, MemoryCategory::WorkingSet, fws);
    // F(0,0) runs beside all M inputs, a later F beside fewer and the earlier stashes;
    // under an asynchronous kind the next iteration's F(0,0) beside all M and the copy
    // before it, held across iterations (Note [Held offloads] in schedules/HeldOffloads.h; seed 0
    // instance 28 of PlanRunsTest, alexnet/8 pipefb-async-checkpoint-offload S=3 M=2,
    // stage 0's forward device held 2 inputs and 2 stashes: +14.9% over the plan). A
    // decoupled forward device pairs each F with the copy before it (Note [Decoupled
    // devices]): the M-th input is charged there.
    const bool heldAcross = !isFlushing(shape.kind);
    const std::int64_t earlier = fstash - e.stashBytes;
    const std::int64_t inputs =
        decoupled    ? (M - 1) * oneInput
        : heldAcross ? M * oneInput
                     : std::max<std::int64_t>((M - 1) * oneInput, M * oneInput - earlier);
    e.firstInputBytes = decoupled ? oneInput : 0;
    e.firstInputBesideCopy = heldAcross;
    w(e.forwardMemory, MemoryCategory::CommBuffers, inputs + actsWaiting);
    // Note [Folded pace]: what waits beside F only on a folded device.
    if (shape.folded && isFlushing(shape.kind)) {
      const std::int64_t inputsAtB =
          waitingFor(shape.kind, S, M, true, shape.lag()).inputsAtBackward * oneInput;
      e.forwardCommOnlyAtForward =
          std::max<std::int64_t>(0, inputs - inputsAtB) + waiting.activationsOnlyAtForward;
      e.backwardCommOnlyAtForward = waiting.gradientsOnlyAtForward;
    }
    // Note [Split backward]: pipefb-zb's W runs after its I, its stash still on the device
    // beside the prefetched ones (at most one, Note [PipeFB with a split backward]).
    const int deferred =
        splitsBackward(shape.kind) ? generatedContract(shape.kind, S, M).deferredW.at(k) : 0;
    const int deferredAtI =
        splitsBackward(shape.kind) ? generatedContract(shape.kind, S, M).deferredAtI.at(k) : 0;
    // Note [Stashes at a backward]: fewer on a folded device whose PREs follow its
    // forwards' offloads (counted at B starts: not for a split backward, whose stashes
    // stay until W).
    const bool countedAtB = shape.folded && !splitsBackward(shape.kind);
    int resident = std::min(
        {e.inFlight, shape.lookahead + 1 + deferred,
         countedAtB ? foldedStashesAtBackward(shape.kind, S, M, shape.lookahead, shape.lag()).at(k)
                    : e.inFlight});
    // Note [Prefetches bound ahead]
    if (isAsync(shape.kind) && !splitsBackward(shape.kind))
      resident = std::max(resident, asyncStashesAtBackward(shape.kind, S, M, shape.lookahead,
                                                           shape.folded, shape.lag())
                                        .at(k));
    w(e.backwardMemory, MemoryCategory::Weights, Wres);
    // The weights B(s,m) runs on when a STEP came after F(s,m): kept on the backward device
    // (keepVersionsBeforeStep), beside the old forward copy a graph stash keeps.
    // Under a checkpoint kind, pipefb-async's weight prediction is that version and sends
    // the next one by reference; a graph kind sends its weights by reference too (Note
    // [Forward device memory]): no snapshot.
    const bool async = shape.kind == ScheduleKind::PipeFbAsync;
    // Note [Planned async lag]: at lag 1 a decoupled device's offloaded versions are there
    // only near their segment's first B, charged there (DecoupledDevice).
    const bool windowed = async && decoupled && shape.lag() == 1 && ckpt && offW;
    // Their BatchNorm statistics stay, charged with the states (measured beside the version
    // of the B that peaked: those of the segments that had not run their B yet).
    e.windowedVersionBytes = windowed ? deviceCopies * W : 0;
    w(e.backwardMemory, MemoryCategory::WeightVersions,
      ((windowed ? 0 : deviceCopies) + (async && ckpt)) * W +
          (windowed ? range(buffer_, first, last) : 0));
    w(e.backwardMemory, MemoryCategory::Grads, G);
    w(e.backwardMemory, MemoryCategory::OptimizerState, O);
    w(e.backwardMemory, MemoryCategory::CommBuffers,
      (shape.replicas > 1 ? G : 0) +  // the gradient buckets (Note [Gradient buckets])
          targetsFed + gradsWaiting);
    e.residentStashes = resident;
    // Note [What waits for W]
    // (Near B: lookahead + 1 prefetched, and the ones that wait for their W.)
    const int residentAtI = splitsBackward(shape.kind)
                                ? std::min(resident, shape.lookahead + 1 + deferredAtI)
                                : resident;
    // A split stage's W comes right after its I (Note [PipeFB with a split backward]), and the
    // lowering issues the next PRE only after that I: lookahead of them beside W's own.
    const int residentAtW =
        splitsBackward(shape.kind) ? std::min(resident, shape.lookahead + deferred) : resident;
    const DeferredCharge waitsForW =
        chargeDeferred(e, residentAtI, residentAtW, deferredAtI, deferred, e.backwardWorkingBytes);
    w(e.backwardMemory, MemoryCategory::Stash, waitsForW.stash);
    // Note [Folded pace]: a folded pipefb-async device steps after its stage's last B of
    // the iteration, beside the prefetches its lowering issued before that STEP (Note
    // [Stashes at a step]).
    const int atStep =
        shape.folded && async
            ? std::min(resident,
                       foldedStashesAtStep(shape.kind, S, M, shape.lookahead, shape.lag()).at(k))
        : flushing ? 0
                   : resident;
    // (The outputs in wsB that arrive after B's loss may still wait at the step.)
    w(e.backwardMemory, MemoryCategory::WorkingSet,
      wsB + waitsForW.excess +
          stepExcess(waitsForW.stash, atStep, wsB + waitsForW.excess - waiting.outputsAfterLoss));
  } else {
    const std::int64_t wsB = backwardWs();
    e.backwardWorkingBytes = wsB;
    // Note [Split backward]: the stashes waiting for their W stay beside the prefetched ones.
    const int deferred =
        splitsBackward(shape.kind) ? generatedContract(shape.kind, S, M).deferredW.at(k) : 0;
    const int deferredAtI =
        splitsBackward(shape.kind) ? generatedContract(shape.kind, S, M).deferredAtI.at(k) : 0;
    // Note [Prefetches after the forward phase] (Lowering.h). A folded placement's
    // unsplit stage is not looked at: charged as if its PREs fell among its Fs.
    const bool phased = !unsplitPipeFb && phasedStages(shape.kind, S, M, shape.lag()).at(k);
    const int resident =
        off ? schedules::residentOffloadedStashes(e.inFlight, shape.lookahead, phased, deferred)
            : e.inFlight;
    // Note [Two phases]: with the forward phase first, no activation waits in the B phase.
    const bool twoPhases = phased && !shape.sharesDevices();
    CategoryBytes& m = e.backwardMemory;
    w(m, MemoryCategory::Weights, Wres);
    // Note [Versions being copied out] (Lowering.h): beside the contract's versions, the
    // one an OFFW is still copying out. One copy goes out at a time, stash or version; where
    // the stash count already holds a slot for it (lookahead + 2), only a version larger
    // than a stash needs more.
    static_assert(schedules::kOffloadsInFlight == 1, "one copy out at a time: one slot");
    std::int64_t versionBytes = deviceCopies * W;
    if (movesCopies && schedules::heldStashedVersions(copies, shape.lookahead) > deviceCopies) {
      const bool stashSlot = !phased && resident > std::min(e.inFlight, shape.lookahead + 1);
      versionBytes += stashSlot ? std::max<std::int64_t>(0, W - e.stashBytes) : W;
    }
    w(m, MemoryCategory::WeightVersions, versionBytes);
    w(m, MemoryCategory::Grads, G);
    w(m, MemoryCategory::OptimizerState, O);
    const std::int64_t buckets = shape.replicas > 1 ? G : 0;  // Note [Gradient buckets]
    // Note [Comm buffers in the cost model]: the inputs whose F has not run when B peaks.
    const int inputsWaiting = isFlushing(shape.kind) ? std::max(0, M - e.inFlight) : M - 1;
    // (actsWaiting: those that wait at B's starts, Note [Forward beside backward]; none in
    // the B phase of a stage with the forward phase first, Note [Two phases].)
    w(m, MemoryCategory::CommBuffers,
      buckets + inputsWaiting * oneInput + targetsFed + actsWaiting + gradsWaiting);
    // An offloaded last stage's F keeps its output for the loss on the device (execForward:
    // OFF takes autograd's saved tensors, not the loss's input), one per microbatch in
    // flight. (Seed 0 instance 29 of PlanRunsTest, gpt2-tiny gpipe-offload, held 4 logits
    // beside 2 stashes on the head's device.) Not on shared devices yet: sharedDeviceMemory
    // reads the stash category as whole stashes.
    const std::int64_t lossInputs =
        k == S - 1 && off && !ckpt && !shape.sharesDevices() ? e.inFlight * output : 0;
    e.residentStashes = resident;
    // Note [What waits for W]
    const int residentAtI =
        off ? schedules::residentOffloadedStashes(e.inFlight, shape.lookahead, phased, deferredAtI)
            : e.inFlight;
    const DeferredCharge waitsForW =
        chargeDeferred(e, residentAtI, resident, deferredAtI, deferred, wsB);
    const std::int64_t stash = waitsForW.stash + lossInputs;
    w(m, MemoryCategory::Stash, stash);
    // Note [Step working set]: PipeDream's STEP(s,m) comes right after B(s,m), which let go
    // of the weight copy F(s,m) ran on: the step's transient has that copy's room too.
    const std::int64_t freedAtStep = shape.kind == ScheduleKind::PipeDream && copies > 0 ? W : 0;
    // Note [Forward beside backward]: F's excess over B (a stage with the forward phase
    // first charges its F phase whole, below).
    const std::int64_t atB = stash + wsB + waitsForW.excess + actsWaiting + gradsWaiting;
    const std::int64_t atF = residentStashBytes(e, std::max(0, resident - 1), deferred) +
                             e.forwardPeakBytes + waiting.atForward;
    const std::int64_t forwardExcess =
        forwardBesideBackward(shape) && !twoPhases ? std::max<std::int64_t>(0, atF - atB) : 0;
    // (A flushing stage steps after its last B: its stashes and loss inputs are gone.)
    w(m, MemoryCategory::WorkingSet,
      wsB + waitsForW.excess +
          stepExcess(waitsForW.stash, flushing ? 0 : resident,
                     wsB + waitsForW.excess + freedAtStep + (flushing ? lossInputs : 0)) +
          forwardExcess);
    // Note [Held at a same-device stage's starts] (Lowering.h): a pipedream stage that
    // stashes weight versions and offloads them (not the last: it has none, and keeps its
    // outputs for the loss) is charged its stashes, versions and inputs as they are held
    // together at its B, F and STEP starts, not each category's worst beside the others'.
    if (shape.kind == ScheduleKind::PipeDream && offW && copies > 0 && k < S - 1 &&
        forwardBesideBackward(shape) && !twoPhases) {
      using Held = schedules::SameDeviceHeld;
      auto held = [&](const Held& h) {
        return h.stashes * e.stashBytes + h.versions * W + h.inputs * oneInput;
      };
      const Held* atB = nullptr;
      std::int64_t atF = 0, atStep = 0;
      for (const Held& h : pipedreamHeld(S, k, M, shape.lookahead)) {
        if (h.at == Held::At::Backward && (!atB || held(h) > held(*atB))) atB = &h;
        if (h.at == Held::At::Forward) atF = std::max(atF, held(h));
        if (h.at == Held::At::Step) atStep = std::max(atStep, held(h));
      }
      PIPEFB_ASSERT(
          atB, "stage " << k << " of pipedream S=" << S << " M=" << M << " has no backward start");
      const std::int64_t messages = actsWaiting + gradsWaiting;
      const std::int64_t backward = held(*atB) + wsB + messages;
      const std::int64_t forward = atF + e.forwardPeakBytes + waiting.atForward;
      const std::int64_t step = atStep + stepWs + messages;
      m[index(MemoryCategory::Stash)] = atB->stashes * e.stashBytes;
      m[index(MemoryCategory::WeightVersions)] = atB->versions * W;
      m[index(MemoryCategory::CommBuffers)] =
          buckets + atB->inputs * oneInput + targetsFed + messages;
      m[index(MemoryCategory::WorkingSet)] =
          wsB + std::max<std::int64_t>(0, std::max(forward, step) - backward);
    }
    // Note [Two phases]
    // A stage whose iteration runs all its Fs before its first B (Note [Prefetches after
    // the forward phase]) peaks in one of two phases. In the B phase every F ran: no
    // activation waits for one (charged above without them). In the F phase no gradient
    // waits and no B runs: its last F, at its own peak (forwardPeakBytes, with the stash
    // it builds), beside the stashes of the Fs before it (offloaded: the kOffloadsInFlight
    // still being copied out), their outputs kept for the loss, the waiting activations
    // and, on stage 0, the inputs not taken yet (F(0,j) beside M - j of them). The larger
    // phase is the stage's charge. (Charged beside the B phase, gpt2-tiny gpipe-offload's
    // head, PlanRunsTest seed 0 instance 29, peaked 10.5% below the plan: 3 activations
    // that wait only before its Fs.)
    if (twoPhases) {
      CategoryBytes f{};
      for (MemoryCategory c : {MemoryCategory::Weights, MemoryCategory::WeightVersions,
                               MemoryCategory::Grads, MemoryCategory::OptimizerState})
        f[index(c)] = m[index(c)];
      // F(s,j), j = 0 .. n - 1: the inputs left and the stashes before it.
      std::int64_t inputs = 0, stashes = 0;
      for (int j = 0; j < e.inFlight; ++j) {
        const int held = off ? std::min(j, kOffloadsInFlight) : j;
        const std::int64_t in = (M - j) * oneInput;
        const std::int64_t st = held * e.stashBytes + (lossInputs > 0 ? j * output : 0);
        if (in + st > inputs + stashes) inputs = in, stashes = st;
      }
      w(f, MemoryCategory::CommBuffers,
        buckets + inputs + targetsFed + waiting.activationsAtForward);
      w(f, MemoryCategory::Stash, stashes);
      w(f, MemoryCategory::WorkingSet, e.forwardPeakBytes);
      if (total(f) > total(m)) m = f;
    }
    e.forwardMemory = m;
  }
  e.hostBytes = (off ? static_cast<std::int64_t>(e.inFlight) * e.stashBytes : 0) + hostOptimizer +
                static_cast<std::int64_t>(hostCopies) * W +  // Note [Weight-version offload]
                e.windowedVersionBytes;  // in the host pool between its OFFW and PREW
  return e;
}

}  // namespace pipefb::planner
