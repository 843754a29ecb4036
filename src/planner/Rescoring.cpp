// Re-scoring: the simulator runs a plan's schedule with the cost model's numbers.
#include <algorithm>
#include <set>
#include <vector>

#include "SolverDetail.h"
#include "pipefb/planner/Solver.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/sim/Simulator.h"

namespace pipefb::planner {

namespace {

// Note [Prefetch distance in re-scoring]
// The cost model counts a stage's copies as a resource of their own that hides under
// compute when it is shorter. The schedule hides a PRE only under the `lookahead` compute
// actions in front of its B: with lookahead 1 on a folded device, a 5.9 ms PRE (VGG16's
// stage 0 at 224 px, 12 GB/s) has 3.2 ms of F to hide under, and pipefb-sync simulated at
// 748 ms per iteration against 615 ms predicted. So the re-scoring also simulates each
// candidate that offloads with up to two more actions of lookahead, and keeps the faster
// when its memory (one more resident stash per offloaded stage for each) still fits.
bool fitsLimits(const Plan& p, const std::vector<std::int64_t>& limits, std::int64_t hostLimit) {
  for (size_t d = 0; d < p.deviceMemory.size() && d < limits.size(); ++d)
    if (limits[d] >= 0 && p.deviceMemory[d] > limits[d]) return false;
  return hostLimit < 0 || p.hostBytes <= hostLimit;
}
}  // namespace

namespace detail {

void prefetchFurther(const CostModel& modelIn, Plan& plan, const std::vector<std::int64_t>& limits,
                     std::int64_t hostLimit, int lookahead) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  const bool offloads = std::any_of(plan.stages.begin(), plan.stages.end(), [](const StagePlan& s) {
    return schedules::isOffloaded(s.estimate.effective);
  });
  if (!offloads || !plan.simulated) return;
  for (int extra = 1; extra <= 2; ++extra) {
    Plan q = plan;
    q.shape.lookahead = lookahead + extra;
    evaluatePlan(model, q);
    if (!fitsLimits(q, limits, hostLimit)) return;
    simulatePlan(model, q, limits, hostLimit);
    if (q.simFits && q.simIterationTime < plan.simIterationTime * (1 - 1e-3)) plan = q;
  }
}

}  // namespace detail

// Note [One memory model]
// The simulator holds what the runtime holds, action by action and in simulated time: the
// stashes a device keeps after their copy out (Note [Held offloads] in
// schedules/HeldOffloads.h), the weight versions B keeps (Note [Versions in simulated
// time] in src/sim/Simulator.cpp). What an action holds beyond the stashes while it runs
// is the cost model's own number, not a second estimate from the profile: F's whole peak,
// the stash it builds included (StageEstimate::forwardPeakBytes, Note [Forward peak]),
// B's working set (backwardWorkingBytes, Note [Backward layer by layer]) and the step's
// transient (stepWorkingBytes). Before, the simulator was given the profile's largest
// forward working set without the stash F builds (vgg16/8 pipefb-async 2S at its plan:
// device 0 simulated 16.41 MiB against 25.66 MiB costed) and B's working set as a fused B
// holds it whole, its graph beside it, where the runtime frees the graph layer by layer
// (device 3: 33.61 MiB simulated, 27.35 MiB costed, 25.27 MiB measured a round before).
// Where they still differ, the cost model takes the worst over timing and waiting
// messages that the simulator does not model (SimAgreementTest lists them).

void simulatePlan(const CostModel& modelIn, Plan& plan, const std::vector<std::int64_t>& limits,
                  std::int64_t hostLimit) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  const PipelineShape& sh = plan.shape;
  // Note [Decoupled search]: the generators do not run several segments per device yet.
  if (sh.decoupled()) return;
  const int S = sh.stages;
  std::vector<schedules::StagePlacement> sp;
  std::vector<StashPolicy> policies;
  sim::CostTable ct;
  const Cluster& cl = model.cluster();
  const double f = model.scale(sh);
  // The simulator's devices: the cluster's, or for a shared shape the chain positions (its
  // generators take only their default placement, Note [Shared devices]).
  auto clusterDevice = [&](int simDevice) {
    return sh.sharesDevices() ? sh.chain.at(simDevice) : simDevice;
  };
  for (int k = 0; k < S; ++k) {
    const StagePlan& st = plan.stages[k];
    if (sh.sharesDevices())
      sp.push_back({sh.position(k), sh.position(k)});
    else
      sp.push_back({st.forwardDevice, st.backwardDevice});
    policies.push_back(st.policy);
    const StageEstimate& e = st.estimate;
    sim::StageCosts c;
    c.forward = e.forwardTime + e.snapshotTime;  // Note [Weight snapshots]
    const double sb = model.speed(sh, st.backwardDevice);
    c.backward = model.backwardTime(st.first, st.last, f) / sb;
    c.recompute = model.recomputeTime(st.first, st.last, f) / sb;
    // Note [Backward after a step]: the first B after a STEP pays the excess; charged to
    // the STEP, on the same device and once per step.
    c.step = e.stepTime + e.afterStepTime + e.allReduceTime;  // Note [Replicated pipelines]
    c.activationBytes = scaledBytes(model.profile().layers[st.last - 1].outputBytes, f);
    c.gradientBytes = scaledBytes(model.inputBytes(st.first), f);
    std::int64_t saved = 0, W = 0, G = 0, O = 0, Wf = 0;
    for (int l = st.first; l < st.last; ++l) {
      const auto& lc = model.profile().layers[l];
      saved += lc.savedBytes;
      // Note [Half-precision weights on a device], as StageEstimate charges them.
      W += st.optimizerOnHost ? forwardParamBytes(lc) : lc.paramBytes;
      G += st.optimizerOnHost ? hostedGradBytes(lc) : lc.gradBytes;
      O += lc.optimizerBytes;
      Wf += forwardParamBytes(lc);
    }
    c.stashBytes = scaledBytes(saved, f);
    c.checkpointBytes = c.gradientBytes;
    c.deferredBytes = e.deferredStashBytes;  // Note [What waits for W] (CostModel.h)
    c.weightVersionBytes = W;
    c.weightsBytes = W;
    c.forwardWeightsBytes = Wf;
    c.gradsBytes = G;
    c.optimizerStateBytes = st.optimizerOnHost ? 0 : O;  // Note [Optimizer placement search]
    // Note [One memory model]: what F, B and STEP hold beyond the stashes, as the cost model
    // charges them. F: its whole peak, the stash it builds included (Note [Forward peak]);
    // the simulator charges the stash from F's end. B: its working set (Note [Backward
    // layer by layer]), of which a recomputing B's recomputed graph is charged by the
    // simulator as one stash (it adds stashBytes while BR runs).
    c.forwardWorkingSetBytes = e.forwardPeakBytes;
    const bool recomputes = schedules::isCheckpoint(e.effective);
    c.workingSetBytes =
        std::max<std::int64_t>(0, e.backwardWorkingBytes - (recomputes ? c.stashBytes : 0));
    c.stepWorkingBytes = e.stepWorkingBytes;  // Note [Step working set]
    if (e.weightWorkingBytes > 0)             // (W's own stash is the simulator's until W ends)
      c.weightWorkingSetBytes =
          std::max<std::int64_t>(0, e.weightWorkingBytes - e.deferredStashBytes);
    ct.stages.push_back(c);
  }
  std::set<int> used;
  for (auto& p : sp) used.insert(p.forward), used.insert(p.backward);
  for (int a : used) {
    const ClusterDevice& ca = cl.devices[clusterDevice(a)];
    ct.hostLinks[a] = {ca.host.bandwidth, ca.host.latency};
    for (int b : used)
      if (a != b) {
        const Link l = cl.link(clusterDevice(a), clusterDevice(b));
        ct.links[{a, b}] = {l.bandwidth, l.latency};
      }
  }
  // Enough iterations to reach the steady state the cost model assumes: PipeDream keeps
  // min(S-s, K*M) stashes, so K*M must reach S.
  int K = 3;
  if (sh.kind == ScheduleKind::PipeDream)
    K = std::max(K, (2 * S + sh.microbatches - 1) / sh.microbatches + 1);
  auto plan3 = schedules::makeSchedule(toString(sh.kind), S, sh.microbatches,
                                       schedules::Placement(sp), K, sh.lag());
  auto lowered = schedules::lower(plan3, policies, sh.lookahead, sh.offloadWeights);
  sim::SimOptions so;
  so.recordMemoryTimeline = false;
  sim::SimResult r = sim::simulate(lowered.schedule, ct, so);
  plan.simulated = true;
  plan.simIterationTime = r.iterationTime;
  plan.simPeak.assign(cl.numDevices(), 0);
  plan.simFits = true;
  for (int d = 0; d < static_cast<int>(r.memory.size()) && d < cl.numDevices(); ++d) {
    const int c = clusterDevice(d);
    if (sh.sharesDevices() && d >= sh.chainLength()) break;
    plan.simPeak[c] = r.memory[d].peakBytes;
    plan.simPeak[c] +=
        plannedReserve(plan.simPeak[c], cl.reservePerMille);  // Note [Planned reserve]
    if (limits[c] >= 0 && plan.simPeak[c] > limits[c]) plan.simFits = false;
  }
  plan.simHostPeak = r.host.peakBytes;
  if (hostLimit >= 0 && plan.simHostPeak > hostLimit) plan.simFits = false;
}

}  // namespace pipefb::planner
