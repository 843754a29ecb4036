#include "pipefb/schedules/Validator.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Messages.h"
#include "pipefb/schedules/WeightVersions.h"

namespace pipefb::schedules {

namespace {

// What a device has on it, keyed by (what, device, stage, index).
enum class Have : std::uint64_t { Act = 1, Grad = 2, Weights = 3 };

std::uint64_t haveKey(Have h, int d, int s, int i) {
  return (static_cast<std::uint64_t>(h) << 60) | (static_cast<std::uint64_t>(d) << 44) |
         (static_cast<std::uint64_t>(s) << 28) | static_cast<std::uint64_t>(i);
}
// A send/receive pair is matched on (send type, stage, index).
std::uint64_t commKey(ActionType sendType, int s, int i) {
  return (static_cast<std::uint64_t>(sendType) << 56) | (static_cast<std::uint64_t>(s) << 28) |
         static_cast<std::uint64_t>(i);
}

constexpr int kNowhere = -1;
constexpr int kHost = -2;

struct Position {
  int device = -1;
  int step = -1;
};

constexpr size_t kMaxStageIndexPairs = size_t{1} << 24;

class AbstractRun {
 public:
  AbstractRun(const Schedule& s, const MemoryContract* c) : s_(s), c_(c) {
    S_ = s.numStages;
    D_ = s.numDevices();
    int maxIdx = 0;
    for (const auto& list : s.devices)
      for (const Action& a : list) maxIdx = std::max(maxIdx, a.index);
    if (maxIdx >= (1 << 27)) fail("index " + std::to_string(maxIdx) + " is too large", {});
    N_ = maxIdx + 1;
    const size_t SN = static_cast<size_t>(S_) * N_;
    // The per-(stage, index) tables below hold ~60 bytes an entry; bound them so that a
    // schedule file naming F0.100000000 is an error, not gigabytes (seen under
    // fuzz/ScheduleFuzzer).
    if (SN > kMaxStageIndexPairs)
      fail(std::to_string(S_) + " stages x " + std::to_string(N_) +
               " microbatch indices is more than the validator tracks (" +
               std::to_string(kMaxStageIndexPairs) + " pairs)",
           {});
    fPos_.assign(SN, {});
    bPos_.assign(SN, {});
    iPos_.assign(SN, {});
    wPos_.assign(SN, {});
    fDone_.assign(SN, false);
    bDone_.assign(SN, false);
    iDone_.assign(SN, false);
    stashAt_.assign(SN, kNowhere);
    version_.assign(SN, 0);
    offInSchedule_.assign(SN, false);
    offDone_.assign(SN, false);
    prePending_.assign(SN, kNowhere);
    copies_.assign(D_, {});
    offloadsOut_.assign(D_, 0);
    resident_.assign(static_cast<size_t>(D_) * S_, 0);
    deferred_.assign(static_cast<size_t>(D_) * S_, 0);
    stats_.peakDeferredW.assign(S_, 0);
    curVersion_.assign(static_cast<size_t>(D_) * S_, 0);
    inFlight_.assign(S_, 0);
    versionRefs_.assign(S_, {});
    stats_.peakInFlight.assign(S_, 0);
    stats_.peakResident.assign(D_, std::vector<int>(S_, 0));
    stats_.peakWeightVersions.assign(S_, 1);
    stagesOf_.assign(D_, {});
    for (int st = 0; st < S_; ++st) {
      int fd = s.placement.forward(st), bd = s.placement.backward(st);
      if (fd < D_) stagesOf_[fd].push_back(st);
      if (bd != fd && bd < D_) stagesOf_[bd].push_back(st);
    }
    if (c_) checkContractShape();
    // Index the schedule: where each F and B is; which sends exist.
    for (int d = 0; d < D_; ++d)
      for (int i = 0; i < static_cast<int>(s.devices[d].size()); ++i) {
        const Action& a = s.devices[d][i];
        if (a.stage < 0 || a.stage >= S_)
          fail("action " + toString(a) + " names stage " + std::to_string(a.stage) + " of " +
                   std::to_string(S_),
               {{d, i}});
        if ((a.isSend() || a.isRecv()) && (a.peer < 0 || a.peer >= D_ || a.peer == d))
          fail("action " + toString(a) + " on device " + std::to_string(d) +
                   " names an invalid peer device " + std::to_string(a.peer),
               {{d, i}});
        if (a.type == ActionType::Forward) {
          Position& p = fPos_[at(a.stage, a.index)];
          if (p.device >= 0)
            fail("F" + std::to_string(a.stage) + "." + std::to_string(a.index) + " appears twice",
                 {{p.device, p.step}, {d, i}});
          p = {d, i};
        } else if (a.type == ActionType::Backward || a.type == ActionType::InputGrad ||
                   a.type == ActionType::WeightGrad) {
          auto& table = a.type == ActionType::Backward    ? bPos_
                        : a.type == ActionType::InputGrad ? iPos_
                                                          : wPos_;
          Position& p = table[at(a.stage, a.index)];
          if (p.device >= 0) fail(toString(a) + " appears twice", {{p.device, p.step}, {d, i}});
          p = {d, i};
        } else if (a.isSend()) {
          auto [it, fresh] = sendPos_.emplace(commKey(a.type, a.stage, a.index), Position{d, i});
          if (!fresh)
            fail(toString(a) + " is sent twice", {{it->second.device, it->second.step}, {d, i}});
        } else if (a.type == ActionType::Offload && a.stash == StashKind::Activation) {
          offInSchedule_[at(a.stage, a.index)] = true;
        }
      }
    // Note [Split backward]: a (stage, microbatch) has B, or I and W, on one device.
    for (int st = 0; st < S_; ++st)
      for (int m = 0; m < N_; ++m) {
        const Position &b = bPos_[at(st, m)], &ip = iPos_[at(st, m)], &w = wPos_[at(st, m)];
        const std::string sm = std::to_string(st) + "." + std::to_string(m);
        if (b.device >= 0 && (ip.device >= 0 || w.device >= 0))
          fail("B" + sm + " and a split backward (I/W" + sm + ") of the same microbatch",
               {{b.device, b.step},
                ip.device >= 0 ? GridMark{ip.device, ip.step} : GridMark{w.device, w.step}});
        if ((ip.device >= 0) != (w.device >= 0))
          fail((ip.device >= 0 ? "I" + sm + " has no W" + sm : "W" + sm + " has no I" + sm) +
                   " (a split backward needs both)",
               {ip.device >= 0 ? GridMark{ip.device, ip.step} : GridMark{w.device, w.step}});
        if (ip.device >= 0 && ip.device != w.device)
          fail("W" + sm + " runs on device " + std::to_string(w.device) + " but I" + sm +
                   " on device " + std::to_string(ip.device) + "; W uses what I left on its device",
               {{ip.device, ip.step}, {w.device, w.step}});
        if (ip.device >= 0 && w.step < ip.step)
          fail("W before I: W" + sm + " comes before I" + sm + " on device " +
                   std::to_string(w.device),
               {{w.device, w.step}, {ip.device, ip.step}});
      }
    pc_.assign(D_, 0);
    passes_ = rendezvousPasses(s);
    stepAfterRecv_ = s.kind == toString(ScheduleKind::PipeFbAsync);
    // Note [Stashed weight versions]: the copies the schedule keeps, and what needs them.
    residentW_.assign(static_cast<size_t>(D_) * S_, 0);
    stats_.peakResidentWeightVersions.assign(D_, std::vector<int>(S_, 0));
    for (const StashedVersion& v : stashedVersions(s)) {
      Stashed& w = stashed_[{v.stage, v.version}];
      w.stage = v.stage;
      w.device = v.device;
      w.madeByStep = v.madeByStep;
      w.remaining = static_cast<int>(v.microbatches.size());
      for (int m : v.microbatches) usesVersion_[{v.stage, m}] = v.version;
    }
    for (int d = 0; d < D_; ++d)
      for (const Action& a : s.devices[d])
        if (a.type == ActionType::Drop && a.stash == StashKind::Weights) {
          auto it = stashed_.find({a.stage, a.index});
          if (it != stashed_.end()) it->second.dropInSchedule = true;
        }
  }

  ValidationStats run() {
    bool progressed = true;
    while (progressed) {
      progressed = false;
      for (int d = 0; d < D_; ++d) {
        while (pc_[d] < static_cast<int>(s_.devices[d].size()) && tryStep(d)) {
          ++pc_[d];
          progressed = true;
        }
      }
    }
    std::vector<GridMark> blocked;
    std::ostringstream why;
    for (int d = 0; d < D_; ++d)
      if (pc_[d] < static_cast<int>(s_.devices[d].size())) {
        blocked.push_back({d, pc_[d]});
        why << (blocked.size() > 1 ? "; " : "") << "device " << d << " waits at "
            << toString(s_.devices[d][pc_[d]]) << " (" << waitReason(d) << ")";
      }
    if (!blocked.empty()) fail("deadlock: no device can progress: " + why.str(), blocked);
    for (const auto& [key, pos] : sendPos_)
      if (!received_.count(key))
        fail("unmatched send: " + toString(s_.devices[pos.device][pos.step]) + " on device " +
                 std::to_string(pos.device) + " is never received (missing receive on device " +
                 std::to_string(s_.devices[pos.device][pos.step].peer) + ")",
             {{pos.device, pos.step}});
    for (int st = 0; st < S_; ++st)
      for (int m = 0; m < N_; ++m) {
        const Position& f = fPos_[at(st, m)];
        if (f.device >= 0 && !bDone_[at(st, m)] && stashAt_[at(st, m)] != kNowhere)
          fail("F" + std::to_string(st) + "." + std::to_string(m) +
                   " has no B: its stash is never consumed or dropped",
               {{f.device, f.step}});
      }
    for (const auto& [k, w] : stashed_)
      if (w.at == WAt::Host)
        fail(wName(k.first, k.second) + " is left in the host pool (an OFFW without a DROPW)", {});
    return stats_;
  }

 private:
  size_t at(int st, int i) const { return static_cast<size_t>(st) * N_ + i; }
  int& resident(int d, int st) { return resident_[static_cast<size_t>(d) * S_ + st]; }
  int& curVersion(int d, int st) { return curVersion_[static_cast<size_t>(d) * S_ + st]; }

  [[noreturn]] void fail(const std::string& reason, std::vector<GridMark> marks) const {
    throw scheduleError(s_, reason, std::move(marks));
  }
  [[noreturn]] void failHere(int d, const std::string& reason) const {
    fail(toString(s_.devices[d][pc_[d]]) + " on device " + std::to_string(d) + " (step " +
             std::to_string(pc_[d]) + "): " + reason,
         {{d, pc_[d]}});
  }

  void checkContractShape() const {
    auto ok = [&](const std::vector<int>& v) { return static_cast<int>(v.size()) == S_; };
    PIPEFB_ASSERT(ok(c_->inFlight) && ok(c_->residentForward) && ok(c_->residentBackward) &&
                      ok(c_->weightVersions),
                  "memory contract is not sized for " << S_ << " stages");
  }

  std::string waitReason(int d) const {
    const Action& a = s_.devices[d][pc_[d]];
    if (a.isRecv()) {
      ActionType st = matchingType(a.type);
      auto it = sendPos_.find(commKey(st, a.stage, a.index));
      Action want = a;
      want.type = st;
      want.peer = d;
      return "for " + toString(want) + " on device " + std::to_string(it->second.device) +
             ", which has not run";
    }
    if (a.type == ActionType::SendAct || a.type == ActionType::SendGrad)
      return "for device " + std::to_string(a.peer) + " to reach its receive (Note [Message " +
             "rendezvous])";
    if (a.type == ActionType::Step)
      return "for RW" + std::to_string(a.stage) + "." + std::to_string(a.index - 1) +
             " to take the weights (Note [Weights by reference])";
    auto name = [](const char* kind, int st, int i) {
      return std::string(kind) + std::to_string(st) + "." + std::to_string(i);
    };
    // A copy engine waits at a PRE whose OFF has not finished (Note [Abstract run]).
    auto engine = [&](int e) {
      const CopyJob* j = blockedCopy(e);
      if (!j) return std::string();
      return "; device " + std::to_string(e) + "'s copy engine waits at " +
             name("PRE", j->stage, j->index) + " for its OFF";
    };
    if (a.isInputBackward())
      return "for " + name("PRE", a.stage, a.index) + " to complete" + engine(d);
    if (a.type == ActionType::Offload)
      return "for its earlier offload's copy, queued on the copy engine" + engine(d);
    return "?";
  }

  bool has(Have h, int d, int st, int i) const { return have_.count(haveKey(h, d, st, i)) > 0; }

  // Note [Counting resident stashes]: checked when a compute action starts.
  void checkResidency(int d) {
    for (int st : stagesOf_[d]) {
      int r = resident(d, st);
      stats_.peakResident[d][st] = std::max(stats_.peakResident[d][st], r);
      const int def = deferred_[static_cast<size_t>(d) * S_ + st];
      stats_.peakDeferredW[st] = std::max(stats_.peakDeferredW[st], def);
      if (!c_) continue;
      if (static_cast<int>(c_->deferredW.size()) == S_ && def > c_->deferredW[st])
        failHere(d, "memory contract broken: " + std::to_string(def) + " stashes of stage " +
                        std::to_string(st) +
                        " wait for their W on this device, the contract allows " +
                        std::to_string(c_->deferredW[st]));
      bool fwd = s_.placement.forward(st) == d;
      int bound = fwd ? c_->residentForward[st] : c_->residentBackward[st];
      if (r > bound)
        failHere(d, "memory contract broken: " + std::to_string(r) + " stashes of stage " +
                        std::to_string(st) + " are resident on its " +
                        (fwd ? "forward" : "backward") + " device, the contract allows " +
                        std::to_string(bound));
      int w = residentW(d, st);
      stats_.peakResidentWeightVersions[d][st] =
          std::max(stats_.peakResidentWeightVersions[d][st], w);
      if (c_ && static_cast<int>(c_->residentWeightVersions.size()) == S_ &&
          w > c_->residentWeightVersions[st])
        failHere(d, "memory contract broken: " + std::to_string(w) +
                        " stashed weight versions of stage " + std::to_string(st) +
                        " are resident on device " + std::to_string(d) + ", the contract allows " +
                        std::to_string(c_->residentWeightVersions[st]));
    }
  }

  // ---- stashed weight versions (Note [Stashed weight versions])
  enum class WAt { Absent, Device, Host, Gone };
  struct Stashed {
    int stage = 0;
    int device = 0;
    bool madeByStep = false;
    bool dropInSchedule = false;
    int remaining = 0;  // B's that still need it
    WAt at = WAt::Absent;
  };
  int& residentW(int d, int st) { return residentW_[static_cast<size_t>(d) * S_ + st]; }
  Stashed* stashedVersion(int st, int v) {
    auto it = stashed_.find({st, v});
    return it == stashed_.end() ? nullptr : &it->second;
  }
  void makeVersion(int d, Stashed& w) {
    if (w.at != WAt::Absent || w.device != d) return;
    w.at = WAt::Device;
    ++residentW(d, w.stage);
  }
  std::string wName(int st, int v) const {
    return "weight version " + std::to_string(v) + " of stage " + std::to_string(st);
  }
  // OFFW/PREW/DROPW s.v at pc_[d].
  void weightAction(int d, const Action& a) {
    const int st = a.stage, v = a.index;
    Stashed* w = stashedVersion(st, v);
    if (!w)
      failHere(d, wName(st, v) +
                      " is not a stashed weight version of this schedule (no F runs on " +
                      "it whose B runs on a later one, Note [Stashed weight versions])");
    if (w->device != d)
      failHere(d, wName(st, v) + " is kept on device " + std::to_string(w->device) + ", not here");
    switch (a.type) {
      case ActionType::Offload:
        if (w->at != WAt::Device)
          failHere(d, wName(st, v) + " is not on this device (" +
                          (w->at == WAt::Absent ? "not made yet"
                           : w->at == WAt::Host ? "already offloaded"
                                                : "dropped") +
                          ")");
        w->at = WAt::Host;
        --residentW(d, st);
        return;
      case ActionType::Prefetch:
        if (w->at != WAt::Host)
          failHere(d, "prefetches " + wName(st, v) + ", which is not in the host pool (no OFFW" +
                          std::to_string(st) + "." + std::to_string(v) + " before it)");
        w->at = WAt::Device;
        ++residentW(d, st);
        return;
      case ActionType::Drop:
        if (w->remaining > 0)
          failHere(d, "drops " + wName(st, v) + " while " + std::to_string(w->remaining) +
                          " backward(s) still need it");
        if (w->at == WAt::Device) --residentW(d, st);
        w->at = WAt::Gone;
        return;
      default:
        PIPEFB_ASSERT(false, "not a weight stash action");
    }
  }
  // Whether the version B(s,m) runs on is still being prefetched (Note [Abstract run]).
  bool versionComing(int st, int m) const {
    auto u = usesVersion_.find({st, m});
    return u != usesVersion_.end() && versionsComing_.count({st, u->second}) > 0;
  }
  // B(s,m) needs its stashed version on its device.
  void useVersion(int d, int st, int m) {
    auto u = usesVersion_.find({st, m});
    if (u == usesVersion_.end()) return;
    Stashed& w = stashed_.at({st, u->second});
    if (w.at != WAt::Device)
      failHere(d, wName(st, u->second) + " that B needs is " +
                      (w.at == WAt::Host ? "in the host pool; a PREW" + std::to_string(st) + "." +
                                               std::to_string(u->second) + " must precede it"
                                         : std::string("not on this device")));
  }
  // After B(s,m) ran: its version may be done with.
  void releaseVersion(int d, int st, int m) {
    auto u = usesVersion_.find({st, m});
    if (u == usesVersion_.end()) return;
    Stashed& w = stashed_.at({st, u->second});
    if (--w.remaining == 0 && !w.dropInSchedule) {
      --residentW(d, st);  // freed with its last stash
      w.at = WAt::Gone;
    }
  }

  void updateVersions(int d, int st) {
    int bd = s_.placement.backward(st);
    int cur = curVersion(bd, st);
    const auto& refs = versionRefs_[st];
    int distinct = static_cast<int>(refs.size()) + (refs.count(cur) ? 0 : 1);
    stats_.peakWeightVersions[st] = std::max(stats_.peakWeightVersions[st], distinct);
    if (c_ && distinct > c_->weightVersions[st])
      failHere(d, "memory contract broken: stage " + std::to_string(st) + " holds " +
                      std::to_string(distinct) + " weight versions, the contract allows " +
                      std::to_string(c_->weightVersions[st]));
  }

  // After B(s,m) or W(s,m): the stash and its weight version are done with.
  void consumeStash(int d, int st, int i) {
    releaseVersion(d, st, i);
    bDone_[at(st, i)] = true;
    removeStash(st, i);
    --inFlight_[st];
    auto& refs = versionRefs_[st];
    auto it = refs.find(version_[at(st, i)]);
    if (--it->second == 0) refs.erase(it);
    updateVersions(d, st);
  }

  void placeStash(int st, int m, int where) {
    stashAt_[at(st, m)] = where;
    if (where >= 0) ++resident(where, st);
  }
  void removeStash(int st, int m) {
    int& where = stashAt_[at(st, m)];
    if (where >= 0) --resident(where, st);
    where = kNowhere;
  }

  // Whether the receiver of send a, on device d, waits at the matching receive.
  bool waitsToReceive(int d, const Action& a) const {
    const int p = a.peer;
    if (pc_[p] >= static_cast<int>(s_.devices[p].size())) return false;
    const Action& r = s_.devices[p][pc_[p]];
    return r.isRecv() && matchingType(r.type) == a.type && r.stage == a.stage &&
           r.index == a.index && r.peer == d;
  }

  struct CopyJob {  // on a copy engine (Note [Abstract run])
    bool offload;
    bool weights;  // OFFW/PREW: index is the version
    int stage, index;
  };
  // Note [Abstract run]: runs every device's copy engine as far as it can go: an OFF
  // finishes when it reaches the head of its queue, a PRE once its OFF finished.
  void runCopies() {
    for (bool progressed = true; progressed;) {
      progressed = false;
      for (int d = 0; d < D_; ++d)
        while (!copies_[d].empty()) {
          const CopyJob j = copies_[d].front();
          if (j.offload) {
            if (!j.weights) offDone_[at(j.stage, j.index)] = true;
            --offloadsOut_[d];
          } else if (j.weights) {  // its OFFW came before it on this engine
            versionsComing_.erase({j.stage, j.index});
          } else if (offDone_[at(j.stage, j.index)]) {
            prePending_[at(j.stage, j.index)] = kNowhere;
            placeStash(j.stage, j.index, d);
          } else {
            break;
          }
          copies_[d].pop_front();
          progressed = true;
        }
    }
  }
  // The PRE at the head of device d's copy engine, or null.
  const CopyJob* blockedCopy(int d) const {
    const bool waits = !copies_[d].empty() && !copies_[d].front().offload;
    return waits ? &copies_[d].front() : nullptr;
  }

  // Runs the action at pc_[d] if it can; returns false when it must wait.
  bool tryStep(int d) {
    const Action& a = s_.devices[d][pc_[d]];
    const int st = a.stage, i = a.index;
    switch (a.type) {
      case ActionType::Forward: {
        if (st > 0 && !has(Have::Act, d, st - 1, i))
          failHere(
              d, "missing receive: the output of stage " + std::to_string(st - 1) + " microbatch " +
                     std::to_string(i) +
                     " is neither computed on this device nor received before it (expected RA" +
                     std::to_string(st - 1) + "." + std::to_string(i) + "<...)");
        checkResidency(d);
        fDone_[at(st, i)] = true;
        have_.insert(haveKey(Have::Act, d, st, i));
        placeStash(st, i, d);
        int& inf = inFlight_[st];
        ++inf;
        stats_.peakInFlight[st] = std::max(stats_.peakInFlight[st], inf);
        if (c_ && inf > c_->inFlight[st])
          failHere(d, "memory contract broken: " + std::to_string(inf) + " stashes of stage " +
                          std::to_string(st) + " in flight, the contract allows " +
                          std::to_string(c_->inFlight[st]));
        version_[at(st, i)] = curVersion(d, st);
        ++versionRefs_[st][curVersion(d, st)];
        updateVersions(d, st);
        if (auto u = usesVersion_.find({st, i}); u != usesVersion_.end()) {
          Stashed& w = stashed_.at({st, u->second});
          if (!w.madeByStep && (w.at == WAt::Host || w.at == WAt::Gone))
            failHere(d, toString(a) + " runs on " + wName(st, u->second) + ", which is " +
                            (w.at == WAt::Host ? "in the host pool (OFFW before its last F)"
                                               : "dropped"));
          if (!w.madeByStep) makeVersion(d, w);
        }
        return true;
      }
      case ActionType::Backward:
      case ActionType::InputGrad: {
        const Position& f = fPos_[at(st, i)];
        if (f.device < 0)
          failHere(d, toString(a).substr(0, 1) + " before F: there is no F" + std::to_string(st) +
                          "." + std::to_string(i) + " in the schedule");
        if (!fDone_[at(st, i)] && f.device == d)
          fail(toString(a) + " on device " + std::to_string(d) + " (step " +
                   std::to_string(pc_[d]) + "): B before F: F" + std::to_string(st) + "." +
                   std::to_string(i) + " comes later on the same device (step " +
                   std::to_string(f.step) + ")",
               {{d, pc_[d]}, {f.device, f.step}});
        if (st + 1 < S_ && !has(Have::Grad, d, st + 1, i))
          failHere(d,
                   "missing receive: the gradient from stage " + std::to_string(st + 1) +
                       " microbatch " + std::to_string(i) +
                       " is neither computed on this device nor received before it (expected RG" +
                       std::to_string(st + 1) + "." + std::to_string(i) + "<...)");
        // Note [Recomputed last output]: a recomputing B makes the output itself.
        if (st + 1 == S_ && lastOutputTravels(f.device != d, a.recompute) &&
            !has(Have::Act, d, st, i))
          failHere(d, "missing receive: the output of the last stage, microbatch " +
                          std::to_string(i) +
                          ", is neither computed on this device nor received "
                          "before it (expected RA" +
                          std::to_string(st) + "." + std::to_string(i) + "<...)");
        if (stashAt_[at(st, i)] != d) {
          if (prePending_[at(st, i)] == d) return false;  // waits for the prefetch
          failHere(d, std::string("the stash of F") + std::to_string(st) + "." + std::to_string(i) +
                          " is not on this device (it is " +
                          (stashAt_[at(st, i)] == kHost ? "in the host pool" : "elsewhere") +
                          "); a PRE" + std::to_string(st) + "." + std::to_string(i) +
                          " must precede its use");
        }
        if (versionComing(st, i)) return false;  // its PREW is still on the copy engine
        useVersion(d, st, i);
        checkResidency(d);  // B counts its own version
        have_.insert(haveKey(Have::Grad, d, st, i));
        if (a.type == ActionType::InputGrad) {  // the stash stays for W (Note [Split backward])
          iDone_[at(st, i)] = true;
          ++deferred_[static_cast<size_t>(d) * S_ + st];
          return true;
        }
        consumeStash(d, st, i);
        return true;
      }
      case ActionType::WeightGrad: {
        PIPEFB_ASSERT(iDone_[at(st, i)], "the structural checks put I before W on its device");
        if (versionComing(st, i)) return false;
        useVersion(d, st, i);
        checkResidency(d);  // W counts its own stash
        --deferred_[static_cast<size_t>(d) * S_ + st];
        consumeStash(d, st, i);
        return true;
      }
      case ActionType::SendAct:
      case ActionType::SendGrad:
      case ActionType::SyncWeights: {
        Have h = a.type == ActionType::SendAct    ? Have::Act
                 : a.type == ActionType::SendGrad ? Have::Grad
                                                  : Have::Weights;
        if (!has(h, d, st, i))
          failHere(d, std::string("sends data this device does not have yet (") +
                          (h == Have::Act    ? "no F"
                           : h == Have::Grad ? "no B"
                                             : "no STEP") +
                          std::to_string(st) + "." + std::to_string(i) + " ran here before it)");
        // Note [Message rendezvous]: sent once the receiver waits at its receive.
        if (a.type != ActionType::SyncWeights &&
            rendezvous(passes_, d, a.peer, messageKind(a, S_)) && !waitsToReceive(d, a))
          return false;
        sent_.insert(commKey(a.type, st, i));
        return true;
      }
      case ActionType::RecvAct:
      case ActionType::RecvGrad:
      case ActionType::RecvWeights: {
        ActionType sendType = matchingType(a.type);
        std::uint64_t key = commKey(sendType, st, i);
        auto it = sendPos_.find(key);
        Action want = a;
        want.type = sendType;
        want.peer = d;
        if (it == sendPos_.end())
          failHere(d, "receive without a matching send: no " + toString(want) + " on device " +
                          std::to_string(a.peer));
        const Action& snd = s_.devices[it->second.device][it->second.step];
        if (it->second.device != a.peer || snd.peer != d)
          fail("mismatched pair: " + toString(a) + " on device " + std::to_string(d) + " and " +
                   toString(snd) + " on device " + std::to_string(it->second.device),
               {{d, pc_[d]}, {it->second.device, it->second.step}});
        if (!sent_.count(key)) return false;
        if (!received_.insert(key).second) failHere(d, "received twice");
        Have h = a.type == ActionType::RecvAct    ? Have::Act
                 : a.type == ActionType::RecvGrad ? Have::Grad
                                                  : Have::Weights;
        have_.insert(haveKey(h, d, st, i));
        if (a.type == ActionType::RecvWeights) {
          curVersion(d, st) = i + 1;
          updateVersions(d, st);
        }
        return true;
      }
      case ActionType::Offload: {
        if (a.stash == StashKind::Weights) {
          // Note [Abstract run]: an OFFW is a copy out on the same engine.
          if (offloadsOut_[d] >= kOffloadsInFlight) return false;
          weightAction(d, a);
          copies_[d].push_back({true, true, st, i});
          ++offloadsOut_[d];
          runCopies();
          return true;
        }
        if (stashAt_[at(st, i)] != d)
          failHere(d, "offloads a stash that is not on this device (F" + std::to_string(st) + "." +
                          std::to_string(i) + " did not run here, or it was moved)");
        // Note [Abstract run]: waits while kOffloadsInFlight of its copies have not finished.
        if (offloadsOut_[d] >= kOffloadsInFlight) return false;
        removeStash(st, i);
        stashAt_[at(st, i)] = kHost;
        copies_[d].push_back({true, false, st, i});
        ++offloadsOut_[d];
        runCopies();
        return true;
      }
      case ActionType::Prefetch: {
        if (a.stash == StashKind::Weights) {
          weightAction(d, a);
          // Note [Abstract run]: what needs the version waits until the engine ran this.
          versionsComing_.insert({st, i});
          copies_[d].push_back({false, true, st, i});
          runCopies();
          return true;
        }
        if (prePending_[at(st, i)] == kNowhere &&
            (stashAt_[at(st, i)] == kHost ||
             (!offDone_[at(st, i)] && offInSchedule_[at(st, i)] && !bDone_[at(st, i)]))) {
          // Completes on the copy engine once its OFF finished and the copies before it did.
          prePending_[at(st, i)] = d;
          copies_[d].push_back({false, false, st, i});
          runCopies();
        } else {
          failHere(d, "prefetches a stash that is not in the host pool and has no pending OFF" +
                          std::to_string(st) + "." + std::to_string(i));
        }
        return true;
      }
      case ActionType::Drop: {
        if (a.stash == StashKind::Weights) {
          weightAction(d, a);
          return true;
        }
        int where = stashAt_[at(st, i)];
        if (where != d && where != kHost)
          failHere(d, "drops a stash that is neither on this device nor in the host pool");
        removeStash(st, i);
        --inFlight_[st];
        bDone_[at(st, i)] = true;  // consumed
        auto& refs = versionRefs_[st];
        auto it = refs.find(version_[at(st, i)]);
        if (it != refs.end() && --it->second == 0) refs.erase(it);
        return true;
      }
      case ActionType::Step: {
        // Note [Weights by reference] (runtime/WeightVersions.cpp): pipefb-async's STEP(s, k)
        // waits until RW(s, k - 1) took the weights SW(s, k - 1) sent.
        if (stepAfterRecv_ && i > 0) {
          const std::uint64_t sw = commKey(ActionType::SyncWeights, st, i - 1);
          if (sendPos_.count(sw) && !received_.count(sw)) return false;
        }
        have_.insert(haveKey(Have::Weights, d, st, i));
        if (Stashed* w = stashedVersion(st, i); w && w->madeByStep) makeVersion(d, *w);
        curVersion(d, st) = i + 1;
        updateVersions(d, st);
        return true;
      }
      case ActionType::AllReduce:
        return true;
    }
    PIPEFB_ASSERT(false, "unhandled action type");
  }

  const Schedule& s_;
  const MemoryContract* c_;
  int S_ = 0, D_ = 0, N_ = 0;
  std::vector<int> pc_;
  std::vector<int> passes_;     // Note [Message rendezvous]
  bool stepAfterRecv_ = false;  // Note [Weights by reference]
  std::vector<Position> fPos_, bPos_, iPos_, wPos_;
  std::vector<bool> fDone_, bDone_, iDone_, offInSchedule_, offDone_;
  std::vector<int> deferred_;  // [device][stage]: I ran, W not yet
  std::vector<int> stashAt_, version_, prePending_;
  // Note [Abstract run]: each device's copy engine, in issue order (activation OFF and PRE),
  // and how many of its OFFs have not finished (the backpressure, kOffloadsInFlight).
  std::vector<std::deque<CopyJob>> copies_;
  std::set<std::pair<int, int>> versionsComing_;  // (stage, version) whose PREW waits
  std::vector<int> offloadsOut_;
  std::vector<int> resident_, curVersion_, inFlight_;
  std::vector<std::map<int, int>> versionRefs_;
  std::vector<std::vector<int>> stagesOf_;
  std::unordered_set<std::uint64_t> have_, sent_, received_;
  std::unordered_map<std::uint64_t, Position> sendPos_;
  std::map<std::pair<int, int>, Stashed> stashed_;  // (stage, version)
  std::map<std::pair<int, int>, int> usesVersion_;  // (stage, mb) -> its stashed version
  std::vector<int> residentW_;                      // [device][stage]
  ValidationStats stats_;
};

}  // namespace

ValidationStats validate(const Schedule& s, const MemoryContract* contract) {
  if (s.placement.numStages() != s.numStages || s.numDevices() != s.placement.numDevices())
    throw UserError("schedule shape is inconsistent: " + std::to_string(s.numStages) +
                    " stages, placement " + s.placement.toString() + ", " +
                    std::to_string(s.numDevices()) + " device lists");
  AbstractRun run(s, contract);
  return run.run();
}

}  // namespace pipefb::schedules
