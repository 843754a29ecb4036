#pragma once
// Schedule generators: pure functions of (stages S, microbatches M, placement, iterations K)
// that return the compute + weight actions of every device and the memory contract.
// Communication and offload are added afterwards by the lowering passes (Lowering.h).
//
// Note [Weight versions]
// Version 0 is the initial weights; STEP s.n makes version n+1 on the device that runs
// it (the backward device). A forward device that is not the backward device gets new
// weights only through RW s.n (version n+1). The runtime keeps a weight version alive
// while a stashed microbatch refers to it (the version its F used), so weight-version
// stashes need no explicit actions from the generators.
#include <string>
#include <vector>

#include "pipefb/schedules/MemoryContract.h"
#include "pipefb/schedules/Placement.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/schedules/ScheduleKind.h"

namespace pipefb::schedules {

struct SchedulePlan {
  Schedule schedule;
  MemoryContract contract;
};

/// UserError (starting with `kind`) unless S, M and K are >= 1 and `p` has S stages.
void checkShape(const std::string& kind, int S, int M, int K, const Placement& p);
/// A schedule of `kind` with S stages, M microbatches, K iterations on placement `p`: one
/// empty action list per device, what every generator starts from.
Schedule emptySchedule(const std::string& kind, int S, int M, int K, const Placement& p);

/// GPipe: every forward, then every backward (microbatch order), STEP per stage, per
/// iteration. Contract: M stashes per stage.
SchedulePlan gpipe(int S, int M, const Placement& placement, int iterations = 1);

/// PipeDream-Flush / DAPPLE: warm-up of S-s-1 forwards, steady 1F1B, cool-down, STEP.
/// Contract: min(S-s, M) stashes per stage.
SchedulePlan oneFOneB(int S, int M, const Placement& placement, int iterations = 1);

/// PipeDream (asynchronous 1F1B, weight stashing): one 1F1B over K*M microbatches with no
/// flush, and a STEP after every backward (each microbatch is one update). Stage s holds
/// min(S-s, K*M) stashes and as many weight versions.
SchedulePlan pipedream(int S, int M, const Placement& placement, int iterations = 1);

/// PipeFB, synchronous: F(s) devices run the forwards of an iteration in order, B(s)
/// devices the backwards in the same order, then STEP s.k and SW s.k; the forward device
/// receives RW s.k before the first forward of iteration k+1 (a flush per iteration).
SchedulePlan pipefbSync(int S, int M, const Placement& placement, int iterations = 1);

/// PipeFB, asynchronous: like sync, but the forward device receives RW s.k only before
/// iteration k+2, so forwards use weights at most one version stale and never wait for
/// the backward of the previous iteration. The backward device keeps the version the
/// forwards used (2 versions per stage). In flight: up to 2M stashes per stage.
///
/// `lag` (pipeline.async_lag) is how many forwards of iteration k run before RW s.(k-1):
/// -1 or M (the default) = a whole iteration, as above; 0 = pipefb-sync's weights; in
/// between, the first `lag` microbatches of each iteration use the previous version and
/// the rest the current one (up to M + lag stashes in flight). Less lag, less staleness,
/// less overlap (experiments/README.md, async_convergence).
SchedulePlan pipefbAsync(int S, int M, const Placement& placement, int iterations = 1,
                         int lag = -1);

/// Note [PipeFB device order]: the slot of every forward and backward of a pipefb
/// placement. Ranges (Note [Decoupled partitions]) count, not stages: F(s,j) has slot
/// r + j where r is the index of s's forward range; B(s,j) has slot R + q + j where R is the
/// number of forward ranges and q the index of s's backward range counted from the chain's
/// end. Every device runs its actions of an iteration in the order of key(): slot, then
/// forwards before backwards, forwards by ascending stage, backwards by descending stage.
class PipefbSlots {
 public:
  explicit PipefbSlots(const Placement& placement);
  int forward(int s, int j) const { return forwardRange_[s] + j; }
  int backward(int s, int j) const { return numForwardRanges_ + backwardRange_[s] + j; }
  /// The order a device runs F(s,j) (backward = false) or B(s,j) in (smaller first); every
  /// dependency of an action has a smaller key, so no device waits in a cycle.
  long long key(bool backward, int s, int j) const;

 private:
  std::vector<int> forwardRange_, backwardRange_;
  int numForwardRanges_ = 0;
};

/// Stashes in flight of a pipefb stage s that is not split (folded, odd S: the middle one;
/// a decoupled stage whose forward and backward range share a device): its device runs
/// F(s,j) before B(s,i) while j <= i + backward(s,0) - forward(s,0) (Note [PipeFB device
/// order]), so min(M, backward(s,0) - forward(s,0) + 1). The contract takes it from here.
int unsplitPipefbInFlight(const Placement& placement, int s, int M);
/// The folded() case: the middle stage of S (odd), min(M, S + 1); the planner's cost model
/// takes it from here (GeneratorsTest checks it equals the placement form).
int unsplitPipefbInFlight(int S, int M);

/// By name. An unknown name, S < 1, M < 1, iterations < 1, or a placement the kind cannot
/// use is a UserError listing what is allowed.
SchedulePlan makeSchedule(ScheduleKind kind, int S, int M, const Placement& placement,
                          int iterations = 1, int asyncLag = -1);
SchedulePlan makeSchedule(const std::string& kind, int S, int M, const Placement& placement,
                          int iterations = 1, int asyncLag = -1);
/// With the kind's default placement (Placement::defaultFor).
SchedulePlan makeSchedule(const std::string& kind, int S, int M, int iterations = 1);

}  // namespace pipefb::schedules
