#include "pipefb/sim/Simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/HeldOffloads.h"
#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/Messages.h"
#include "pipefb/schedules/ScheduleError.h"
#include "pipefb/schedules/WeightVersions.h"

// Note [Simulation model]
// Resources: each device has a compute thread that runs its action list in order, and a
// copy engine (device <-> host pool) that runs the device's OFF/PRE in the order the thread
// issued them. Each ordered device pair is a link. All three are FIFO and used by one
// device only, so times can be computed as soon as an action's inputs are known, without a
// global clock: every agent (thread or copy engine) advances until it needs a time that is
// not known yet, registers as the waiter of that key, and is woken when the key resolves.
//  * F, B, I, W, STEP, AR occupy the thread. B (or I) waits for its PRE to finish.
//  * A send is issued by the thread without blocking; the transfer starts when the link is
//    free: arrival = start + bytes/bandwidth + latency (the link is busy for bytes/bandwidth).
//    A rendezvous send waits for its receive instead (Note [Rendezvous in the simulator]).
//  * A receive blocks the thread until the data arrived.
//  * OFF/PRE are issued without blocking; the copy starts when the copy engine is free (and,
//    for PRE, when the OFF of that stash finished, possibly on another device). Except that
//    an OFF waits, on the thread, while kOffloadsInFlight earlier D2H copies of its device
//    are unfinished (the runtime's backpressure, Note [Offloads in flight] in
//    planner/CostModel.h).
// Memory is charged per device and category (pipefb/common/MemoryCategory.h):
//  * weights on F(s) and B(s), grads and optimizer state on B(s), from time 0;
//  * working set while F/B runs (plus the recomputed graph stash during BR);
//  * stash from the end of F until OFF finished (a held offload's until the OFF that
//    releases it, Note [Held offloads] in schedules/HeldOffloads.h, as the runtime holds
//    it), and from its PRE's destination (Note [Prefetch destinations in the simulator])
//    until B finished
//    (graph stash, or checkpoint bytes when the B is BR); with a split backward (Note
//    [Split backward]) until W finished, deferredStashBytes() from the end of I;
//  * weight versions: on B(s), (distinct versions referenced by stashed microbatches and
//    the current one) - 1, times weightVersionBytes; for a stage whose schedule moves its
//    versions (OFFW/PREW/DROPW, Note [Weight-version offload]) each stashed version
//    instead (Note [Stashed weight versions]): from the end of the F or STEP that made it,
//    off the device from the end of its OFFW copy, back from the start of its PREW copy
//    (B waits for that copy to end), gone at DROPW (or its last B), and in the host pool
//    from its OFFW's start to its PREW's end;
//  * comm buffers: on the sender from issue to arrival, on the receiver during the transfer;
//  * a split stage's old forward copy, from the RW that replaced it until the last B of a
//    graph stash made on it (Note [Old forward copies in the simulator]), as weight versions.
// Samples are taken after all changes at one instant (frees and allocations at the same time
// net out), which is also how the stash counts are taken.
//
// Note [Simulator speed]
// The planner re-scores its best candidates here (simulatePlan in planner/Solver.cpp), and
// bench_planner's 64-stage PipeDream plans run 9 iterations of 16 microbatches: tens of
// thousands of actions per run, several runs per plan. So the per-action work stays
// O(1): links, hosts' links and each microbatch's stashed weight version are flat tables
// looked up by index (not maps), and the event lists are reserved up front. The events are
// sorted with std::sort, not a stable sort: an instant's changes are all applied before it
// is sampled (above), and they are integer sums, so their order within the instant cannot
// change a sample, a peak or a count.

namespace pipefb::sim {

using schedules::Action;
using schedules::ActionType;
using schedules::GridMark;
using schedules::Schedule;
using schedules::StashKind;

std::int64_t MemorySample::total() const {
  std::int64_t t = 0;
  for (auto b : bytes) t += b;
  return t;
}

namespace {

constexpr double kUnknown = -1.0;
constexpr int kNowhere = -1;
constexpr int kHost = -2;

// Keys whose time another agent may wait for.
enum KeyKind : int {
  kArrAct = 0,
  kArrGrad,
  kArrWeights,
  kOffEnd,
  kPreEnd,
  kOffEndW,
  kPreEndW,
  kOffDone,    // = kOffEnd, waited for by the device's next OFF (Note [Offloads in flight])
  kOffDoneW,   // = kOffEndW, likewise
  kRecvW,      // RW done: pipefb-async's next STEP may go (Note [Weights by reference])
  kReachAct,   // the receiver's thread reached RA: a rendezvous SA may go
  kReachGrad,  // likewise RG, for SG
  kNumKinds
};

// Note [Offloads in flight] (planner/CostModel.h): D2H copies a device may have unfinished
// before its OFF waits, as the runtime's copy engine has them (schedules/MemoryContract.h).
constexpr size_t kOffloadsInFlight = schedules::kOffloadsInFlight;

struct MemEvent {
  double time;
  int device;  // -1 = host pool
  int cat;     // MemoryCategory index
  std::int64_t delta;
};

struct CountEvent {
  double time;
  int device;  // -1 = in flight anywhere (per stage)
  int stage;
  int delta;
};

class Simulation {
 public:
  Simulation(const Schedule& s, const CostTable& c, const SimOptions& o) : s_(s), c_(c), o_(o) {
    S_ = s.numStages;
    D_ = s.numDevices();
    if (c.numStages() != S_)
      throw UserError("the cost table has " + std::to_string(c.numStages()) +
                      " stages but the schedule has " + std::to_string(S_));
    int maxIdx = 0;
    for (const auto& list : s.devices)
      for (const Action& a : list) maxIdx = std::max(maxIdx, a.index);
    N_ = maxIdx + 1;
    const size_t SN = static_cast<size_t>(S_) * N_;
    times_.assign(kNumKinds * SN, kUnknown);
    waiter_.assign(kNumKinds * SN, -1);
    stashAt_.assign(SN, kNowhere);
    stashBytes_.assign(SN, 0);
    preIssuedOn_.assign(SN, kNowhere);
    recompute_.assign(SN, false);
    version_.assign(SN, 0);
    recvW_.assign(SN, false);
    for (const auto& list : s.devices)
      for (const Action& a : list) {
        if (a.isInputBackward() && a.recompute) recompute_[at(a.stage, a.index)] = true;
        if (a.type == ActionType::RecvWeights) recvW_[at(a.stage, a.index)] = true;
      }
    curVersion_.assign(static_cast<size_t>(D_) * S_, 0);
    result_.peakWeightVersions.assign(S_, 1);
    // Stages whose versions the schedule moves are charged version by version.
    explicitW_.assign(S_, false);
    for (const auto& list : s.devices)
      for (const Action& a : list)
        if (a.stash == StashKind::Weights &&
            (a.type == ActionType::Offload || a.type == ActionType::Prefetch ||
             a.type == ActionType::Drop)) {
          explicitW_[a.stage] = true;
          if (a.type == ActionType::Drop) wv_[{a.stage, a.index}].dropInSchedule = true;
        }
    usesV_.assign(SN, -1);
    for (const auto& v : schedules::stashedVersions(s)) {
      if (!explicitW_[v.stage]) continue;
      Stashed& w = wv_[{v.stage, v.version}];
      w.madeByStep = v.madeByStep;
      w.remaining = static_cast<int>(v.microbatches.size());
      for (int m : v.microbatches) usesV_[at(v.stage, m)] = v.version;
    }
    passes_ = schedules::rendezvousPasses(s);
    // Note [Held offloads]: what each OFF releases (a device's held copies).
    held_ = schedules::heldOffloadReleases(s);
    releases_.assign(D_, {});
    for (int d = 0; d < D_; ++d)
      for (size_t j = 0; j < held_[d].size(); ++j)
        if (held_[d][j] >= 0) releases_[d][held_[d][j]].push_back(static_cast<int>(j));
    heldOn_.assign(SN, kNowhere);
    later_ = schedules::prefetchesBoundLater(s);
    bindEvents_.assign(D_, {});
    layoutTime_.assign(S_, std::numeric_limits<double>::infinity());
    offDevice_.assign(SN, kNowhere);
    lastOffEnd_.assign(D_, std::vector<double>(S_, -1.0));
    heldBytes_.assign(SN, 0);
    async_ = s.kind == "pipefb-async";
    // Note [Simulator speed]: the links looked up once, not per message.
    links_.resize(static_cast<size_t>(D_) * D_);
    hostLinks_.resize(D_);
    size_t actions = 0;
    for (int d = 0; d < D_; ++d) {
      hostLinks_[d] = &c.hostLink(d);
      for (int e = 0; e < D_; ++e) links_[static_cast<size_t>(d) * D_ + e] = &c.link(d, e);
      actions += s.devices[d].size();
    }
    mem_.reserve(4 * actions);
    counts_.reserve(2 * actions);
    pc_.assign(D_, 0);
    threadTime_.assign(D_, 0.0);
    copyQueue_.assign(D_, {});
    copyHead_.assign(D_, 0);
    copyFree_.assign(D_, 0.0);
    offIssued_.assign(D_, {});
    issueTime_.assign(D_, {});
    linkFree_.assign(static_cast<size_t>(D_) * D_, 0.0);
    result_.spans.resize(D_);
    result_.busy.assign(D_, 0.0);
    for (int d = 0; d < D_; ++d) {
      result_.spans[d].assign(s.devices[d].size(), ActionSpan{});
      issueTime_[d].assign(s.devices[d].size(), 0.0);
    }
    // Resident state from time 0.
    for (int st = 0; st < S_; ++st) {
      const StageCosts& sc = c.stages[st];
      int fd = s.placement.forward(st), bd = s.placement.backward(st);
      if (bd == fd) {
        mem(0, fd, MemoryCategory::Weights, sc.weightsBytes);
      } else {
        mem(0, fd, MemoryCategory::Weights,
            sc.forwardWeightsBytes >= 0 ? sc.forwardWeightsBytes : sc.weightsBytes);
        mem(0, bd, MemoryCategory::Weights, sc.weightsBytes);
      }
      mem(0, bd, MemoryCategory::Grads, sc.gradsBytes);
      mem(0, bd, MemoryCategory::OptimizerState, sc.optimizerStateBytes);
    }
  }

  SimResult run() {
    std::deque<int> work;
    for (int a = 0; a < 2 * D_; ++a) work.push_back(a);
    std::vector<bool> queued(2 * D_, true);
    wake_ = [&](int agent) {
      if (!queued[agent]) {
        queued[agent] = true;
        work.push_back(agent);
      }
    };
    while (!work.empty()) {
      int agent = work.front();
      work.pop_front();
      queued[agent] = false;
      int d = agent / 2;
      if (agent % 2 == 0) {
        while (pc_[d] < static_cast<int>(s_.devices[d].size()) && threadStep(d, agent)) ++pc_[d];
      } else {
        while (copyHead_[d] < copyQueue_[d].size() && copyStep(d, agent)) ++copyHead_[d];
      }
    }
    std::vector<GridMark> stuck;
    for (int d = 0; d < D_; ++d) {
      if (pc_[d] < static_cast<int>(s_.devices[d].size())) stuck.push_back({d, pc_[d]});
      if (copyHead_[d] < copyQueue_[d].size()) stuck.push_back({d, copyQueue_[d][copyHead_[d]]});
    }
    if (!stuck.empty())
      throw schedules::scheduleError(
          s_, "simulation deadlock: the marked actions wait for data that never comes", stuck);
    finish();
    return std::move(result_);
  }

 private:
  size_t at(int st, int i) const { return static_cast<size_t>(st) * N_ + i; }
  size_t key(int kind, int st, int i) const {
    return static_cast<size_t>(kind) * S_ * N_ + at(st, i);
  }
  const StageCosts& cost(int st) const { return c_.stages[st]; }

  void mem(double t, int device, MemoryCategory cat, std::int64_t delta) {
    if (delta != 0) mem_.push_back({t, device, static_cast<int>(index(cat)), delta});
  }
  void count(double t, int device, int st, int delta) { counts_.push_back({t, device, st, delta}); }

  [[noreturn]] void fail(int d, int step, const std::string& why) {
    throw schedules::scheduleError(
        s_, toString(s_.devices[d][step]) + " on device " + std::to_string(d) + ": " + why,
        {{d, step}});
  }

  // Resolves a key at time t and wakes its waiter.
  void resolve(size_t k, double t) {
    times_[k] = t;
    if (waiter_[k] >= 0) {
      wake_(waiter_[k]);
      waiter_[k] = -1;
    }
  }
  // Returns the time of key k, or registers `agent` as its waiter and returns kUnknown.
  double need(size_t k, int agent, int d, int step) {
    if (times_[k] != kUnknown) return times_[k];
    if (waiter_[k] >= 0 && waiter_[k] != agent)
      fail(d, step, "two actions wait for the same data (a duplicate receive or prefetch)");
    waiter_[k] = agent;
    return kUnknown;
  }

  // Note [Versions in simulated time]
  // The versions B(s) keeps are the distinct ones its stashed microbatches ran on, plus its
  // current one. Agents run out of time order (a device's thread may run far ahead of
  // another's, Note [Simulation model]), so these are recorded as events and counted in
  // finish(), in time order, not from the other devices' state at the time an agent gets
  // there. (Counted so, pipefb-async S=2 M=2 charged a STEP of the backward device to a
  // forward that ran before it: 2 extra versions where the runtime holds 1.)
  void versionRef(double t, int st, int version, int delta) {
    versionEvents_.push_back({t, st, version, delta});
  }
  void currentVersion(double t, int d, int st, int version) {
    if (d == s_.placement.backward(st)) versionEvents_.push_back({t, st, version, 0});
  }
  void countVersions() {
    std::sort(versionEvents_.begin(), versionEvents_.end(),
              [](const VersionEvent& x, const VersionEvent& y) { return x.time < y.time; });
    std::vector<std::map<int, int>> refs(S_);
    std::vector<int> cur(S_, 0), extraNow(S_, 0);
    std::vector<int> touched;
    for (size_t j = 0; j < versionEvents_.size(); ++j) {
      const VersionEvent& e = versionEvents_[j];
      if (e.delta == 0) {
        cur[e.stage] = e.version;
      } else {
        auto it = refs[e.stage].try_emplace(e.version, 0).first;
        if ((it->second += e.delta) == 0) refs[e.stage].erase(it);
      }
      touched.push_back(e.stage);
      if (j + 1 < versionEvents_.size() && versionEvents_[j + 1].time == e.time) continue;
      for (int st : touched) {  // after every change at this instant
        const int distinct = static_cast<int>(refs[st].size()) + (refs[st].count(cur[st]) ? 0 : 1);
        result_.peakWeightVersions[st] = std::max(result_.peakWeightVersions[st], distinct);
        if (explicitW_[st]) continue;  // charged version by version
        const int extra = distinct - 1;
        mem(e.time, s_.placement.backward(st), MemoryCategory::WeightVersions,
            (extra - extraNow[st]) * cost(st).weightVersionBytes);
        extraNow[st] = extra;
      }
      touched.clear();
    }
  }

  void compute(int d, int step, double start, double duration) {
    result_.spans[d][step] = {start, start + duration};
    result_.busy[d] += duration;
    threadTime_[d] = start + duration;
  }

  // Note [Rendezvous in the simulator]
  // A rendezvous send (Note [Message rendezvous] in schedules/Messages.h) starts its
  // transfer once the receiver's thread reached the matching receive (kReachAct/kReachGrad,
  // resolved there) and the link is free, and holds the sender's thread until it arrived:
  // the runtime's sender waits in Channels::offer until the receiver copied the message
  // (Note [Rendezvous hand-over]), or copies it over itself when the receiver came first.
  // The sender holds the message as comm buffers from the send's start, as before; the
  // receiver only during the transfer. Without this a simulated forward-only device of
  // pipefb-sync ran all its forwards ahead of the backward devices, as the runtime's does not.
  bool sendAt(int d, int step, const Action& a, int agent, int arrivalKind, int reachKind,
              std::int64_t bytes) {
    if (!schedules::rendezvous(passes_, d, a.peer, schedules::messageKind(a, S_))) {
      sendData(d, step, a, arrivalKind, bytes);
      return true;
    }
    const double reach = need(key(reachKind, a.stage, a.index), agent, d, step);
    if (reach == kUnknown) return false;
    threadTime_[d] = sendData(d, step, a, arrivalKind, bytes, true, reach);
    return true;
  }

  // `buffered`: the sender and the receiver each hold `bytes` of comm buffers while the
  // message is in flight (activations and gradients). Weights are not: Note [Weight syncs
  // in the simulator]. The transfer starts no earlier than `notBefore`; returns its arrival.
  double sendData(int d, int step, const Action& a, int kind, std::int64_t bytes,
                  bool buffered = true, double notBefore = 0.0) {
    double t = threadTime_[d];
    const LinkCost& link = *links_[static_cast<size_t>(d) * D_ + a.peer];
    double& free = linkFree_[static_cast<size_t>(d) * D_ + a.peer];
    double start = std::max({t, free, notBefore});
    double xfer = link.transferTime(bytes);
    free = start + xfer;
    double arrival = start + xfer + link.latency;
    result_.spans[d][step] = {start, arrival};
    if (buffered) {
      mem(t, d, MemoryCategory::CommBuffers, bytes);
      mem(arrival, d, MemoryCategory::CommBuffers, -bytes);
      mem(start, a.peer, MemoryCategory::CommBuffers, bytes);
      mem(arrival, a.peer, MemoryCategory::CommBuffers, -bytes);
    }
    size_t k = key(kind, a.stage, a.index);
    if (times_[k] != kUnknown) fail(d, step, "sent twice");
    resolve(k, arrival);
    return arrival;
  }

  bool threadStep(int d, int agent) {
    const int step = pc_[d];
    const Action& a = s_.devices[d][step];
    const int st = a.stage, i = a.index;
    double t = threadTime_[d];
    switch (a.type) {
      case ActionType::Forward: {
        const StageCosts& sc = cost(st);
        compute(d, step, t, sc.forward);
        double end = threadTime_[d];
        const std::int64_t ws =
            sc.forwardWorkingSetBytes >= 0 ? sc.forwardWorkingSetBytes : sc.workingSetBytes;
        mem(t, d, MemoryCategory::WorkingSet, ws);
        mem(end, d, MemoryCategory::WorkingSet, -ws);
        std::int64_t bytes = recompute_[at(st, i)] ? sc.checkpointBytes : sc.stashBytes;
        stashBytes_[at(st, i)] = bytes;
        stashAt_[at(st, i)] = d;
        mem(end, d, MemoryCategory::Stash, bytes);
        count(end, d, st, +1);
        count(end, -1, st, +1);
        version_[at(st, i)] = curVersion_[static_cast<size_t>(d) * S_ + st];
        versionRef(end, st, version_[at(st, i)], +1);
        if (Stashed* w = versionOf(st, i); w && !w->madeByStep && !w->made) {
          w->made = true;  // the snapshot F ran on
          mem(end, d, MemoryCategory::WeightVersions, sc.weightVersionBytes);
        }
        return true;
      }
      case ActionType::Backward:
      case ActionType::InputGrad: {
        const StageCosts& sc = cost(st);
        double start = t;
        Stashed* w = versionOf(st, i);
        if (w && w->preIssued) {  // its weight version comes back first
          double ready = need(key(kPreEndW, st, usesV_[at(st, i)]), agent, d, step);
          if (ready == kUnknown) return false;
          start = std::max(start, ready);
        }
        if (preIssuedOn_[at(st, i)] == d) {
          double ready = need(key(kPreEnd, st, i), agent, d, step);
          if (ready == kUnknown) return false;
          start = std::max(start, ready);
        } else if (stashAt_[at(st, i)] != d) {
          fail(d, step, "its stash is not on this device and no PRE precedes it");
        }
        // Note [Prefetch destinations in the simulator]: B's acquires, at its start.
        if (preIssuedOn_[at(st, i)] == d) bindEvents_[d].push_back({t, epoch(i)});
        if (w && w->preIssued) bindEvents_[d].push_back({t, std::numeric_limits<int>::max()});
        const bool split = a.type == ActionType::InputGrad;
        double duration =
            (split ? sc.inputGradTime() : sc.backward) + (a.recompute ? sc.recompute : 0.0);
        compute(d, step, start, duration);
        double end = threadTime_[d];
        mem(start, d, MemoryCategory::WorkingSet, sc.workingSetBytes);
        mem(end, d, MemoryCategory::WorkingSet, -sc.workingSetBytes);
        if (a.recompute) {  // the recomputed graph lives while B runs
          mem(start, d, MemoryCategory::WorkingSet, sc.stashBytes);
          mem(end, d, MemoryCategory::WorkingSet, -sc.stashBytes);
        }
        if (split) {  // Note [Split backward]: what W needs stays until W
          const std::int64_t keep = sc.deferredStashBytes();
          mem(end, d, MemoryCategory::Stash, keep - stashBytes_[at(st, i)]);
          stashBytes_[at(st, i)] = keep;
          return true;
        }
        releaseStash(d, st, i, end);
        return true;
      }
      case ActionType::WeightGrad: {
        const StageCosts& sc = cost(st);
        if (stashAt_[at(st, i)] != d) fail(d, step, "its I did not run on this device");
        compute(d, step, t, sc.weightGradTime());
        const double end = threadTime_[d];
        const std::int64_t ws =
            sc.weightWorkingSetBytes >= 0 ? sc.weightWorkingSetBytes : sc.workingSetBytes;
        mem(t, d, MemoryCategory::WorkingSet, ws);
        mem(end, d, MemoryCategory::WorkingSet, -ws);
        releaseStash(d, st, i, end);
        return true;
      }
      case ActionType::SendAct:
        return sendAt(d, step, a, agent, kArrAct, kReachAct, cost(st).activationBytes);
      case ActionType::SendGrad:
        return sendAt(d, step, a, agent, kArrGrad, kReachGrad, cost(st).gradientBytes);
      case ActionType::SyncWeights:
        // Note [Weight syncs in the simulator]
        // As the runtime does within one process (Note [Weight syncs] in
        // PipelineEngine.cpp): a synchronous schedule's message carries references and RW
        // copies tensor by tensor into the forward copy in place, so neither side holds a
        // second copy; pipefb-async under a checkpoint kind sends a snapshot (or the weight
        // prediction, a version of the same size) that the sender holds as comm buffers
        // until RW took it, and with a graph stash the weights themselves (Note [Weights by
        // reference]). (This charged W on both sides while in flight, which made
        // pipefb-sync's forward device of fc6 peak at 1.02 GiB against the cost model's
        // 538.81 MiB on VGG16 224 px, 4x-t4-pcie.)
        sendData(d, step, a, kArrWeights, cost(st).weightVersionBytes, /*buffered=*/false);
        if (async_ && !byReference(st))
          mem(threadTime_[d], d, MemoryCategory::CommBuffers, cost(st).weightVersionBytes);
        return true;
      case ActionType::RecvAct:
      case ActionType::RecvGrad:
      case ActionType::RecvWeights: {
        int kind = a.type == ActionType::RecvAct    ? kArrAct
                   : a.type == ActionType::RecvGrad ? kArrGrad
                                                    : kArrWeights;
        // Note [Rendezvous in the simulator]: a rendezvous sender may go now.
        if (a.type != ActionType::RecvWeights) {
          const size_t reach = key(a.type == ActionType::RecvAct ? kReachAct : kReachGrad, st, i);
          if (times_[reach] == kUnknown) resolve(reach, t);
        }
        double arrival = need(key(kind, st, i), agent, d, step);
        if (arrival == kUnknown) return false;
        double end = std::max(t, arrival);
        result_.spans[d][step] = {t, end};
        threadTime_[d] = end;
        if (a.type == ActionType::RecvWeights) {
          int& cur = curVersion_[static_cast<size_t>(d) * S_ + st];
          if (s_.placement.split(st)) replaced_.push_back({st, d, cur, end});
          cur = i + 1;
          currentVersion(end, d, st, cur);
          if (async_ && !byReference(st))  // the sender's snapshot goes
            mem(end, a.peer, MemoryCategory::CommBuffers, -cost(st).weightVersionBytes);
          resolve(key(kRecvW, st, i), end);
        }
        return true;
      }
      case ActionType::Offload:
      case ActionType::Prefetch: {
        const bool weights = a.stash == StashKind::Weights;
        if (a.type == ActionType::Offload && offIssued_[d].size() >= kOffloadsInFlight) {
          // Note [Offloads in flight]: wait for the copy kOffloadsInFlight OFFs back.
          const auto& issued = offIssued_[d];
          double done = need(issued[issued.size() - kOffloadsInFlight], agent, d, step);
          if (done == kUnknown) return false;
          t = std::max(t, done);
          threadTime_[d] = t;
        }
        if (a.type == ActionType::Offload && !weights) {
          // Note [Prefetch destinations in the simulator]: the stage's layout is known.
          layoutTime_[st] = std::min(layoutTime_[st], t);
          offDevice_[at(st, i)] = d;
        }
        if (a.type == ActionType::Prefetch && (weights || !later_[d][step]))
          bindEvents_[d].push_back({t, weights ? 0 : epoch(i)});
        if (a.type == ActionType::Offload) {
          offIssued_[d].push_back(key(weights ? kOffDoneW : kOffDone, st, i));
          // Note [Held offloads]: the held copies this OFF releases; their copies are done
          // (it waited for them above).
          if (auto r = releases_[d].find(step); r != releases_[d].end())
            for (int j : r->second) {
              const Action& h = s_.devices[d][j];
              const double end = times_[key(kOffEnd, h.stage, h.index)];
              PIPEFB_ASSERT(end != kUnknown, "released " << toString(h) << " before its copy");
              releaseHeld(std::max(t, end), d, h.stage, h.index);
            }
        }
        if (a.type == ActionType::Prefetch && a.stash == StashKind::Activation) {
          if (preIssuedOn_[at(st, i)] != kNowhere) fail(d, step, "prefetched twice");
          preIssuedOn_[at(st, i)] = d;
        }
        if (a.stash == StashKind::Weights) {
          auto it = wv_.find({st, i});
          if (it == wv_.end()) fail(d, step, "not a stashed weight version of this schedule");
          (a.type == ActionType::Offload ? it->second.offIssued : it->second.preIssued) = true;
        }
        issueTime_[d][step] = t;
        result_.spans[d][step] = {t, t};
        copyQueue_[d].push_back(step);
        wake_(agent + 1);
        return true;
      }
      case ActionType::Drop: {
        result_.spans[d][step] = {t, t};
        if (a.stash == StashKind::Weights) {
          auto it = wv_.find({st, i});
          if (it == wv_.end()) fail(d, step, "not a stashed weight version of this schedule");
          const std::int64_t bytes = cost(st).weightVersionBytes;
          if (it->second.offIssued && !it->second.preIssued) {  // in the host pool
            double offEnd = need(key(kOffEndW, st, i), agent, d, step);
            if (offEnd == kUnknown) return false;
            mem(std::max(t, offEnd), -1, MemoryCategory::WeightVersions, -bytes);
          } else {
            mem(t, d, MemoryCategory::WeightVersions, -bytes);
          }
          return true;
        }
        int where = stashAt_[at(st, i)];
        if (where == d) {
          mem(t, d, MemoryCategory::Stash, -stashBytes_[at(st, i)]);
          count(t, d, st, -1);
        } else if (where == kHost) {
          hostStash(t, -stashBytes_[at(st, i)]);
          if (heldOn_[at(st, i)] != kNowhere) {  // Note [Held offloads]: a drop releases it
            double offEnd = need(key(kOffEnd, st, i), agent, d, step);
            if (offEnd == kUnknown) return false;
            releaseHeld(std::max(t, offEnd), heldOn_[at(st, i)], st, i);
          }
        } else {
          fail(d, step, "drops a stash that is neither here nor in the host pool");
        }
        count(t, -1, st, -1);
        stashAt_[at(st, i)] = kNowhere;
        versionRef(t, st, version_[at(st, i)], -1);
        return true;
      }
      case ActionType::Step: {
        // Note [Weights by reference] (runtime/WeightVersions.cpp): after RW(s, k - 1).
        if (byReference(st) && i > 0 && recvW_[at(st, i - 1)]) {
          const double taken = need(key(kRecvW, st, i - 1), agent, d, step);
          if (taken == kUnknown) return false;
          t = std::max(t, taken);
          threadTime_[d] = t;
        }
        compute(d, step, t, cost(st).step);
        // The optimizer's temporaries (Note [Step working set] in planner/CostModel.h).
        mem(t, d, MemoryCategory::OptimizerState, cost(st).stepWorkingBytes);
        mem(threadTime_[d], d, MemoryCategory::OptimizerState, -cost(st).stepWorkingBytes);
        if (auto it = wv_.find({st, i});
            it != wv_.end() && it->second.madeByStep && !it->second.made) {
          it->second.made = true;  // the version this STEP supersedes is kept
          mem(threadTime_[d], d, MemoryCategory::WeightVersions, cost(st).weightVersionBytes);
        }
        curVersion_[static_cast<size_t>(d) * S_ + st] = i + 1;
        currentVersion(threadTime_[d], d, st, i + 1);
        return true;
      }
      case ActionType::AllReduce:
        compute(d, step, t, cost(st).allReduce);
        return true;
    }
    PIPEFB_ASSERT(false, "unhandled action type");
  }

  // The end of B(st,i) or W(st,i): its stash and its hold on a weight version go.
  void releaseStash(int d, int st, int i, double end) {
    if (s_.placement.split(st) && !recompute_[at(st, i)]) {
      double& last = lastGraphUse_[{st, version_[at(st, i)]}];
      last = std::max(last, end);
    }
    mem(end, d, MemoryCategory::Stash, -stashBytes_[at(st, i)]);
    stashAt_[at(st, i)] = kNowhere;
    count(end, d, st, -1);
    count(end, -1, st, -1);
    versionRef(end, st, version_[at(st, i)], -1);
    Stashed* w = versionOf(st, i);
    if (w && --w->remaining == 0 && !w->dropInSchedule)
      mem(end, d, MemoryCategory::WeightVersions, -cost(st).weightVersionBytes);
  }

  void hostStash(double t, std::int64_t delta) { mem(t, -1, MemoryCategory::Stash, delta); }

  int epoch(int microbatch) const {
    return schedules::prefetchEpoch(microbatch, std::max(1, s_.numMicrobatches), async_);
  }

  // Note [Prefetch destinations in the simulator]
  // The runtime allocates a prefetch's device tensors when the plan issues it, or, when it
  // cannot yet, at the device's next bind (Note [Planned prefetch destinations] in
  // offload/TransferManager.h): a later PRE issued with its destination, or an acquire (B or
  // I taking an offloaded stash, or a stashed weight version, at its start), of an epoch at
  // least the prefetch's (Note [Prefetches across a flush] in schedules/HeldOffloads.h; a
  // version's acquire binds every epoch, its PREW epoch 0), once the stage's layout is
  // known (its first OFF, on any device) and, for a stash offloaded by the same device,
  // once that copy is done, and those of the stage's other OFFs the device issued before it
  // (Note [Prefetches behind their stage's offloads]); at the latest when its copy starts. Charged
  // from its copy's start instead, a backward device held a stash less than the runtime whenever
  // the OFF came after the PRE (pipefb-zb S=2 M=4, SimAgreementTest: 39% below the cost model).
  void bindDestinations() {
    for (const Destination& p : destinations_) {
      const double from = std::max({p.issue, layoutTime_[p.stage], p.sameDeviceOffEnd});
      const auto& ev = bindEvents_[p.device];
      auto it = std::lower_bound(ev.begin(), ev.end(), from,
                                 [](const BindEvent& e, double t) { return e.time < t; });
      const int want = epoch(p.index);
      while (it != ev.end() && it->epoch < want) ++it;
      const double bound = it != ev.end() ? std::min(it->time, p.copyStart) : p.copyStart;
      mem(bound, p.device, MemoryCategory::Stash, p.bytes);
      count(bound, p.device, p.stage, +1);
    }
  }

  // Note [Held offloads]: the device copy of an offloaded (st, i) that `d` held goes at t.
  void releaseHeld(double t, int d, int st, int i) {
    if (heldOn_[at(st, i)] != d) return;
    heldOn_[at(st, i)] = kNowhere;
    mem(t, d, MemoryCategory::Stash, -heldBytes_[at(st, i)]);
    count(t, d, st, -1);
  }

  // Note [Stashed weight versions], for stages whose schedule moves them.
  struct Stashed {
    bool madeByStep = false, made = false, dropInSchedule = false;
    bool offIssued = false, preIssued = false;
    int remaining = 0;  // B's that still need it
  };
  // The stashed version B(st, m) differentiates at, when its stage is charged per version.
  Stashed* versionOf(int st, int m) {
    const int v = usesV_[at(st, m)];
    return v < 0 ? nullptr : &wv_.at({st, v});
  }

  bool copyStep(int d, int agent) {
    const int step = copyQueue_[d][copyHead_[d]];
    const Action& a = s_.devices[d][step];
    const int st = a.stage, i = a.index;
    const LinkCost& link = *hostLinks_[d];
    double start = std::max(issueTime_[d][step], copyFree_[d]);
    const bool weights = a.stash == StashKind::Weights;
    if (a.type == ActionType::Offload) {
      std::int64_t bytes = weights ? cost(st).weightVersionBytes : stashBytes_[at(st, i)];
      double end = start + link.transferTime(bytes) + link.latency;
      copyFree_[d] = end;
      result_.spans[d][step] = {start, end};
      if (weights) {
        mem(start, -1, MemoryCategory::WeightVersions, bytes);
        mem(end, d, MemoryCategory::WeightVersions, -bytes);
        resolve(key(kOffEndW, st, i), end);
        resolve(key(kOffDoneW, st, i), end);
        return true;
      }
      if (stashAt_[at(st, i)] != d) fail(d, step, "offloads a stash that is not on this device");
      hostStash(start, bytes);
      if (held_[d][step] >= 0) {
        heldOn_[at(st, i)] = d;  // Note [Held offloads]: until the OFF that releases it
        heldBytes_[at(st, i)] = bytes;
      } else {
        mem(end, d, MemoryCategory::Stash, -bytes);
        count(end, d, st, -1);
      }
      stashAt_[at(st, i)] = kHost;
      lastOffEnd_[d][st] = end;
      resolve(key(kOffEnd, st, i), end);
      resolve(key(kOffDone, st, i), end);
      return true;
    }
    PIPEFB_ASSERT(a.type == ActionType::Prefetch, "copy engine got " << toString(a));
    double offEnd = need(key(weights ? kOffEndW : kOffEnd, st, i), agent, d, step);
    if (offEnd == kUnknown) return false;
    start = std::max(start, offEnd);
    std::int64_t bytes = weights ? cost(st).weightVersionBytes : stashBytes_[at(st, i)];
    double end = start + link.transferTime(bytes) + link.latency;
    copyFree_[d] = end;
    result_.spans[d][step] = {start, end};
    if (weights) {
      mem(start, d, MemoryCategory::WeightVersions, bytes);
      mem(end, -1, MemoryCategory::WeightVersions, -bytes);
      resolve(key(kPreEndW, st, i), end);
      return true;
    }
    // Note [Prefetch destinations in the simulator]: charged in finish().
    // Note [Prefetches behind their stage's offloads]: the engine is in list order, so the
    // last of the stage's OFFs it ran on d was issued before this PRE.
    const double offEnd2 = std::max(offDevice_[at(st, i)] == d ? offEnd : -1.0, lastOffEnd_[d][st]);
    destinations_.push_back({d, st, i, issueTime_[d][step], start, offEnd2, bytes});
    hostStash(end, -bytes);
    stashAt_[at(st, i)] = d;
    resolve(key(kPreEnd, st, i), end);
    return true;
  }

  // Timelines, peaks, iteration time and bubble.
  void finish() {
    SimResult& r = result_;
    // Iterations: an action belongs to the iteration of its microbatch; weight actions to
    // that of the last microbatch action before them on the same device.
    const int K = std::max(1, s_.numIterations);
    const int M = std::max(1, s_.numMicrobatches);
    r.iterationEnd.assign(K, 0.0);
    for (int d = 0; d < D_; ++d) {
      int iter = 0;
      bool hasCompute = false;
      for (size_t j = 0; j < s_.devices[d].size(); ++j) {
        const Action& a = s_.devices[d][j];
        bool weightAction = a.type == ActionType::Step || a.type == ActionType::SyncWeights ||
                            a.type == ActionType::RecvWeights || a.type == ActionType::AllReduce ||
                            a.stash == StashKind::Weights;
        if (!weightAction) iter = std::min(K - 1, a.index / M);
        hasCompute |= a.isCompute();
        double end = r.spans[d][j].end;
        r.iterationEnd[iter] = std::max(r.iterationEnd[iter], end);
        r.makespan = std::max(r.makespan, end);
      }
      r.computeDevices += hasCompute;
    }
    // Iteration ends are monotone by construction for sane schedules; keep them so.
    for (int k = 1; k < K; ++k)
      r.iterationEnd[k] = std::max(r.iterationEnd[k], r.iterationEnd[k - 1]);
    r.iterationTime = K == 1 ? r.makespan : (r.iterationEnd[K - 1] - r.iterationEnd[0]) / (K - 1);
    double busy = 0;
    for (double b : r.busy) busy += b;
    if (r.iterationTime > 0 && r.computeDevices > 0)
      r.bubbleFraction = 1.0 - (busy / K) / (r.computeDevices * r.iterationTime);

    countVersions();  // Note [Versions in simulated time]
    bindDestinations();
    // Note [Old forward copies in the simulator]
    // The runtime's RecvWeights copies the new weights into a split stage's forward copy
    // in place unless a graph stash made on that copy still waits for its B (pipefb-async
    // with keep or offload): then it builds a new copy, and the old one stays on the
    // forward device until the last such B is done (Note [Forward device memory] in
    // planner/CostModel.h, which charges it as W of weight versions). Known only once
    // every B has run, so charged here. (It was not charged: on VGG16 224 px, 4x-t4-pcie,
    // pipefb-async's 2S plan, device 1 peaked at 593 MiB simulated, 1.25 GiB in the cost
    // model.)
    for (const Replaced& r : replaced_) {
      auto it = lastGraphUse_.find({r.stage, r.version});
      if (it == lastGraphUse_.end() || it->second <= r.time) continue;
      mem(r.time, r.device, MemoryCategory::WeightVersions, cost(r.stage).weightVersionBytes);
      mem(it->second, r.device, MemoryCategory::WeightVersions, -cost(r.stage).weightVersionBytes);
    }
    // Memory: sort, then sample after each instant (any order within it: Note [Simulator
    // speed]).
    std::sort(mem_.begin(), mem_.end(),
              [](const MemEvent& x, const MemEvent& y) { return x.time < y.time; });
    r.memory.assign(D_, DeviceMemory{});
    std::vector<CategoryBytes> cur(D_, CategoryBytes{});
    std::vector<char> dirty(D_, 0);
    CategoryBytes hostCur{};
    bool hostDirty = false;
    r.peakStashBytes.assign(D_, 0);
    auto flush = [&](double t) {
      for (int d = 0; d < D_; ++d) {
        if (!dirty[d]) continue;
        dirty[d] = 0;
        DeviceMemory& dm = r.memory[d];
        MemorySample sample{t, cur[d]};
        std::int64_t total = sample.total();
        if (total > dm.peakBytes || dm.timeline.empty()) {
          if (total > dm.peakBytes) {
            dm.peakBytes = total;
            dm.peakTime = t;
            dm.atPeak = cur[d];
          }
        }
        for (size_t c = 0; c < kNumMemoryCategories; ++c)
          dm.peakByCategory[c] = std::max(dm.peakByCategory[c], cur[d][c]);
        r.peakStashBytes[d] = dm.peakByCategory[index(MemoryCategory::Stash)];
        if (o_.recordMemoryTimeline) dm.timeline.push_back(sample);
      }
      if (hostDirty) {
        hostDirty = false;
        HostPoolSample hs{t, hostCur[index(MemoryCategory::Stash)],
                          hostCur[index(MemoryCategory::WeightVersions)]};
        r.host.peakBytes = std::max(r.host.peakBytes, hs.stashBytes + hs.weightVersionBytes);
        if (o_.recordMemoryTimeline) r.host.timeline.push_back(hs);
      }
    };
    for (size_t j = 0; j < mem_.size(); ++j) {
      const MemEvent& e = mem_[j];
      if (e.device < 0) {
        hostCur[e.cat] += e.delta;
        hostDirty = true;
      } else {
        cur[e.device][e.cat] += e.delta;
        dirty[e.device] = 1;
      }
      if (j + 1 == mem_.size() || mem_[j + 1].time != e.time) flush(e.time);
    }

    // Stash counts: per (device, stage), per device, and in flight per stage.
    std::sort(counts_.begin(), counts_.end(),
              [](const CountEvent& x, const CountEvent& y) { return x.time < y.time; });
    r.peakStashCount.assign(D_, 0);
    r.peakStashCountByStage.assign(D_, std::vector<int>(S_, 0));
    r.peakInFlight.assign(S_, 0);
    std::vector<int> byStage(static_cast<size_t>(D_) * S_, 0), byDevice(D_, 0), inFlight(S_, 0);
    std::vector<std::pair<int, int>> touched;  // (device or -1, stage)
    for (size_t j = 0; j < counts_.size(); ++j) {
      const CountEvent& e = counts_[j];
      if (e.device < 0) {
        inFlight[e.stage] += e.delta;
      } else {
        byStage[static_cast<size_t>(e.device) * S_ + e.stage] += e.delta;
        byDevice[e.device] += e.delta;
      }
      touched.push_back({e.device, e.stage});
      if (j + 1 == counts_.size() || counts_[j + 1].time != e.time) {
        for (auto [d, st] : touched) {
          if (d < 0) {
            r.peakInFlight[st] = std::max(r.peakInFlight[st], inFlight[st]);
          } else {
            r.peakStashCountByStage[d][st] =
                std::max(r.peakStashCountByStage[d][st], byStage[static_cast<size_t>(d) * S_ + st]);
            r.peakStashCount[d] = std::max(r.peakStashCount[d], byDevice[d]);
          }
        }
        touched.clear();
      }
    }
  }

  const Schedule& s_;
  const CostTable& c_;
  SimOptions o_;
  int S_ = 0, D_ = 0, N_ = 0;
  std::vector<double> times_;
  std::vector<int> waiter_;
  std::vector<int> stashAt_, preIssuedOn_, version_;
  std::vector<std::int64_t> stashBytes_;
  std::vector<bool> recompute_;
  std::vector<bool> recvW_;  // [stage][index]: the schedule has RW s.index
  // Note [Weights by reference]: pipefb-async with a graph stash (its B's do not recompute).
  bool byReference(int st) const { return async_ && !recompute_[at(st, 0)]; }
  bool async_ = false;                              // s_.kind == "pipefb-async"
  std::vector<const LinkCost*> links_, hostLinks_;  // [src * D + dst], [device]
  std::vector<int> curVersion_;
  // Note [Versions in simulated time]: a stashed microbatch's version taken (+1) or let go
  // (-1), or (delta 0) the backward device's current version becoming `version`.
  struct VersionEvent {
    double time;
    int stage, version, delta;
  };
  std::vector<VersionEvent> versionEvents_;
  std::vector<bool> explicitW_;
  std::map<std::pair<int, int>, Stashed> wv_;  // (stage, version)
  std::vector<int> usesV_;                     // [stage][mb]: its stashed version, -1 none
  // Note [Old forward copies in the simulator]: per RW of a split stage, (stage, forward
  // device, the version it replaced, its end); per (stage, forward version), the end of the
  // last B (or W) that consumed a graph stash made on that version.
  struct Replaced {
    int stage, device, version;
    double time;
  };
  std::vector<Replaced> replaced_;
  std::map<std::pair<int, int>, double> lastGraphUse_;
  std::vector<int> passes_;  // Note [Message rendezvous]
  // Note [Held offloads]: per device and action, the OFF that releases a held OFF (-1: not
  // held); per device, the held OFFs each OFF releases; per (stage, index), the device
  // holding its offloaded copy (kNowhere: none) and its bytes.
  std::vector<std::vector<int>> held_;
  // Note [Prefetch destinations in the simulator]: per device and action, a PRE bound at a
  // later acquire; per device, its binds in time order (PRE issues with their destinations,
  // acquires); per stage, its first OFF's issue; per (stage, index), its OFF's device; the
  // activation prefetches' destinations to charge.
  std::vector<std::vector<bool>> later_;
  struct BindEvent {
    double time;
    int epoch;
  };
  std::vector<std::vector<BindEvent>> bindEvents_;
  std::vector<double> layoutTime_;
  std::vector<int> offDevice_;
  std::vector<std::vector<double>> lastOffEnd_;  // per device and stage: its last stash OFF's end
  struct Destination {
    int device, stage, index;
    double issue, copyStart, sameDeviceOffEnd;
    std::int64_t bytes;
  };
  std::vector<Destination> destinations_;
  std::vector<std::map<int, std::vector<int>>> releases_;
  std::vector<int> heldOn_;
  std::vector<std::int64_t> heldBytes_;
  std::vector<int> pc_;
  std::vector<double> threadTime_;
  std::vector<std::vector<int>> copyQueue_;
  std::vector<size_t> copyHead_;
  std::vector<double> copyFree_;
  std::vector<std::vector<size_t>> offIssued_;  // per device: kOffDone(W) keys of its OFFs
  std::vector<std::vector<double>> issueTime_;
  std::vector<double> linkFree_;
  std::vector<MemEvent> mem_;
  std::vector<CountEvent> counts_;
  std::function<void(int)> wake_;
  SimResult result_;
};

}  // namespace

SimResult simulate(const Schedule& schedule, const CostTable& costs, const SimOptions& options) {
  Simulation sim(schedule, costs, options);
  return sim.run();
}

}  // namespace pipefb::sim
