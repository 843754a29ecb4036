// pipefb_sweep --config configs/vgg16.yaml --budgets 256MiB:4GiB:12 [--schedules ...] [--out DIR]
//
// Runs the planner over a range of per-device budgets for each schedule family and
// writes DIR/sweep.csv, DIR/sweep.gp and (with gnuplot) DIR/sweep.png: throughput
// against budget, one line per family, the smallest feasible budget of each marked.
// Prints each family's smallest feasible budget and its ratio to 1f1b-keep's.
// `--measure N` (train N iterations per point) needs the pipeline runtime and is not
// available yet: it exits 2 saying so.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Program.h"
#include "pipefb/common/Size.h"
#include "pipefb/config/Config.h"
#include "pipefb/planner/Explain.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/Sweep.h"

using namespace pipefb;
using namespace pipefb::planner;

int main(int argc, char** argv) {
  CLI::App app{"pipefb_sweep: the planner across memory budgets and schedule families"};
  std::string configPath, budgetsText, out = "sweep";
  std::vector<std::string> overrides, families;
  SetupOptions setup;
  int measure = 0, fixedMicrobatches = 0, maxMicrobatches = 64, simulate = 0;
  app.add_option("--config,-c", configPath, "YAML config file")->required();
  app.add_option("--set,-s", overrides, "override a config key (repeatable)");
  app.add_option("--budgets", budgetsText,
                 "LOW:HIGH:COUNT (geometric) or a list, e.g. 256MiB:4GiB:12")
      ->required();
  app.add_option("--schedules", families,
                 "schedule families (default: 1f1b-keep,1f1b-offload,"
                 "1f1b,gpipe,pipedream,pipefb-sync,pipefb-async)")
      ->delimiter(',');
  app.add_option("--cluster", setup.cluster, "cluster spec (default: devices.count x --device)");
  app.add_option("--device", setup.device, "device spec for a config-derived cluster (cpu)");
  app.add_option("--profile", setup.profile, "profile file (default: analytic)");
  app.add_option("--max-microbatches", maxMicrobatches, "largest microbatch count tried (64)");
  app.add_option("--microbatches", fixedMicrobatches,
                 "only this microbatch count (default: search)");
  app.add_option("--simulate-top", simulate, "re-score candidates with the simulator (0)");
  app.add_option("--measure", measure, "also train N iterations per point (needs the runtime)");
  app.add_option("--out,-o", out, "output folder (sweep)");
  return runProgram("pipefb_sweep", app, argc, argv, [&] {
    if (measure != 0)
      throw UserError(
          "--measure: measured sweeps need the pipeline runtime, which is not "
          "built yet; run without --measure for the planner's predictions");
    config::Config cfg = config::loadConfig(configPath, overrides);
    Planning pl = setupPlanning(cfg, setup);
    SolverOptions o = pl.solver;
    o.maxMicrobatches = maxMicrobatches;
    o.microbatches = fixedMicrobatches;
    o.simulateTop = simulate;
    if (families.empty()) families = defaultSweepFamilies();
    parseScheduleFamilies(families);  // check names before any work
    const auto budgets = parseBudgets(budgetsText);
    const CostModel& model = *pl.model;
    SweepResult r = runSweep(model, o, budgets, families);
    const std::string title = model.profile().model + " on " + model.cluster().name + ", batch " +
                              std::to_string(o.batch) + " (" + pl.profileText + ")";
    auto files = writeSweep(r, out, title);
    std::printf("%zu budgets x %zu families in %.3f s (%s)\n", budgets.size(), families.size(),
                r.seconds, title.c_str());
    std::printf("%-16s %-18s %s\n", "family", "smallest budget", "vs 1f1b-keep");
    const auto base = r.minimalBudget.count("1f1b-keep") ? r.minimalBudget.at("1f1b-keep") : -1;
    for (const auto& f : families) {
      const std::int64_t m = r.minimalBudget.at(f);
      std::string ratio = "";
      if (m > 0 && base > 0) {
        char b[64];
        std::snprintf(b, sizeof b, "%.3fx (1f1b-keep / this = %.2f)", double(m) / base,
                      double(base) / m);
        ratio = b;
      }
      std::printf("%-16s %-18s %s\n", f.c_str(), m >= 0 ? formatBytes(m).c_str() : "never fits",
                  ratio.c_str());
    }
    for (const auto& f : files) std::printf("wrote %s\n", f.c_str());
    return 0;
  });
}
