#pragma once
// The solver: a pure dynamic program (no LibTorch) that picks the stage partition, the
// stage -> device mapping, the microbatch count, each stage's stash policy and the
// placement (by schedule family) that minimise iteration time under per-device and
// host-pool memory budgets (Note [Solver search]).
//
// Note [Solver search]
// For every (schedule, microbatches M, stages S, device chain) the DP runs over
// (layers covered j, stages used k):
//   best[k][j] = min over i, policy of max(best[k-1][i], link(k-1, i), stage(k-1, i, j))
// where stage() (CostModel) is infinite when a device of the stage is over its limit.
// Because the pace tau is a maximum, and the iteration time of a fixed (schedule, M, S,
// chain) is increasing in tau, the DP is exact for that shape. A host-pool budget adds a
// sum constraint; the DP then keeps, per cell, the Pareto front of (tau, host bytes),
// which is exact too. Pruning, none of which drops a cell a plan under the cap could use:
// * Note [Solver relaxation] (Solver.cpp): per stage, a compute lower bound and a memory
//   lower bound (weights x versions + grads + optimizer state + working set + one graph)
//   that only grow with the stage; greedy covers from both ends give each row k a window
//   of cells, and reject a shape whose layers cannot be covered under the cap (this is
//   what makes memory-bound shapes, e.g. PipeDream's S weight versions on stage 0, cheap
//   to rule out).
// * The scan over i stops once either bound of [i, j) reaches the cell's best; starts
//   whose prefix is already at the best are jumped over with a per-row range-minimum
//   table; the cell is first seeded with the previous cell's argmin so the cap is tight
//   early; a candidate's memory is only costed when its time could beat the best.
// * Shapes are visited by a lower bound of their iteration time and skipped once it
//   cannot beat the best found; the best found caps every cell of the next shape's DP.
// With these, 1000 layers x 64 devices plans in well under a second (bench_planner), and
// SolverOptimality.PrunedDpEqualsPlainDpOnLargerShapes checks the pruned DP against a
// plain one on shapes of up to 80 layers.
// Chains: ordered selections of distinct devices. Devices that can be swapped without
// changing any cost (same speed, capacity, host link, and link rows/columns) form
// classes, and the solver enumerates chains up to those swaps, which is exhaustive
// (8 identical T4s give one chain per length). When the count of distinct chains exceeds
// SolverOptions::maxChains, it falls back to greedy chains (highest-bandwidth next hop
// from every start device, and the cluster order) and says so in the result.
//
// Note [Replicated pipelines]
// Hybrid data + pipeline parallelism as the runtime runs it (pipeline.replicas = R,
// PipeDream's and the hybrid-parallel papers' replication, here of the whole pipeline):
// R copies of one pipeline shape, each on its own devices and batch / R samples, average
// their stage gradients before every STEP. The solver tries R = 1..maxReplicas (R x
// chain length <= devices, R divides the batch) and costs a copy as one pipeline on
// batch / R plus, per stage, a ring all-reduce of its gradient bytes over the link
// between its backward device and the next device, 2(R-1) latencies + 2(R-1)/R x G /
// bandwidth, charged to the backward device once per step (CostModel, allReduceTime) and
// G bytes of gradient buckets (CommBuffers). That stays exact (the all-reduce is a per-stage
// cost, like the step) but it only holds when every replica sees the same devices and links:
// R > 1 is tried only on clusters whose devices are all interchangeable (same speed,
// capacity, host link, links and processes) and whose devices do not share cores
// (Cluster::cores == 0). The brute force (BruteForce.h) enumerates the same R.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipefb/planner/CostModel.h"

namespace pipefb::planner {

/// A schedule family in a search: a kind and the stash policies it may use
/// ("1f1b" = every policy, "1f1b-keep" = keep only).
struct ScheduleFamily {
  std::string name;
  ScheduleKind kind = ScheduleKind::OneFOneB;
  std::vector<StashPolicy> policies;
};
/// "1f1b", "1f1b-keep", "pipefb-sync-offload", ...; else a UserError listing the forms.
ScheduleFamily parseScheduleFamily(const std::string& name);
std::vector<ScheduleFamily> parseScheduleFamilies(const std::vector<std::string>& names);

/// Folded PipeFB shapes (Note [Folded search] in Solver.cpp) are searched up to this many
/// layers (their DP is O(S L^4) at worst).
inline constexpr int kFoldedExactLayers = 64;
/// Shared shapes (interleaved-1f1b, zbv: Note [Shared search] in Solver.cpp) are searched
/// up to this many layers.
inline constexpr int kSharedExactLayers = 64;

/// Note [Decoupled search]
/// PipeFB's forward chain and backward chain each get their own cut points and their own
/// devices: Df forward devices run the forward ranges, Db other devices the backward
/// ranges (Df + Db <= D; "0/1 0/2 0/3": one forward device feeds three backward devices).
/// The solver cuts the chain at every layer (each layer is a segment, a PipelineStage
/// with its own forward and backward device) and stashes every segment boundary through
/// the host pool, so a backward device recomputes (checkpoint kinds) or prefetches
/// (offload) one layer's stash at a time, whatever its range (Note [Decoupled devices] in
/// CostModel.h). Of all segmentations that refine the range cuts, the finest holds the
/// least on every device (each device's stash and working-set terms are maxima over its
/// segments, which only shrink when a segment is cut), at the price of more copies: their
/// time and host bytes are charged, and under a host budget a coarser segmentation that
/// would fit is not tried. With every layer a segment, a device's cost depends only on its
/// own range (and, at its ends, the boundary's message), so the forward partition and the
/// backward partition are two independent prefix DPs (Solver.cpp, solveDecoupledShape),
/// one stash policy and one optimizer placement for the whole shape (both enumerated), and
/// the DP is exact for that space; BruteForce.h enumerates it too. Shapes are (M, Df, Db,
/// chain of Df + Db devices), searched up to kDecoupledExactLayers layers (a plan of more
/// segments than that would be dominated by per-action overheads the profile does not
/// see), with one pipeline (replicas = 1) and all chain devices in one process (across
/// processes a segment's forward device would send its stash rather than offload it,
/// Note [Devices and processes], which couples the two passes' costs). Pruning: each pass's
/// scan over a range's start stops once the range's compute (or bytes) reaches the cap, a
/// monotone floor; segment estimates are shared by devices of the same speed and host link;
/// and each shape has a lower bound (the work of each pass spread over its devices; the
/// states of the backward devices and the weights of the forward devices spread over them)
/// by which the search skips it. 64 layers x 64 devices then plan in about the time of the
/// other shapes (bench_planner --layers 64; experiments/README.md says how long).
inline constexpr int kDecoupledExactLayers = 64;

/// Note [Optimizer placement search]
/// Where each stage's optimizer state and master weights may live (pipeline.
/// optimizer_offload, Note [Optimizer offload in the cost model]): None keeps every
/// stage's on its backward device, Host puts every stage's in the host pool, PerStage
/// lets the DP choose per stage, beside its stash policy (the runtime takes a per-stage
/// list, pipeline.optimizer_offload: [host, none, ...]). A stage's choice changes only its
/// own time (the step's copies) and memory (no optimizer state or step transient on the
/// device; W + G + O in the host pool), so the choice per stage keeps the DP exact, and the
/// brute force enumerates it too.
enum class OptimizerOffload { None, Host, PerStage };
/// "none" | "host" | "per-stage"; else a UserError naming `flag` and the allowed values.
OptimizerOffload parseOptimizerOffload(const std::string& text, const std::string& flag);
const char* toString(OptimizerOffload o);
/// The placements a stage may take (false: backward device, true: host).
std::vector<bool> optimizerPlacements(OptimizerOffload o);
/// `shape` costing every stage's optimizer in one place (PipelineShape::optimizerOnHost).
PipelineShape stageShape(const PipelineShape& shape, bool optimizerOnHost);

enum class Objective {
  Time,    // minimise iteration time under the budgets
  Memory,  // minimise the largest device memory (the smallest feasible uniform budget)
};

struct SolverOptions {
  std::int64_t batch = 1;                 // global batch, samples per iteration
  std::vector<ScheduleFamily> schedules;  // empty = every kind with every policy
  std::int64_t budget = -1;               // per device (min with its capacity); -1 = capacity only
  std::int64_t hostBudget = -1;           // host pool (min with the cluster's); -1 = cluster's
  int maxMicrobatches = 64;               // M ranges over divisors of batch up to this
  int microbatches = 0;                   // > 0: only this M (it must divide batch)
  int maxStages = 0;                      // 0 = as many as devices (and layers) allow
  int lookahead = 1;                      // prefetch distance of offloaded stashes
  int asyncLag = -1;     // pipefb-async: pipeline.async_lag, -1 = M (Note [Planned async lag])
  int maxChains = 5000;  // per chain length; beyond it, greedy chains
  /// Note [Replicated pipelines]: R in 1..maxReplicas copies of the pipeline are tried.
  int maxReplicas = 1;
  /// Note [Folded search]: PipeFB families are also searched folded onto S devices.
  bool foldedPlacements = true;
  /// Note [Decoupled search]: PipeFB families are also searched decoupled.
  bool decoupledPlacements = true;
  /// Note [Optimizer placement search]
  OptimizerOffload optimizerOffload = OptimizerOffload::None;
  int keepTop = 4;      // candidates kept (distinct shapes) for re-scoring
  int simulateTop = 4;  // re-score this many with the simulator (0 = DP only)
  Objective objective = Objective::Time;
  void validate() const;
};

struct StagePlan {
  int first = 0, last = 0;  // layers [first, last)
  int forwardDevice = 0, backwardDevice = 0;
  StashPolicy policy = StashPolicy::Keep;
  /// The stage's optimizer state and master weights in the host pool (Note [Optimizer
  /// placement search]); evaluatePlan costs the stage with it.
  bool optimizerOnHost = false;
  StageEstimate estimate;
};

struct Plan {
  std::string family;  // the ScheduleFamily name it came from
  PipelineShape shape;
  std::vector<StagePlan> stages;
  double tau = 0;                          // pace: seconds per microbatch of the slowest resource
  double iterationTime = 0;                // predicted by the cost model
  double throughput = 0;                   // samples per second
  std::vector<std::int64_t> deviceMemory;  // per cluster device (0 when unused)
  /// Of deviceMemory, the reserve beside the charged bytes (Note [Planned reserve]).
  std::vector<std::int64_t> deviceReserve;
  std::int64_t hostBytes = 0;
  std::int64_t peakMemory = 0;  // the largest of deviceMemory
  // Re-scored by the event simulator (Solver.cpp, simulatePlan()).
  bool simulated = false;
  double simIterationTime = 0;
  std::vector<std::int64_t> simPeak;  // per cluster device
  std::int64_t simHostPeak = 0;
  bool simFits = true;  // the simulated peaks are within the limits

  int bindingStage() const;                                          // the stage whose time is tau
  int bindingDevice(const CostModel& m, std::int64_t budget) const;  // highest use of limit
};

struct SolveResult {
  bool feasible = false;
  Plan best;                     // when feasible
  std::vector<Plan> candidates;  // best first (DP order, or simulated order if re-scored)
  // When nothing fits: the smallest uniform per-device budget that fits (within the
  // capacities; -1 if even unlimited budgets do not fit them) and the plan that needs it.
  std::int64_t minimalBudget = -1;
  std::optional<Plan> minimalPlan;
  // Search statistics.
  long shapesTotal = 0, shapesSolved = 0;
  bool heuristicChains = false;  // some chain length used greedy chains
  /// Note [Folded search] (Solver.cpp): the model has more than kFoldedExactLayers layers,
  /// so PipeFB was searched only in its 2S-device form.
  bool foldedSkipped = false;
  /// Note [Shared search]: more than kSharedExactLayers layers, so interleaved-1f1b and zbv
  /// were not searched.
  bool sharedSkipped = false;
  /// Note [Decoupled search]: more than kDecoupledExactLayers layers, not searched
  /// decoupled.
  bool decoupledSkipped = false;
  double seconds = 0;
};

/// The DP for one shape (no pruning across shapes). Returns the best plan, or nullopt.
/// `limits` per cluster device (-1 = unlimited), `hostLimit` (-1 = unlimited).
/// `bound`: only plans whose pace (Time) or peak (Memory) is below it are of interest; the
/// DP prunes with it (Note [Solver search]).
std::optional<Plan> solveShape(const CostModel& model, const PipelineShape& shape,
                               const std::vector<StashPolicy>& policies,
                               const std::vector<std::int64_t>& limits, std::int64_t hostLimit,
                               Objective objective,
                               double bound = std::numeric_limits<double>::infinity());

/// Note [Decoupled search]: the best decoupled plan of `shape` (forwardDevices,
/// backwardDevices and chain set; its ranges are chosen), or nullopt.
std::optional<Plan> solveDecoupledShape(const CostModel& model, const PipelineShape& shape,
                                        const std::vector<StashPolicy>& policies,
                                        const std::vector<std::int64_t>& limits,
                                        std::int64_t hostLimit, Objective objective,
                                        double bound = std::numeric_limits<double>::infinity());

/// One choice a decoupled shape makes for all of its segments.
struct DecoupledChoice {
  StashPolicy policy = StashPolicy::Keep;  // as a split stage runs it
  bool optimizerOnHost = false;
  int lookahead = 1;  // Note [Prefetch distance zero]
  bool operator==(const DecoupledChoice& o) const {
    return policy == o.policy && optimizerOnHost == o.optimizerOnHost && lookahead == o.lookahead;
  }
};

/// The stash policies, optimizer placements and prefetch distances a decoupled shape may
/// take (each for all of its segments): the family's policies as a split stage runs them,
/// each with the shape's lookahead and, when it prefetches stashes and that lookahead is
/// above 0, with lookahead 0 too (Note [Prefetch distance zero] in CostModel.h); none when
/// the chain spans processes or the shape is replicated. The DP and the brute force both
/// enumerate these.
std::vector<DecoupledChoice> decoupledChoices(const CostModel& model, const PipelineShape& shape,
                                              const std::vector<StashPolicy>& policies);

/// The whole search. With objective Time and nothing feasible, also searches for the
/// smallest feasible budget (objective Memory).
SolveResult solve(const CostModel& model, const SolverOptions& options);

/// The smallest uniform per-device budget any plan fits in (objective Memory).
SolveResult minimalBudget(const CostModel& model, const SolverOptions& options);

/// Microbatch counts tried: divisors of batch, at most maxMicrobatches.
std::vector<int> microbatchCounts(std::int64_t batch, int maxMicrobatches);

/// Replica counts tried (Note [Replicated pipelines]): 1, and up to maxReplicas dividing the
/// batch when every device of `c` is interchangeable and none share cores.
std::vector<int> replicaCounts(const Cluster& c, const SolverOptions& options);

/// Chains of `length` distinct devices, up to swaps of interchangeable devices; empty
/// with *heuristic = true when more than maxChains exist (then: greedyChains()).
std::vector<std::vector<int>> distinctChains(const Cluster& c, int length, int maxChains,
                                             bool* heuristic);
std::vector<std::vector<int>> greedyChains(const Cluster& c, int length);

/// Recomputes a plan's per-stage estimates, tau, iteration time and memory from its
/// shape, cuts and policies (used after editing a plan, and by the plan-file reader).
void evaluatePlan(const CostModel& model, Plan& plan);

/// Runs the event simulator on the lowered schedule of a plan (3 iterations) and stores
/// the simulated iteration time and peaks in it.
void simulatePlan(const CostModel& model, Plan& plan, const std::vector<std::int64_t>& limits,
                  std::int64_t hostLimit);

}  // namespace pipefb::planner
