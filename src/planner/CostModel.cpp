// The planner's cost model (Note [Planner cost model] in CostModel.h).
#include "pipefb/planner/CostModel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Messages.h"
#include "pipefb/schedules/SharedDevices.h"
#include "pipefb/schedules/ZeroBubble.h"
#include "pipefb/sim/CostTable.h"
#include "pipefb/sim/Simulator.h"

namespace pipefb::planner {

bool plannerModels(ScheduleKind k) {
  switch (k) {  // Note [Adding a schedule kind]: the cost model's closed forms below
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
    case ScheduleKind::PipeDream:
    case ScheduleKind::PipeFbSync:
    case ScheduleKind::PipeFbAsync:
      return true;
    case ScheduleKind::ZbH1:  // Note [Zero-bubble fill]
    case ScheduleKind::ZbH2:
      return true;
    case ScheduleKind::Zbv:  // Note [Shared devices], Note [Simulated fill]
    case ScheduleKind::Interleaved1F1B:
    case ScheduleKind::PipeFbZb:
      return true;
  }
  return false;
}

std::vector<ScheduleKind> allScheduleKinds() {
  std::vector<ScheduleKind> out;
  for (const auto& row : schedules::scheduleKinds())
    if (plannerModels(row.kind)) out.push_back(row.kind);
  return out;
}

std::vector<ScheduleKind> defaultScheduleKinds() {
  std::vector<ScheduleKind> out;
  for (ScheduleKind k : allScheduleKinds()) {
    const bool onePerDevice = !PipelineShape::of(k, 2, 1, 1, 1).sharesDevices();
    if (!(splitsBackward(k) && onePerDevice)) out.push_back(k);
  }
  return out;
}

namespace {
// A table derived from a generated schedule, computed once per key: the DP asks for one
// shape's table many times in a row, so each thread keeps its last answer without the
// lock (std::map nodes are stable). Each call site's `make` is its own lambda type, and
// so its own cache.
template <typename Key, typename Make>
const std::invoke_result_t<Make>& memoized(const Key& key, Make make) {
  using Value = std::invoke_result_t<Make>;
  thread_local Key lastKey{};
  thread_local const Value* last = nullptr;
  if (last && lastKey == key) return *last;
  static std::mutex mu;
  static std::map<Key, Value> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make()).first;
  lastKey = key;
  last = &it->second;
  return it->second;
}

// Note [Zero-bubble fill]: the generated schedule's contract, per (kind, S, M).
const schedules::MemoryContract& generatedContract(ScheduleKind k, int S, int M) {
  return memoized(std::make_tuple(static_cast<int>(k), S, M),
                  [&] { return schedules::makeSchedule(toString(k), S, M).contract; });
}

// Note [Prefetches after the forward phase] (Lowering.h): per stage of the generated
// schedule (the kind's default placement; asynchronous kinds over 3 iterations, whose
// next iteration's Fs come before the last Bs), per (kind, S, M, lag) (Note [Planned async
// lag]: `lag` is effectiveLag's, -1 for the kinds without one).
const std::vector<bool>& phasedStages(ScheduleKind k, int S, int M, int lag) {
  return memoized(std::make_tuple(static_cast<int>(k), S, M, lag), [&] {
    const int K = isFlushing(k) ? 1 : 3;
    return schedules::forwardPhaseFirst(
        schedules::makeSchedule(k, S, M, schedules::Placement::defaultFor(k, S), K, lag).schedule);
  });
}

// Note [Stashes held together]: per device of the generated schedule, per (kind, S, M, lag).
const std::vector<std::vector<schedules::HeldAtStart>>& heldTogether(ScheduleKind k, int S, int M,
                                                                     int lag) {
  return memoized(std::make_tuple(static_cast<int>(k), S, M, lag), [&] {
    return schedules::stashesHeldTogether(
        schedules::makeSchedule(k, S, M, schedules::Placement::defaultFor(k, S), 1, lag).schedule);
  });
}

// Note [Stashes at a step]: per stage, on the folded schedule of (kind, S, M) lowered with
// `lookahead`, every stage offloaded (a split stage always is: effectivePolicy), over 2
// iterations (the step between them).
const std::vector<int>& foldedStashesAtStep(ScheduleKind k, int S, int M, int lookahead, int lag) {
  return memoized(std::make_tuple(static_cast<int>(k), S, M, lookahead, lag), [&] {
    const schedules::SchedulePlan lowered =
        schedules::lower(schedules::makeSchedule(k, S, M, schedules::Placement::folded(S), 2, lag),
                         {StashPolicy::Offload}, lookahead, /*offloadWeights=*/false);
    return schedules::stashesAtStep(lowered.schedule);
  });
}

// Note [Stashes at a backward]: per stage, on the same folded schedule over 3 iterations
// (the steady state between two of them).
const std::vector<int>& foldedStashesAtBackward(ScheduleKind k, int S, int M, int lookahead,
                                                int lag) {
  return memoized(std::make_tuple(static_cast<int>(k), S, M, lookahead, lag), [&] {
    const schedules::SchedulePlan lowered =
        schedules::lower(schedules::makeSchedule(k, S, M, schedules::Placement::folded(S), 3, lag),
                         {StashPolicy::Offload}, lookahead, /*offloadWeights=*/false);
    return schedules::stashesAtBackward(lowered.schedule);
  });
}

// Note [Prefetches bound ahead]
// The runtime allocates a prefetch's destination when the PRE is issued, or at the backward
// device's next acquire once the stage has offloaded once (Note [Planned prefetch
// destinations] in offload/TransferManager.h); without a flush every PRE is of epoch 0, so
// B(s,m) runs beside every PRE of stage s its device issued before it and whose B has not
// run, whether or not that stash's F ran yet. With fewer stashes in flight than lookahead + 1
// that is more than min(n, lookahead + 1): pipefb-async S=2 M=1 at lookahead 2 issues the
// PREs of 3 microbatches before the first B, with 2 in flight (SimAgreementTest: simulated
// 26055 bytes on a backward device the cost model charged 20174; pipefb_train on mlp-tiny
// pipefb-async S=1 M=1, the backward device's stash peak 24576 B at lookahead 1, 40960 B at
// lookahead 2). So an asynchronous PipeFB stage is charged at least the count on its
// lowered schedule (stashesAtBackward, 3 iterations; the 2S form or folded()). A flushing
// kind binds the next iteration's PREs only at its first acquire (Note [Prefetches across
// a flush] in schedules/HeldOffloads.h): min(n, lookahead + 1) holds there.
const std::vector<int>& asyncStashesAtBackward(ScheduleKind k, int S, int M, int lookahead,
                                               bool folded, int lag) {
  return memoized(std::make_tuple(static_cast<int>(k), S, M, lookahead, folded, lag), [&] {
    const schedules::Placement placement =
        folded ? schedules::Placement::folded(S) : schedules::Placement::defaultFor(k, S);
    const schedules::SchedulePlan lowered =
        schedules::lower(schedules::makeSchedule(k, S, M, placement, 3, lag),
                         {StashPolicy::Offload}, lookahead, /*offloadWeights=*/false);
    return schedules::stashesAtBackward(lowered.schedule);
  });
}

// Note [Output at its receive in the cost model]
// The last stage's output from a forward-only device to a backward-only one is sent at its
// receive (Note [Message rendezvous], schedules/Messages.h): the transfer starts when
// B(S-1, m)'s device reaches RA(S-1, m), and the sender's thread waits until it arrived (Note
// [Rendezvous in the simulator]). So its link time adds to the compute of both devices rather
// than hiding beside it. (Left beside it, gpt2-small pipefb-async on 8x T4 at 13.13 GiB, head
// block11..head under offload, 1.53 GiB of logits a microbatch: predicted 3.367 s an
// iteration, simulated 5.186 s.) Whether it is so is read off the generated schedule, as the
// runtime and the simulator do: the 2S form's, not the folded one's. A decoupled plan's
// last backward range does the same with its boundary (RangeBoundary::atReceive).
bool outputAtReceive(ScheduleKind k, int S, int M, bool folded, int lag) {
  return memoized(std::make_tuple(static_cast<int>(k), S, M, folded, lag), [&] {
    if (!isSplit(k)) return false;
    const schedules::Placement placement =
        folded ? schedules::Placement::folded(S) : schedules::Placement::defaultFor(k, S);
    const schedules::Schedule s = schedules::makeSchedule(k, S, M, placement, 1, lag).schedule;
    return schedules::rendezvous(schedules::rendezvousPasses(s), placement.forward(S - 1),
                                 placement.backward(S - 1), schedules::MessageKind::Output);
  });
}

// Note [Held at a same-device stage's starts] (Lowering.h): stage k of pipedream (S, M) lowered
// with `lookahead`, per (S - k, k == 0, M, lookahead) (pipedreamHeld).
const std::vector<schedules::SameDeviceHeld>& pipedreamHeld(int S, int k, int M, int lookahead) {
  return memoized(std::make_tuple(S - k, k == 0, M, lookahead),
                  [&] { return schedules::pipedreamHeld(S, k, M, lookahead); });
}

// Note [Waiting messages]: counted on the generated schedule (the kind's default
// placement, or the folded one, Note [Folded placements]); asynchronous kinds over 3
// iterations, to see the next iteration's feed.
const schedules::WaitingMessages& waitingFor(ScheduleKind k, int S, int M, bool folded, int lag) {
  return memoized(std::make_tuple(static_cast<int>(k), S, M, folded, lag), [&] {
    const int K = isFlushing(k) ? 1 : 3;
    const schedules::Placement placement =
        folded ? schedules::Placement::folded(S) : schedules::Placement::defaultFor(k, S);
    return schedules::waitingMessages(schedules::makeSchedule(k, S, M, placement, K, lag).schedule);
  });
}

// Note [Planned async lag]: pipefb-async's contract at its lag, over 2 iterations (the
// second one's forwards before RW run beside the first one's stashes), per (S, M, lag).
const schedules::MemoryContract& asyncContract(int S, int M, int lag) {
  return memoized(std::make_tuple(S, M, lag), [&] {
    const ScheduleKind k = ScheduleKind::PipeFbAsync;
    return schedules::makeSchedule(k, S, M, schedules::Placement::defaultFor(k, S), 2, lag)
        .contract;
  });
}
}  // namespace

int effectiveLag(ScheduleKind k, int M, int asyncLag) {
  if (k != ScheduleKind::PipeFbAsync) return -1;
  return asyncLag < 0 || asyncLag > M ? M : asyncLag;
}

int PipelineShape::lag() const { return effectiveLag(kind, microbatches, asyncLag); }

int inFlightStashes(ScheduleKind k, int S, int s, int M, int asyncLag) {
  switch (k) {
    case ScheduleKind::GPipe:
      return M;
    case ScheduleKind::OneFOneB:
      return std::min(S - s, M);
    case ScheduleKind::PipeDream:
      return S - s;  // min(S-s, K*M) with many iterations K
    case ScheduleKind::PipeFbSync:
      return M;
    case ScheduleKind::PipeFbAsync:  // M + lag (Note [Planned async lag])
      return asyncContract(S, M, effectiveLag(k, M, asyncLag)).inFlight.at(s);
    case ScheduleKind::ZbH1:
    case ScheduleKind::ZbH2:
    case ScheduleKind::Zbv:
    case ScheduleKind::Interleaved1F1B:
      return generatedContract(k, S, M).inFlight.at(s);
    case ScheduleKind::PipeFbZb:
      return M;  // a split stage, as pipefb-sync (contractFromOrder)
  }
  return M;
}

int weightVersions(ScheduleKind k, int S, int s, int M, int asyncLag) {
  switch (k) {
    case ScheduleKind::PipeDream:
      return S - s;
    case ScheduleKind::PipeFbAsync:  // 2, or 1 at lag 0 (Note [Planned async lag])
      return asyncContract(S, M, effectiveLag(k, M, asyncLag)).weightVersions.at(s);
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
    case ScheduleKind::PipeFbSync:
    case ScheduleKind::ZbH1:
    case ScheduleKind::ZbH2:
    case ScheduleKind::Zbv:
    case ScheduleKind::Interleaved1F1B:
    case ScheduleKind::PipeFbZb:
      return 1;
  }
  return 1;
}

int weightCopies(ScheduleKind k, int S, int s, int M, int asyncLag) {
  if (k == ScheduleKind::PipeDream) {
    const int n = inFlightStashes(k, S, s, M);
    return n > 1 ? n : 0;  // with one in flight no update separates F from B
  }
  return weightVersions(k, S, s, M, asyncLag) - 1;
}

double stepsPerMicrobatch(ScheduleKind k, int M) {
  return schedules::stepsPerMicrobatch(k) ? 1.0 : 1.0 / M;
}

std::vector<StashPolicy> allStashPolicies() {
  return {StashPolicy::Keep, StashPolicy::Offload, StashPolicy::Checkpoint,
          StashPolicy::CheckpointOffload};
}

namespace {
std::int64_t scaled(std::int64_t bytes, double f);

// Note [Simulated fill]: per (kind, S, M, F : B : copy : sync), computed once. F and B
// are the model's totals; copy, a stage's hand-off copy (one way), and sync, its weight
// sync, in the same unit (0 for the kinds that do not split).
// pipefb-async at a lag below M (Note [Planned async lag]): the steady state's iteration
// time over 3 iterations in place of one iteration's makespan.
double simulatedFill(ScheduleKind k, int S, int M, double F, double B, double copy, double sync,
                     int lag = -1) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, double, double, double, int>, double> cache;
  const double F1 = F / (F + B), copy1 = copy / (F + B), sync1 = sync / (F + B);
  const auto key = std::make_tuple(static_cast<int>(k), S, M, F1, copy1, sync1, lag);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  const bool steady = k == ScheduleKind::PipeFbAsync;
  const schedules::SchedulePlan plan =
      schedules::makeSchedule(k, S, M, schedules::Placement::defaultFor(k, S), steady ? 3 : 1, lag);
  const int D = plan.schedule.numDevices();
  double fill = 0;
  if (D > 1) {
    // In units of F + B: one MiB of stash or weights takes `copy` or `sync` to move;
    // activations and gradients travel free (the links are in the pace).
    constexpr std::int64_t kUnit = 1 << 20;
    sim::CostTable costs = sim::CostTable::uniform(S);
    for (sim::StageCosts& c : costs.stages) {
      c.forward = F1 / S;
      c.backward = (1 - F1) / S;
      c.activationBytes = c.gradientBytes = 0;
      c.stashBytes = c.weightVersionBytes = kUnit;
    }
    costs.defaultHostLink = {copy1 > 0 ? kUnit / copy1 : 0.0, 0.0};
    costs.defaultLink = {sync1 > 0 ? kUnit / sync1 : 0.0, 0.0};
    const auto lowered =
        schedules::lower(plan, std::vector<StashPolicy>(S, StashPolicy::Keep), 1, false);
    sim::SimOptions so;
    so.recordMemoryTimeline = false;
    const sim::SimResult r = sim::simulate(lowered.schedule, costs, so);
    const double makespan = steady ? r.iterationTime : r.makespan;
    // A device's work per microbatch: its stages' F + B (PipeFB: F or B, on 2S devices).
    double pace = 0;
    for (int d = 0; d < D; ++d) {
      double w = 0;
      for (int s = 0; s < S; ++s) {
        if (plan.schedule.placement.forward(s) == d) w += F1 / S;
        if (plan.schedule.placement.backward(s) == d) w += (1 - F1) / S;
      }
      pace = std::max(pace, w);
    }
    fill = std::max(0.0, (makespan / pace - M) / (D - 1));
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, fill);
  return fill;
}
}  // namespace

double PipelineShape::slots() const {
  // A folded device runs iteration k's backwards before iteration k+1's forwards (Note
  // [PipeFB device order]), so folded pipefb-async fills and drains like a flush too.
  // Note [Planned async lag]: so does pipefb-async's 2S chain below a whole iteration's lag.
  const bool lagged = kind == ScheduleKind::PipeFbAsync && lag() < microbatches && !decoupled();
  return isFlushing(kind) || folded || lagged ? microbatches + (chainLength() - 1) * fill
                                              : microbatches;
}

double CostModel::fill(const PipelineShape& shape) const {
  const ScheduleKind k = shape.kind;
  const int L = numLayers();
  // At the shape's microbatch: with fixed costs F : B depends on it (Note [Microbatch scaling]).
  const double f = scale(shape);
  const double F = forwardTime(0, L, f), B = backwardTime(0, L, f);
  if (k == ScheduleKind::ZbH2) return 0;
  if (F + B <= 0) return 1;
  // Note [Planned async lag]: below a whole iteration's lag, pipefb-async's forwards wait
  // for the previous iteration's weights, so its chain fills and drains; on its 2S chain.
  const bool lagged = k == ScheduleKind::PipeFbAsync && shape.lag() < shape.microbatches &&
                      !shape.folded && !shape.decoupled();
  if (lagged || k == ScheduleKind::Zbv || k == ScheduleKind::Interleaved1F1B ||
      k == ScheduleKind::PipeFbZb) {
    // Note [Simulated fill]: a split kind hands every stash over through the host pool and
    // syncs the weights back to the forward devices; both at the model's totals / S, on
    // stage 0's devices (compute at the forward device's speed).
    double copy = 0, sync = 0;
    const int S = shape.stages;
    if (isSplit(k) && static_cast<int>(shape.chain.size()) >= shape.chainLength()) {
      const int fd = shape.forwardDevice(0), bd = shape.backwardDevice(0);
      const double sp = cluster_.devices[fd].speed;
      copy = cluster_.devices[fd].host.time(scaled(saved_[L], f) / S) * sp;
      sync = cluster_.link(bd, fd).time(param_[L] / S) * sp;
    }
    return simulatedFill(k, S, shape.microbatches, F, B, copy, sync, lagged ? shape.lag() : -1);
  }
  if (k != ScheduleKind::ZbH1) return 1;
  const sim::SplitBackward iw = sim::splitBackward(B, -1, -1);  // Note [I and W costs]
  return std::max(0.0, F + iw.input - iw.weight) / (F + B);
}

double PipelineShape::iterationTime(double tau) const { return slots() * std::max(tau, corePace); }

double CostModel::corePace(const PipelineShape& shape) const {
  const int D = shape.chainLength(), C = cluster_.cores;
  if (C <= 0 || D <= C || static_cast<int>(shape.chain.size()) < D) return 0;
  const int L = numLayers();
  double slowest = cluster_.devices[shape.chain[0]].speed;
  for (int d : shape.chain) slowest = std::min(slowest, cluster_.devices[d].speed);
  const double excess = std::max(0.0, afterStep_[L] - B_[L]);
  const double work = forwardTime(0, L, scale(shape)) + backwardTime(0, L, scale(shape)) +
                      (step_[L] + excess) * stepsPerMicrobatch(shape.kind, shape.microbatches);
  return work / (C * slowest);
}

std::int64_t total(const CategoryBytes& b) {
  std::int64_t t = 0;
  for (auto x : b) t += x;
  return t;
}

const char* toString(Resource r) {
  switch (r) {
    case Resource::ForwardCompute:
      return "forward compute";
    case Resource::BackwardCompute:
      return "backward compute";
    case Resource::Compute:
      return "compute";
    case Resource::ForwardCopy:
      return "offload copies";
    case Resource::BackwardCopy:
      return "prefetch copies";
    case Resource::Copy:
      return "offload+prefetch copies";
    case Resource::LinkIn:
      return "link from the previous stage";
    case Resource::LinkOut:
      return "forward-to-backward link";
  }
  return "?";
}

std::int64_t StageEstimate::peakMemory() const {
  return std::max(total(forwardMemory), total(backwardMemory));
}

void Cluster::validate() const {
  const int n = numDevices();
  if (n < 1) throw UserError("cluster '" + name + "': no devices");
  if (static_cast<int>(links.size()) != n)
    throw UserError("cluster '" + name + "': the link matrix has " + std::to_string(links.size()) +
                    " rows for " + std::to_string(n) + " devices");
  for (int a = 0; a < n; ++a) {
    if (static_cast<int>(links[a].size()) != n)
      throw UserError("cluster '" + name + "': link matrix row " + std::to_string(a) + " has " +
                      std::to_string(links[a].size()) + " entries, expected " + std::to_string(n));
    if (!(devices[a].speed > 0))
      throw UserError("cluster '" + name + "': device " + std::to_string(a) + " has speed <= 0");
  }
}

Cluster Cluster::uniform(int n, double speed, std::int64_t capacity, Link link, Link host,
                         std::int64_t hostPool) {
  Cluster c;
  c.name = std::to_string(n) + "x-uniform";
  for (int i = 0; i < n; ++i)
    c.devices.push_back({"dev:" + std::to_string(i), speed, capacity, host});
  c.links.assign(n, std::vector<Link>(n, link));
  c.hostPool = hostPool;
  return c;
}

CostModel::CostModel(Profile profile, Cluster cluster)
    : profile_(std::move(profile)), cluster_(std::move(cluster)) {
  cluster_.validate();
  views_ = std::make_shared<ViewCache>();
  if (!profile_.bytesAt.empty()) views_->base = profile_;
  if (profile_.layers.empty()) throw UserError("profile '" + profile_.model + "' has no layers");
  if (profile_.microbatch < 1) throw UserError("profile microbatch must be >= 1");
  const size_t L = profile_.layers.size();
  F_.assign(L + 1, 0);
  B_ = R_ = Ffixed_ = Bfixed_ = Rfixed_ = step_ = afterStep_ = snapshot_ = F_;
  saved_.assign(L + 1, 0);
  param_ = buffer_ = grad_ = opt_ = states_ = saved_;
  std::vector<std::int64_t> stepWs(L), fws(L), fpeak(L), noGrad(L);
  for (size_t l = 0; l < L; ++l) {
    const LayerCost& c = profile_.layers[l];
    F_[l + 1] = F_[l] + c.forward;
    B_[l + 1] = B_[l] + c.backward;
    R_[l + 1] = R_[l] + c.recompute;
    Ffixed_[l + 1] = Ffixed_[l] + c.forwardFixed;
    Bfixed_[l + 1] = Bfixed_[l] + c.backwardFixed;
    Rfixed_[l + 1] = Rfixed_[l] + c.recomputeFixed;
    step_[l + 1] = step_[l] + c.step;
    // Note [Backward after a step]: B after a step (B when not measured). The excess is
    // taken over a whole stage, so that the noise of small layers cancels.
    afterStep_[l + 1] =
        afterStep_[l] + (c.backwardAfterStep > 0 ? c.backwardAfterStep : c.backward);
    snapshot_[l + 1] = snapshot_[l] + c.snapshot;
    saved_[l + 1] = saved_[l] + c.savedBytes;
    param_[l + 1] = param_[l] + c.paramBytes;
    buffer_[l + 1] = buffer_[l] + c.bufferBytes;
    grad_[l + 1] = grad_[l] + c.gradBytes;
    opt_[l + 1] = opt_[l] + c.optimizerBytes;
    states_[l + 1] = states_[l] + c.paramBytes + c.gradBytes + c.optimizerBytes;
    stepWs[l] = c.stepWorkingBytes;
    fws[l] = c.forwardWorkingBytes >= 0 ? c.forwardWorkingBytes : c.workingBytes;
    fpeak[l] = saved_[l + 1] + c.outputBytes + fws[l];
    noGrad[l] = c.noGradForwardBytes >= 0
                    ? c.noGradForwardBytes
                    : inputBytes(static_cast<int>(l)) + c.outputBytes + fws[l];
  }
  stepWorkingMax_ = buildMax(std::move(stepWs));
  forwardWorkingMax_ = buildMax(std::move(fws));
  forwardPeakMax_ = buildMax(std::move(fpeak));
  noGradForwardMax_ = buildMax(std::move(noGrad));
}

const CostModel& CostModel::at(std::int64_t microbatchSize) const {
  if (microbatchSize == profile_.microbatch) return *this;
  std::lock_guard<std::mutex> lock(views_->mu);
  const Profile& base = views_->base;
  if (base.bytesAt.empty()) return *this;  // nothing measured at other sizes: scale
  auto it = views_->models.find(microbatchSize);
  if (it == views_->models.end()) {
    // Not measured at that size: the base profile, scaled (Note [Microbatch scaling]).
    const std::optional<Profile> there = profileAt(base, microbatchSize);
    if (!there && !isView_) return *this;
    auto model = std::make_shared<CostModel>(there ? *there : base, cluster_);
    model->views_ = views_;
    model->isView_ = true;
    it = views_->models.emplace(microbatchSize, std::move(model)).first;
  }
  return *it->second;
}

std::int64_t CostModel::forwardPeak(int k, int first, int last, bool graph) const {
  if (graph) return rangeMax(forwardPeakMax_, first, last) - saved_[first];
  // Note [Forward without autograd]: layer `first` reads the stage input; the later ones
  // run beside it (execForward holds it until F returns). Stage 0's input is one of the
  // microbatch inputs charged as comm buffers.
  const std::int64_t in = inputBytes(first);
  std::int64_t peak = rangeMax(noGradForwardMax_, first, first + 1);
  if (last > first + 1) peak = std::max(peak, rangeMax(noGradForwardMax_, first + 1, last) + in);
  return peak - (k == 0 ? in : 0);
}

CostModel::SparseMax CostModel::buildMax(std::vector<std::int64_t> values) {
  const size_t L = values.size();
  SparseMax t;
  t.push_back(std::move(values));
  for (size_t p = 1; (size_t(1) << p) <= L; ++p) {
    t.emplace_back(L - (size_t(1) << p) + 1);
    for (size_t l = 0; l + (size_t(1) << p) <= L; ++l)
      t[p][l] = std::max(t[p - 1][l], t[p - 1][l + (size_t(1) << (p - 1))]);
  }
  return t;
}

std::int64_t CostModel::rangeMax(const SparseMax& t, int first, int last) {
  // p = floor(log2(last - first))
  const int p = 31 - __builtin_clz(static_cast<unsigned>(last - first));
  return std::max(t[p][first], t[p][last - (1 << p)]);
}

std::int64_t CostModel::inputBytes(int layer) const {
  return layer == 0 ? profile_.inputBytes : profile_.layers[layer - 1].outputBytes;
}

double CostModel::scale(const PipelineShape& shape) const {
  return static_cast<double>(shape.microbatchSize) / static_cast<double>(profile_.microbatch);
}

namespace {
std::int64_t scaled(std::int64_t bytes, double f) { return scaledBytes(bytes, f); }

// Note [What waits for W]: n resident stashes of which `deferred` (at most) wait for their
// W, counted at their size first.
std::int64_t residentStashBytes(const StageEstimate& e, int n, int deferred) {
  const int d = std::max(0, std::min(n, deferred));
  return d * e.deferredStashBytes + (n - d) * e.stashBytes;
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
}  // namespace

const CostModel::GatherTables& CostModel::gatherTables(const PipelineShape& shape) const {
  const double f = scale(shape);
  std::lock_guard<std::mutex> lock(gather_->mu);
  auto it = gather_->tables.find(shape.microbatchSize);
  if (it == gather_->tables.end()) {
    // key(l) = scaled ws(l) - G(0 .. l+1): max over [first, last) plus G(0 .. last) is
    // max over l of ws(l) + G(l+1 .. last); layered adds the saved prefix S(0 .. l+1),
    // less S(0 .. first) after the range maximum; ws the gathered one. In place: the
    // in-place ws, without G.
    const size_t L = profile_.layers.size();
    std::vector<std::int64_t> key(L), layered(L), own(L), ownLayered(L);
    for (size_t l = 0; l < L; ++l) {
      const LayerCost& c = profile_.layers[l];
      // Note [Parameter-sized working sets] in LayerCost.h: affine in the microbatch.
      own[l] = scaledBytes(c.workingBytes, c.workingFixedBytes, f);
      ownLayered[l] = own[l] + scaled(saved_[l + 1], f);
      key[l] = (c.gatheredWorkingBytes >= 0
                    ? scaledBytes(c.gatheredWorkingBytes, c.gatheredWorkingFixedBytes, f)
                    : own[l]) -
               grad_[l + 1];
      layered[l] = key[l] + scaled(saved_[l + 1], f);
    }
    GatherTables t{buildMax(std::move(key)), buildMax(std::move(layered)), buildMax(std::move(own)),
                   buildMax(std::move(ownLayered))};
    it = gather_->tables.emplace(shape.microbatchSize, std::move(t)).first;
  }
  return it->second;  // std::map nodes are stable
}

bool CostModel::gradientsInPlace(const PipelineShape& shape, int k, StashPolicy policy) {
  if (shape.replicas > 1 || splitsBackward(shape.kind)) return false;
  const bool split = shape.splits(k);
  if (split)
    return shape.kind == ScheduleKind::PipeFbSync &&
           schedules::isCheckpoint(schedules::effectivePolicy(policy, split));
  const bool unsplitPipeFb = isSplit(shape.kind);
  return unsplitPipeFb ||
         weightCopies(shape.kind, shape.stages, k, shape.microbatches, shape.asyncLag) == 0;
}

std::int64_t CostModel::backwardWorking(const PipelineShape& shape, int k, int first, int last,
                                        bool inPlace) const {
  const double f = scale(shape);
  const GatherTables& t = gatherTables(shape);
  const std::int64_t during =
      inPlace ? rangeMax(t.inPlace, first, last) : grad_[last] + rangeMax(t.gathered, first, last);
  const std::int64_t atEnd =
      (inPlace ? 0 : range(grad_, first, last)) + (k > 0 ? scaled(inputBytes(first), f) : 0);
  return std::max(during, atEnd);
}

std::int64_t CostModel::backwardLayered(const PipelineShape& shape, int k, int first, int last,
                                        bool inPlace, std::int64_t onStash) const {
  const double f = scale(shape);
  const GatherTables& t = gatherTables(shape);
  const std::int64_t during = (inPlace ? rangeMax(t.inPlaceLayered, first, last)
                                       : grad_[last] + rangeMax(t.layered, first, last)) -
                              scaled(saved_[first], f) - onStash;
  const std::int64_t atEnd =
      (inPlace ? 0 : range(grad_, first, last)) + (k > 0 ? scaled(inputBytes(first), f) : 0);
  return std::max(during, atEnd);
}

std::int64_t CostModel::limit(int device, std::int64_t budget) const {
  std::int64_t cap = cluster_.devices.at(device).capacity;
  if (budget < 0) return cap;
  if (cap < 0) return budget;
  return std::min(cap, budget);
}

double CostModel::linkTime(const PipelineShape& shape, int k, int first) const {
  if (k == 0) return 0;
  const std::int64_t bytes = scaled(inputBytes(first), scale(shape));
  const double act = cluster_.link(shape.forwardDevice(k - 1), shape.forwardDevice(k)).time(bytes);
  const double grad =
      cluster_.link(shape.backwardDevice(k), shape.backwardDevice(k - 1)).time(bytes);
  return std::max(act, grad);
}

double CostModel::computeLowerBound(const PipelineShape& shape, int k, int first, int last) const {
  const double f = scale(shape);
  const double fw = forwardTime(first, last, f), bw = backwardTime(first, last, f);
  const double step =
      range(step_, first, last) * stepsPerMicrobatch(shape.kind, shape.microbatches);
  const double sf = speed(shape, shape.forwardDevice(k));
  const double sb = speed(shape, shape.backwardDevice(k));
  if (shape.splits(k)) return std::max(fw / sf, (bw + step) / sb);
  return (fw + bw + step) / sf;
}

std::int64_t CostModel::memoryLowerBound(const PipelineShape& shape, int k, int first, int last,
                                         std::int64_t maxWorking) const {
  // Weights, grads and optimizer state on the backward device, and the working set: all
  // grow with the stage; the stash (which may shrink under a checkpoint) is left out.
  return range(param_, first, last) + range(grad_, first, last) +
         (shape.optimizerOnHost ? 0 : range(opt_, first, last)) + maxWorking;
}

namespace {
// Note [Forward beside backward]: a stage alone on its device, F and fused B there.
bool forwardBesideBackward(const PipelineShape& shape) {
  return !shape.sharesDevices() && !shape.decoupled() && !isSplit(shape.kind) &&
         !splitsBackward(shape.kind);
}
}  // namespace

CostModel::WaitingBytes CostModel::waitingBytes(const PipelineShape& shape, int k, int first,
                                                int last, bool outputTravels) const {
  WaitingBytes out;
  if (shape.decoupled()) return out;  // Note [Decoupled devices]
  const double f = scale(shape);
  const std::int64_t input = scaled(inputBytes(first), f);
  const std::int64_t output = scaled(profile_.layers[last - 1].outputBytes, f);
  const schedules::WaitingMessages& wm =
      waitingFor(shape.kind, shape.stages, shape.microbatches, shape.folded, shape.lag());
  // Note [Outputs at the loss]: those of the next iteration come after B's loss. A folded
  // device also runs forwards, beside which they may wait as well: charged whole there.
  const int atLoss = shape.folded ? wm.outputs : wm.outputsAtLoss;
  const std::int64_t outputs = outputTravels ? atLoss * output : 0;
  out.outputsAfterLoss = outputTravels ? (wm.outputs - atLoss) * output : 0;
  if (forwardBesideBackward(shape)) {  // Note [Forward beside backward]
    out.activations = wm.activationsAtBackward.at(k) * input;
    out.gradients = wm.gradientsAtBackward.at(k) * output + outputs;
    out.activationsAtForward = wm.activations.at(k) * input;
    out.atForward = out.activationsAtForward + wm.gradients.at(k) * output + outputs;
    return out;
  }
  out.activations = out.activationsAtForward = wm.activations.at(k) * input;
  out.gradients = wm.gradients.at(k) * output + outputs;
  if (shape.folded && shape.splits(k) && isFlushing(shape.kind)) {  // Note [Folded pace]
    out.activationsOnlyAtForward = (wm.activations.at(k) - wm.activationsAtBackward.at(k)) * input;
    out.gradientsOnlyAtForward = (wm.gradients.at(k) - wm.gradientsAtBackward.at(k)) * output;
  }
  return out;
}

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

namespace {
// Note [Decoupled devices]: a boundary between two devices of one pass waits as many
// messages as the 2S-device form's (the forward devices never wait for a backward within
// an iteration, and a backward device only for its stashes and the next range's gradients).
const schedules::WaitingMessages& decoupledWaiting(const PipelineShape& shape) {
  return waitingFor(shape.kind, 2, shape.microbatches, false, shape.lag());
}
}  // namespace

RangeBoundary CostModel::forwardRangeInput(const PipelineShape& shape, int a, int first) const {
  RangeBoundary out;
  if (a == 0) return out;
  const std::int64_t bytes = scaled(inputBytes(first), scale(shape));
  out.time =
      cluster_.link(shape.forwardRangeDevice(a - 1), shape.forwardRangeDevice(a)).time(bytes);
  out.bytes = decoupledWaiting(shape).activations.at(1) * bytes;
  return out;
}

RangeBoundary CostModel::backwardRangeOutput(const PipelineShape& shape, int r, int last,
                                             StashPolicy lastPolicy) const {
  RangeBoundary out;
  const schedules::WaitingMessages& wm = decoupledWaiting(shape);
  const std::int64_t bytes = scaled(profile_.layers[last - 1].outputBytes, scale(shape));
  const int to = shape.backwardRangeDevice(r);
  if (r + 1 < shape.backwardDevices) {
    out.time = cluster_.link(shape.backwardRangeDevice(r + 1), to).time(bytes);
    out.bytes = wm.gradients.at(0) * bytes;
  } else if (schedules::lastOutputTravels(true, schedules::isCheckpoint(lastPolicy))) {
    // Note [Recomputed last output]: only a B that does not recompute is sent the output.
    // A decoupled placement's devices run one pass each: it is sent at its receive (Note
    // [Output at its receive in the cost model]).
    out.time = cluster_.link(shape.forwardRangeDevice(shape.forwardDevices - 1), to).time(bytes);
    out.bytes = wm.outputs * bytes;
    out.atReceive = true;
  }
  return out;
}

void DecoupledDevice::addForward(const StageEstimate& e) {
  const int st = index(MemoryCategory::Stash), ws = index(MemoryCategory::WorkingSet);
  const CategoryBytes& m = e.forwardMemory;
  compute += e.forwardCompute;
  copy += e.forwardCopy;
  resident += total(m) - m[st] - m[ws];
  // Note [Decoupled devices]: F of a segment beside the stash of the device's OFF before
  // it, the previous segment's (one copy: the pairing below assumes kOffloadsInFlight 1).
  static_assert(schedules::kOffloadsInFlight == 1, "pair each F with as many OFFs before it");
  // What of this segment's stashes stays beside the next microbatch's F of the range's
  // first segment when it is the range's last (a one-segment range's own bound); an
  // unsplit segment keeps its other stashes beside every F.
  const std::int64_t kept = m[st] - e.stashBytes;
  if (e.same) resident += kept;
  const Held here{e.stashBytes, m[ws]};
  if (forwardSegments_ == 0) {
    wrap_ = e.same ? 0 : kept;
  } else {  // the old first segment's F now follows this one's OFF
    const Held h{firstF_.stashes + e.copyingOutBytes, firstF_.working};
    if (h.total() > inside_.total()) inside_ = h;
  }
  firstF_ = here;
  firstInput_ = e.firstInputBytes;
  firstInputBesideCopy_ = e.firstInputBesideCopy;
  ++forwardSegments_;
}

std::int64_t DecoupledDevice::memoryFloor() const {
  if (forwardSegments_ > 0) return resident + std::max(inside_.total(), firstF_.total());
  return resident + inside_.total();
}

void DecoupledDevice::addBackward(const StageEstimate& e, const PipelineShape& shape) {
  const int st = index(MemoryCategory::Stash), ws = index(MemoryCategory::WorkingSet);
  const CategoryBytes& m = e.backwardMemory;
  compute += e.backwardCompute;
  copy += e.backwardCopy;
  resident += total(m) - m[st] - m[ws];
  lookahead_ = shape.lookahead;
  microbatches_ = shape.microbatches;
  stashes_.push_back(e.stashBytes);
  working_.push_back(m[ws]);
  steps_.push_back(e.stepWorkingBytes);
  versionSum_.push_back(versionSum_.back() + e.windowedVersionBytes);
  windowed_ = windowed_ || e.windowedVersionBytes > 0;
  // Note [Decoupled devices]: B order is the order added, so segment q's lookahead + 1
  // B's stay within one microbatch once q + lookahead segments follow it; adding one
  // more segment settles the window of the segment `lookahead` places before it.
  const int q = static_cast<int>(stashes_.size()) - 1 - lookahead_;
  if (q >= 0) {
    const Held h = window(q);
    if (h.total() > inside_.total()) inside_ = h;
  }
}

DecoupledDevice::Held DecoupledDevice::window(int q) const {
  const int n = static_cast<int>(stashes_.size());
  // The B's from B(q,0) on: n - q of microbatch 0, n of each later one.
  const std::int64_t left = static_cast<std::int64_t>(n) * microbatches_ - q;
  const int count = static_cast<int>(std::min<std::int64_t>(lookahead_ + 1, left));
  Held h;
  for (int t = 0; t < count; ++t) h.stashes += stashes_[(q + t) % n];
  h.working = working_[q];
  return h;
}

// The windowed versions of the segments in the union of the ranges [first, last] (clipped
// to the segments; an empty range has first > last).
std::int64_t DecoupledDevice::versionsIn(std::initializer_list<std::pair<int, int>> list) const {
  const int n = static_cast<int>(stashes_.size());
  std::array<std::pair<int, int>, 5> ranges{};
  PIPEFB_ASSERT(list.size() <= ranges.size(), "versionsIn: at most 5 ranges");
  std::copy(list.begin(), list.end(), ranges.begin());
  std::fill(ranges.begin() + list.size(), ranges.end(), std::pair<int, int>{1, 0});
  std::sort(ranges.begin(), ranges.end());
  std::int64_t sum = 0;
  int next = 0;  // the segments below it are counted
  for (auto [a, b] : ranges) {
    a = std::max(a, next);
    b = std::min(b, n - 1);
    if (a > b) continue;
    sum += versionSum_[b + 1] - versionSum_[a];
    next = b + 1;
  }
  return sum;
}

// Note [Planned async lag]: B(q, 0), B(q, M-1) and STEP(q) with the versions there then.
DecoupledDevice::Held DecoupledDevice::windowedPeak() const {
  const int n = static_cast<int>(stashes_.size()), a = lookahead_, b = std::max(a, 1);
  constexpr std::pair<int, int> none{1, 0};
  Held best;
  for (int q = 0; q < n; ++q) {
    const Held h = window(q);
    const std::pair<int, int> prefetched{q, q + a}, goingOut{n + q - a, n - 1},
        held = q == 0 ? std::pair<int, int>{n - 1, n - 1} : none, stepped{q - b, q - 1},
        early{0, q - n + a};
    const std::int64_t first = versionsIn({prefetched, goingOut, held});
    const std::int64_t last = versionsIn({stepped, early});
    // With M = 1, B(q, 0) is B(q, M-1).
    const std::int64_t atB = microbatches_ == 1
                                 ? versionsIn({prefetched, goingOut, held, stepped, early})
                                 : std::max(first, last);
    const std::int64_t atStep = versionsIn({{q - b, q}, {0, q - n + a + 1}});
    const Held atBackward{h.stashes, h.working, atB}, step{h.stashes, steps_[q], atStep};
    if (atBackward.total() > best.total()) best = atBackward;
    if (step.total() > best.total()) best = step;
  }
  return best;
}

DecoupledDevice::Held DecoupledDevice::peak() const {
  Held best = inside_;
  if (windowed_) {
    const Held h = windowedPeak();
    if (h.total() > best.total()) best = h;
  }
  if (forwardSegments_ > 0) {  // the range's first F beside its last segment's copies
    const std::int64_t before =
        firstInputBesideCopy_ ? wrap_ + firstInput_ : std::max(wrap_, firstInput_);
    const Held h{firstF_.stashes + before, firstF_.working};
    return h.total() > best.total() ? h : best;
  }
  const int n = static_cast<int>(stashes_.size());
  for (int q = std::max(0, n - lookahead_); q < n; ++q) {  // windows into microbatch m + 1
    const Held h = window(q);
    if (h.total() > best.total()) best = h;
  }
  return best;
}

double CostModel::foldedLinkTime(const PipelineShape& shape, int a, int actLayer,
                                 int gradLayer) const {
  const double f = scale(shape);
  const Link& l = cluster_.link(shape.chain.at(a), shape.chain.at(a + 1));
  return l.time(scaled(inputBytes(actLayer), f)) + l.time(scaled(inputBytes(gradLayer), f));
}

double foldedDeviceTime(const StageEstimate& forwardPart, const StageEstimate& backwardPart) {
  return std::max(forwardPart.forwardCompute + backwardPart.backwardCompute,
                  forwardPart.forwardCopy + backwardPart.backwardCopy);
}

std::int64_t foldedDeviceMemory(const StageEstimate& forwardPart,
                                const StageEstimate& backwardPart) {
  const int ws = index(MemoryCategory::WorkingSet), st = index(MemoryCategory::Stash);
  const CategoryBytes& f = forwardPart.forwardMemory;
  const CategoryBytes& b = backwardPart.backwardMemory;
  // Note [Folded pace]: the messages that wait at F starts only wait beside the forwards.
  const std::int64_t besideF =
      forwardPart.forwardCommOnlyAtForward + backwardPart.backwardCommOnlyAtForward;
  const std::int64_t both = total(f) - f[ws] - f[st] + total(b) - b[ws] - besideF;
  // Note [Folded pace]: while B runs, F is not building a stash; only the copies still
  // going out (Note [Offloads in flight]) stay beside B's working set.
  const std::int64_t whileF = f[st] + f[ws] + besideF;
  const std::int64_t whileB = std::max<std::int64_t>(0, f[st] - forwardPart.stashBytes) + b[ws];
  return both + std::max(whileF, whileB);
}

std::vector<DecoupledRange> decoupledRanges(const CostModel& modelIn, const PipelineShape& shape,
                                            const std::vector<StageEstimate>& stages,
                                            const std::vector<int>& cuts) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shape.microbatchSize);
  const int S = static_cast<int>(stages.size());
  std::vector<DecoupledRange> out;
  for (bool backward : {false, true}) {
    const std::vector<int>& range = backward ? shape.backwardRange : shape.forwardRange;
    for (int k = 0; k < S; ++k) {
      if (k == 0 || range[k] != range[k - 1]) {
        DecoupledRange r;
        r.backward = backward;
        r.index = range[k];
        r.first = k;
        r.device = backward ? shape.backwardDevice(k) : shape.forwardDevice(k);
        out.push_back(r);
      }
      DecoupledRange& r = out.back();
      r.last = k + 1;
      r.firstLayer = cuts[r.first];
      r.lastLayer = cuts[k + 1];
    }
  }
  // A range's segments from its last to its first (Note [Decoupled devices]).
  for (DecoupledRange& r : out)
    for (int k = r.last - 1; k >= r.first; --k)
      r.backward ? r.load.addBackward(stages[k], shape) : r.load.addForward(stages[k]);
  for (DecoupledRange& r : out)
    r.boundary = r.backward ? model.backwardRangeOutput(shape, r.index, r.lastLayer,
                                                        stages[r.last - 1].policy)
                            : model.forwardRangeInput(shape, r.index, r.firstLayer);
  return out;
}

double CostModel::linksTime(const PipelineShape& shape,
                            const std::vector<std::pair<int, int>>& boundaries) const {
  const double f = scale(shape);
  struct Load {
    int from, to;
    double time;
  };
  std::vector<Load> load;  // a few links: a flat list
  auto add = [&](int from, int to, double t) {
    for (Load& l : load)
      if (l.from == from && l.to == to) return void(l.time += t);
    load.push_back({from, to, t});
  };
  for (const auto& [k, first] : boundaries) {
    const int a = shape.forwardDevice(k - 1), b = shape.forwardDevice(k);
    if (a == b) continue;  // the V's turn, or D = 1: handed over locally
    const std::int64_t bytes = scaled(inputBytes(first), f);
    add(a, b, cluster_.link(a, b).time(bytes));
    add(b, a, cluster_.link(b, a).time(bytes));
  }
  double out = 0;
  for (const Load& l : load) out = std::max(out, l.time);
  return out;
}

double sharedDeviceTime(const std::vector<HostedStage>& stages) {
  return sharedDeviceTime(stages.data(), stages.data() + stages.size());
}

double sharedDeviceTime(const HostedStage* first, const HostedStage* last) {
  double compute = 0, copy = 0, largest = 0;
  for (const HostedStage* h = first; h != last; ++h) {
    compute += h->estimate->forwardCompute;
    copy += h->estimate->forwardCopy;
    largest = std::max(largest, h->estimate->forwardCompute);
  }
  // Note [Balanced chunks]
  return std::max({compute, copy, static_cast<double>(last - first) * largest});
}

const std::vector<schedules::HeldAtStart>& stashesHeldTogether(const PipelineShape& shape,
                                                               int position) {
  return heldTogether(shape.kind, shape.stages, shape.microbatches, shape.lag()).at(position);
}

std::int64_t sharedDeviceMemory(const PipelineShape& shape, int position,
                                const std::vector<HostedStage>& stages) {
  return sharedDeviceMemory(stashesHeldTogether(shape, position), stages.data(),
                            stages.data() + stages.size());
}

std::int64_t sharedDeviceMemory(const std::vector<schedules::HeldAtStart>& held,
                                const HostedStage* first, const HostedStage* last) {
  const int st = index(MemoryCategory::Stash), ws = index(MemoryCategory::WorkingSet);
  std::int64_t states = 0;
  for (const HostedStage* h = first; h != last; ++h) {
    const CategoryBytes& m = h->estimate->backwardMemory;
    states += total(m) - m[st] - m[ws];
  }
  // Note [Stashes held together]: the stashes alive at a compute start, beside the working
  // set of the stage that starts (B's, I's or W's, without the step's excess).
  // Note [Step working set]: the shared kinds flush, and a device's STEPs come after its
  // last B or W, so a step's transient is charged beside the states alone. (Charged as
  // the stage's working set instead, beside the other stage's stashes, it had zbv's
  // device 0 (VGG16/4, conv1_1..conv4_3 and fc7..fc8) measure 11.1% below the plan: fc7's
  // Adam transient, 8.4 MB, charged beside conv1_1..conv4_3's three stashes.)
  std::int64_t peak = 0;
  for (const HostedStage* h = first; h != last; ++h)
    peak = std::max(peak, h->estimate->stepWorkingBytes);
  for (const schedules::HeldAtStart& n : held) {
    std::int64_t together = 0;
    for (const HostedStage* h = first; h != last; ++h) {
      const StageEstimate& e = *h->estimate;
      // Note [What waits for W]: a W's own stash is in its working set.
      const int own = h->stage == n.starting && n.weight ? 1 : 0;
      const int alive = std::min(n.alive[h->stage], e.residentStashes) - own;
      together += residentStashBytes(e, alive, std::min(alive, n.deferred[h->stage] - own));
      if (h->stage == n.starting)
        together += n.forward  ? e.forwardPeakBytes
                    : n.weight ? e.weightWorkingBytes
                               : e.backwardWorkingBytes;
    }
    peak = std::max(peak, together);
  }
  return states + peak;
}

PlanLoad planLoad(const CostModel& modelIn, const PipelineShape& shape,
                  const std::vector<StageEstimate>& stages, const std::vector<int>& cuts) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shape.microbatchSize);
  const int S = static_cast<int>(stages.size());
  PlanLoad out;
  out.deviceMemory.assign(model.cluster().numDevices(), 0);
  if (shape.sharesDevices()) {  // Note [Shared devices]
    std::vector<std::vector<HostedStage>> byPosition(shape.chainLength());
    std::vector<std::pair<int, int>> boundaries;
    for (int k = 0; k < S; ++k) {
      out.tau = std::max(out.tau, stages[k].time);
      out.hostBytes += stages[k].hostBytes;
      byPosition.at(shape.position(k)).push_back({k, &stages[k]});
      if (k > 0) boundaries.push_back({k, cuts[k]});
    }
    for (int p = 0; p < shape.chainLength(); ++p) {
      out.tau = std::max(out.tau, sharedDeviceTime(byPosition[p]));
      out.deviceMemory[shape.chain.at(p)] += sharedDeviceMemory(shape, p, byPosition[p]);
    }
    out.tau = std::max(out.tau, model.linksTime(shape, boundaries));
    return out;
  }
  if (shape.decoupled()) {  // Note [Decoupled devices]
    for (const StageEstimate& e : stages) out.hostBytes += e.hostBytes;
    for (const DecoupledRange& r : decoupledRanges(model, shape, stages, cuts)) {
      out.tau = std::max(out.tau, r.boundary.busy(r.load.time()));
      out.deviceMemory[r.device] += r.load.memory() + r.boundary.bytes;
    }
    return out;
  }
  for (int k = 0; k < S; ++k) {
    const StageEstimate& e = stages[k];
    out.tau = std::max(out.tau, e.time);
    out.hostBytes += e.hostBytes;
    if (shape.folded && e.same == false) continue;  // below, per device
    if (e.same) {
      out.deviceMemory[shape.forwardDevice(k)] += total(e.backwardMemory);
    } else {
      out.deviceMemory[shape.forwardDevice(k)] += total(e.forwardMemory);
      out.deviceMemory[shape.backwardDevice(k)] += total(e.backwardMemory);
    }
  }
  if (!shape.folded) return out;
  // Note [Folded pace]: device chain[d] runs F(d) and B(S-1-d).
  for (int d = 0; d < S; ++d) {
    if (!shape.splits(d)) continue;
    out.tau = std::max(out.tau, foldedDeviceTime(stages[d], stages[S - 1 - d]));
    out.deviceMemory[shape.chain[d]] += foldedDeviceMemory(stages[d], stages[S - 1 - d]);
  }
  for (int a = 0; a + 1 < S; ++a)
    out.tau = std::max(out.tau, model.foldedLinkTime(shape, a, cuts[a + 1], cuts[S - 1 - a]));
  return out;
}

bool inputStashOnly(const Cluster& cluster, const PipelineShape& shape, int k) {
  const int fd = shape.forwardDevice(k), bd = shape.backwardDevice(k);
  return fd != bd && (shape.replicas > 1 || !cluster.sameProcess(fd, bd));
}

}  // namespace pipefb::planner
