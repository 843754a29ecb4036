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

void charge(CategoryBytes& m, MemoryCategory c, std::int64_t v) { m[index(c)] += v; }

// What stage() derives once from the shape, the stage and its policy: the terms its
// charges below read.
struct StageTerms {
  const PipelineShape* shape = nullptr;
  int k = 0, first = 0, last = 0, S = 1, M = 1;
  double f = 1;  // the shape's microbatch over the profile's
  StashPolicy policy = StashPolicy::Keep;
  bool split = false;
  // A PipeFB stage that is not split (folded, odd S: the middle one) runs F and B on one
  // device (Note [PipeFB device order]): min(M, S + 1) stashes, one version, no weight
  // messages.
  bool unsplitPipeFb = false;
  // Note [Decoupled devices]: a segment's links and waiting messages are its range's.
  bool decoupled = false;
  int fd = 0, bd = 0;
  const ClusterDevice* fdev = nullptr;
  const ClusterDevice* bdev = nullptr;
  bool ckpt = false, off = false;
  // Of the layers [first, last): parameters, gradients, optimizer state (on the device),
  // buffers (unscaled), the saved graph, the stage's input and output (scaled).
  std::int64_t W = 0, G = 0, O = 0, buffers = 0, graph = 0, input = 0, output = 0;
  // Note [What waits for W]: what a split backward's I keeps for W (0 on stage 0, whose W
  // runs from the output).
  std::int64_t keptGrad = 0;
  std::int64_t hostOptimizer = 0;
  // Weights on a device: the parameters and the buffers (BatchNorm statistics) of its copy.
  std::int64_t Wres = 0;
  // A split stage's forward device: its copy (Note [Half-precision weights on a device]).
  std::int64_t WresForward = 0;
  std::int64_t oneInput = 0, targetsFed = 0;
  bool outputTravels = false;
  CostModel::WaitingBytes waiting;
  std::int64_t actsWaiting = 0, gradsWaiting = 0;
  // Note [Weight-version offload]
  int copies = 0, deviceCopies = 0, hostCopies = 0;
  bool offW = false, movesCopies = false;
  bool flushing = false;
  // The unscaled sums of B after a step, of B, and of the weight snapshot (the times).
  double afterStepSum = 0, backwardSum = 0, snapshotSum = 0;
  // Memory only, known once the times are (Note [Planner speed]): F's peak (Note [Forward
  // peak]) under the policy and with autograd, scaled; the step's working set.
  std::int64_t forwardPeak = 0, forwardPeakWithGraph = 0, stepWs = 0;
};

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
void countWeightCopies(StageTerms& t) {
  const PipelineShape& shape = *t.shape;
  t.copies = t.unsplitPipeFb ? 0 : weightCopies(shape.kind, t.S, t.k, t.M, shape.asyncLag);
  t.offW = t.off && shape.offloadWeights;
  t.deviceCopies =
      t.offW ? schedules::residentStashedVersions(t.copies, shape.lookahead) : t.copies;
  t.movesCopies = t.offW && shape.kind == ScheduleKind::PipeDream && t.copies > 0 &&
                  2 * (t.copies - 1) > shape.lookahead;
  t.hostCopies = t.movesCopies ? t.copies - 1 - shape.lookahead / 2 : 0;
}

// Times (Note [Planner cost model]).
void chargeTimes(const CostModel& model, const StageTerms& t, StageEstimate& e) {
  const PipelineShape& shape = *t.shape;
  const int k = t.k, first = t.first, last = t.last, M = t.M;
  const double f = t.f;
  const bool ckpt = t.ckpt;
  const double fspeed = model.speed(shape, t.fd), bspeed = model.speed(shape, t.bd);
  e.forwardTime = model.forwardTime(first, last, f) / fspeed;
  e.backwardTime =
      (model.backwardTime(first, last, f) + (ckpt ? model.recomputeTime(first, last, f) : 0.0)) /
      bspeed;
  e.stepTime = model.stepSum(first, last) / bspeed +
               (shape.optimizerOnHost ? t.bdev->host.time(t.G) + t.bdev->host.time(t.W) : 0.0);
  // Not scaled by the microbatch: the excess is parameter-sized.
  e.afterStepTime = std::max(0.0, t.afterStepSum - t.backwardSum) / bspeed;
  // Note [Replicated pipelines] (Solver.h): a ring all-reduce of the stage's gradients
  // over the R replicas' backward devices before every step, charged to the backward
  // device like the step (not hidden under the backward: the bound is conservative).
  if (shape.replicas > 1) {
    const int R = shape.replicas;
    const Cluster& cluster = model.cluster();
    const Link ring = cluster.link(t.bd, (t.bd + 1) % cluster.numDevices());
    e.allReduceTime = 2.0 * (R - 1) * ring.latency +
                      (ring.bandwidth > 0 ? 2.0 * (R - 1) / R * double(t.G) / ring.bandwidth : 0.0);
  }
  e.stepShare =
      (e.stepTime + e.afterStepTime + e.allReduceTime) * stepsPerMicrobatch(shape.kind, M);
  // Note [Weight snapshots]: one per F when PipeDream keeps copies (a STEP after every B).
  if (shape.kind == ScheduleKind::PipeDream && t.copies > 0)
    e.snapshotTime = t.snapshotSum / fspeed;
  e.linkIn = t.decoupled ? 0.0 : model.linkTime(shape, k, first);
  if (t.outputTravels && !t.decoupled)
    e.linkOut = model.cluster()
                    .link(t.fd, t.bd)
                    .time(scaled(model.profile().layers[last - 1].outputBytes, f));
}

// Times: the busiest of the stage's resources, its pace.
void chargePace(const StageTerms& t, StageEstimate& e) {
  const PipelineShape& shape = *t.shape;
  const bool off = t.off;
  const double stepPerMb = e.stepShare;
  if (t.split) {
    e.forwardCompute = e.forwardTime + e.snapshotTime;
    e.backwardCompute = e.backwardTime + stepPerMb;
    e.forwardCopy = off ? t.fdev->host.time(e.stashBytes) : 0;
    e.backwardCopy = off ? t.bdev->host.time(e.stashBytes) : 0;
    if (shape.lookahead == 0) {  // Note [Prefetch distance zero]
      e.backwardCompute += e.backwardCopy;
      e.backwardCopy = 0;
    }
    if (e.linkOut > 0 && outputAtReceive(shape.kind, t.S, t.M, shape.folded, shape.lag())) {
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
    e.forwardCopy = e.backwardCopy =
        (off ? 2 * t.fdev->host.time(e.stashBytes) : 0) +
        (t.movesCopies ? 2 * t.fdev->host.time(t.W) : 0);  // OFFW + PREW
    e.time = e.forwardCompute;
    e.binding = Resource::Compute;
    if (e.forwardCopy > e.time) e.time = e.forwardCopy, e.binding = Resource::Copy;
    if (e.linkIn > e.time) e.time = e.linkIn, e.binding = Resource::LinkIn;
  }
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
std::int64_t backwardWorkingSet(const CostModel& model, const StageTerms& t,
                                std::int64_t maxWorking) {
  const PipelineShape& shape = *t.shape;
  const int k = t.k, first = t.first, last = t.last, S = t.S;
  const double f = t.f;
  const bool ckpt = t.ckpt;
  const std::int64_t graph = t.graph, output = t.output;
  const bool layered = !splitsBackward(shape.kind) && k < S - 1;
  const bool inPlace = CostModel::gradientsInPlace(shape, k, t.policy);
  const std::int64_t loss = k == S - 1 ? scaled(model.profile().lossWorkingBytes, f) : 0;
  // Note [Backward layer by layer]: a checkpointed B recomputes on the stashed input itself,
  // so what its first layer's graph saves of that input is in Stash, not beside it.
  const std::int64_t onStash = ckpt ? scaled(model.profile().layers[first].savedInputBytes, f) : 0;
  // It also copies the stage's buffers before the recompute and puts them back at its end.
  const std::int64_t buffersCopy = ckpt ? t.buffers : 0;
  if (layered) {
    const std::int64_t peak = model.backwardLayered(shape, k, first, last, inPlace, onStash);
    // A checkpointed B first recomputes F with autograd (Note [Forward peak]), and holds
    // the recomputed output through the backward (a kept one is in the stash).
    return ckpt ? std::max(peak + output, t.forwardPeakWithGraph - onStash) + output + buffersCopy
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
  // I keeps the gradients into the weight nodes as it makes them (t.keptGrad).
  const std::int64_t whole =
      std::max(maxWorking, model.backwardWorking(shape, k, first, last, noWeightGrads)) +
      recomputed + output + lossScalars + t.keptGrad;
  if (lossInGraph)
    return std::max(whole, recomputedGraph + scaled(model.profile().recomputedLossBytes, f));
  // Note [Outputs at the loss]: the outputs that arrive only after the loss wait beside
  // the rest of B (comm buffers, charged here as B's).
  return std::max(
      whole + t.waiting.outputsAfterLoss,
      ckpt ? recomputed + (k == S - 1 ? 0 : output) + loss : (t.outputTravels ? output : 0) + loss);
}

// Note [Step working set]: what the step transient needs beyond stash + working set.
// Of `resident` stashes, `atStep` are still there when STEP starts (all of them between
// an asynchronous schedule's microbatches, none after a flush's last B).
// `stash`: the stash category's charge; `atStep` (plain) stashes of it are still there.
std::int64_t stepExcess(const StageTerms& t, const StageEstimate& e, std::int64_t stash, int atStep,
                        std::int64_t working) {
  const std::int64_t gone = std::max<std::int64_t>(0, stash - atStep * e.stashBytes);
  return std::max<std::int64_t>(0, t.stepWs - (gone + working));
}

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

// Note [Split backward]: the stashes whose W has not run, at W's starts (`atW`) and at I's
// (`atI`): pipefb-zb's W runs after its I, its stash still on the device beside the
// prefetched ones (at most one, Note [PipeFB with a split backward]). None without a
// split backward.
struct Deferred {
  int atW = 0, atI = 0;
};
Deferred deferredStashes(const StageTerms& t) {
  const PipelineShape& shape = *t.shape;
  if (!splitsBackward(shape.kind)) return {};
  const schedules::MemoryContract& c = generatedContract(shape.kind, t.S, t.M);
  return {c.deferredW.at(t.k), c.deferredAtI.at(t.k)};
}

// A split stage's forward device (Note [Forward device memory]): weights, the stash until
// its offload copy is done, F's working set; RecvWeights copies into place. pipefb-async
// with a graph stash keeps the old copy beside the new one (not on the backward device),
// its buffers too (resnet50/8 pipefb-async-keep's forward devices: 2 x Wres at the peak).
void chargeForwardDevice(const CostModel& model, const StageTerms& t, StageEstimate& e) {
  const PipelineShape& shape = *t.shape;
  const int k = t.k, S = t.S, M = t.M;
  const bool ckpt = t.ckpt;
  const std::int64_t oneInput = t.oneInput;
  const bool oldCopyOnForward = shape.kind == ScheduleKind::PipeFbAsync && !ckpt;
  // Note [Offloads in flight]: the stash F is building plus, through the copy engine,
  // up to kOffloadsInFlight earlier ones whose D2H copy has not finished.
  const int viaCopyEngine = inputStashOnly(model.cluster(), shape, k) ? 0 : kOffloadsInFlight;
  const std::int64_t fstash = std::min(e.inFlight, 1 + viaCopyEngine) * e.stashBytes;
  e.copyingOutBytes = viaCopyEngine > 0 ? e.stashBytes : 0;
  // Note [Forward peak]: the stash F is building is part of F's own peak.
  const std::int64_t fpeak = t.forwardPeak;
  const std::int64_t fws = ckpt ? fpeak : std::max<std::int64_t>(0, fpeak - e.stashBytes);
  charge(e.forwardMemory, MemoryCategory::Weights, t.WresForward);
  charge(e.forwardMemory, MemoryCategory::WeightVersions, oldCopyOnForward ? t.WresForward : 0);
  charge(e.forwardMemory, MemoryCategory::Stash, fstash);
  charge(e.forwardMemory, MemoryCategory::WorkingSet, fws);
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
      t.decoupled  ? (M - 1) * oneInput
      : heldAcross ? M * oneInput
                   : std::max<std::int64_t>((M - 1) * oneInput, M * oneInput - earlier);
  e.firstInputBytes = t.decoupled ? oneInput : 0;
  e.firstInputBesideCopy = heldAcross;
  charge(e.forwardMemory, MemoryCategory::CommBuffers, inputs + t.actsWaiting);
  // Note [Folded pace]: what waits beside F only on a folded device.
  if (shape.folded && isFlushing(shape.kind)) {
    const std::int64_t inputsAtB =
        waitingFor(shape.kind, S, M, true, shape.lag()).inputsAtBackward * oneInput;
    e.inputsOnlyAtForward = std::max<std::int64_t>(0, inputs - inputsAtB);
    e.forwardCommOnlyAtForward = e.inputsOnlyAtForward + t.waiting.activationsOnlyAtForward;
    e.backwardCommOnlyAtForward = t.waiting.gradientsOnlyAtForward;
  }
}

// A split stage's stashes resident on its backward device: lookahead + 1 prefetched, and
// the ones that wait for their W.
int residentOnBackward(const StageTerms& t, const StageEstimate& e, int deferred) {
  const PipelineShape& shape = *t.shape;
  const int k = t.k, S = t.S, M = t.M;
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
    resident = std::max(
        resident,
        asyncStashesAtBackward(shape.kind, S, M, shape.lookahead, shape.folded, shape.lag()).at(k));
  return resident;
}

// A split stage's backward device: its weights, the versions B runs on, gradients,
// optimizer state, the messages that wait for B, the stashes near B and B's working set.
void chargeBackwardDevice(const StageTerms& t, StageEstimate& e, std::int64_t wsB) {
  const PipelineShape& shape = *t.shape;
  const int k = t.k, S = t.S, M = t.M;
  const bool ckpt = t.ckpt;
  const std::int64_t W = t.W;
  const Deferred deferredW = deferredStashes(t);
  const int deferred = deferredW.atW, deferredAtI = deferredW.atI;
  const int resident = residentOnBackward(t, e, deferred);
  charge(e.backwardMemory, MemoryCategory::Weights, t.Wres);
  // The weights B(s,m) runs on when a STEP came after F(s,m): kept on the backward device
  // (keepVersionsBeforeStep), beside the old forward copy a graph stash keeps.
  // Under a checkpoint kind, pipefb-async's weight prediction is that version and sends
  // the next one by reference; a graph kind sends its weights by reference too (Note
  // [Forward device memory]): no snapshot.
  const bool async = shape.kind == ScheduleKind::PipeFbAsync;
  // Note [Planned async lag]: at lag 1 a decoupled device's offloaded versions are there
  // only near their segment's first B, charged there (DecoupledDevice).
  const bool windowed = async && t.decoupled && shape.lag() == 1 && ckpt && t.offW;
  // Their BatchNorm statistics stay, charged with the states (measured beside the version
  // of the B that peaked: those of the segments that had not run their B yet).
  e.windowedVersionBytes = windowed ? t.deviceCopies * W : 0;
  charge(e.backwardMemory, MemoryCategory::WeightVersions,
         ((windowed ? 0 : t.deviceCopies) + (async && ckpt)) * W + (windowed ? t.buffers : 0));
  charge(e.backwardMemory, MemoryCategory::Grads, t.G);
  charge(e.backwardMemory, MemoryCategory::OptimizerState, t.O);
  charge(e.backwardMemory, MemoryCategory::CommBuffers,
         (shape.replicas > 1 ? t.G : 0) +  // the gradient buckets (Note [Gradient buckets])
             t.targetsFed + t.gradsWaiting);
  e.residentStashes = resident;
  // Note [What waits for W]
  // (Near B: lookahead + 1 prefetched, and the ones that wait for their W.)
  const int residentAtI =
      splitsBackward(shape.kind) ? std::min(resident, shape.lookahead + 1 + deferredAtI) : resident;
  // A split stage's W comes right after its I (Note [PipeFB with a split backward]), and the
  // lowering issues the next PRE only after that I: lookahead of them beside W's own.
  const int residentAtW =
      splitsBackward(shape.kind) ? std::min(resident, shape.lookahead + deferred) : resident;
  const DeferredCharge waitsForW =
      chargeDeferred(e, residentAtI, residentAtW, deferredAtI, deferred, e.backwardWorkingBytes);
  charge(e.backwardMemory, MemoryCategory::Stash, waitsForW.stash);
  // Note [Folded pace]: a folded pipefb-async device steps after its stage's last B of
  // the iteration, beside the prefetches its lowering issued before that STEP (Note
  // [Stashes at a step]).
  const int atStep =
      shape.folded && async
          ? std::min(resident,
                     foldedStashesAtStep(shape.kind, S, M, shape.lookahead, shape.lag()).at(k))
      : t.flushing ? 0
                   : resident;
  // (The outputs in wsB that arrive after B's loss may still wait at the step.)
  charge(e.backwardMemory, MemoryCategory::WorkingSet,
         wsB + waitsForW.excess +
             stepExcess(t, e, waitsForW.stash, atStep,
                        wsB + waitsForW.excess - t.waiting.outputsAfterLoss));
}

// Note [Held at a same-device stage's starts] (Lowering.h): a pipedream stage that
// stashes weight versions and offloads them (not the last: it has none, and keeps its
// outputs for the loss) is charged its stashes, versions and inputs as they are held
// together at its B, F and STEP starts, not each category's worst beside the others'.
void chargeHeldTogether(const StageTerms& t, StageEstimate& e, std::int64_t wsB,
                        std::int64_t buckets) {
  const PipelineShape& shape = *t.shape;
  const int k = t.k, S = t.S, M = t.M;
  const std::int64_t W = t.W, oneInput = t.oneInput;
  CategoryBytes& m = e.backwardMemory;
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
  PIPEFB_ASSERT(atB,
                "stage " << k << " of pipedream S=" << S << " M=" << M << " has no backward start");
  const std::int64_t messages = t.actsWaiting + t.gradsWaiting;
  const std::int64_t backward = held(*atB) + wsB + messages;
  const std::int64_t forward = atF + e.forwardPeakBytes + t.waiting.atForward;
  const std::int64_t step = atStep + t.stepWs + messages;
  m[index(MemoryCategory::Stash)] = atB->stashes * e.stashBytes;
  m[index(MemoryCategory::WeightVersions)] = atB->versions * W;
  m[index(MemoryCategory::CommBuffers)] =
      buckets + atB->inputs * oneInput + t.targetsFed + messages;
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
void chargeForwardPhase(const StageTerms& t, StageEstimate& e, std::int64_t buckets,
                        std::int64_t lossInputs) {
  const int M = t.M;
  const std::int64_t oneInput = t.oneInput, output = t.output;
  CategoryBytes& m = e.backwardMemory;
  CategoryBytes f{};
  for (MemoryCategory c : {MemoryCategory::Weights, MemoryCategory::WeightVersions,
                           MemoryCategory::Grads, MemoryCategory::OptimizerState})
    f[index(c)] = m[index(c)];
  // F(s,j), j = 0 .. n - 1: the inputs left and the stashes before it.
  std::int64_t inputs = 0, stashes = 0;
  for (int j = 0; j < e.inFlight; ++j) {
    const int held = t.off ? std::min(j, kOffloadsInFlight) : j;
    const std::int64_t in = (M - j) * oneInput;
    const std::int64_t st = held * e.stashBytes + (lossInputs > 0 ? j * output : 0);
    if (in + st > inputs + stashes) inputs = in, stashes = st;
  }
  charge(f, MemoryCategory::CommBuffers,
         buckets + inputs + t.targetsFed + t.waiting.activationsAtForward);
  charge(f, MemoryCategory::Stash, stashes);
  charge(f, MemoryCategory::WorkingSet, e.forwardPeakBytes);
  if (total(f) > total(m)) m = f;
}

// A stage that runs F and B on one device: its states, the versions B runs on, the
// messages and inputs that wait, its stashes and B's working set, beside F's peak where F
// runs beside the backward (Note [Forward beside backward]).
void chargeSameDevice(const StageTerms& t, StageEstimate& e, std::int64_t wsB) {
  const PipelineShape& shape = *t.shape;
  const int k = t.k, S = t.S, M = t.M;
  const bool off = t.off;
  const std::int64_t W = t.W, oneInput = t.oneInput, output = t.output;
  const Deferred deferredW = deferredStashes(t);
  const int deferred = deferredW.atW, deferredAtI = deferredW.atI;
  // Note [Prefetches after the forward phase] (Lowering.h). A folded placement's
  // unsplit stage is not looked at: charged as if its PREs fell among its Fs.
  const bool phased = !t.unsplitPipeFb && phasedStages(shape.kind, S, M, shape.lag()).at(k);
  const int resident =
      off ? schedules::residentOffloadedStashes(e.inFlight, shape.lookahead, phased, deferred)
          : e.inFlight;
  // Note [Two phases]: with the forward phase first, no activation waits in the B phase.
  const bool twoPhases = phased && !shape.sharesDevices();
  CategoryBytes& m = e.backwardMemory;
  charge(m, MemoryCategory::Weights, t.Wres);
  // Note [Versions being copied out] (Lowering.h): beside the contract's versions, the
  // one an OFFW is still copying out. One copy goes out at a time, stash or version; where
  // the stash count already holds a slot for it (lookahead + 2), only a version larger
  // than a stash needs more.
  static_assert(schedules::kOffloadsInFlight == 1, "one copy out at a time: one slot");
  std::int64_t versionBytes = t.deviceCopies * W;
  if (t.movesCopies && schedules::heldStashedVersions(t.copies, shape.lookahead) > t.deviceCopies) {
    const bool stashSlot = !phased && resident > std::min(e.inFlight, shape.lookahead + 1);
    versionBytes += stashSlot ? std::max<std::int64_t>(0, W - e.stashBytes) : W;
  }
  charge(m, MemoryCategory::WeightVersions, versionBytes);
  charge(m, MemoryCategory::Grads, t.G);
  charge(m, MemoryCategory::OptimizerState, t.O);
  const std::int64_t buckets = shape.replicas > 1 ? t.G : 0;  // Note [Gradient buckets]
  // Note [Comm buffers in the cost model]: the inputs whose F has not run when B peaks.
  const int inputsWaiting = isFlushing(shape.kind) ? std::max(0, M - e.inFlight) : M - 1;
  // (actsWaiting: those that wait at B's starts, Note [Forward beside backward]; none in
  // the B phase of a stage with the forward phase first, Note [Two phases].)
  charge(m, MemoryCategory::CommBuffers,
         buckets + inputsWaiting * oneInput + t.targetsFed + t.actsWaiting + t.gradsWaiting);
  // An offloaded last stage's F keeps its output for the loss on the device (execForward:
  // OFF takes autograd's saved tensors, not the loss's input), one per microbatch in
  // flight. (Seed 0 instance 29 of PlanRunsTest, gpt2-tiny gpipe-offload, held 4 logits
  // beside 2 stashes on the head's device.) Not on shared devices yet: sharedDeviceMemory
  // reads the stash category as whole stashes.
  const std::int64_t lossInputs =
      k == S - 1 && off && !t.ckpt && !shape.sharesDevices() ? e.inFlight * output : 0;
  e.residentStashes = resident;
  // Note [What waits for W]
  const int residentAtI =
      off ? schedules::residentOffloadedStashes(e.inFlight, shape.lookahead, phased, deferredAtI)
          : e.inFlight;
  const DeferredCharge waitsForW =
      chargeDeferred(e, residentAtI, resident, deferredAtI, deferred, wsB);
  const std::int64_t stash = waitsForW.stash + lossInputs;
  charge(m, MemoryCategory::Stash, stash);
  // Note [Step working set]: PipeDream's STEP(s,m) comes right after B(s,m), which let go
  // of the weight copy F(s,m) ran on: the step's transient has that copy's room too.
  const std::int64_t freedAtStep = shape.kind == ScheduleKind::PipeDream && t.copies > 0 ? W : 0;
  // Note [Forward beside backward]: F's excess over B (a stage with the forward phase
  // first charges its F phase whole, below).
  const std::int64_t atB = stash + wsB + waitsForW.excess + t.actsWaiting + t.gradsWaiting;
  const std::int64_t atF = residentStashBytes(e, std::max(0, resident - 1), deferred) +
                           e.forwardPeakBytes + t.waiting.atForward;
  const std::int64_t forwardExcess =
      forwardBesideBackward(shape) && !twoPhases ? std::max<std::int64_t>(0, atF - atB) : 0;
  // (A flushing stage steps after its last B: its stashes and loss inputs are gone.)
  charge(m, MemoryCategory::WorkingSet,
         wsB + waitsForW.excess +
             stepExcess(t, e, waitsForW.stash, t.flushing ? 0 : resident,
                        wsB + waitsForW.excess + freedAtStep + (t.flushing ? lossInputs : 0)) +
             forwardExcess);
  if (shape.kind == ScheduleKind::PipeDream && t.offW && t.copies > 0 && k < S - 1 &&
      forwardBesideBackward(shape) && !twoPhases)
    chargeHeldTogether(t, e, wsB, buckets);  // Note [Held at a same-device stage's starts]
  if (twoPhases) chargeForwardPhase(t, e, buckets, lossInputs);  // Note [Two phases]
  e.forwardMemory = m;
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
  StageTerms t;
  t.shape = &shape;
  t.k = k;
  t.first = first;
  t.last = last;
  t.policy = policy;
  const double f = t.f = scale(shape);
  const int S = t.S = shape.stages, M = t.M = shape.microbatches;
  const bool split = t.split = shape.splits(k);
  t.unsplitPipeFb = isSplit(shape.kind) && !split;
  t.decoupled = shape.decoupled();
  t.fd = shape.forwardDevice(k);
  t.bd = shape.backwardDevice(k);
  t.fdev = &cluster_.devices[t.fd];
  t.bdev = &cluster_.devices[t.bd];

  StageEstimate e;
  e.policy = policy;
  e.effective = schedules::effectivePolicy(policy, split);
  e.same = !split;
  const bool ckpt = t.ckpt = schedules::isCheckpoint(e.effective);
  const bool off = t.off = schedules::isOffloaded(e.effective);

  // Note [Optimizer offload in the cost model]; Note [Half-precision weights on a device]:
  // with the optimizer on the host, an analytic half profile's device holds the half copy
  // and half gradients, the host the fp32 master, gradients and states.
  t.W = shape.optimizerOnHost ? range(fwdParam_, first, last) : range(param_, first, last);
  t.G = shape.optimizerOnHost ? range(hostedGrad_, first, last) : range(grad_, first, last);
  t.O = shape.optimizerOnHost ? 0 : range(opt_, first, last);
  t.hostOptimizer = shape.optimizerOnHost ? range(hostOpt_, first, last) : 0;
  t.buffers = range(buffer_, first, last);
  t.Wres = t.W + t.buffers;
  t.WresForward = range(fwdParam_, first, last) + t.buffers;
  t.graph = scaled(savedSum(first, last), f);  // Note [Outputs kept between layers]
  t.input = scaled(inputBytes(first), f);
  t.output = scaled(profile_.layers[last - 1].outputBytes, f);
  t.keptGrad = k > 0 && splitsBackward(shape.kind) ? scaled(keptGradSum(first, last), f) : 0;
  // Note [Comm buffers in the cost model]: the iteration's inputs wait on stage 0's forward
  // device, its targets on the last stage's backward device.
  t.oneInput = k == 0 ? scaled(profile_.inputBytes, f) : 0;
  t.targetsFed = k == S - 1 ? M * scaled(profile_.targetBytes, f) : 0;
  // Note [Waiting messages]: activations sent to F ahead of it, gradients (and the last
  // stage's outputs) sent to B ahead of it. A folded device is charged both of its
  // stages' counts (each the most over the device's compute starts: an upper bound).
  // Note [Recomputed last output]: a recomputing B(S-1) is sent no output.
  t.outputTravels = k == S - 1 && schedules::lastOutputTravels(split, ckpt);
  // (Memory only: the DP's times-only look, Note [Planner speed], never reads them.)
  t.waiting = timesOnly ? WaitingBytes{} : waitingBytes(shape, k, first, last, t.outputTravels);
  t.actsWaiting = t.waiting.activations;
  t.gradsWaiting = t.waiting.gradients;
  if (shape.folded && split && !timesOnly) {  // Note [Messages held together]
    const schedules::WaitingMessages& wm = waitingFor(shape.kind, S, M, true, shape.lag());
    const int device = schedules::Placement::folded(S).forward(k);
    e.messages = {t.actsWaiting,
                  t.gradsWaiting,
                  t.input,
                  scaled(profile_.layers[last - 1].outputBytes, f),
                  t.outputTravels ? scaled(profile_.layers[last - 1].outputBytes, f) : 0,
                  &wm.together.at(device),
                  &wm.togetherAtBackward.at(device)};
  }
  // A kept graph (not offloaded) also holds the stage's output: execForward's stash entry
  // keeps the graph root, and the profile's saved bytes leave the output out. An offloaded
  // graph holds what of it the last layer's graph saved (Note [Measured saved bytes]).
  const std::int64_t savedOutput = scaled(profile_.layers[last - 1].savedOutputBytes, f);
  e.stashBytes = ckpt ? t.input : t.graph + (off ? savedOutput : t.output);
  // Note [What waits for W]
  // Past stage 0, I lets the output and its gradient go and keeps the weight nodes'
  // gradients instead; what the last layer's graph saves of the output stays with it.
  e.deferredStashBytes = k > 0 ? t.graph + savedOutput + t.keptGrad
                               : (ckpt ? t.graph + t.output : e.stashBytes) + t.output;
  countWeightCopies(t);  // Note [Weight-version offload]
  t.flushing = isFlushing(shape.kind) || t.unsplitPipeFb;

  t.afterStepSum = range(afterStep_, first, last);
  t.backwardSum = range(B_, first, last);
  t.snapshotSum = range(snapshot_, first, last);
  chargeTimes(*this, t, e);
  chargePace(t, e);
  // The DP's times-only look stops here (Note [Planner speed]): what follows is memory.
  if (timesOnly) return e;
  e.inFlight = t.unsplitPipeFb ? schedules::unsplitPipefbInFlight(S, M)
                               : inFlightStashes(shape.kind, S, k, M, shape.asyncLag);
  e.versions = t.unsplitPipeFb ? 1 : weightVersions(shape.kind, S, k, M, shape.asyncLag);
  // Note [Forward peak]; under a checkpoint kind the stash is the input
  t.forwardPeak = scaled(forwardPeak(k, first, last, !ckpt), f);
  t.forwardPeakWithGraph = scaled(forwardPeak(k, first, last, true), f);
  e.forwardPeakBytes = ckpt ? t.forwardPeak + e.stashBytes : std::max(t.forwardPeak, e.stashBytes);
  // Note [What waits for W]: W runs autograd on its own stash's graph, which it frees as it
  // goes (Note [Backward layer by layer]), for the weight gradients (in place or gathered,
  // Note [Gathered weight gradients]), beside its roots and their gradients: the gradients
  // I kept, or on stage 0 the output and its gradient.
  e.weightWorkingBytes =
      splitsBackward(shape.kind)
          ? std::max(maxWorking,
                     backwardLayered(shape, k, first, last, weightGradientsInPlace(shape, k), 0)) +
                (k > 0 ? t.keptGrad : 2 * t.output)
          : 0;
  // Note [Step working set]: what the step transient needs beyond stash + working set.
  t.stepWs = shape.optimizerOnHost ? 0 : stepWorking(first, last);
  e.stepWorkingBytes = t.stepWs;
  const std::int64_t wsB = backwardWorkingSet(*this, t, maxWorking);
  e.backwardWorkingBytes = wsB;
  if (split) {
    chargeForwardDevice(*this, t, e);
    chargeBackwardDevice(t, e, wsB);
  } else {
    chargeSameDevice(t, e, wsB);
  }
  e.hostBytes = (off ? static_cast<std::int64_t>(e.inFlight) * e.stashBytes : 0) + t.hostOptimizer +
                static_cast<std::int64_t>(t.hostCopies) * t.W +  // Note [Weight-version offload]
                e.windowedVersionBytes;  // in the host pool between its OFFW and PREW
  return e;
}

}  // namespace pipefb::planner
