#pragma once
// Memory-budget sweeps (issue 6, "Sweeps"): the planner over a range of per-device
// budgets for each schedule family, with the smallest feasible budget of each family.
// Writes sweep.csv and a gnuplot chart (throughput against budget, one line per family,
// the smallest feasible budget marked). Torch-free; `--measure` (training each point)
// lives with the runtime.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pipefb/planner/Solver.h"

namespace pipefb::planner {

/// "256MiB:4GiB:12": 12 budgets spaced geometrically from 256 MiB to 4 GiB (both
/// included); "1GiB" alone is one budget; "1GiB,2GiB,3GiB" a list.
std::vector<std::int64_t> parseBudgets(const std::string& text);

/// The families a sweep runs by default: 1f1b-keep (the baseline), 1f1b-offload, 1f1b,
/// gpipe, pipedream, pipefb-sync, pipefb-async.
std::vector<std::string> defaultSweepFamilies();

/// One training run of a plan (`pipefb_sweep --measure N`): what pipefb_train's run
/// folder says (summary.json, metrics.csv).
struct MeasuredRun {
  bool ran = false;                // a run was attempted
  int exitCode = 0;                // pipefb_train's (2: the runtime refused the plan, 1: failed)
  std::string note;                // why it did not run, or the first stderr line
  double throughput = 0;           // samples/s over the whole run (summary.json)
  double iterationTime = 0;        // s: median step interval after the first (metrics.csv)
  std::vector<std::int64_t> peak;  // per virtual device cpu:0.. (summary.json)
  std::int64_t hostPeak = 0;
  std::int64_t peakMax() const;
};

/// Reads a finished run folder; UserError naming the file when it is missing or malformed.
MeasuredRun readMeasuredRun(const std::string& runDir);

struct SweepPoint {
  std::string family;
  std::int64_t budget = 0;
  bool feasible = false;
  Plan plan;             // when feasible
  MeasuredRun measured;  // with --measure
};

struct SweepResult {
  std::vector<SweepPoint> points;  // family-major, budgets ascending
  std::vector<std::string> families;
  std::map<std::string, std::int64_t> minimalBudget;  // -1 = never fits the capacities
  std::map<std::string, Plan> minimalPlan;
  double seconds = 0;
};

/// `base` carries batch, lookahead, limits of the search; its schedules are replaced by
/// each family in turn.
SweepResult runSweep(const CostModel& model, const SolverOptions& base,
                     const std::vector<std::int64_t>& budgets,
                     const std::vector<std::string>& families);

std::string sweepCsv(const SweepResult& r);
/// A gnuplot script that reads `csvName` (in the same folder) and draws `pngName`.
std::string sweepGnuplot(const SweepResult& r, const std::string& csvName,
                         const std::string& pngName, const std::string& title);
/// Writes sweep.csv and sweep.gp into `dir`, and renders sweep.png when gnuplot is on the
/// PATH. Returns the files written.
std::vector<std::string> writeSweep(const SweepResult& r, const std::string& dir,
                                    const std::string& title);

}  // namespace pipefb::planner
