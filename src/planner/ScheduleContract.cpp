// The schedules' memory contracts as the cost model reads them: closed forms, and tables
// computed once from the generated schedules (Note [Planner cost model] in CostModel.h).
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "CostModelDetail.h"
#include "pipefb/planner/CostModel.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Messages.h"
#include "pipefb/schedules/SharedDevices.h"

namespace pipefb::planner {

using detail::generatedContract;

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
    case ScheduleKind::InterleavedZb:
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

}  // namespace

namespace detail {

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

}  // namespace detail

namespace {
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
    case ScheduleKind::InterleavedZb:
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
    case ScheduleKind::InterleavedZb:
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

}  // namespace pipefb::planner
