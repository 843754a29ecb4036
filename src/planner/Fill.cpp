// The fill and the pace: an iteration's slots (Note [Zero-bubble fill], Note [Simulated
// fill]) and the least pace of shared cores (Note [Shared cores]).
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "CostModelDetail.h"
#include "pipefb/planner/CostModel.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/sim/CostTable.h"
#include "pipefb/sim/Simulator.h"

namespace pipefb::planner {

using detail::scaled;

namespace {

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
      k == ScheduleKind::InterleavedZb || k == ScheduleKind::PipeFbZb) {
    // Note [Simulated fill]: a split kind hands every stash over through the host pool and
    // syncs the weights back to the forward devices; both at the model's totals / S, on
    // stage 0's devices (compute at the forward device's speed).
    double copy = 0, sync = 0;
    const int S = shape.stages;
    if (isSplit(k) && static_cast<int>(shape.chain.size()) >= shape.chainLength()) {
      const int fd = shape.forwardDevice(0), bd = shape.backwardDevice(0);
      const double sp = cluster_.devices[fd].speed;
      copy = cluster_.devices[fd].host.time(scaled(saved_[L], f) / S) * sp;
      sync = cluster_.link(bd, fd).time(fwdParam_[L] / S) * sp;  // the copy F runs on
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

}  // namespace pipefb::planner
