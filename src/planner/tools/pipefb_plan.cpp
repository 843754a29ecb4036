// pipefb_plan --config configs/gpt2-xl.yaml --cluster 8x-t4-pcie [--budget 12GiB] [--out plan.yaml]
//
// Plans a pipeline (docs/planner.md): the profile (a profile file, or analytic from the
// device spec), the cluster (a cluster spec, or devices.count x --device), then the DP
// solver, re-scored by the simulator. Prints the per-stage table and what binds, and
// writes a plan file for `pipefb_train --plan`.
//
// Exit codes: 0 a plan was written; 2 bad input, or nothing fits the budget (then it
// prints the smallest budget that fits and that plan); 1 any other failure.
#include <CLI/CLI.hpp>
#include <iostream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Program.h"
#include "pipefb/common/Size.h"
#include "pipefb/config/Config.h"
#include "pipefb/planner/Explain.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/SetupFlags.h"

using namespace pipefb;
using namespace pipefb::planner;

namespace {

std::int64_t sizeFlag(const std::string& text, const std::string& flag) {
  if (text.empty() || text == "capacity" || text == "unlimited") return -1;
  auto v = parseSize(text);
  if (!v || *v <= 0)
    throw UserError(flag + ": expected a size such as 512MiB or 2GiB, got '" + text + "'");
  return *v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipefb_plan: the fastest pipeline plan that fits a memory budget"};
  std::string configPath, budgetText, hostText, out = "plan.yaml";
  std::vector<std::string> overrides, schedules;
  SetupOptions setup;
  int maxStages = 0, maxReplicas = 1;
  SearchFlags search;
  search.simulateTop = 4;
  bool quiet = false, noFolded = false, noDecoupled = false;
  addConfigOptions(app, configPath, overrides);
  app.add_option("--budget,-b", budgetText,
                 "memory budget per device (e.g. 2GiB; default: capacity)");
  app.add_option("--host-budget", hostText, "host-pool budget (default: the cluster's)");
  addSetupOptions(app, setup);
  app.add_option("--profile-microbatch", setup.profileMicrobatch,
                 "microbatch of the analytic profile (default 1)");
  app.add_option("--schedules", schedules,
                 "schedule families, e.g. 1f1b,pipefb-sync,1f1b-keep (default: all)")
      ->delimiter(',');
  addSearchOptions(app, search);
  app.add_option("--max-stages", maxStages, "most stages tried (default: all devices)");
  app.add_option("--max-replicas", maxReplicas,
                 "also try up to this many copies of the pipeline (pipeline.replicas; only on "
                 "clusters of identical devices that do not share cores; default 1)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--no-folded", noFolded,
               "search PipeFB only on 2S devices, not folded onto S (device d runs F of stage d "
               "and B of stage S-1-d)");
  app.add_flag("--no-decoupled", noDecoupled,
               "do not search PipeFB with forward and backward partitions of their own (Df "
               "forward devices feeding Db backward devices, every layer a segment)");
  app.add_option("--out,-o", out, "plan file to write (plan.yaml)");
  app.add_flag("--quiet,-q", quiet, "print only the summary line");
  return runProgram("pipefb_plan", app, argc, argv, [&] {
    config::Config cfg = config::loadConfig(configPath, overrides, config::ConfigUse::Plan);
    Planning pl = setupPlanning(cfg, setup);
    SolverOptions o = pl.solver;
    o.budget = sizeFlag(budgetText, "--budget");
    o.hostBudget = sizeFlag(hostText, "--host-budget");
    o.schedules = parseScheduleFamilies(schedules);
    search.applyTo(o);
    o.maxStages = maxStages;
    o.maxReplicas = maxReplicas;
    o.foldedPlacements = !noFolded;
    o.decoupledPlacements = !noDecoupled;
    const CostModel& model = *pl.model;
    std::cout << "model " << model.profile().model << ": " << model.numLayers() << " layers, "
              << pl.profileText << " profile; cluster " << model.cluster().name << " ("
              << model.cluster().numDevices() << " devices); batch " << o.batch << "; budget "
              << (o.budget < 0 ? std::string("capacity") : formatBytes(o.budget)) << "\n";
    SolveResult r = solve(model, o);
    std::cout << "searched " << r.shapesSolved << " of " << r.shapesTotal
              << " shapes (schedule x microbatches x stages x device chain) in "
              << formatSeconds(r.seconds)
              << (r.heuristicChains ? "; device chains: greedy (too many to enumerate)" : "")
              << (r.foldedSkipped ? "; PipeFB not searched folded (over " +
                                        std::to_string(kFoldedExactLayers) + " layers)"
                                  : std::string())
              << (r.decoupledSkipped ? "; PipeFB not searched decoupled (over " +
                                           std::to_string(kDecoupledExactLayers) + " layers)"
                                     : std::string())
              << "\n\n";
    PlanContext ctx{configPath, model.profile().model, pl.profileText, model.cluster().name,
                    o.budget,   o.hostBudget};
    if (!r.feasible) {
      std::cout << "Nothing fits in "
                << (o.budget < 0 ? std::string("the devices' capacity") : formatBytes(o.budget))
                << " per device.\n";
      if (r.minimalPlan) {
        SolverOptions at = o;
        at.budget = r.minimalBudget;
        Plan shown = *r.minimalPlan;
        if (r.minimalBudget >= 0) {
          // The fastest plan at the smallest budget (the memory-minimal plan is one of them).
          SolveResult f = solve(model, at);
          if (f.feasible) shown = f.best;
          std::cout << "The smallest budget that fits is " << formatBytes(r.minimalBudget)
                    << " per device (" << r.minimalBudget << " bytes), with this plan:\n\n";
        } else {
          std::cout << "Even the full capacities are too small: the smallest plan needs "
                    << formatBytes(r.minimalPlan->peakMemory) << " on its fullest device:\n\n";
        }
        std::cout << stageTable(model, shown, at.budget) << "\n"
                  << explainPlan(model, shown, at.budget, std::nullopt);
      }
      std::cerr << "pipefb_plan: error: no plan fits the budget "
                << (o.budget < 0 ? std::string("(capacity)") : formatBytes(o.budget))
                << "; smallest feasible budget: "
                << (r.minimalBudget >= 0 ? formatBytes(r.minimalBudget) : std::string("none"))
                << " (--budget " << r.minimalBudget << ")\n";
      return 2;
    }
    // What the budget costs: the same search without it (capacities only).
    std::optional<Plan> free;
    if (o.budget >= 0) {
      SolverOptions u = o;
      u.budget = -1;
      u.simulateTop = 0;
      SolveResult fr = solve(model, u);
      if (fr.feasible) free = fr.best;
    }
    if (!quiet)
      std::cout << stageTable(model, r.best, o.budget) << "\n"
                << explainPlan(model, r.best, o.budget, free) << "\n";
    writePlanFile(out, model, r.best, ctx);
    std::cout << "plan written to " << out << ": " << toString(r.best.shape.kind)
              << (r.best.shape.folded ? " folded" : "")
              << (r.best.shape.decoupled() ? " decoupled" : "") << ", " << r.best.shape.stages
              << " stages, "
              << (r.best.shape.replicas > 1 ? std::to_string(r.best.shape.replicas) + " replicas, "
                                            : std::string())
              << r.best.shape.microbatches << " microbatches, "
              << formatSeconds(r.best.iterationTime) << " per iteration\n";
    return 0;
  });
}
